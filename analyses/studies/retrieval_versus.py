"""Another router file's retrieval cases against the committed shipped ones, paired by case.

A run of ``focus-lab probe retrieval --routers OTHER`` writes its cases under its pattern names
(``hard_top2``). This script renames them ``<pattern>@<--name>``, puts them beside the committed
cases (``figures/results/retrieval_cases.parquet``) of the same (task, length, seed), and prints,
per task and length: each pattern's score relative to dense and the mean change of the answers'
log-prob against dense (``retrieval_tables.summary``: dense is the run's own), then the new
pattern minus the committed one, paired over the cases both ran (``paired_difference``; score,
answers' log-prob in nats, distant pairs kept).

    python -m analyses.studies.retrieval_versus runs/needle_mix_r4k --name needle_mix
    python -m analyses.studies.retrieval_versus runs/nm_8k runs/nm_8k0 --name needle_mix   # two runs as one

``--committed FILE`` pairs with another committed suite instead (e.g. the previous shipped file's,
``figures/results/retrieval_cases_5710775e.parquet``).

``--save FILE`` also keeps the run's cases (every pattern, a ``routers`` column holding ``--name``)
in FILE, a parquet shared by several runs: rows of the same (routers, task, length, seed, pattern)
are replaced, and the file is written atomically (``io.write_parquet``).
"""

from __future__ import annotations

import argparse
from pathlib import Path

import pandas as pd

from focus_lab.eval.retrieval_tables import CASE_KEY, merge_suites, paired_difference, read_suite, summary
from focus_lab.io import write_parquet

COMMITTED = Path(__file__).resolve().parents[2] / "figures" / "results" / "retrieval_cases.parquet"


def versus(run: pd.DataFrame, committed: pd.DataFrame, name: str, patterns: list[str]) -> pd.DataFrame:
    """The run's cases (``patterns`` renamed ``p@name``; its dense kept as ``dense``) and the
    committed cases of ``patterns`` at the same (task, length, seed), one frame."""
    keys = run[["task", "length", "seed"]].drop_duplicates()
    new = run[run["pattern"].isin(["dense", *patterns])].copy()
    new["pattern"] = new["pattern"].map(lambda p: p if p == "dense" else f"{p}@{name}")
    old = committed[committed["pattern"].isin(patterns)].merge(keys, on=["task", "length", "seed"])
    return pd.concat([new, old[new.columns.intersection(old.columns)]], ignore_index=True)


def save(run: pd.DataFrame, name: str, path: Path) -> pd.DataFrame:
    """``path``'s table (if any) with ``run``'s rows, labelled ``routers = name``, in place of the
    rows of the same (routers, task, length, seed, pattern). Writes it atomically; returns it."""
    new = run.assign(routers=name)
    old = pd.read_parquet(path) if path.is_file() else new.iloc[:0]
    table = pd.concat([new, old], ignore_index=True).drop_duplicates(["routers", *CASE_KEY], keep="first")
    write_parquet(path, table)
    return table


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("run", type=Path, nargs="+", help="the --out folder(s) of the other routers' runs "
                    "(several: merged, ``merge_suites``)")
    ap.add_argument("--name", required=True, help="label of the other routers")
    ap.add_argument("--patterns", default="hard_top2", help="comma list of patterns to compare")
    ap.add_argument("--save", type=Path, default=None, help="keep the run's cases in this parquet")
    ap.add_argument("--committed", type=Path, default=COMMITTED,
                    help="the cases to pair with (default: the shipped file's, %(default)s; the file shipped "
                    "before 2026-11-28: figures/results/retrieval_cases_5710775e.parquet)")
    a = ap.parse_args(argv)
    pats = [p for p in a.patterns.split(",") if p]
    run = merge_suites([read_suite(r) for r in a.run])
    if a.save is not None:
        print(f"{a.save}: {len(save(run, a.name, a.save))} rows")
    both = versus(run, pd.read_parquet(a.committed), a.name, pats)
    s = summary(both)
    cols = ["task", "length", "pattern", "cases", "score", "relative", "relative_lo", "relative_hi",
            "logprob_change", "logprob_change_lo", "logprob_change_hi", "distant_pairs_kept", "needle_mass_kept"]
    print(s[cols].round(3).to_string(index=False))
    for p in pats:
        for col in ("score", "answer_logprob", "distant_pairs_kept"):
            d = paired_difference(both, f"{p}@{a.name}", p, col)
            print(f"\n{p}@{a.name} minus {p} ({col}):")
            print(d.round(3).to_string(index=False))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
