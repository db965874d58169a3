"""Experiment ``ablation``: ``make_data(ctx)`` makes ``<out>/data/ablation.parquet`` (run and cached by
``analyses/figures.py``, ``focus-lab-figures``). Read by ``analyses/fig_ablation.py``,
``analyses/table_reproduction.py``.
"""

from __future__ import annotations

import pandas as pd

from focus_lab.method.config import TrainConfig

from analyses.common import Context, cached_part


def make_data(ctx: Context) -> pd.DataFrame:
    """Short router trainings over K, window, tau and Sinkhorn iterations, one axis at a time
    around the base setting (docs/method.md §3, Table 9); each evaluated (held-out Austen) in soft mode
    and hard top-(K/2), with the dense model once."""
    from focus_lab.eval.evaluate import evaluate
    from focus_lab.hf.retrofit import attach
    from focus_lab.train.loop import train
    s = ctx.settings
    base = ctx.base_config()
    win = ctx.windows("austen", "train", s.ablation_seq_len, None)
    ev = ctx.windows("austen", "heldout", s.ablation_seq_len, s.ablation_eval_windows)
    units = [("base", None, None)] + [(axis, axis, v) for axis, vals in s.ablation_grid.items() for v in vals]
    frames = []
    for unit, axis, value in units:
        name = unit if axis is None else f"{axis}={value}"

        def run(axis=axis, value=value, name=name):
            model = ctx.model()
            cfg = base if axis is None else base.replace(**{axis: value})
            cfg = cfg.replace(top_k=max(1, cfg.num_groups // 2), window=min(cfg.window, s.ablation_seq_len))
            res = train(model, win, cfg, TrainConfig(steps=s.ablation_steps, seq_len=s.ablation_seq_len,
                                                     batch_size=1, warmup=1),
                        ctx.data / "ablation" / name.replace("=", "_"), progress=False)
            pats = [("soft", {"mode": "soft"}), (f"hard_top{cfg.top_k}", {"mode": "hard"})]
            if axis is None:
                pats = [("dense", {"mode": "dense"})] + pats
            df = evaluate(model, ev, pats, progress=False)
            df.insert(0, "setting", name)
            df["axis"] = axis or "base"
            df["value"] = "base" if axis is None else str(value)
            for f in ("num_groups", "window", "tau", "sinkhorn_iters"):
                df[f] = getattr(cfg, f)
            df["train_seconds"] = res.seconds
            df["first_loss"], df["last_loss"] = res.first_loss, res.last_loss
            return df
        frames.append(cached_part(ctx, "ablation", name.replace("=", "_"), run))
    return pd.concat(frames, ignore_index=True)
