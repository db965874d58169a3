"""Experiment ``transfer_length``: ``make_data(ctx)`` makes ``<out>/data/transfer_length.parquet`` (run
and cached by ``analyses/figures.py``, ``focus-lab figures``). Read by
``analyses/fig_length_transfer.py``, ``analyses/table_reproduction.py``.
"""

from __future__ import annotations

import pandas as pd

from analyses.common import Context, cached_part, evaluate_with_random, focus_patterns


def make_data(ctx: Context) -> pd.DataFrame:
    """The router trained at 512 tokens, evaluated at longer contexts (settings.long_lens):
    dense, window, soft, hard top-1 and top-k, random groups at top-k."""
    from focus_lab.retrofit import load_routers
    s = ctx.settings
    frames = []
    for T in s.long_lens:
        def run(T=T):
            model = ctx.model()
            cfg = load_routers(model, ctx.routers())
            ev = ctx.windows("austen", "heldout", T, s.long_windows)
            pats = [p for p in focus_patterns(cfg.num_groups) if p[0] in
                    ("dense", "window", "soft", "hard_top1", f"hard_top{cfg.top_k}")]
            df = evaluate_with_random(model, ev, pats, cfg.top_k)
            df["seq_len"] = T
            return df
        frames.append(cached_part(ctx, "transfer_length", f"T{T}", run))
    return pd.concat(frames, ignore_index=True)
