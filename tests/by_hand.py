"""By-hand references for the tests of the generated blocks (tests/test_study_blocks_*.py,
tests/test_reference_blocks.py), computed straight from the committed rows and independent of the
code under test (neither ``analyses.length_table.summarize`` nor ``evaluate.paired_change`` nor the
helpers of analyses/blocks/): perplexity = exp of the token-weighted mean NLL over the windows; a
paired change over the windows both patterns have. And the reading of a block: its text, after
checking its page holds it, and a table row's cells.

The length cells come from the ``cells`` fixture (tests/conftest.py), read once.
"""

from __future__ import annotations

import numpy as np
import pandas as pd

from analyses import doc_blocks
from analyses.doc_blocks import REPO


# --------------------------------------------------------------------------------------------
# the length table's cells (figures/results/length_cells.parquet)

def length_cells() -> pd.DataFrame:
    """Every committed length-table row: one per table, corpus, length, pattern and window."""
    return pd.read_parquet(REPO / doc_blocks.LENGTH_CELLS)


def rows(cells: pd.DataFrame, table: str, corpus: str, L: int, label: str) -> pd.DataFrame:
    """One cell's rows (one per window); fails on an empty cell."""
    g = cells[(cells["table"] == table) & (cells.corpus == corpus) & (cells.seq_len == L) & (cells.label == label)]
    assert len(g), (table, corpus, L, label)
    return g


def ppl(g: pd.DataFrame) -> float:
    """Perplexity pooled over ``g``'s windows: exp of the token-weighted mean NLL."""
    return float(np.exp((g.nll * g.tokens).sum() / g.tokens.sum()))


def over_dense(cells: pd.DataFrame, table: str, corpus: str, L: int, label: str) -> float:
    """% change of a pattern's pooled perplexity over dense's in the same table's cell."""
    return 100 * (ppl(rows(cells, table, corpus, L, label)) / ppl(rows(cells, table, corpus, L, "dense")) - 1)


def kept(cells: pd.DataFrame, table: str, corpus: str, L: int, label: str) -> float:
    """The distant pairs kept, mean over the cell's windows."""
    return float(rows(cells, table, corpus, L, label).distant_pairs_kept.mean())


def change(a: pd.DataFrame, b: pd.DataFrame) -> float:
    """% change of perplexity of ``a`` over ``b`` on the windows both have."""
    a, b = a.set_index("window"), b.set_index("window")
    w = a.index.intersection(b.index)
    assert len(w)
    return float(100 * (np.exp(((a.nll * a.tokens)[w].sum() - (b.nll * b.tokens)[w].sum()) / a.tokens[w].sum()) - 1))


def paired(cells: pd.DataFrame, a: tuple[str, str], b: tuple[str, str], corpus: str, L: int = 4096) -> float:
    """``change`` of a = (table, label) over b = (table, label) on one corpus and length."""
    return change(rows(cells, a[0], corpus, L, a[1]), rows(cells, b[0], corpus, L, b[1]))


# --------------------------------------------------------------------------------------------
# the recipes at 512 tokens (figures/results/recipes.parquet)

def recipe_ppl(df: pd.DataFrame, sweep: str, recipe: str, label: str) -> float:
    """A recipe's perplexity: exp of its one pooled NLL over the sweep's 3 windows."""
    r = df[(df.sweep == sweep) & (df.recipe == recipe) & (df.label == label)]
    assert len(r) == 1, (sweep, recipe, label)
    return float(np.exp(r.nll.iloc[0]))


# --------------------------------------------------------------------------------------------
# reading a block

def blocks_on(rel: str) -> set[str]:
    """The names of the generated blocks the page ``rel`` (from the repository root) holds."""
    return {f.name for f in doc_blocks.find_blocks((REPO / rel).read_text(encoding="utf-8"))}


def on_page(page: str, name: str) -> str:
    """The block's rendered text, after checking the study page ``page`` (in docs/studies/) holds it."""
    assert name in blocks_on(f"docs/studies/{page}"), f"{page} holds no block {name}"
    return doc_blocks.render(name)


def table_row(text: str, first: str, nth: int = 0) -> list[str]:
    """The cells of the ``nth`` table row of ``text`` whose first cell is ``first``."""
    found = [line for line in text.splitlines() if line.startswith(f"| {first} |")]
    assert len(found) > nth, f"no row {first!r} in\n{text}"
    return [c.strip() for c in found[nth].strip().strip("|").split("|")]
