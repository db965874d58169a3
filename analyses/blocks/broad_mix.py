"""docs/studies/broad-mix.md: the shipped file (before its top-2 budget) continued 30 steps on the
five-domain mix and averaged with itself (tables ``broad_mix_domains``, ``broad_mix_persuasion``,
``broad_mix_train_domains`` of length_cells.parquet), against the file it continues at uniform
top-2 on the same windows (tables ``shipped_domains``, ``shipped_train_domains``,
``shipped_uniform``)."""

from __future__ import annotations

from analyses.blocks.common import paired, table_router
from analyses.doc_blocks import LENGTH_CELLS, Generated, _Cells, _change, block

PAGE = "docs/studies/broad-mix.md"
PROSE_PAGES = (PAGE,)
#: the interval's level; the criteria for a new default (docs/recipes.md) the page measures against
ALLOWED = {PAGE: {"95%", "+1.5%", "+4%"}}

#: (row name, kind, corpus, length, the broad mix's table, the file it continues: table)
ROWS = (("python-docs", "held out", "python-docs", 4096, "broad_mix_domains", "shipped_domains"),
        ("man-pages", "held out", "man-pages", 4096, "broad_mix_domains", "shipped_domains"),
        ("debian-reference", "held out", "debian-reference", 4096, "broad_mix_domains", "shipped_domains"),
        ("kernel-docs", "broad mix only", "kernel-docs", 4096, "broad_mix_train_domains", "shipped_train_domains"),
        ("python-source", "broad mix only", "python-source", 4096, "broad_mix_train_domains", "shipped_train_domains"),
        ("bible-kjv", "broad mix only", "bible-kjv", 4096, "broad_mix_train_domains", "shipped_train_domains"),
        ("*Persuasion* 4096", "trained", "austen", 4096, "broad_mix_persuasion", "shipped_uniform"),
        ("*Persuasion* 8192", "trained", "austen", 8192, "broad_mix_persuasion", "shipped_uniform"),
        ("*Hamlet* 4096", "trained", "shakespeare", 4096, "broad_mix_train_domains", "shipped_uniform"))


@block("broad-mix", LENGTH_CELLS)
def broad_mix() -> Generated:
    """Per text: the broad mix's hard top-1 and top-2 over dense with 95% paired intervals over
    windows (distant pairs kept at top-2), the continued file's change in parentheses, the
    router's lead over random groups at top-2, and the broad mix paired against the continued file
    on the same windows at top-2 (with its interval) and top-1 (< 0: the broad mix is better)."""
    c = _Cells()
    lines = ["| text | kind | windows | hard top-1 | hard top-2 | router over random, top-2 | broad mix vs shipped, "
             "top-2 / top-1 |", "|---|---|---:|---|---|---|---|"]
    for name, kind, d, L, t, ref in ROWS:
        a1, a2 = c.summary(t, d, L, "hard_top1"), c.summary(t, d, L, "hard_top2")
        s1, s2 = c.summary(ref, d, L, "hard_top1"), c.summary(ref, d, L, "hard_top2")
        r = c.summary(t, d, L, "random_top2")
        lines.append(f"| {name} | {kind} | {int(a1.windows)} | {_change(a1)} ({s1.delta_vs_dense_pct:+.1f}%) | "
                     f"{_change(a2)} [{a2.distant_pairs_kept:.2f}] ({s2.delta_vs_dense_pct:+.1f}%) | "
                     f"{_change(r, 'control_vs_router_pct', 'control_ci_lo', 'control_ci_hi')} | "
                     f"{paired(c, (t, 'hard_top2'), (ref, 'hard_top2'), d, L)} / "
                     f"{paired(c, (t, 'hard_top1'), (ref, 'hard_top1'), d, L, ci=False)} |")
    tables = dict.fromkeys(t for *_, t, _ in ROWS)
    refs = dict.fromkeys(ref for *_, ref in ROWS)
    inputs = (f"{LENGTH_CELLS} (broad mix: " + ", ".join(f"{t} {table_router(c, t)}" for t in tables)
              + "; shipped, continued by it: " + ", ".join(refs) + f" {table_router(c, next(iter(refs)))}); "
              "windows of 4096 and 8192 tokens as the table says; patterns dense, hard_top1, hard_top2, random_top2, "
              "every layer at k = 1 or 2 (no budget)")
    return Generated(inputs, "\n".join(lines))
