"""docs/studies/eight-groups.md: the shipped file's groups split in two (K = 8, every k doubled),
trained 30 steps with the key shift (table ``k8_split_domains`` of length_cells.parquet), paired
against four groups trained the same steps under the same budgets at the same share of distant
pairs (tables ``keyshift_budgets_domains``, ``keyshift_tech_top1_domains``)."""

from __future__ import annotations

from analyses.blocks.common import paired, table_router
from analyses.doc_blocks import LENGTH_CELLS, Generated, _Cells, _change, block

PAGE = "docs/studies/eight-groups.md"
PROSE_PAGES = (PAGE,)
#: the interval's level; the split's noise (each copy of a centroid moved by 10% of its norm)
ALLOWED = {PAGE: {"95%", "10%"}}

DOMAINS = ("python-docs", "man-pages", "debian-reference")
TABLE = "k8_split_domains"
#: (pattern of eight groups, table of four groups, its pattern at the same share of distant pairs)
PAIRS = (("hard_top2_keyshift", "keyshift_tech_top1_domains", "hard_top1_keyshift"),
         ("hard_top4_keyshift", "keyshift_budgets_domains", "hard_top2_keyshift"),
         ("random_top4_keyshift", "keyshift_budgets_domains", "random_top2_keyshift"))


@block("eight-groups", LENGTH_CELLS)
def eight_groups() -> Generated:
    """Per held-out technical domain: top-2 and top-4 of eight groups over dense (distant pairs
    kept), each paired against four groups at half the k (95% interval over windows, < 0: eight
    groups better), the router's lead over random groups at top-4 of 8, and random top-4 of 8
    paired against random top-2 of 4."""
    c = _Cells()
    lines = ["| text | windows | top-2 of 8 | vs top-1 of 4 | top-4 of 8 | vs top-2 of 4 | over random, top-4 of 8 | "
             "random: top-4 of 8 vs top-2 of 4 |", "|---|---:|---|---|---|---|---|---|"]
    for d in DOMAINS:
        vs = [paired(c, (TABLE, mine), (t, theirs), d, 4096) for mine, t, theirs in PAIRS]
        s2, s4 = c.summary(TABLE, d, 4096, "hard_top2_keyshift"), c.summary(TABLE, d, 4096, "hard_top4_keyshift")
        r = c.summary(TABLE, d, 4096, "random_top4_keyshift")
        lines.append(f"| {d} | {int(s2.windows)} | {s2.delta_vs_dense_pct:+.1f}% [{s2.distant_pairs_kept:.2f}] | {vs[0]} | "
                     f"{s4.delta_vs_dense_pct:+.1f}% [{s4.distant_pairs_kept:.2f}] | {vs[1]} | "
                     f"{_change(r, 'control_vs_router_pct', 'control_ci_lo', 'control_ci_hi')} | {vs[2]} |")
    inputs = (f"{LENGTH_CELLS} (table {TABLE}, routers {table_router(c, TABLE)}, K = 8; against four groups: "
              + ", ".join(f"{t} ({table_router(c, t)})" for t in dict.fromkeys(p[1] for p in PAIRS))
              + "); windows of 4096 tokens; pairs " + ", ".join(f"{a} = {b}" for a, _, b in PAIRS))
    return Generated(inputs, "\n".join(lines))
