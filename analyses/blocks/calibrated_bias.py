"""docs/studies/calibrated-bias.md: the group bias re-fitted on each held-out technical domain's
training documents (``focus-lab calibrate``), against the shipped file on the same windows
(tables ``calibrated_<domain>`` and ``shipped_per_domain`` of length_cells.parquet)."""

from __future__ import annotations

from analyses.blocks.common import paired, table_router
from analyses.doc_blocks import LENGTH_CELLS, Generated, _Cells, block

PROSE_PAGES = ("docs/studies/calibrated-bias.md",)
#: the interval's level (a setting)
ALLOWED = {"docs/studies/calibrated-bias.md": {"95%"}}

DOMAINS = {"python-docs": "Python docs", "man-pages": "man pages", "debian-reference": "Debian Reference"}
SHIPPED = "shipped_per_domain"  # the shipped file (smollm2-135m/soup-budget) on the same windows
PROSE = "shipped"  # the same file's length table: *Persuasion* at 4096 for reference


@block("calibrated-bias", LENGTH_CELLS)
def calibrated_bias() -> Generated:
    """Per domain: hard top-2 over dense with the shipped bias and with the re-fitted one (distant
    pairs kept in brackets), the re-fitted bias's paired change at top-2 with its 95% interval over
    windows (> 0: worse), and hard top-1 with the re-fitted bias (its paired change in
    parentheses); *Persuasion* at 4096 with the shipped file for reference."""
    c = _Cells()
    lines = ["| domain | top-2, shipped | top-2, re-fitted bias | paired change | top-1, re-fitted |",
             "|---|---|---|---|---|"]
    for d, name in DOMAINS.items():
        t = f"calibrated_{d}"
        s2, r2 = c.summary(SHIPPED, d, 4096, "hard_top2"), c.summary(t, d, 4096, "hard_top2")
        r1 = c.summary(t, d, 4096, "hard_top1")
        lines.append(f"| {name} | {s2.delta_vs_dense_pct:+.1f}% [{s2.distant_pairs_kept:.2f}] | "
                     f"{r2.delta_vs_dense_pct:+.1f}% [{r2.distant_pairs_kept:.2f}] | "
                     f"{paired(c, (t, 'hard_top2'), (SHIPPED, 'hard_top2'), d, 4096)} | {r1.delta_vs_dense_pct:+.1f}% "
                     f"({paired(c, (t, 'hard_top1'), (SHIPPED, 'hard_top1'), d, 4096, ci=False)}) |")
    p = c.summary(PROSE, "austen", 4096, "hard_top2")
    lines.append(f"| *Persuasion* (not re-fitted) | {p.delta_vs_dense_pct:+.1f}% [{p.distant_pairs_kept:.2f}] | | | |")
    windows = {int(c.summary(f"calibrated_{d}", d, 4096, "dense").windows) for d in DOMAINS}
    inputs = (f"{LENGTH_CELLS} (tables {', '.join(f'calibrated_{d}' for d in DOMAINS)}, {SHIPPED}; {PROSE} for "
              f"*Persuasion*); re-fitted routers " + ", ".join(f"{d} {table_router(c, f'calibrated_{d}')}"
                                                               for d in DOMAINS)
              + f"; shipped {table_router(c, SHIPPED)}; {'/'.join(map(str, sorted(windows)))} windows of 4096 "
              f"tokens a domain, {int(p.windows)} of *Persuasion*; patterns dense, hard_top1 (k = 1 in every layer), "
              "hard_top2 (the file's top-2 budget)")
    return Generated(inputs, "\n".join(lines))
