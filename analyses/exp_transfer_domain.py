"""Experiment ``transfer_domain``: ``make_data(ctx)`` makes ``<out>/data/transfer_domain.parquet`` (run
and cached by ``analyses/figures.py``, ``focus-lab-figures``). Read by
``analyses/fig_domain_transfer.py``, ``analyses/fig_lora.py``, ``analyses/table_reproduction.py``.
"""

from __future__ import annotations

import pandas as pd

from analyses.common import Context, length_cells


def make_data(ctx: Context) -> pd.DataFrame:
    """The Austen-trained routers on held-out Shakespeare (Hamlet) and Python docs at
    ``settings.domain_cells``: dense, window + sinks, Focus hard top-1 / top-2, random and
    shuffled groups (the controls), one row per (corpus, window, pattern)."""
    return length_cells(ctx, "transfer_domain", ctx.settings.domain_cells)
