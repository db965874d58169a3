"""docs/studies/three-times-training.md: the routers trained with the key shift for 90 steps, given
the ``pooled`` top-2 and ``tech`` top-1 budgets (the 90-step file ``E``), against the 30-step file
under the same budgets, against random and shuffled groups, and at 8192 tokens against the shipped
file (tables ``keyshift90_*`` of length_cells.parquet)."""

from __future__ import annotations

from analyses.blocks.common import margin, over_dense, paired, table_router, tables_routers, windows_a_domain
from analyses.doc_blocks import LENGTH_CELLS, Generated, _Cells, _change, block

PAGE = "docs/studies/three-times-training.md"
PROSE_PAGES = (PAGE,)
#: the interval's level (a setting) and the criteria of docs/recipes.md (top-2 within +1.5% of dense,
#: a margin of 2% over random groups)
ALLOWED = {PAGE: {"95%", "+1.5%", "2%"}}

DOMAINS = ("python-docs", "man-pages", "debian-reference")
E90 = "keyshift90_domains"  # the 90-step file, both budgets
CONTROLS = "keyshift90_controls_domains"  # the same file against random and shuffled groups
HELD_8K = "keyshift90_heldout_8k"  # the 90-step file at 8192 tokens
SHIPPED_8K = "shipped_heldout_8k"  # the shipped file on the same 8192-token windows
#: the 30-step routers under the same budgets: top-2 (the pooled budget) and top-1 (the tech budget)
THIRTY = {2: "keyshift_budgets_domains", 1: "keyshift_tech_top1_domains"}


@block("three-times-training", LENGTH_CELLS)
def three_times_training() -> Generated:
    """Per held-out domain at 4096 tokens: the 90-step file's top-1 and top-2 with the shift over
    dense (95% paired interval over windows, distant pairs kept), the paired change against the
    30-step file under the same budget (< 0: better) and that file's own change over dense; the
    router's margin over random groups at top-2."""
    c = _Cells()
    lines = ["| text | windows | top-1 | paired change | 30 steps, top-1 | top-2 | paired change | 30 steps, top-2 "
             "| router over random, top-2 |", "|---|---:|---|---|---|---|---|---|---|"]
    for d in DOMAINS:
        cells = [str(int(c.summary(E90, d, 4096, "dense").windows))]
        for k in (1, 2):
            lab = f"hard_top{k}_keyshift"
            cells += [over_dense(c, E90, d, 4096, lab), paired(c, (E90, lab), (THIRTY[k], lab), d, 4096),
                      over_dense(c, THIRTY[k], d, 4096, lab, kept=False, ci=False)]
        cells.append(margin(c, E90, d, 4096, "random_top2_keyshift"))
        lines.append(f"| {d} | " + " | ".join(cells) + " |")
    inputs = (f"{LENGTH_CELLS} (tables {E90}; against {THIRTY[1]} at top-1 and {THIRTY[2]} at top-2, the "
              f"30-step routers under the same budgets); routers {tables_routers(c, [E90, THIRTY[1], THIRTY[2]])}; "
              "4 windows of 4096 tokens a domain; patterns dense, hard_top1_keyshift, hard_top2_keyshift, "
              "random_top2_keyshift")
    return Generated(inputs, "\n".join(lines))


@block("three-times-training-controls", LENGTH_CELLS)
def three_times_training_controls() -> Generated:
    """The controls' perplexity over the 90-step router's at the same k (> 0: the router is
    better), 95% interval over windows: random and shuffled groups at top-1 and top-2, each shifted
    and under the same budgets."""
    c = _Cells()
    labels = ("random_top1_keyshift", "shuffled_top1_keyshift", "random_top2_keyshift", "shuffled_top2_keyshift")
    lines = ["| text | random top-1 | shuffled top-1 | random top-2 | shuffled top-2 |", "|---|---|---|---|---|"]
    for d in DOMAINS:
        cells = [_change(c.summary(CONTROLS, d, 4096, lab), "control_vs_router_pct", "control_ci_lo", "control_ci_hi")
                 for lab in labels]
        lines.append(f"| {d} | " + " | ".join(cells) + " |")
    inputs = (f"{LENGTH_CELLS} (table {CONTROLS}); routers {table_router(c, CONTROLS)}; "
              f"{windows_a_domain(c, CONTROLS, DOMAINS)}; patterns "
              "hard_top1_keyshift, hard_top2_keyshift and " + ", ".join(labels))
    return Generated(inputs, "\n".join(lines))


@block("three-times-training-8k", LENGTH_CELLS)
def three_times_training_8k() -> Generated:
    """At 8192 tokens, per held-out domain: the 90-step file's top-2 and top-1 over dense (the
    interval from 3 windows up) [distant pairs kept], its margin over random groups at top-2, and
    the shipped file's top-2 and top-1 on the same windows."""
    c = _Cells()
    lines = ["| text | windows | 90 steps, top-2 | 90 steps, top-1 | router over random, top-2 | shipped, top-2 "
             "| shipped, top-1 |", "|---|---:|---|---|---|---|---|"]
    for d in DOMAINS:
        n = int(c.summary(HELD_8K, d, 8192, "dense").windows)
        r2, r1 = c.summary(HELD_8K, d, 8192, "hard_top2_keyshift"), c.summary(HELD_8K, d, 8192, "hard_top1_keyshift")
        s2, s1 = c.summary(SHIPPED_8K, d, 8192, "hard_top2"), c.summary(SHIPPED_8K, d, 8192, "hard_top1")
        lines.append(f"| {d} | {n} | {_change(r2, windows=n)} [{r2.distant_pairs_kept:.2f}] | {_change(r1, windows=n)} "
                     f"[{r1.distant_pairs_kept:.2f}] | {c.margin(HELD_8K, d, 8192, 'random_top2_keyshift'):+.1f}% | "
                     f"{_change(s2, windows=n)} [{s2.distant_pairs_kept:.2f}] | {_change(s1, windows=n)} "
                     f"[{s1.distant_pairs_kept:.2f}] |")
    inputs = (f"{LENGTH_CELLS} (tables {HELD_8K}, {SHIPPED_8K}); routers {tables_routers(c, [HELD_8K, SHIPPED_8K])}; "
              "every window of 8192 tokens the held-out pages hold, up to 4; patterns dense, hard_top1_keyshift, "
              "hard_top2_keyshift, random_top2_keyshift (90 steps), hard_top1, hard_top2 (shipped)")
    return Generated(inputs, "\n".join(lines))
