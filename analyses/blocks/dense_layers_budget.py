"""docs/studies/dense-layers-budget.md: top-2 budgets that run dense layers where the shipped budget
has k = 3 layers (tables ``budget_dense6``, ``budget_dense6_domains``, ``budget_dense8``,
``budget_dense8_domains`` of length_cells.parquet), paired against the shipped budget on the same
windows (tables ``shipped``, ``shipped_per_domain``); the one-call kernel times at k = 1, 2, 3
(figures/bench_attention/kernel_k123_4096.csv) and the end-to-end prefill of the shipped file and
``dense8`` back to back (figures/bench_attention/e2e_dense8_shipped.csv, e2e_dense8.csv)."""

from __future__ import annotations

import pandas as pd

from analyses.blocks.common import layer_top_k_spec, paired, table_router
from analyses.doc_blocks import LENGTH_CELLS, REPO, Generated, MissingInput, _Cells, block

PAGE = "docs/studies/dense-layers-budget.md"
PROSE_PAGES = (PAGE,)
#: the interval's level; a k = 3 layer of K = 4 keeps 3/4 of the pairs (arithmetic, not a measurement)
ALLOWED = {PAGE: {"95%", "75%"}}

KERNEL = "figures/bench_attention/kernel_k123_4096.csv"
E2E = {"shipped": "figures/bench_attention/e2e_dense8_shipped.csv", "dense8": "figures/bench_attention/e2e_dense8.csv"}
#: (row label, corpus, the shipped budget's table, the suffix of the dense budgets' tables)
ROWS = (("*Persuasion* 4096", "austen", "shipped", ""),
        ("man pages", "man-pages", "shipped_per_domain", "_domains"),
        ("Python docs", "python-docs", "shipped_per_domain", "_domains"))
BUDGETS = ("dense6", "dense8")


@block("dense-layers-kernel", KERNEL)
def dense_layers_kernel() -> Generated:
    """One attention call of 4096 tokens, K = 4 balanced groups, one thread: dense's time and
    Focus's at k = 1, 2, 3 (medians over the run's repeats) and Focus's time over dense's."""
    df = pd.read_csv(REPO / KERNEL)
    df = df[(df.n == 4096) & (df.K == 4) & (df.groups == "balanced")].sort_values("k")
    if not len(df):
        raise MissingInput(f"{KERNEL} (rows at 4096 tokens, K = 4, balanced groups)")
    lines = ["| k | dense (s) | Focus (s) | Focus / dense time |", "|---:|---:|---:|---:|"]
    for r in df.itertuples():
        lines.append(f"| {r.k} | {r.dense_s:.2f} | {r.focus_s:.2f} | {r.focus_s / r.dense_s:.2f}x |")
    inputs = (f"{KERNEL}; one attention call of 4096 tokens, K = 4, balanced groups, one thread, medians over "
              f"{int(df.repeats.iloc[0])} repeats; "
              f"load average {df.loadavg_start.min():.1f}-{df.loadavg_end.max():.1f}")
    return Generated(inputs, "\n".join(lines))


@block("dense-layers-budget", LENGTH_CELLS, *E2E.values())
def dense_layers_budget() -> Generated:
    """Per corpus: hard top-2 over dense under the shipped budget and under ``dense6`` and
    ``dense8`` (distant pairs kept), each dense budget's paired change over the shipped budget with
    its 95% interval over windows (> 0: worse); then the bare prefill forward's speed-up over
    dense in the same run, the shipped file and ``dense8`` back to back."""
    c = _Cells()
    lines = ["| | shipped budget | " + " | ".join(BUDGETS) + " |", "|---|---|---|---|"]
    for name, corpus, ref, suffix in ROWS:
        s = c.summary(ref, corpus, 4096, "hard_top2")
        cells = [f"{s.delta_vs_dense_pct:+.2f}% [{s.distant_pairs_kept:.2f}]"]
        for b in BUDGETS:
            t = f"budget_{b}{suffix}"
            x = c.summary(t, corpus, 4096, "hard_top2")
            cells.append(f"{x.delta_vs_dense_pct:+.2f}% [{x.distant_pairs_kept:.2f}], "
                         f"{paired(c, (t, 'hard_top2'), (ref, 'hard_top2'), corpus, 4096)}")
        lines.append(f"| {name} ({int(s.windows)} windows) | " + " | ".join(cells) + " |")
    e2e = {f: pd.read_csv(REPO / p) for f, p in E2E.items()}
    for L in sorted(set(e2e["shipped"].tokens)):
        def speed(f: str) -> str:
            g = e2e[f] if f in e2e else None
            if g is None:
                return "-"
            r = g[(g.phase == "prefill") & (g.tokens == L) & (g.pattern == "hard_top2")]
            return f"{r.speedup_bare.iloc[0]:.2f}x" if len(r) else "-"
        lines.append(f"| prefill {L}, bare, vs dense in the same run | {speed('shipped')} | "
                     + " | ".join(speed(b) for b in BUDGETS) + " |")
    inputs = (f"{LENGTH_CELLS} (tables shipped, shipped_per_domain: {table_router(c, 'shipped')}; "
              + "; ".join(f"budget_{b}, budget_{b}_domains: {table_router(c, f'budget_{b}')}, layer top-k "
                          f"{layer_top_k_spec(c, f'budget_{b}', 'hard_top2')}" for b in BUDGETS)
              + "); windows of 4096 tokens; pattern hard_top2 against dense; "
              + ", ".join(E2E.values()) + " (prefill, hard_top2's speedup_bare, "
              f"medians over {int(e2e['shipped'].repeats.max())} repeats, 1 torch thread, load average "
              f"{min(g.loadavg_min.min() for g in e2e.values()):.1f}-{max(g.loadavg_max.max() for g in e2e.values()):.1f})")
    return Generated(inputs, "\n".join(lines))
