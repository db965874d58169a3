"""docs/studies/trained-with-pairs.md: stage 5 of the broad mix trained with the token-match pairs
kept (``--match-shifts 0,1``; tables ``match_trained_domains``, ``match_trained_persuasion`` of
length_cells.parquet) against the same 30 steps without them (``broad_s5_match_domains``), all
evaluated with the pairs; the shipped file with the pairs (``match_per_domain``) beside them."""

from __future__ import annotations

from analyses.blocks.common import over_dense, paired, table_router, windows_a_domain
from analyses.doc_blocks import LENGTH_CELLS, Generated, _Cells, _change, block

PAGE = "docs/studies/trained-with-pairs.md"
PROSE_PAGES = (PAGE,)
#: the interval's level (a setting) and the criteria of docs/recipes.md (top-2 within +1.5% of dense
#: at no more than 55% of the distant pairs, top-1 within +4%)
ALLOWED = {PAGE: {"95%", "+1.5%", "55%", "+4%"}}

DOMAINS = ("python-docs", "man-pages", "debian-reference")
TRAINED = "match_trained_domains"  # trained with the pairs
TRAINED_PROSE = "match_trained_persuasion"
WITHOUT = "broad_s5_match_domains"  # the same 30 steps without the pairs
SHIPPED = "match_per_domain"  # the shipped file with the pairs


@block("trained-with-pairs", LENGTH_CELLS)
def trained_with_pairs() -> Generated:
    """Per text, the file trained with the pairs, evaluated with them: hard top-1 and top-2 over
    dense [distant pairs kept], the router's margin over random groups at top-2 (95% interval over
    windows), the paired change of top-2 (top-1) against the file trained without the pairs (< 0:
    training with them helps), and top-2 of that file and of the shipped file, both with the
    pairs."""
    c = _Cells()
    lines = ["| text | hard top-1 | hard top-2 | router over random, top-2 | paired change of top-2 (top-1) | "
             "trained without the pairs, top-2 | shipped file, top-2 |", "|---|---|---|---|---|---|---|"]
    texts = [(d, d, 4096, TRAINED) for d in DOMAINS] + [
        (f"*Persuasion* {L} ({int(c.summary(TRAINED_PROSE, 'austen', L, 'dense').windows)} windows)", "austen", L,
         TRAINED_PROSE) for L in (4096, 8192)]
    for name, d, L, t in texts:
        cells = [over_dense(c, t, d, L, "hard_top1", ci=False), over_dense(c, t, d, L, "hard_top2", ci=False),
                 _change(c.summary(t, d, L, "random_top2"), "control_vs_router_pct", "control_ci_lo", "control_ci_hi")]
        if t == TRAINED:
            cells += [(f"{paired(c, (t, 'hard_top2'), (WITHOUT, 'hard_top2'), d, L)} "
                       f"({paired(c, (t, 'hard_top1'), (WITHOUT, 'hard_top1'), d, L, ci=False)})"),
                      over_dense(c, WITHOUT, d, L, "hard_top2", ci=False), over_dense(c, SHIPPED, d, L, "hard_top2", ci=False)]
        else:
            cells += ["", "", ""]
        lines.append(f"| {name} | " + " | ".join(cells) + " |")
    inputs = (f"{LENGTH_CELLS} (tables {TRAINED}, {TRAINED_PROSE}: trained with the pairs; {WITHOUT}: trained "
              f"without them; {SHIPPED}: the shipped file); routers {TRAINED} {table_router(c, TRAINED)}, "
              f"{WITHOUT} {table_router(c, WITHOUT)}, {SHIPPED} {table_router(c, SHIPPED)}; "
              f"{windows_a_domain(c, TRAINED, DOMAINS)} (*Persuasion*: as its rows say); every pattern with the token-match pairs "
              "(match shifts 0-1); patterns dense, hard_top1, hard_top2 (the shipped top-2 budget), random_top2")
    return Generated(inputs, "\n".join(lines))
