"""docs/studies/lm-objective.md's table: the 90-step key-shift file continued for 12 steps with
the LM objective (``sinks64`` at 4096 tokens), on the held-out technical domains, paired against
the file it started from under the same budgets."""

from __future__ import annotations

from analyses.blocks.common import TECH, margin, over_dense, paired, routers_of, windows_of
from analyses.doc_blocks import LENGTH_CELLS, Generated, _Cells, block

PAGE = "docs/studies/lm-objective.md"
PROSE_PAGES = (PAGE,)
#: settings: the interval's level
ALLOWED = {PAGE: {"95%"}}

TABLE, BEFORE = "lm_objective_domains", "keyshift90_domains"


@block("lm-objective", LENGTH_CELLS)
def lm_objective() -> Generated:
    """Per domain: hard top-1 / top-2 with the shift over dense [pairs kept], each paired against
    the 90-step file under the same budgets, and the router's margin over random groups at top-2."""
    c = _Cells()
    t1, t2 = "hard_top1_keyshift", "hard_top2_keyshift"
    lines = ["| text | windows | top-1 | paired change | top-2 | paired change | router over random, top-2 |",
             "|---|---:|---|---|---|---|---|"]
    for d in TECH:
        n = int(c.summary(TABLE, d, 4096, "dense").windows)
        lines.append(f"| {d} | {n} | {over_dense(c, TABLE, d, 4096, t1)} | {paired(c, (TABLE, t1), (BEFORE, t1), d, 4096)} | "
                     f"{over_dense(c, TABLE, d, 4096, t2)} | {paired(c, (TABLE, t2), (BEFORE, t2), d, 4096)} | "
                     f"{margin(c, TABLE, d, 4096, 'random_top2_keyshift', ci=True)} |")
    tables = [TABLE, BEFORE]
    budgets = sorted({s for s in c.cells.loc[c.cells["table"] == TABLE, "layer_top_k"].unique() if s})
    inputs = (f"{LENGTH_CELLS} (tables {', '.join(tables)}); routers {routers_of(c, tables)}; {windows_of(c, tables)}; "
              f"patterns dense, {t1}, {t2}, random_top2_keyshift; per-layer k {' and '.join(budgets)}")
    return Generated(inputs, "\n".join(lines))
