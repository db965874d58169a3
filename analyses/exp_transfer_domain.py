"""Experiment ``transfer_domain``: ``make_data(ctx)`` makes ``<out>/data/transfer_domain.parquet`` (run
and cached by ``analyses/figures.py``, ``focus-lab figures``). Read by
``analyses/fig_domain_transfer.py``, ``analyses/fig_lora.py``, ``analyses/table_reproduction.py``.
"""

from __future__ import annotations

import pandas as pd

from analyses.common import Context, cached_part, evaluate_with_random, focus_patterns


def make_data(ctx: Context) -> pd.DataFrame:
    """The Austen router on held-out Shakespeare and Python docs: dense, window, soft, hard
    top-1..K, and random groups at hard top-k (the control)."""
    from focus_lab.retrofit import load_routers
    s = ctx.settings
    frames = []
    for corpus in ("shakespeare", "python-docs"):
        def run(corpus=corpus):
            model = ctx.model()
            cfg = load_routers(model, ctx.routers())
            ev = ctx.windows(corpus, "heldout", s.seq_len, s.eval_windows)
            df = evaluate_with_random(model, ev, focus_patterns(cfg.num_groups), cfg.top_k)
            df["corpus"] = corpus
            return df
        frames.append(cached_part(ctx, "transfer_domain", corpus, run))
    return pd.concat(frames, ignore_index=True)
