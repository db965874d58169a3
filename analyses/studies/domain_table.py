"""The per-domain table of docs/results.md ("Per domain: trained and held-out text"), printed as
markdown from the committed length-table cells (``figures/results/length_cells.parquet``).

For each named domain at 4096 tokens (and *Persuasion* and the held-out domains at 8192): dense
perplexity; the shipped
file's hard top-1, hard top-2 (its per-layer budget, docs/method.md §2.7) with the distant pairs
kept, random top-2 under the same budget and the router's margin over it; then uniform top-2 of
the same tensors without the budget and of the broad-mix file (docs/studies/broad-mix.md), each as the
change over dense with its 95% paired bootstrap interval over windows
(``analyses.length_table.summarize``). A row without a uniform-top-2 or broad-mix table shows "-"
there (the held-out domains at 8192 were measured with the shipped file only).

Usage::

    python -m analyses.studies.domain_table
"""

from __future__ import annotations

import pandas as pd

# (row name, kind, tokens, corpus, table of the shipped file, table of uniform top-2 or None,
#  table of the broad mix or None)
ROWS = [
    ("austen (Persuasion)", "trained", 4096, "austen", "shipped", "shipped_uniform", "broad_mix_persuasion"),
    ("austen (Persuasion), 8192", "trained", 8192, "austen", "shipped", "shipped_uniform", "broad_mix_persuasion"),
    ("shakespeare (Hamlet)", "trained", 4096, "shakespeare", "shipped", "shipped_uniform", "broad_mix_train_domains"),
    ("kernel-docs", "broad mix only", 4096, "kernel-docs", "shipped_per_domain", "shipped_train_domains", "broad_mix_train_domains"),
    ("python-source", "broad mix only", 4096, "python-source", "shipped_per_domain", "shipped_train_domains", "broad_mix_train_domains"),
    ("bible-kjv", "broad mix only", 4096, "bible-kjv", "shipped_per_domain", "shipped_train_domains", "broad_mix_train_domains"),
    ("python-docs", "held out", 4096, "python-docs", "shipped_per_domain", "shipped_domains", "broad_mix_domains"),
    ("man-pages", "held out", 4096, "man-pages", "shipped_per_domain", "shipped_domains", "broad_mix_domains"),
    ("debian-reference", "held out", 4096, "debian-reference", "shipped_per_domain", "shipped_domains", "broad_mix_domains"),
    ("python-docs, 8192", "held out", 8192, "python-docs", "shipped_heldout_8k", None, None),
    ("man-pages, 8192", "held out", 8192, "man-pages", "shipped_heldout_8k", None, None),
    ("debian-reference, 8192", "held out", 8192, "debian-reference", "shipped_heldout_8k", None, None),
]
HEADER = ("| domain | kind | windows | dense | hard top-1 | hard top-2 [pairs kept] | random top-2 | "
          "router over random, top-2 | uniform top-2 | uniform top-2, broad mix |\n"
          "|---|---|---:|---:|---|---|---|---|---|---|")


def domain_table(cells: pd.DataFrame | None = None) -> str:
    """The markdown table (header and one line per ``ROWS`` entry) from the committed cells.
    Raises KeyError naming a table, or a (table, corpus, tokens, pattern), the cells lack."""
    from analyses.length_table import committed_cells, summarize
    cells = committed_cells() if cells is None else cells
    summaries: dict[str, pd.DataFrame] = {}

    def row(table: str, corpus: str, tokens: int, label: str) -> pd.Series:
        if table not in summaries:
            part = cells[cells["table"] == table]
            if not len(part):
                raise KeyError(f"the committed cells have no table {table!r}")
            summaries[table] = summarize(part.drop(columns="table")).set_index(["corpus", "seq_len", "label"])
        key = (corpus, tokens, label)
        if key not in summaries[table].index:
            raise KeyError(f"committed table {table!r} has no {label} at {tokens} tokens on {corpus}")
        return summaries[table].loc[key]

    def change(table, corpus, tokens, label, pairs=False) -> str:
        if table is None:
            return "-"
        r = row(table, corpus, tokens, label)
        return f"{r.delta_vs_dense_pct:+.1f}% [{r.ci_lo:+.1f}, {r.ci_hi:+.1f}]" + (
            f" [{r.distant_pairs_kept:.2f}]" if pairs else "")

    lines = [HEADER]
    for name, kind, tokens, corpus, shipped, uniform, broad in ROWS:
        dense, rnd = row(shipped, corpus, tokens, "dense"), row(shipped, corpus, tokens, "random_top2")
        lines.append(" | ".join([
            f"| {name}", kind, str(int(dense.windows)), f"{dense.perplexity:.2f}",
            change(shipped, corpus, tokens, "hard_top1"), change(shipped, corpus, tokens, "hard_top2", True),
            change(shipped, corpus, tokens, "random_top2"),
            f"{rnd.control_vs_router_pct:+.1f}% [{rnd.control_ci_lo:+.1f}, {rnd.control_ci_hi:+.1f}]",
            change(uniform, corpus, tokens, "hard_top2"), change(broad, corpus, tokens, "hard_top2")]) + " |")
    return "\n".join(lines)


if __name__ == "__main__":
    print(domain_table())
