"""docs/studies/gemma-token-blocks.md's block (analyses/blocks/gemma_token_blocks.py): the numbers
of each row recomputed by hand from the committed per-window rows and their losses of each run of
256 predicted tokens."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

import analyses.blocks  # noqa: F401  (registers the blocks)
from analyses import doc_blocks
from analyses.doc_blocks import REPO


_row = doc_blocks.table_row  # the cells of a block's row, by its leading cells


def _runs(g: pd.DataFrame, window: int, per: int) -> np.ndarray:
    """Summed NLL of each run of ``per`` blocks of 256 tokens in one window, by hand."""
    b = np.asarray(g[g.window == window].block_nll.iloc[0], float)
    return np.array([b[s:s + per].sum() for s in range(0, len(b), per)])


@pytest.mark.parametrize("held, corpus, seq_len", [("*Persuasion*", "austen", 32768),
                                                   ("*Hamlet*", "shakespeare", 16384)])
def test_a_row_by_hand(held, corpus, seq_len):
    cells = pd.read_parquet(REPO / doc_blocks.LENGTH_CELLS)
    g = cells[(cells.table == doc_blocks.GEMMA_G5_TABLE) & (cells.corpus == corpus) & (cells.seq_len == seq_len)]
    router, control = g[g.label == "hard_top2"], g[g.label == "random_top2"]
    wins = sorted(router.window)
    assert len(wins) == 3 and sorted(control.window) == wins
    row = _row(doc_blocks.render("gemma-token-blocks"), held, str(seq_len))
    assert row[2] == "3"
    each = [100 * (np.exp(control[control.window == w].nll.iloc[0] - router[router.window == w].nll.iloc[0]) - 1)
            for w in wins]
    assert row[3] == " / ".join(f"{x:+.2f}%" for x in each)
    pooled = lambda r: (r.nll * r.tokens).sum() / r.tokens.sum()  # noqa: E731
    change = 100 * (np.exp(pooled(control) - pooled(router)) - 1)
    assert row[4].startswith(f"{change:+.2f}% [")
    # runs of 2048 tokens: 8 blocks of 256; a window of N tokens predicts N - 1 of them
    ra = np.concatenate([_runs(control, w, 8) for w in wins])
    rb = np.concatenate([_runs(router, w, 8) for w in wins])
    assert len(ra) == 3 * -(-(seq_len - 1) // 2048)
    assert row[6].endswith(f"({len(ra)})")
    assert row[9] == f"{int((rb < ra).sum())} of {len(ra)}"
    lo, hi = (float(x) for x in row[6].split(" (")[0].strip("[]").split(", "))
    assert lo <= change <= hi
    need = "cleared" if lo > 0 or hi < 0 else f"{((hi - lo) / 2 / abs(change)) ** 2:.0f}x these"
    assert row[10] == need


def test_other_draws_and_their_mean_by_hand():
    from analyses.blocks.gemma_token_blocks import SEEDS_TABLE
    cells = pd.read_parquet(REPO / doc_blocks.LENGTH_CELLS)
    at = (cells.corpus == "austen") & (cells.seq_len == 32768)
    ship, other = cells[(cells.table == doc_blocks.GEMMA_G5_TABLE) & at], cells[(cells.table == SEEDS_TABLE) & at]
    router = ship[ship.label == "hard_top2"].sort_values("window")
    draws = {0: ship[ship.label == "random_top2"]} | {int(s): g for s, g in other.groupby("seed")}
    assert sorted(draws) == [0, 1, 2]
    text = doc_blocks.render("gemma-token-blocks-seeds")
    pooled = lambda r: (r.nll * r.tokens).sum() / r.tokens.sum()  # noqa: E731
    for seed, g in draws.items():
        g = g.sort_values("window")
        assert list(g.window) == list(router.window)
        row = _row(text, str(seed))
        assert row[3].startswith(f"{100 * (np.exp(pooled(g) - pooled(router)) - 1):+.2f}% [")
    # the mean row: each window's loss averaged over the three draws, by hand
    mean = sum(draws[s].sort_values("window").nll.to_numpy() for s in draws) / 3
    each = 100 * (np.exp(mean - router.nll.to_numpy()) - 1)
    row = _row(text, "the 3 draws' mean loss")
    assert row[2] == " / ".join(f"{x:+.2f}%" for x in each)
    ra = []
    for w in router.window:  # the draws' mean loss of each block of 256, then runs of 8 blocks
        b = sum(np.asarray(draws[s][draws[s].window == w].block_nll.iloc[0], float) for s in draws) / 3
        ra += [b[k:k + 8].sum() for k in range(0, len(b), 8)]
    ra = np.array(ra)
    rb = np.concatenate([_runs(router, w, 8) for w in router.window])
    assert row[5] == f"{int((rb < ra).sum())} of {len(rb)}"
