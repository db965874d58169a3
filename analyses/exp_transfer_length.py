"""Experiment ``transfer_length``: ``make_data(ctx)`` makes ``<out>/data/transfer_length.parquet`` (run
and cached by ``analyses/figures.py``, ``focus-lab-figures``). Read by
``analyses/fig_length_transfer.py``, ``analyses/table_reproduction.py``.
"""

from __future__ import annotations

import pandas as pd

from analyses.common import Context, length_cells


def make_data(ctx: Context) -> pd.DataFrame:
    """The routers at every length of ``settings.length_cells`` (the length table's corpora,
    lengths and windows): dense, window + sinks, Focus hard top-1 / top-2, and balanced random
    and shuffled groups at the same sparsity, one row per (cell, window, pattern)
    (``common.length_cells``; committed length-table cells are reused)."""
    return length_cells(ctx, "transfer_length", ctx.settings.length_cells)
