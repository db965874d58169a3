"""The dependency audit's committed tables: from a recorded run (the main job's,
``runs/smollm2-austen``), the per-layer dropped attention mass by distance and each costly query's
heaviest dropped edge, written as two small tidy parquet files that the results page's generated
blocks read (``analyses/doc_blocks.py``: ``audit-summary``, ``audit-costliest``).

* ``figures/results/audit_dropped_mass.parquet``: one row per layer_idx, from
  ``focus_lab.runs.dropped_mass_by_distance`` (``dropped_mass``, ``far_dropped_mass``,
  ``far_share``: the share of the dropped dense mass on edges of at least 512 tokens);
* ``figures/results/audit_costly.parquet``: one row per costly query (``costly_drops``: the
  queries whose next-token loss rises most under the hard mask), joined to its heaviest dropped
  edge (``weight``, dense attention weight), with the token before the query and before the key
  (``query_prev``, ``key_prev``) for reading.

Both carry the run's router file (``router_name``, ``routers_sha256``), ``seq_len``, ``windows``
and ``schema_version``. Source: docs/audit.md; ``focus_lab.runs``.

Usage::

    bash scripts/quickstart.sh --no-serve            # records runs/smollm2-austen (4 x 4096 tokens)
    python -m analyses.audit_table runs/smollm2-austen --save

Raises SystemExit (one line) when the run lacks a table, naming the option that records it.
"""

from __future__ import annotations

import argparse
from pathlib import Path

import pandas as pd

SCHEMA_VERSION = 1
RESULTS = Path(__file__).resolve().parent.parent / "figures" / "results"
DROPPED = RESULTS / "audit_dropped_mass.parquet"
COSTLY = RESULTS / "audit_costly.parquet"


def extract(run: Path) -> tuple[pd.DataFrame, pd.DataFrame]:
    """(per-layer dropped mass, per costly query its heaviest dropped edge) of run ``run``.
    Raises SystemExit naming a missing table and the record option that makes it."""
    from focus_lab.hf.shipped import named_file
    from focus_lab.runs import Run, RunError, dropped_mass_by_distance
    try:
        r = Run.open(run)
    except RunError as e:
        raise SystemExit(str(e)) from None
    for t, how in (("coverage_distance", "--metrics coverage"), ("costly_drops", "the default metrics"),
                   ("tokens", "the default metrics")):
        if not r.has(t):
            raise SystemExit(f"{run} has no {t} table: record it with {how}")
    man = r.manifest
    sha = man["routers"]["sha256"]
    meta = {"router_name": named_file(sha) or "", "routers_sha256": sha,
            "seq_len": int(man["seq_len"]),
            "windows": int(r.table("tokens").window.nunique()), "schema_version": SCHEMA_VERSION}
    layers = dropped_mass_by_distance(r.table("coverage_distance")).assign(**meta)
    drops = r.table("costly_drops")
    heavy = drops.sort_values(["weight", "window", "query_position"], ascending=[False, True, True]) \
        .drop_duplicates(["window", "query_position"]).sort_values(["delta", "window", "query_position"],
                                                                    ascending=[False, True, True])
    tok = r.table("tokens").set_index(["window", "position"]).token
    prev = lambda w, p: tok.get((w, p - 1), "")  # noqa: E731
    heavy = heavy.assign(query_prev=[prev(w, p) for w, p in zip(heavy.window, heavy.query_position)],
                         key_prev=[prev(w, p) for w, p in zip(heavy.window, heavy.key_position)])
    cols = ["window", "query_position", "query_prev", "query_token", "next_token", "delta", "layer_idx", "head",
            "key_position", "key_prev", "key_token", "distance", "weight", "relation"]
    return layers.reset_index(drop=True), heavy[cols].assign(**meta).reset_index(drop=True)


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("run", type=Path, help="a recorded run directory (the main job's: runs/smollm2-austen)")
    ap.add_argument("--save", action="store_true", help=f"write {DROPPED.name} and {COSTLY.name} under figures/results/")
    a = ap.parse_args(argv)
    layers, heavy = extract(a.run)
    print(f"far share, mean over layers: {layers.far_share.mean():.3f}; {len(heavy)} costly queries")
    if a.save:
        from focus_lab.io import write_parquet
        write_parquet(DROPPED, layers)
        write_parquet(COSTLY, heavy)
        print(f"wrote {DROPPED} and {COSTLY}")


if __name__ == "__main__":
    main()
