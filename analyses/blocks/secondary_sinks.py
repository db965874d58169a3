"""docs/studies/secondary-sinks.md: routers in every layer (``smollm2-135m/distill64-4k``, table
``every_layer_routed`` of length_cells.parquet) against random and shuffled groups at the same k,
the length table's protocol. The page's recorded tables (dropped edges, coverage by distance) come
from ``focus-lab record`` runs whose outputs are not committed; they stay as the page states them."""

from __future__ import annotations

from analyses.doc_blocks import (HELD_NAMES, LENGTH_CELLS, Generated, _Cells, _change, _windows_text, block,
                                 router_label)

PAGE = "docs/studies/secondary-sinks.md"
PROSE_PAGES = (PAGE,)
#: the interval's level, the recorder's thresholds (a heavy edge: dense weight > 0.05; a query's heaviest
#: dropped edge > 0.01) and the share of later queries that keep any one group under balanced random
#: groups at top-2 of 4 (2 / 4): settings and a constant, not measurements
ALLOWED = {PAGE: {"95%", "0.05", "0.01", "50%"}}

TABLE = "every_layer_routed"
CONTROLS = ("random_top1", "random_top2", "shuffled_top1", "shuffled_top2")


@block("secondary-sinks-every-layer", LENGTH_CELLS)
def secondary_sinks_every_layer() -> Generated:
    """Per held-out text at 4096 and 8192 tokens: hard top-1 and top-2 over dense [distant pairs
    kept] with routers in every layer, and each control's perplexity over the router's at the same
    k with its 95% paired interval over windows (> 0: the router is better)."""
    c = _Cells()
    df = c.cells[c.cells["table"] == TABLE]
    lines = ["| text | tokens | windows | hard top-1 | hard top-2 | random top-1 vs router | random top-2 vs router | "
             "shuffled top-1 vs router | shuffled top-2 vs router |", "|---|---:|---:|---|---|---|---|---|---|"]
    for corpus in ("austen", "shakespeare"):
        held = HELD_NAMES.get(df[df.corpus == corpus].heldout.iloc[0], corpus)
        for L in (4096, 8192):
            n = int(c.summary(TABLE, corpus, L, "dense").windows)
            cells = [f"{c.dense(TABLE, corpus, L, p):+.1f}% [{c.kept(TABLE, corpus, L, p):.2f}]" for p in ("hard_top1", "hard_top2")]
            cells += [_change(c.summary(TABLE, corpus, L, p), "control_vs_router_pct", "control_ci_lo", "control_ci_hi", n)
                      for p in CONTROLS]
            lines.append(f"| {held} | {L} | {n} | " + " | ".join(cells) + " |")
    shas = sorted(df.routers_sha256.unique())
    inputs = (f"{LENGTH_CELLS} (table {TABLE}); routers {'; '.join(router_label(s) for s in shas)}, every layer routed; "
              f"{_windows_text(df[df.seq_len.isin([4096, 8192])])}; patterns dense, hard_top1, hard_top2, "
              + ", ".join(CONTROLS))
    return Generated(inputs, "\n".join(lines))
