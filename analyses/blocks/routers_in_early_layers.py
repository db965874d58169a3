"""docs/studies/routers-in-early-layers.md: the 90-step file of three-times-training with routers in
layers 1-9 (``--random-layers none``, table ``keyshift90_all_routed_domains`` of
length_cells.parquet) against the same file with random groups there (``keyshift90_domains``)."""

from __future__ import annotations

from analyses.blocks.common import over_dense, paired, table_router, windows_a_domain
from analyses.doc_blocks import LENGTH_CELLS, Generated, _Cells, block

PAGE = "docs/studies/routers-in-early-layers.md"
PROSE_PAGES = (PAGE,)
#: the interval's level (a setting)
ALLOWED = {PAGE: {"95%"}}

DOMAINS = ("python-docs", "man-pages", "debian-reference")
ROUTED = "keyshift90_all_routed_domains"  # routers in layers 1-9
RANDOM = "keyshift90_domains"  # the same file, random groups in layers 1-9


@block("routers-in-early-layers", LENGTH_CELLS)
def routers_in_early_layers() -> Generated:
    """Per held-out domain, top-2 and top-1 with the shift and budgets, routers in layers 1-9: the
    change over dense with its 95% paired interval over windows [distant pairs kept], then the
    paired change against random groups in layers 1-9 with its interval (> 0: routers there are
    worse)."""
    c = _Cells()
    lines = ["| text | top-2 | paired change, top-2 | top-1 | paired change, top-1 |", "|---|---|---|---|---|"]
    for d in DOMAINS:
        cells = []
        for k in (2, 1):
            lab = f"hard_top{k}_keyshift"
            cells += [over_dense(c, ROUTED, d, 4096, lab), paired(c, (ROUTED, lab), (RANDOM, lab), d, 4096)]
        lines.append(f"| {d} | " + " | ".join(cells) + " |")
    rs = c.cells[c.cells["table"] == ROUTED].random_layers.unique()
    inputs = (f"{LENGTH_CELLS} (tables {ROUTED}, random layers {', '.join(rs)}; {RANDOM}, "
              f"random groups in layers 1-9); routers {table_router(c, ROUTED)} in both; "
              f"{windows_a_domain(c, ROUTED, DOMAINS)}; patterns dense, hard_top1_keyshift, "
              "hard_top2_keyshift (the file's top-1 and top-2 budgets)")
    return Generated(inputs, "\n".join(lines))
