"""Experiment ``lora``: ``make_data(ctx)`` makes ``<out>/data/lora.parquet`` (run and cached by
``analyses/figures.py``, ``focus-lab-figures``). Read by ``analyses/fig_lora.py``,
``analyses/table_reproduction.py``.
"""

from __future__ import annotations

import time

import pandas as pd

from focus_lab.method.config import FocusConfig, TrainConfig

from analyses.common import Context


def make_data(ctx: Context) -> pd.DataFrame:
    """LoRA (peft, q/v projections) at the router's parameter budget, trained on Austen's training
    windows (``settings.lora_steps`` steps of ``lora_batch`` x ``lora_seq_len`` tokens: a backward
    at 4K tokens is out of a 2-core CPU's reach); dense PPL, one row per window, on held-out Austen
    (domain) and Shakespeare / Python docs (general text) at the windows of "baselines" and
    "transfer_domain", whose Focus numbers it is compared with."""
    from focus_lab.eval.baselines import lora_param_count, lora_rank_for_budget, router_parameter_count, train_lora
    from focus_lab.eval.evaluate import evaluate
    from focus_lab.hf.retrofit import attach, read_router_file
    s = ctx.settings
    rcfg = read_router_file(ctx.routers())[0]
    tc = ctx.router_train_config()
    steps, seq, batch = s.lora_steps, s.lora_seq_len, s.lora_batch
    model = ctx.model()
    budget = router_parameter_count(model, rcfg)
    rank = lora_rank_for_budget(model, budget, s.lora_targets)
    tcfg = TrainConfig(steps=steps, seq_len=seq, batch_size=batch, lr=s.lora_lr, seed=int(tc.get("seed") or 0))
    t0 = time.perf_counter()
    win = ctx.windows("austen", "train", seq, None)
    ctx.log(f"  LoRA rank {rank} ({lora_param_count(model, rank, s.lora_targets)} params; router budget "
            f"{budget}), {steps} steps of {batch} x {seq} tokens, lr {s.lora_lr}")
    merged, log = train_lora(model, win, tcfg, rank, s.lora_targets)
    secs = time.perf_counter() - t0
    attach(merged, FocusConfig(mode="dense", num_groups=rcfg.num_groups))
    rows = []
    cells = [("austen", s.seq_len, s.eval_windows)] + list(s.domain_cells)
    for corpus, T, n in cells:
        ev = ctx.windows(corpus, "heldout", T, n)
        df = evaluate(merged, ev, [("lora", {"mode": "dense"})], progress=False, per_window=True)
        df["corpus"], df["seq_len"] = corpus, T
        rows.append(df)
    out = pd.concat(rows, ignore_index=True)
    out.insert(0, "method", "lora")
    out["rank"] = rank
    out["lora_parameters"] = int(log["lora_parameters"].iloc[0])
    out["router_parameters"] = budget
    out["steps"], out["train_seq_len"], out["batch_size"], out["lr"] = steps, seq, batch, s.lora_lr
    out["train_seconds"] = secs
    out["first_loss"], out["last_loss"] = float(log["loss"].iloc[0]), float(log["loss"].iloc[-1])
    return out
