"""Experiment ``router``: ``make_data(ctx)`` makes ``<out>/data/router.parquet`` (run and cached by
``analyses/figures.py``, ``focus-lab-figures``). Read by ``analyses/table_reproduction.py``.
"""

from __future__ import annotations

from pathlib import Path

import pandas as pd

from focus_lab.method.config import TrainConfig

from analyses.common import Context


def make_data(ctx: Context) -> pd.DataFrame:
    """The Focus routers every experiment uses: the shipped ones (``focus_lab/routers/``) or ``--routers``,
    else trained here (``train.train``, settings.router_steps steps) into ``data/router/``."""
    from focus_lab.hf.retrofit import read_router_file
    from focus_lab.train.loop import train
    s = ctx.settings
    path = ctx.default_routers
    trained_here, secs = False, 0.0
    if path is None or not Path(path).is_file():
        path = ctx.data / "router" / "routers.safetensors"
        if not path.is_file():
            ctx.log(f"  no trained router found; training {s.router_steps} steps into {path.parent}")
            model = ctx.model()
            win = ctx.windows("austen", "train", s.seq_len, None)
            res = train(model, win, ctx.base_config(),
                        TrainConfig(steps=s.router_steps, seq_len=s.seq_len, batch_size=s.router_batch),
                        path.parent, progress=False, meta={"corpus": "austen", "by": "focus-lab-figures"})
            secs = res.seconds
        trained_here = True
    cfg, base, tensors, extra = read_router_file(path)
    tc = ctx.router_train_config(Path(path))
    n_params = sum(t.numel() for k, t in tensors.items() if not k.endswith("group_bias"))
    return pd.DataFrame([{"path": str(Path(path).resolve()), "trained_here": trained_here, "train_seconds": secs,
                          "router_parameters": n_params, "num_groups": cfg.num_groups, "window": cfg.window,
                          "sink_tokens": cfg.sink_tokens, "tau": cfg.tau, "sinkhorn_iters": cfg.sinkhorn_iters,
                          "steps": tc.get("steps"), "train_seq_len": tc.get("seq_len"),
                          "batch_size": tc.get("batch_size"), "lr": tc.get("lr"),
                          "model": base.get("name"), "focus_config": cfg.to_json()}])
