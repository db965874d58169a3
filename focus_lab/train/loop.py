"""Router-only training (docs/method.md §3): every pretrained weight frozen, AdamW on the routers.

A training directory holds ``routers.safetensors`` (final), ``checkpoint/`` (atomic, every N
steps: routers, optimizer, step), ``train_log.parquet`` (one row per step and layer) and
``train_config.json``. ``resume=True`` continues from ``checkpoint/`` with the same data
order (window order is a function of (seed, step) only).
"""

from __future__ import annotations

import contextlib
import json
import math
import time
from dataclasses import dataclass
from pathlib import Path

import pandas as pd
import torch
from tqdm.auto import tqdm

from focus_lab.method.core import hard_group_shares
from focus_lab.method.config import FocusConfig, TrainConfig
from focus_lab.io import atomic_path, write_json, write_parquet
from focus_lab.hf.hooks import hooks
from focus_lab.train.layerwise import coverage_layer_loss, coverage_step, layerwise_step  # noqa: F401
from focus_lab.hf.retrofit import (FocusForward, attach, checkpointed_layers, forward_state, is_attached,
                                  load_routers, router_tensors, routers, save_routers)

TRAIN_LOG_SCHEMA = 1


@dataclass
class TrainResult:
    """Summary of a training run. Losses in nats/token, time in seconds."""

    out_dir: Path
    steps: int
    first_loss: float  # mean loss of the first 5 steps (nats/token)
    last_loss: float  # mean loss of the last 5 steps (nats/token)
    seconds: float
    tokens_per_second: float
    router_parameters: int


def lr_at(step: int, cfg: TrainConfig) -> float:
    """The learning rate of ``step``: linear warmup over ``cfg.warmup`` steps, then cosine decay from
    ``cfg.lr`` to 0.1 ``cfg.lr`` over the remaining ``cfg.steps`` (docs/method.md §3)."""
    if step < cfg.warmup:
        return cfg.lr * (step + 1) / cfg.warmup
    frac = (step - cfg.warmup) / max(1, cfg.steps - cfg.warmup)
    return cfg.lr * (0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * min(1.0, frac))))


def schedule_config(base: FocusConfig, cfg: TrainConfig, step: int) -> FocusConfig:
    """The FocusConfig in force at ``step``: tau annealing (recipe d) and the final hard
    phase (recipe e) applied to ``base``."""
    changes = {}
    if cfg.tau_final is not None:
        frac = step / max(1, cfg.steps - 1)
        changes["tau"] = base.tau * (cfg.tau_final / base.tau) ** frac
    if cfg.hard_phase > 0 and step >= cfg.steps * (1 - cfg.hard_phase):
        changes.update(straight_through=True, gumbel_noise=cfg.hard_phase_noise)
    return base.replace(**changes) if changes else base


def batch_for_step(windows: list, step: int, cfg: TrainConfig) -> torch.Tensor:
    """(batch_size, seq_len) input ids of a step: a deterministic function of (seed, step).

    Epoch e visits the windows in ``torch.randperm`` order seeded by ``seed + e``.
    """
    n = len(windows)
    ids = []
    for b in range(cfg.batch_size):
        flat = step * cfg.batch_size + b
        epoch, pos = divmod(flat, n)
        perm = torch.randperm(n, generator=torch.Generator().manual_seed(cfg.seed * 7919 + epoch))
        ids.append(windows[int(perm[pos])].input_ids)
    return torch.stack(ids)  # (batch, seq_len)


def distributed_context() -> tuple[int, int]:
    """(rank, world_size); initializes torch.distributed when launched by torchrun
    (gloo on CPU, nccl on GPU). (0, 1) otherwise."""
    import os
    import torch.distributed as dist
    world = int(os.environ.get("WORLD_SIZE", "1"))
    if world <= 1:
        return 0, 1
    if not dist.is_initialized():
        dist.init_process_group("nccl" if torch.cuda.is_available() else "gloo")
    return dist.get_rank(), dist.get_world_size()


def router_checksum(model) -> str:
    """sha256 of every router tensor (parameters and group bias), in layer order."""
    import hashlib
    h = hashlib.sha256()
    for i, r in sorted(routers(model).items()):
        for t in router_tensors(r).values():
            h.update(t.detach().to("cpu", torch.float32).contiguous().numpy().tobytes())
    return h.hexdigest()


def train(model, windows: list, focus_cfg: FocusConfig, train_cfg: TrainConfig, out_dir: str | Path,
          resume: bool = False, progress: bool = True, meta: dict | None = None) -> TrainResult:
    """Train only the routers of ``model`` on ``windows`` (each with ``input_ids: (seq_len,)``).

    Args:
        model: a transformers causal LM (Focus attached or not; attached with focus_cfg if not).
        windows: training windows from ``focus_lab.data.make_windows``.
        focus_cfg: Focus configuration (mode is forced to "soft" while training, docs/method.md §2).
            With ``train_cfg.init_routers``, that file's ``seed`` and ``random_layers`` replace
            focus_cfg's: a continued file keeps the random groups it was measured with.
        train_cfg: schedule. out_dir: training directory. resume: continue from its checkpoint.
        meta: extra provenance (model name, corpus) written into train_config.json, beside
            ``machine`` (``io.machine()``: CPU, torch version and threads, GPU), which the
            router bytes depend on: the same command gives the same bytes on the same machine
            and thread count, and may differ in the last bits elsewhere (docs/reliability.md).
    Returns:
        TrainResult. Raises FileNotFoundError when ``resume`` finds no checkpoint.

    Distributed: under ``torchrun --nproc_per_node=N`` the model is wrapped in PyTorch's
    DistributedDataParallel; each rank takes every N-th window of the global batch
    (``batch_size`` must be a multiple of N), gradients are averaged by DDP, the logged loss is
    the all-reduced mean, and rank 0 alone writes files. ``ddp.json`` records each rank's
    router checksum at the end (they must be identical).
    """
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    ckpt = out / "checkpoint"
    if not windows:
        raise ValueError("no training windows: the corpus is shorter than one window; lower --seq-len")
    rank, world = distributed_context()
    if train_cfg.batch_size % world:
        raise ValueError(f"batch_size={train_cfg.batch_size} is not a multiple of the {world} "
                         "processes; choose a batch size divisible by --nproc_per_node")
    source = ckpt / "routers.safetensors" if resume else train_cfg.init_routers
    if source and Path(source).is_file() and not is_attached(model):
        # a key-router file continues as one (a shared file may also start a key router)
        from focus_lab.hf.retrofit import read_router_file
        if read_router_file(source)[0].key_router:
            focus_cfg = focus_cfg.replace(key_router=True)
    if not is_attached(model):
        attach(model, focus_cfg.replace(mode="soft"))
    # the config every training forward uses (passed per forward, the model's default untouched)
    base_cfg = forward_state(model, mode="soft").config
    params = [p for r in routers(model).values() for p in r.parameters()]  # proj, centroids (, key_proj)
    opt = torch.optim.AdamW(params, lr=train_cfg.lr, weight_decay=train_cfg.weight_decay)
    start, log_rows = 0, []
    if resume and not (ckpt / "routers.safetensors").is_file():
        raise FileNotFoundError(f"--resume: no checkpoint in {ckpt}; start without --resume")
    if source:  # the checkpoint, or a length curriculum starting from trained routers
        loaded = load_routers(model, source)
        # a continued file keeps its identity: the seed of its random groups (random layers,
        # random and shuffled controls) and its random layers (docs/method.md §2.6);
        # ``train_cfg.seed`` still orders the windows
        base_cfg = base_cfg.replace(seed=loaded.seed, random_layers=loaded.random_layers)
    if train_cfg.random_layers is not None:  # an explicit choice wins over the init file's
        base_cfg = base_cfg.replace(random_layers=list(train_cfg.random_layers))
    if resume:
        state = torch.load(ckpt / "trainer.pt", weights_only=True)
        opt.load_state_dict(state["optimizer"])
        start = int(state["step"])
        log_rows = pd.read_parquet(ckpt / "train_log.parquet").to_dict("records")
    if rank == 0:
        from focus_lab.io import machine
        write_json(out / "train_config.json", {"focus_config": base_cfg.to_dict(),
                   "train_config": train_cfg.to_dict(), "meta": meta or {}, "machine": machine()})
    torch.manual_seed(train_cfg.seed)
    if resume:
        torch.set_rng_state(state["rng"])
    model.eval()
    rs = routers(model)
    for r in rs.values():
        r.train()
    K = base_cfg.num_groups
    shares: dict[int, torch.Tensor] = {}

    def group_shares(key_group, hook):  # (B, T) -> the layer's (K,) hard top-1 shares
        shares[hook.layer_idx] = hard_group_shares(key_group, K)
    watch = contextlib.ExitStack()  # the hook lives until the finally below
    if train_cfg.objective == "lm":  # the layer-local objectives fill the shares themselves, from dense forwards
        watch.enter_context(hooks(model, {"key_group": group_shares}))
    forward = model
    device = next(model.parameters()).device
    if world > 1:
        import torch.distributed as dist
        from torch.nn.parallel import DistributedDataParallel
        forward = DistributedDataParallel(model, broadcast_buffers=False,
                                          device_ids=[device.index] if device.type == "cuda" else None)  # group bias synced in update_bias
    n_params = sum(p.numel() for p in params)
    t_start = time.perf_counter()
    tokens_done = 0
    stop = train_cfg.stop_after or train_cfg.steps  # the schedule spans train_cfg.steps
    bar = tqdm(range(start, stop), initial=start, total=stop,
               desc="train routers", disable=not progress or rank > 0, dynamic_ncols=True)
    try:
        for step in bar:
            t0 = time.perf_counter()
            for g in opt.param_groups:
                g["lr"] = lr_at(step, train_cfg)
            step_cfg = schedule_config(base_cfg, train_cfg, step)
            ids = batch_for_step(windows, step, train_cfg)[rank::world].to(device)  # this rank's share
            opt.zero_grad(set_to_none=True)
            if train_cfg.objective in ("coverage", "distill"):
                if train_cfg.objective == "coverage":
                    loss_d = coverage_step(model, ids, step_cfg, shares)
                else:
                    from focus_lab.train.distill import distill_step
                    loss_d = distill_step(model, ids, step_cfg, step, train_cfg.distill_queries,
                                          train_cfg.seed, shares, train_cfg.distill_top_k,
                                          train_cfg.distill_copy_share)
                if world > 1:  # the model is not run through DDP here: average by hand
                    for p in params:
                        if p.grad is not None:
                            dist.all_reduce(p.grad)
                            p.grad /= world
            else:
                with checkpointed_layers(model) if train_cfg.gradient_checkpointing else contextlib.nullcontext():
                    loss_t = forward(input_ids=ids, labels=ids, use_cache=False,
                                     focus=FocusForward(step_cfg)).loss
                    loss_t.backward()
                loss_d = loss_t.detach().clone()
            if world > 1:
                dist.all_reduce(loss_d)
                loss_d /= world
            loss = loss_d.item()
            opt.step()
            dt = time.perf_counter() - t0
            tokens_done += ids.numel()
            for layer_idx, s in sorted(shares.items()):
                log_rows.append({"step": step, "layer_idx": layer_idx, "loss": loss,
                                 "lr": opt.param_groups[0]["lr"], "seconds": dt,
                                 "tokens_per_second": ids.numel() / dt,
                                 "max_group_share": float(s.max()), "min_group_share": float(s.min())})
            bar.set_postfix(loss=f"{loss:.3f}", tok_s=f"{ids.numel() / dt:.0f}")
            if rank == 0 and ((step + 1) % train_cfg.checkpoint_every == 0 or step + 1 == stop):
                _checkpoint(model, opt, step + 1, log_rows, ckpt, base_cfg)
    finally:
        watch.close()
        for r in rs.values():
            r.eval()
    seconds = time.perf_counter() - t_start
    log = pd.DataFrame(log_rows)
    log["schema_version"] = TRAIN_LOG_SCHEMA
    if world > 1:
        sums = [None] * world
        dist.all_gather_object(sums, router_checksum(model))
        if rank == 0:
            write_json(out / "ddp.json", {"world_size": world, "router_checksums": sums,
                                          "identical": len(set(sums)) == 1})
        dist.barrier()
    if rank == 0:
        write_parquet(out / "train_log.parquet", log)
        save_routers(model, out / "routers.safetensors", extra={"steps": stop, **(meta or {})},
                     config=base_cfg)
    per_step = log.groupby("step")["loss"].first()
    n = min(5, len(per_step))  # single-batch losses are noisy: average the first and last n steps
    return TrainResult(out, stop, float(per_step.iloc[:n].mean()), float(per_step.iloc[-n:].mean()), seconds,
                       tokens_done / seconds if seconds > 0 else float("nan"), n_params)


def _checkpoint(model, opt, step: int, log_rows: list, ckpt: Path, config: FocusConfig) -> None:
    """Write routers, optimizer state and the log so far as one atomic directory."""
    with atomic_path(ckpt) as tmp:
        tmp.mkdir()
        save_routers(model, tmp / "routers.safetensors", extra={"step": step}, config=config)
        torch.save({"optimizer": opt.state_dict(), "step": step, "rng": torch.get_rng_state()},
                   tmp / "trainer.pt")
        write_parquet(tmp / "train_log.parquet", pd.DataFrame(log_rows))
        (tmp / "step.json").write_text(json.dumps({"step": step}))
