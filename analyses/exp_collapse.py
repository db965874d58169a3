"""Experiment ``collapse``: ``make_data(ctx)`` makes ``<out>/data/collapse.parquet`` (run and cached by
``analyses/figures.py``, ``focus-lab-figures``). Read by ``analyses/fig_collapse.py``,
``analyses/table_reproduction.py``.
"""

from __future__ import annotations

import pandas as pd
import torch

from focus_lab.method.core import hard_group_shares

from focus_lab.method.config import TrainConfig

from analyses.common import Context, cached_part, convert_router


def _train_log_hook(rows: list, gate: str, K: int, n_layers: int):
    calls = {"n": 0}

    def observe(key_group, hook):  # the key_group hook point (focus_lab.hf.hooks)
        routing = hook.call.routing
        if routing.log_p is None:
            return
        step = calls["n"] // n_layers
        calls["n"] += 1
        p = routing.log_p.detach().exp()  # (B, T, K)
        T = p.shape[0] * p.shape[1]
        argmax = hard_group_shares(p.argmax(-1), K)  # (K,) shares of the argmax groups
        hard = hard_group_shares(key_group, K)
        rows.append({"gate": gate, "step": step, "layer_idx": hook.layer_idx,
                     "soft_mass_largest_share": float(p.sum((0, 1)).max() / T),
                     "argmax_largest_share": float(argmax.max()),
                     "hard_largest_share": float(hard.max())})
    return observe


def make_data(ctx: Context) -> pd.DataFrame:
    """Sinkhorn vs plain softmax (docs/method.md §1): train the same router init for a few steps with
    each gate (``baselines.SoftmaxRouter``) and log, per step and layer, the largest group's share
    of tokens under the gate's own assignment (argmax of P), its share of the soft mass, and the
    causal hard top-1 share."""
    from focus_lab.eval.baselines import SoftmaxRouter, swap_routers
    from focus_lab.hf.hooks import hooks
    from focus_lab.hf.retrofit import attach, attention_modules
    from focus_lab.train.loop import train
    s = ctx.settings
    K = s.collapse_groups
    win = ctx.windows("austen", "train", s.collapse_seq_len, None)
    frames = []
    for gate in ("sinkhorn", "softmax"):
        def run(gate=gate):
            model = ctx.model()
            cfg = ctx.base_config(num_groups=K, top_k=1)
            attach(model, cfg.replace(mode="soft"))
            if gate == "softmax":
                swap_routers(model, lambda r, m: convert_router(SoftmaxRouter, r))
            rows: list = []
            n_layers = len([1 for _, m in attention_modules(model) if hasattr(m, "focus_router")])
            with hooks(model, {"key_group": _train_log_hook(rows, gate, K, n_layers)}):
                res = train(model, win, cfg, TrainConfig(steps=s.collapse_steps, seq_len=s.collapse_seq_len,
                                                         batch_size=1, warmup=1),
                            ctx.data / "collapse" / gate, progress=False)
            df = pd.DataFrame(rows)
            log = pd.read_parquet(ctx.data / "collapse" / gate / "train_log.parquet")
            loss = log.groupby("step")["loss"].first()
            df["loss"] = df["step"].map(loss)
            df["num_groups"] = K
            df["train_seconds"] = res.seconds
            return df
        frames.append(cached_part(ctx, "collapse", gate, run))
    return pd.concat(frames, ignore_index=True)
