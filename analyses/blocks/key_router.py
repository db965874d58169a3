"""docs/studies/key-router.md's tables: a key projection of its own (``--key-router``, trained; or
fitted in closed form) against stage 5 of the broad mix with one projection, on the held-out
technical domains at 4096 tokens, and the paired change the trained key router makes."""

from __future__ import annotations

from analyses.blocks.common import TECH, over_dense, paired, routers_of, windows_of
from analyses.doc_blocks import LENGTH_CELLS, Generated, _Cells, block

PAGE = "docs/studies/key-router.md"
PROSE_PAGES = (PAGE,)
#: settings: the interval's level, the closed-form fit's ridge strength (`lam`)
ALLOWED = {PAGE: {"95%", "0.1"}}

#: (routers, table) of each row of the first table
FILES = (("stage 5 alone, one projection", "broad_unsouped_domains"),
         ("stage 5 with `--key-router`", "key_router_domains"),
         ("shipped + fitted `key_proj`", "key_fit_domains"),
         ("stage 5 averaged with the shipped file (the broad mix)", "broad_mix_domains"))
NAMES = {"python-docs": "Python docs", "man-pages": "man pages", "debian-reference": "Debian Reference"}


@block("key-router", LENGTH_CELLS)
def key_router() -> Generated:
    """Per file and domain, hard top-1 / top-2 over dense [pairs kept at top-2] ("-": not
    measured); then the trained key router paired against stage 5 alone on the same windows."""
    c = _Cells()
    lines = ["| routers | table | " + " | ".join(f"{NAMES[d]} top-1 / top-2" for d in TECH) + " |",
             "|---|---|" + "---|" * len(TECH)]
    for name, t in FILES:
        have = set(c.cells.loc[c.cells["table"] == t, "corpus"])
        cells = [f"{over_dense(c, t, d, 4096, 'hard_top1', kept=False, ci=False)} / "
                 f"{over_dense(c, t, d, 4096, 'hard_top2', ci=False)}" if d in have else "-" for d in TECH]
        lines.append(f"| {name} | `{t}` | " + " | ".join(cells) + " |")
    lines += ["", "| `key_router_domains` over `broad_unsouped_domains`, paired | " + " | ".join(NAMES[d] for d in TECH)
              + " |", "|---|" + "---|" * len(TECH)]
    for label, k in (("hard_top1", "top-1"), ("hard_top2", "top-2")):
        lines.append(f"| {k} | " + " | ".join(paired(c, ("key_router_domains", label), ("broad_unsouped_domains", label),
                                                      d, 4096) for d in TECH) + " |")
    tables = [t for _, t in FILES]
    inputs = (f"{LENGTH_CELLS} (tables {', '.join(tables)}); routers {routers_of(c, tables)}; "
              f"{windows_of(c, tables)}; patterns dense, hard_top1, hard_top2")
    return Generated(inputs, "\n".join(lines))
