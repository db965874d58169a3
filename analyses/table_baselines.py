"""Table: Focus and every baseline on held-out Austen, one row per (method, pattern):
perplexity, change vs dense with its 95% paired bootstrap interval over windows, fraction of distant causal pairs kept, largest hard group's share,
measured tokens/s and speedup over dense in the same run (``data/baselines``)."""

from __future__ import annotations

from pathlib import Path

import pandas as pd

from analyses.common import METHOD_NAMES, change_table, read

TITLE = "Baselines at matched sparsity (held-out Austen)"
DATA = ("baselines",)


def make_table(data_dir: Path) -> pd.DataFrame:
    df = read(data_dir, "baselines")
    ch = change_table(read(data_dir, "baselines", per_window=True), by=("seq_len",)).set_index(["method", "label"])
    ci = [ch.loc[(m, l)] if (m, l) in ch.index else None for m, l in zip(df["method"], df["label"])]
    out = pd.DataFrame({
        "method": df["method"].map(lambda m: METHOD_NAMES.get(m, m)),
        "pattern": df["label"],
        "perplexity": df["perplexity"],
        "vs dense [95% interval]": ["-" if r is None or pd.isna(r.change_pct) else
                                    f"{r.change_pct:+.1f}% [{r.ci_lo:+.1f}, {r.ci_hi:+.1f}]" for r in ci],
        "distant pairs kept": df["distant_pairs_kept"],
        "largest group": df["max_group_share"],
        "window": df["window_size"],
        "tokens/s": df["tokens_per_second"],
        "speedup": df["speedup"],
    })
    return out


def to_markdown(df: pd.DataFrame) -> str:
    fmt = {"perplexity": "{:.3f}", "distant pairs kept": "{:.3f}", "largest group": "{:.3f}",
           "window": "{:.0f}", "tokens/s": "{:.0f}", "speedup": "{:.2f}"}
    head = "| " + " | ".join(df.columns) + " |\n|" + "|".join("---" if c in ("method", "pattern") else "---:"
                                                          for c in df.columns) + "|\n"
    lines = []
    for _, r in df.iterrows():
        cells = []
        for c in df.columns:
            v = r[c]
            cells.append("-" if isinstance(v, float) and pd.isna(v) else fmt.get(c, "{}").format(v))
        lines.append("| " + " | ".join(cells) + " |")
    return head + "\n".join(lines) + "\n"
