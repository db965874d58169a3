"""The per-domain table of docs/results.md ("Per domain: trained and held-out text"), printed as
markdown from the committed length-table cells (``figures/results/length_cells.parquet``).

For each named domain at 4096 tokens (and *Persuasion* and the held-out domains at 8192): dense
perplexity; the shipped file's hard top-1, hard top-2 (its per-layer budget, docs/method.md §2.7)
with the distant pairs kept, random top-2 under the same budget and the router's margin over it,
each as the change over dense with its 95% paired bootstrap interval over windows
(``analyses.length_table.summarize``); then the shipped file's hard top-2 against the same routers'
without the group capacity on the same windows (paired change, %, > 0: the capacity costs;
``evaluate.paired_change``).

Usage::

    python -m analyses.studies.domain_table
"""

from __future__ import annotations

import pandas as pd

HELD_OUT = ("kernel-docs", "python-source", "bible-kjv", "python-docs", "man-pages", "debian-reference")
TECHNICAL = ("python-docs", "man-pages", "debian-reference")  # the held-out domains also measured at 8192
# (row name, kind, tokens, corpus, table of the shipped file, table of the same routers without the capacity)
ROWS = ([("austen (Persuasion)", "trained", 4096, "austen", "capacity_length", "needle_mix_length"),
         ("austen (Persuasion), 8192", "trained", 8192, "austen", "capacity_length", "needle_mix_length"),
         ("shakespeare (Hamlet)", "trained", 4096, "shakespeare", "capacity_length", "needle_mix_length")]
        + [(d, "held out", 4096, d, "capacity_per_domain", "needle_mix_per_domain") for d in HELD_OUT]
        + [(f"{d}, 8192", "held out", 8192, d, "capacity_heldout_8k", "needle_mix_heldout_8k") for d in TECHNICAL])
HEADER = ("| domain | kind | windows | dense | hard top-1 | hard top-2 [pairs kept] | random top-2 | "
          "router over random, top-2 | hard top-2 over no capacity |\n"
          "|---|---|---:|---:|---|---|---|---|---|")


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

    def previous(table, previous_table, corpus, tokens) -> str:
        from focus_lab.eval.evaluate import paired_change
        a, b = (cells[(cells["table"] == t) & (cells["corpus"] == corpus) & (cells["seq_len"] == tokens)
                      & (cells["label"] == "hard_top2")] for t in (table, previous_table))
        if not len(b):
            raise KeyError(f"committed table {previous_table!r} has no hard_top2 at {tokens} tokens on {corpus}")
        m, lo, hi = paired_change(a, b)
        return f"{m:+.2f}% [{lo:+.2f}, {hi:+.2f}]"

    lines = [HEADER]
    for name, kind, tokens, corpus, shipped, before in ROWS:
        dense, rnd = row(shipped, corpus, tokens, "dense"), row(shipped, corpus, tokens, "random_top2")
        lines.append(" | ".join([
            f"| {name}", kind, str(int(dense.windows)), f"{dense.perplexity:.2f}",
            change(shipped, corpus, tokens, "hard_top1"), change(shipped, corpus, tokens, "hard_top2", True),
            change(shipped, corpus, tokens, "random_top2"),
            f"{rnd.control_vs_router_pct:+.1f}% [{rnd.control_ci_lo:+.1f}, {rnd.control_ci_hi:+.1f}]",
            previous(shipped, before, corpus, tokens)]) + " |")
    return "\n".join(lines)


if __name__ == "__main__":
    print(domain_table())
