"""Experiment ``causal_leak``: ``make_data(ctx)`` makes ``<out>/data/causal_leak.parquet`` (run and
cached by ``analyses/figures.py``, ``focus-lab-figures``). Read by ``analyses/fig_causal_leak.py``,
``analyses/table_reproduction.py``.
"""

from __future__ import annotations

import pandas as pd

from analyses.common import Context, convert_router, focus_patterns


def make_data(ctx: Context) -> pd.DataFrame:
    """Soft mode with Sinkhorn over the whole window (the training gate, non-causal) vs
    prefix-causal Sinkhorn (``baselines.PrefixCausalRouter``) vs causal hard top-k inference,
    same router, same held-out Austen windows of ``settings.soft_seq_len`` tokens, one row per
    (window, variant) (docs/method.md §1 [ours])."""
    from focus_lab.eval.baselines import PrefixCausalRouter, swap_routers
    from focus_lab.eval.evaluate import evaluate
    from focus_lab.hf.retrofit import load_routers
    s = ctx.settings
    model = ctx.model()
    cfg = load_routers(model, ctx.routers())
    ev = ctx.windows("austen", "heldout", s.soft_seq_len, s.soft_windows)
    a = evaluate(model, ev, [p for p in focus_patterns(cfg.num_groups) if p[0] != "window"], progress=False,
                 per_window=True)
    a["variant"] = a["label"].map(lambda l: {"dense": "dense", "soft": "soft, Sinkhorn over the window"}.get(
        l, "hard causal " + l.replace("hard_", "")))
    swap_routers(model, lambda r, m: convert_router(PrefixCausalRouter, r))
    b = evaluate(model, ev, [("soft_prefix_causal", {"mode": "soft"})], progress=False, per_window=True)
    b["variant"] = "soft, prefix-causal Sinkhorn"
    out = pd.concat([a, b], ignore_index=True)
    out.insert(0, "method", out["label"].map(lambda l: "dense" if l == "dense" else "focus"))
    out["seq_len"] = s.soft_seq_len
    return out
