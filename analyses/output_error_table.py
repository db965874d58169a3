"""Attention recall and output error of every head, one row per mask: the results page's table
"Attention recall and output error at 8192 tokens" (docs/results.md), from a run recorded with
``--metrics coverage,output_error``.

Per mask the recorder audits (``focus``: the router's hard top-k mask; ``random``: balanced random
groups at the same sparsity; ``window_matched``: a sliding window keeping as many pairs;
``window``: the local window and sinks alone), over every (layer, head): the mean attention
recall (``coverage``, Quest's term), the median and quartiles of the relative output error
``||O_dense - O_mask|| / ||O_dense||`` (``output_error``), the worst head, and the correlation of
the two over heads.

    focus-lab record --seq-len 8192 --max-windows 1 --metrics coverage,output_error --no-pos \\
        --no-per-query --out runs/output_error_8192
    python -m analyses.output_error_table runs/output_error_8192 --save figures/results/output_error_8192.parquet

Raises SystemExit (one line) when the run lacks either table.
"""

from __future__ import annotations

import argparse
from pathlib import Path

import pandas as pd

MASKS = {"focus": "Focus hard top-k", "random": "random groups, same sparsity",
         "window_matched": "window of the same pair count", "window": "window + sinks"}


def head_rows(run: Path) -> pd.DataFrame:
    """One row per (layer_idx, head, pattern): output_error, queries and coverage of ``run``
    (opened as ``focus_lab.runs.Run``). Raises SystemExit (one line) when ``run`` is not a run or
    lacks either table, naming the option that records it."""
    from focus_lab.runs import Run, RunError
    try:
        r = Run.open(run)
    except RunError as e:
        raise SystemExit(str(e)) from None
    for t in ("output_error", "coverage"):
        if not r.has(t):
            raise SystemExit(f"{run} has no {t} table: record it with --metrics coverage,output_error")
    keys = ["layer_idx", "head", "pattern"]
    return r.columns("output_error", keys + ["output_error", "queries"]).merge(
        r.columns("coverage", keys + ["coverage"]), on=keys)


def mask_rows(heads: pd.DataFrame) -> pd.DataFrame:
    """One row per mask of ``heads`` (``head_rows``): recall (mean over heads), output error
    median and quartiles, the worst head and its error, the correlation of recall and error."""
    rows = []
    for p in [m for m in MASKS if m in set(heads.pattern)]:
        g = heads[heads.pattern == p]
        worst = g.loc[g.output_error.idxmax()]
        q = g.output_error.quantile([0.25, 0.5, 0.75]).tolist()
        rows.append({"mask": MASKS[p], "recall": g.coverage.mean(), "error": f"{q[1]:.3f} [{q[0]:.3f}, {q[2]:.3f}]",
                     "worst head": f"{worst.output_error:.2f} (L{int(worst.layer_idx)}H{int(worst['head'])})",
                     "correlation": g.coverage.corr(g.output_error)})
    return pd.DataFrame(rows)


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("run", type=Path, help="a run directory recorded with --metrics coverage,output_error")
    ap.add_argument("--save", type=Path, default=None, help="write the per-head rows as parquet here")
    a = ap.parse_args(argv)
    from analyses.bench_attention import to_markdown
    heads = head_rows(a.run)
    t = mask_rows(heads)
    print(to_markdown(t, list(t.columns), {"recall": "{:.3f}", "correlation": "{:+.2f}"}))
    layers = heads[heads.pattern == "focus"].groupby("layer_idx").output_error.mean().sort_values(ascending=False)
    print("largest mean error, Focus:", ", ".join(f"L{i} {v:.2f}" for i, v in layers.head(4).items()))
    if a.save:
        from focus_lab.io import write_parquet
        write_parquet(a.save, heads)


if __name__ == "__main__":
    main()
