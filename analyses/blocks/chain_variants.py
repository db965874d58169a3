"""docs/studies/chain-variants.md: each stage of the recipe chain and its variants measured on the
cells of the rule that picked the shipped file (*Persuasion* at 8192 tokens, hard top-2;
*Hamlet* at 8192, hard top-1 against random and shuffled groups), at 4096 tokens for the files
with every layer routed, and the paired comparisons between them, from the committed per-window
rows (figures/results/length_cells.parquet)."""

from __future__ import annotations

from analyses.blocks.common import margin, over_dense, tables_routers
from analyses.doc_blocks import LENGTH_CELLS, Generated, _Cells, block

PAGE = "docs/studies/chain-variants.md"
PROSE_PAGES = (PAGE,)
#: the interval's level; the rule's bounds (docs/recipes.md): top-2 within +1.0% of dense, top-1 at
#: least 3% better than random and shuffled groups
ALLOWED = {PAGE: {"95%", "+1.0%", "3%"}}

P, H = "austen", "shakespeare"
#: (routers, *Persuasion* table (top-2 at 8192), *Hamlet* table (top-1 at 8192) or None)
ROWS_8K = (("shipped (average of stages 2 and 3)", "shipped_8k_all_persuasion", "shipped_8k_all_hamlet"),
           ("the same chain remade from scratch", "from_scratch_8k_all_persuasion", "from_scratch_8k_all_hamlet"),
           ("stage 2 alone", "stage2_distill64_8k_all_persuasion", "stage2_distill64_8k_all_hamlet"),
           ("stage 3 alone (90 steps)", "two_domain90_8k_all_persuasion", "two_domain90_8k_all_hamlet"),
           ("stage 3 after 60 steps", "two_domain60_top2_8k", "two_domain60"),
           ("two-domain routers in 5 layers", "merge5_top2", "merge5"),
           ("60-step file, bias re-calibrated at 8192", "two_domain60_calibrated_top2", None),
           ("every layer routed", "every_layer_routed", "every_layer_routed"),
           ("every layer routed, + distill64 at 8192", "distill8k", None))
ROWS_4K = (("every layer routed (`distill64`)", "distill4k"),
           ("+ 30 steps of `distill64_topk`", "distill4k_topk"),
           ("stage 1 alone (`sinks64`, 512 tokens)", "sinks64_512"))


@block("chain-variants", LENGTH_CELLS)
def chain_variants() -> Generated:
    """The rule's cells at 8192 tokens per file: dense perplexity on the file's windows, *Persuasion*
    hard top-2 and *Hamlet* hard top-1 over dense (95% paired interval over windows, distant pairs
    kept), and random / shuffled groups' change over the router at top-1 on *Hamlet* (> 0: the
    router is better; on *Persuasion* where the file has no *Hamlet* rows)."""
    c = _Cells()
    lines = ["| routers | table(s) | windows, *Persuasion* / *Hamlet* | dense, *Persuasion* / *Hamlet* | "
             "*Persuasion* 8192, top-2 | *Hamlet* 8192, top-1 | margin over random / shuffled, top-1 |",
             "|---|---|---|---|---|---|---|"]
    for name, tp, th in ROWS_8K:
        p = c.summary(tp, P, 8192, "hard_top2")
        dp = c.summary(tp, P, 8192, "dense")
        top2 = over_dense(c, tp, P, 8192, "hard_top2", nd=2)
        tables = f"`{tp}`" + (f", `{th}`" if th and th != tp else "")
        if th is not None:
            h, dh = c.summary(th, H, 8192, "hard_top1"), c.summary(th, H, 8192, "dense")
            windows, dense = f"{int(p.windows)} / {int(h.windows)}", f"{dp.perplexity:.2f} / {dh.perplexity:.2f}"
            top1 = over_dense(c, th, H, 8192, "hard_top1")
            margins = f"{margin(c, th, H, 8192, 'random_top1', ci=True)} / {margin(c, th, H, 8192, 'shuffled_top1', ci=True)}"
        else:
            windows, dense, top1 = f"{int(p.windows)} / -", f"{dp.perplexity:.2f} / -", "not measured"
            labels = set(c.cells.loc[(c.cells["table"] == tp) & (c.cells.corpus == P) & (c.cells.seq_len == 8192), "label"])
            margins = (f"*Persuasion*: {margin(c, tp, P, 8192, 'random_top1', ci=True)} / "
                       f"{margin(c, tp, P, 8192, 'shuffled_top1', ci=True)}"
                       if {"random_top1", "shuffled_top1", "hard_top1"} <= labels else "")
        lines.append(f"| {name} | {tables} | {windows} | {dense} | {top2} | {top1} | {margins} |")
    tables = [t for _, tp, th in ROWS_8K for t in (tp, th) if t]
    inputs = (f"{LENGTH_CELLS} (tables and routers: {tables_routers(c, tables)}); every window each table holds at 8192 "
              "tokens; patterns dense, hard_top1, hard_top2, random_top1, shuffled_top1, every layer at k = 1 or 2")
    return Generated(inputs, "\n".join(lines))


@block("chain-variants-4k", LENGTH_CELLS)
def chain_variants_4k() -> Generated:
    """*Persuasion* at 4096 tokens for the files with every layer routed and stage 1: dense
    perplexity, hard top-1 and top-2 over dense (95% paired interval, distant pairs kept), and
    random / shuffled groups' change over the router at top-1."""
    c = _Cells()
    lines = ["| routers | table | windows | dense | hard top-1 | hard top-2 | margin over random / shuffled, top-1 |",
             "|---|---|---:|---:|---|---|---|"]
    for name, t in ROWS_4K:
        d = c.summary(t, P, 4096, "dense")
        lines.append(f"| {name} | `{t}` | {int(d.windows)} | {d.perplexity:.2f} | "
                     f"{over_dense(c, t, P, 4096, 'hard_top1')} | {over_dense(c, t, P, 4096, 'hard_top2')} | "
                     f"{margin(c, t, P, 4096, 'random_top1', ci=True)} / {margin(c, t, P, 4096, 'shuffled_top1', ci=True)} |")
    inputs = (f"{LENGTH_CELLS} (tables and routers: {tables_routers(c, [t for _, t in ROWS_4K])}); *Persuasion* at 4096 "
              "tokens; patterns dense, hard_top1, hard_top2, random_top1, shuffled_top1")
    return Generated(inputs, "\n".join(lines))


#: (comparison, (table, corpus, length, label) of a, of b): the change of a over b on the windows both have
PAIRED = (("every layer routed: random groups over the router, *Persuasion* top-1, 8192 (< 0: random better)",
           ("every_layer_routed", P, 8192, "random_top1"), ("every_layer_routed", P, 8192, "hard_top1")),
          ("stage 2 alone on those 4 windows: *Persuasion* top-2 over dense, 8192",
           ("stage2_distill64", P, 8192, "hard_top2"), ("stage2_distill64", P, 8192, "dense")),
          ("stage 2 alone on those 4 windows: *Hamlet* top-1 over dense, 8192",
           ("stage2_distill64", H, 8192, "hard_top1"), ("stage2_distill64", H, 8192, "dense")),
          ("`distill64_topk` against the file it started from, top-1, 4096",
           ("distill4k_topk", P, 4096, "hard_top1"), ("distill4k", P, 4096, "hard_top1")),
          ("`distill64_topk` against the file it started from, top-2, 4096",
           ("distill4k_topk", P, 4096, "hard_top2"), ("distill4k", P, 4096, "hard_top2")),
          ("the 5-layer merge against stage 2, *Persuasion* top-2, 8192",
           ("merge5_top2", P, 8192, "hard_top2"), ("stage2_distill64", P, 8192, "hard_top2")))


@block("chain-variants-paired", LENGTH_CELLS)
def chain_variants_paired() -> Generated:
    """The page's paired comparisons: the change of perplexity of one pattern or file over another
    on the windows both have, with its 95% paired bootstrap interval over windows."""
    from focus_lab.eval.evaluate import paired_change
    c = _Cells()
    lines = ["| comparison | tables | windows | change [95% interval] |", "|---|---|---:|---|"]
    for what, a, b in PAIRED:
        ra, rb = c.rows(*a), c.rows(*b)
        m, lo, hi = paired_change(ra, rb)
        tables = f"`{a[0]}`" + (f" / `{b[0]}`" if b[0] != a[0] else "")
        lines.append(f"| {what} | {tables} | {len(set(ra.window) & set(rb.window))} | {m:+.2f}% [{lo:+.2f}, {hi:+.2f}] |")
    tables = [x[0] for _, a, b in PAIRED for x in (a, b)]
    inputs = f"{LENGTH_CELLS} (tables and routers: {tables_routers(c, tables)}); each pair on the windows both rows have"
    return Generated(inputs, "\n".join(lines))
