"""docs/studies/gemma-token-blocks.md's table: random groups against the shipped Gemma-3-270M
router at hard top-2, with intervals over runs of tokens inside the windows.

- ``gemma-token-blocks``: per held-out corpus and length of g5's file's length table
  (``gemma3_distill64_8k``) whose hard top-2 and random top-2 rows hold block losses (evaluation
  schema 3): random top-2's perplexity change over the router in each window, pooled with its 95%
  paired interval over windows, and with its interval over runs of 1024, 2048 (the length table's
  ``INTERVAL_BLOCK``), 4096 and 8192 tokens (``evaluate.paired_change`` with ``block``), and the
  share of the 2048-token runs where the router's loss is lower, and, where the 2048-token
  interval spans 0, how many times these tokens an interval of that width shrunk as one over the
  square root of the tokens would need to clear 0 at the measured change ((half-width / change)^2).
- ``gemma-token-blocks-seeds``: the same comparison at *Persuasion*'s 32768 tokens against other
  draws of the random groups (``length_table --seed``, table ``SEEDS_TABLE``), one row a draw, the
  length table's own draw (seed 0) first.
"""

from __future__ import annotations

from analyses.doc_blocks import (GEMMA_G5_TABLE, HELD_NAMES, LENGTH_CELLS, Generated, MissingInput, _cells, block,
                                 router_label)

PAGE = "docs/studies/gemma-token-blocks.md"
PROSE_PAGES = (PAGE,)
#: settings, not measurements: the block sizes (tokens) and the token unit of a block loss
SIZES = (1024, 2048, 4096, 8192)
ALLOWED = {PAGE: {"256", *map(str, SIZES)}}
ROUTER, CONTROL = "hard_top2", "random_top2"
SEEDS_TABLE = "gemma3_distill64_8k_seeds"  # random top-2 of other seeds on the shipped table's windows


def _pct(x: float) -> str:
    return f"{x:+.2f}%"


def _compare(a, b) -> tuple[list[int], str, str, str, str]:
    """(windows, each window, over windows, the interval over runs of ``INTERVAL_BLOCK`` tokens with
    its units, runs where the router's loss is lower) of control rows ``a`` over router rows ``b``."""
    from analyses.length_table import INTERVAL_BLOCK
    from focus_lab.eval.evaluate import block_units, paired_change
    wins = sorted(set(a.window) & set(b.window))
    each = " / ".join(_pct(paired_change(a[a.window == w], b[b.window == w])[0]) for w in wins)
    m, lo, hi = paired_change(a, b)
    over = _pct(m) if len(wins) < 3 else f"{_pct(m)} [{lo:+.2f}, {hi:+.2f}]"
    _, lo, hi = paired_change(a, b, block=INTERVAL_BLOCK)
    ra = block_units(a.set_index("window"), wins, INTERVAL_BLOCK)[0]
    rb = block_units(b.set_index("window"), wins, INTERVAL_BLOCK)[0]
    return wins, each, over, f"[{lo:+.2f}, {hi:+.2f}] ({len(ra)})", f"{int((rb < ra).sum())} of {len(ra)}"


@block("gemma-token-blocks", LENGTH_CELLS)
def gemma_token_blocks() -> Generated:
    """Per held-out corpus and length with block losses: random top-2 over hard top-2 (> 0: the
    router is better) per window, over windows, and over runs of each of ``SIZES`` tokens, with
    the share of 2048-token runs where the router's loss is lower."""
    from analyses.length_table import INTERVAL_BLOCK, has_blocks
    from focus_lab.eval.evaluate import block_units, paired_change
    cells = _cells(GEMMA_G5_TABLE)
    head = " | ".join(f"runs of {n}" for n in SIZES)
    lines = [f"| held out | tokens | windows | each window | over windows | {head} | runs of {INTERVAL_BLOCK} "
             "where the router's loss is lower | tokens to clear 0 at this change |",
             "|---|---:|---:|---|---|" + "---|" * len(SIZES) + "---:|---:|"]
    for (corpus, L), g in cells.groupby(["corpus", "seq_len"], sort=True):
        a, b = g[g.label == CONTROL], g[g.label == ROUTER]
        if not (has_blocks(a) and has_blocks(b)):
            continue
        wins, each, over, _, lower = _compare(a, b)
        m = paired_change(a, b)[0]
        runs = []
        for n in SIZES:
            _, lo, hi = paired_change(a, b, block=n)
            runs.append(f"[{lo:+.2f}, {hi:+.2f}] ({len(block_units(a.set_index('window'), wins, n)[0])})")
            if n == INTERVAL_BLOCK:
                need = "cleared" if lo > 0 or hi < 0 else f"{((hi - lo) / 2 / abs(m)) ** 2:.0f}x these"
        held = HELD_NAMES.get(g.heldout.iloc[0], g.heldout.iloc[0])
        lines.append(f"| {held} | {L} | {len(wins)} | {each} | {over} | " + " | ".join(runs) + f" | {lower} | {need} |")
    if len(lines) == 2:
        raise MissingInput(f"{LENGTH_CELLS} (table {GEMMA_G5_TABLE}: no cell whose {ROUTER} and {CONTROL} rows "
                           "hold block losses)")
    sha = cells[cells.label == ROUTER].routers_sha256.iloc[0]
    inputs = (f"{LENGTH_CELLS} (table {GEMMA_G5_TABLE}, the cells whose {ROUTER} and {CONTROL} rows hold block "
              f"losses, runs of 256 predicted tokens); routers {router_label(sha)}; intervals 95%, 2000 "
              "resamples, units in brackets")
    return Generated(inputs, "\n".join(lines))


@block("gemma-token-blocks-seeds", LENGTH_CELLS)
def gemma_token_blocks_seeds() -> Generated:
    """At *Persuasion*'s 32768 tokens, random top-2 of each draw (the shipped table's seed 0, then
    ``SEEDS_TABLE``'s seeds) over g5's file's hard top-2, on the same windows (> 0: the
    router is better), and the draws' losses pooled."""
    import pandas as pd
    from analyses.length_table import INTERVAL_BLOCK
    ship, other = _cells(GEMMA_G5_TABLE), _cells(SEEDS_TABLE)
    at = lambda d: d[(d.corpus == "austen") & (d.seq_len == 32768)]  # noqa: E731
    ship, other = at(ship), at(other)
    router = ship[ship.label == ROUTER]
    draws = [ship[ship.label == CONTROL]] + [g for _, g in other[other.label == CONTROL].groupby("seed")]
    lines = [f"| draw (seed) | windows | each window | over windows | runs of {INTERVAL_BLOCK} | runs of "
             f"{INTERVAL_BLOCK} where the router's loss is lower |", "|---|---:|---|---|---|---:|"]
    for g in draws:
        wins, each, over, runs, lower = _compare(g, router)
        if wins != sorted(router.window):
            raise MissingInput(f"{LENGTH_CELLS} (table {SEEDS_TABLE}, seed {g.seed.iloc[0]}: windows {wins}, "
                               f"the router's {sorted(router.window)})")
        lines.append(f"| {int(g.seed.iloc[0])} | {len(wins)} | {each} | {over} | {runs} | {lower} |")
    # the draws pooled: each window's loss averaged over the draws, as one control
    pooled = pd.concat(draws).groupby("window", as_index=False).agg(
        nll=("nll", "mean"), tokens=("tokens", "first"),
        block_nll=("block_nll", lambda s: list(pd.DataFrame(list(s)).mean())), block_tokens=("block_tokens", "first"))
    wins, each, over, runs, lower = _compare(pooled, router)
    lines.append(f"| the {len(draws)} draws' mean loss | {len(wins)} | {each} | {over} | {runs} | {lower} |")
    inputs = (f"{LENGTH_CELLS} (tables {GEMMA_G5_TABLE} and {SEEDS_TABLE}, *Persuasion* at 32768 tokens, the same "
              f"windows); routers {router_label(router.routers_sha256.iloc[0])}; intervals 95%, 2000 resamples, "
              "units in brackets")
    return Generated(inputs, "\n".join(lines))
