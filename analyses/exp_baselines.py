"""Experiment ``baselines``: ``make_data(ctx)`` makes ``<out>/data/baselines.parquet`` (run and cached
by ``analyses/figures.py``, ``focus-lab-figures``). Read by ``analyses/fig_domain_transfer.py``,
``analyses/fig_length_transfer.py``, ``analyses/fig_lora.py``, ``analyses/fig_pareto.py``,
``analyses/fig_topk.py``, ``analyses/table_baselines.py``, ``analyses/table_reproduction.py``,
``analyses/exp_records.py`` (MoBA's matched top-k).
"""

from __future__ import annotations

import pandas as pd

from analyses.common import Context


def make_data(ctx: Context) -> pd.DataFrame:
    """Focus and every baseline (``baselines.evaluate_baselines``) on held-out Austen windows of
    ``settings.seq_len`` tokens, one row per (window, method, pattern): Focus at
    ``settings.focus_top_ks``, the baselines at ``settings.baseline_top_ks``, no soft pattern
    at long lengths (its O(T^2) float bias; the soft gate is experiment "causal_leak")."""
    from focus_lab.eval.baselines import evaluate_baselines
    s = ctx.settings
    df = evaluate_baselines(ctx.model(), ctx.routers(), ctx.windows("austen", "train", s.seq_len, s.fit_windows),
                            ctx.windows("austen", "heldout", s.seq_len, s.eval_windows), log=ctx.log,
                            top_ks=s.baseline_top_ks, focus_top_ks=s.focus_top_ks,
                            soft=s.seq_len <= s.soft_seq_len, per_window=True)
    df["corpus"] = "austen"
    return df
