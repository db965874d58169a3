"""Where the top-2 mask's long-range dropped attention goes, and how the router's coverage compares
with random groups: the tidy summary behind docs/studies/secondary-sinks.md.

Reads recorded runs (``focus-lab record`` with the default metrics: ``dropped_edges``,
``assignments``, ``loss_delta``, ``coverage_distance``), one per length, and writes one row per
(run, quantity[, layer][, pattern, distance bucket]) to ``--out`` (default
``figures/results/secondary_sinks.parquet``, ``SCHEMA_VERSION``), with each run's router file (name,
path, sha256), the commit the run was recorded at and the commit of this summary. The
computations are ``focus_lab.recording.long_range``'s; the quantities:

* ``dropped_edges``: the recorded dropped edges (dense weight > ``edge_threshold``, plus each
  query's heaviest above ``edge_min_weight``, per layer and head);
* ``far_share``: share of their dense weight on edges longer than ``--min-distance`` (512);
* ``the_share``: share of that long-range weight on ``" the"`` keys; ``the_keys``: how many
  (window, position) keys carry it; ``top_keys_share``: share on the ``--top-keys`` (10) heaviest
  key positions;
* ``the_weight`` per layer: the long-range weight on ``" the"`` keys;
* ``the_group_kept`` per layer: for those keys, the share of later queries whose top-k groups hold
  the key's group (balanced random groups: k / K);
* ``loss_spearman``, ``delta_top_decile``, ``delta_rest``, ``queries``, ``queries_with_the_drops``:
  per query, the loss delta (hard minus dense, nats) against the dense weight of its dropped
  ``" the"`` edges (every layer, head and distance; 0 without one): Spearman, and the mean delta of
  the tenth of queries with most of that weight and of the rest;
* ``coverage`` per pattern (``focus`` = the router's top-k mask, ``random`` = balanced random groups
  at the same K and k: the recorder's ``random`` pattern) and distance bucket: dense mass kept,
  pooled over layers and heads;
* ``coverage_beyond_window`` per pattern and layer: the same beyond the window, pooled over heads
  and buckets.

Usage (the runs are made by the page's Reproduce commands)::

    python -m analyses.studies.secondary_sinks --runs runs/sinks_4k runs/sinks_8k
"""

from __future__ import annotations

import argparse
from pathlib import Path

import pandas as pd

SCHEMA_VERSION = 1
OUT = Path("figures/results/secondary_sinks.parquet")


def run_rows(path: Path, min_distance: int = 512, top_keys: int = 10) -> list[dict]:
    """The summary rows of one recorded run (``path``)."""
    from focus_lab.recording import long_range as LR
    from focus_lab.runs import Run
    run = Run.open(path)
    m = run.manifest
    edges = run.read_table("dropped_edges", ["window", "layer_idx", "query_position", "key_position", "distance",
                                             "weight", "key_token"])
    drops = LR.long_range_drops(edges, min_distance=min_distance, top_keys=top_keys)
    assignments = run.read_table("assignments", ["window", "position", "layer_idx", "group", "top_k_groups"])
    kept = LR.group_kept_by_later_queries(assignments, drops.keys)
    loss = LR.loss_vs_token_drops(run.read_table("loss_delta", ["window", "position", "delta"]), edges)
    cov = run.read_table("coverage_distance")
    rows = [dict(quantity="dropped_edges", value=drops.edges), dict(quantity="far_share", value=drops.far_share),
            dict(quantity="the_share", value=drops.token_share), dict(quantity="the_keys", value=drops.token_keys),
            dict(quantity="top_keys_share", value=drops.top_keys_share),
            dict(quantity="loss_spearman", value=loss.spearman), dict(quantity="delta_top_decile", value=loss.delta_top),
            dict(quantity="delta_rest", value=loss.delta_rest), dict(quantity="queries", value=loss.queries),
            dict(quantity="queries_with_the_drops", value=loss.queries_with_drops)]
    rows += [dict(quantity="the_weight", layer_idx=int(l), value=w) for l, w in drops.token_weight_by_layer.items()]
    rows += [dict(quantity="the_group_kept", layer_idx=int(l), value=v) for l, v in kept.items()]
    rows += [dict(quantity="coverage", pattern=r.pattern, distance_lo=int(r.distance_lo), distance_hi=int(r.distance_hi),
                  value=r.coverage) for r in LR.coverage_by_distance(cov).itertuples()]
    window = int(m["focus_config"]["window"])
    rows += [dict(quantity="coverage_beyond_window", pattern=r.pattern, layer_idx=int(r.layer_idx),
                  distance_lo=window, distance_hi=int(m["seq_len"]), value=r.coverage)
             for r in LR.coverage_by_layer(cov, window).itertuples()]
    routers = m["routers"]
    cfg = m["focus_config"]
    meta = dict(seq_len=int(m["seq_len"]), windows=int(m["windows"]), corpus=m["corpus"]["name"],
                documents=",".join(m["documents"]), top_k=int(cfg["top_k"]), num_groups=int(cfg["num_groups"]),
                focus_window=window, sink_tokens=int(cfg["sink_tokens"]), min_distance=min_distance,
                top_keys=top_keys, edge_threshold=float(m["recorder"]["edge_threshold"]),
                edge_min_weight=float(m["recorder"]["edge_min_weight"]), routers=routers.get("name") or "",
                routers_path=routers.get("path") or "", routers_sha256=routers["sha256"],
                run_commit=routers.get("commit") or "", command=m.get("command", ""))
    return [{**meta, "layer_idx": -1, "pattern": "", "distance_lo": -1, "distance_hi": -1, **r} for r in rows]


def summary(runs: list[Path], min_distance: int = 512, top_keys: int = 10) -> pd.DataFrame:
    """The tidy summary of ``runs`` (``SCHEMA_VERSION``, this checkout's commit)."""
    from focus_lab.hf.shipped import code_commit
    df = pd.DataFrame([r for p in runs for r in run_rows(Path(p), min_distance, top_keys)])
    df["value"] = df["value"].astype(float)
    for c in ("layer_idx", "distance_lo", "distance_hi"):
        df[c] = df[c].astype("int32")
    df.insert(0, "schema_version", SCHEMA_VERSION)
    df["commit"] = code_commit()
    return df


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--runs", type=Path, nargs="+", default=[Path("runs/sinks_4k"), Path("runs/sinks_8k")],
                    help="recorded runs, one per length")
    ap.add_argument("--min-distance", type=int, default=512, help="long range: edges longer than this (tokens)")
    ap.add_argument("--top-keys", type=int, default=10, help="the heaviest key positions whose share is reported")
    ap.add_argument("--out", type=Path, default=OUT)
    args = ap.parse_args(argv)
    from focus_lab.io import write_parquet
    df = summary(args.runs, args.min_distance, args.top_keys)
    write_parquet(args.out, df)
    scalars = df[(df.layer_idx < 0) & (df.pattern == "")].pivot(index="quantity", columns="seq_len", values="value")
    print(scalars.to_string())
    print(f"{len(df)} rows written to {args.out}")


if __name__ == "__main__":
    main()
