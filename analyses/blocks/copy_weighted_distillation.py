"""docs/studies/copy-weighted-distillation.md: the key-shift routers trained with three quarters of
the distill queries drawn from copy positions (table ``copy_share_domains`` of
length_cells.parquet), paired against the uniform sample under the same budgets (tables
``keyshift_budgets_domains`` at top-2, ``keyshift_tech_top1_domains`` at top-1)."""

from __future__ import annotations

from analyses.blocks.common import layer_top_k_spec, paired, table_router, windows_a_domain
from analyses.doc_blocks import LENGTH_CELLS, Generated, _Cells, _change, block

PAGE = "docs/studies/copy-weighted-distillation.md"
PROSE_PAGES = (PAGE,)
#: the interval's level (a setting)
ALLOWED = {PAGE: {"95%"}}

DOMAINS = ("python-docs", "man-pages", "debian-reference")
TABLE = "copy_share_domains"
#: the uniform sample under the same budgets: (table, pattern) per k
AGAINST = {2: ("keyshift_budgets_domains", "hard_top2_keyshift"), 1: ("keyshift_tech_top1_domains", "hard_top1_keyshift")}


@block("copy-weighted-distillation", LENGTH_CELLS)
def copy_weighted_distillation() -> Generated:
    """Per held-out technical domain: hard top-2 and top-1 (key shift, the 90-step file's two
    budgets) over dense with their 95% paired intervals over windows (distant pairs kept at top-2),
    each paired against the uniform sample under the same budget (< 0: better), and the router's
    lead over random groups at top-2."""
    c = _Cells()
    lines = ["| text | top-2 | paired change | top-1 | paired change | router over random, top-2 |",
             "|---|---|---|---|---|---|"]

    def uniform(d: str, k: int) -> str:
        t, label = AGAINST[k]
        if layer_top_k_spec(c, t, label) != layer_top_k_spec(c, TABLE, label):
            raise ValueError(f"{t}'s {label} is not under {TABLE}'s budget: no paired change")
        return paired(c, (TABLE, label), (t, label), d, 4096)

    for d in DOMAINS:
        s2, s1 = c.summary(TABLE, d, 4096, "hard_top2_keyshift"), c.summary(TABLE, d, 4096, "hard_top1_keyshift")
        r = c.summary(TABLE, d, 4096, "random_top2_keyshift")
        lines.append(f"| {d} | {_change(s2)} [{s2.distant_pairs_kept:.2f}] | {uniform(d, 2)} | {_change(s1)} | "
                     f"{uniform(d, 1)} | {_change(r, 'control_vs_router_pct', 'control_ci_lo', 'control_ci_hi')} |")
    inputs = (f"{LENGTH_CELLS} (table {TABLE}, routers {table_router(c, TABLE)}; against "
              + ", ".join(f"{t} at top-{k} ({table_router(c, t)})" for k, (t, _) in sorted(AGAINST.items(), reverse=True))
              + f"); {windows_a_domain(c, TABLE, DOMAINS)}; patterns dense, hard_top2_keyshift "
              f"(layer top-k {layer_top_k_spec(c, TABLE, 'hard_top2_keyshift')}), hard_top1_keyshift (layer top-k "
              f"{layer_top_k_spec(c, TABLE, 'hard_top1_keyshift')}), random_top2_keyshift")
    return Generated(inputs, "\n".join(lines))
