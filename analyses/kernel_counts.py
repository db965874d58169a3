"""Where a forward's work goes on a GPU: the kernels and host syncs of a prefill of ``--length``
tokens and of one decode step after it, per pattern and per focus_lab function that issued them.

A small model on a GPU is bound by kernel launches and by the points where the host waits for the
device, not by arithmetic, in a decode step and up to several thousand tokens of prefill
(docs/studies/retrieval-suite.md, cost of a case). This script counts, for the prefill
(KV cache, ``FocusCache``) and one decode step after it, with the model's routers:

* kernels: the aten ops dispatched that are not views (a GPU launches one kernel or more for each);
* views: the aten ops that only re-stride (no kernel);
* host syncs: the reads that make the host wait for the device on a GPU: ``item`` / ``int`` /
  ``bool`` of a tensor (``aten._local_scalar_dense``), ``tolist`` / ``numpy``, a copy from the
  GPU to the CPU, and the ops whose output size depends on the data (``nonzero``, ``unique``,
  ``masked_select``, ``equal``, ``repeat_interleave`` by a tensor);
* wall time (milliseconds): the prefill once, the step as the median of ``--steps`` steps, both
  timed without counting (the counted forwards run again).

``--path gpu`` counts on a CPU the paths a GPU runs in fp32 (``core.HOST_DEVICES`` emptied): the
step attends to the whole cache under its mask row in one call (``decomposition._one_query``)
instead of through the CPU's group-ordered store (``GroupedKV``), and skips the router's check
for non-finite scores; the prefill takes the "torch" backend either way (in bf16 / fp16 a GPU
takes "flex" or "flash": count those on the GPU itself). On the CPU the attention kernel's
empty-row check (``_attn_lse``) is one host read more per call than a GPU makes. ``--backend``
sets the hard patterns' ``FocusConfig.backend`` ("dense": the masked reference path, one
attention call a layer under a (T, T) mask, what a GPU might prefer at these lengths). The input
is random token ids: a decode step's counts depend on the shapes only, a prefill's also on how
many segments the groups make.

Usage::

    python -m analyses.kernel_counts --length 1024 --patterns dense,hard_top1,hard_top2 --path gpu

Prints a markdown table, then each pattern's kernels and host syncs by caller. Bad options (an
unknown pattern, a length above the model's positions, a device torch does not see) get one line
and exit 2. On a GPU (``--device cuda``) the counts and times are the GPU's own.
"""

from __future__ import annotations

import argparse
import collections
import statistics
import sys
import time
import traceback

import torch
from torch.overrides import TorchFunctionMode
from torch.utils._python_dispatch import TorchDispatchMode

#: aten ops whose output size depends on the data: on a GPU the host waits for the device
DATA_SIZED = ("aten.nonzero", "aten.unique", "aten._unique", "aten.masked_select", "aten.equal",
              "aten.repeat_interleave.Tensor", "aten._local_scalar_dense")
#: Tensor methods that copy values to the host without an aten op on a CPU tensor
HOST_READS = ("tolist", "numpy")
MODEL = "<the model's own code>"


def _caller() -> str:
    """The innermost ``focus_lab`` function on the stack (``module.py:function``), else MODEL."""
    for f in reversed(traceback.extract_stack()):
        if "/focus_lab/" in f.filename:
            return f"{f.filename.split('/focus_lab/')[-1]}:{f.name}"
    return MODEL


def _to_host(name: str, args, kwargs: dict) -> bool:
    """Whether the aten op ``name`` copies a GPU tensor to the CPU (``_to_copy`` / ``copy_``)."""
    if name.startswith("aten._to_copy"):
        dst = kwargs.get("device")
        return args[0].device.type != "cpu" and dst is not None and torch.device(dst).type == "cpu"
    if name.startswith("aten.copy_"):
        return args[0].device.type == "cpu" and args[1].device.type != "cpu"
    return False


class OpCount(TorchDispatchMode):
    """Counts the aten ops dispatched inside it: ``kernels`` and ``views`` (totals) and
    ``by_caller`` / ``syncs`` (Counters keyed by ``_caller()``)."""

    def __init__(self) -> None:
        super().__init__()
        self.kernels = self.views = 0
        self.by_caller: collections.Counter = collections.Counter()
        self.syncs: collections.Counter = collections.Counter()

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        name = str(func)
        if func.is_view:
            self.views += 1
        else:
            self.kernels += 1
            self.by_caller[_caller()] += 1
        if name.startswith(DATA_SIZED) or _to_host(name, args, kwargs or {}):
            self.syncs[f"{_caller()} ({name.removeprefix('aten.').split('.')[0]})"] += 1
        return func(*args, **(kwargs or {}))


class HostReads(TorchFunctionMode):
    """Counts ``HOST_READS`` calls inside it into ``counts`` (a Counter keyed by caller)."""

    def __init__(self, counts: collections.Counter) -> None:
        super().__init__()
        self.counts = counts

    def __torch_function__(self, func, types, args=(), kwargs=None):
        name = getattr(func, "__name__", "")
        if name in HOST_READS:
            self.counts[f"{_caller()} ({name})"] += 1
        return func(*args, **(kwargs or {}))


def count_step(model, state, past, token: torch.Tensor) -> OpCount:
    """One decode step of ``token`` (1, 1) with ``past`` and ``state`` under both counters."""
    counts = OpCount()
    with torch.no_grad(), HostReads(counts.syncs), counts:
        model(token, use_cache=True, past_key_values=past, focus=state)
    return counts


def _timed(fn, dev: torch.device) -> tuple[object, float]:
    """(fn(), its wall seconds), the device synchronized around it on a GPU (``bench_attention._sync``)."""
    from analyses.bench_attention import _sync
    _sync(dev)
    t0 = time.perf_counter()
    out = fn()
    _sync(dev)
    return out, time.perf_counter() - t0


def measure(model, changes: dict, length: int, steps: int, seed: int = 0) -> dict[str, tuple[OpCount, float]]:
    """Under ``changes`` (``evaluate.pattern_changes``): a timed prefill of ``length`` random
    tokens, one untimed step (the first step after a prefill builds per-layer stores), one counted
    step, ``steps`` timed steps, then the prefill again, counted. Returns {"prefill": (OpCount,
    seconds), "decode step": (OpCount, median seconds)}."""
    from focus_lab.hf.retrofit import forward_state
    g = torch.Generator().manual_seed(seed)
    dev = next(model.parameters()).device
    ids = torch.randint(100, model.config.vocab_size, (1, length + 2 + steps), generator=g).to(dev)
    state = forward_state(model, cache=True, **changes)
    with torch.no_grad():
        res, t_prefill = _timed(lambda: model(ids[:, :length], use_cache=True, focus=state), dev)
        past = res.past_key_values
        model(ids[:, length:length + 1], use_cache=True, past_key_values=past, focus=state)
        step = count_step(model, state, past, ids[:, length + 1:length + 2])
        times = [_timed(lambda: model(ids[:, length + 2 + i:length + 3 + i], use_cache=True, past_key_values=past,
                                      focus=state), dev)[1] for i in range(steps)]
        prefill = OpCount()
        with HostReads(prefill.syncs), prefill:
            model(ids[:, :length], use_cache=True, focus=forward_state(model, cache=True, **changes))
    return {"prefill": (prefill, t_prefill), "decode step": (step, statistics.median(times))}


def main(argv: list[str] | None = None) -> str:
    p = argparse.ArgumentParser(prog="python -m analyses.kernel_counts", description=__doc__.split("\n\n")[0])
    p.add_argument("--model", default=None, help="default: the embedded SmolLM2-135M")
    p.add_argument("--routers", default=None, help="router file; default: the shipped one")
    p.add_argument("--length", type=int, default=1024, help="tokens of context before the step")
    p.add_argument("--patterns", default="dense,hard_top1,hard_top2")
    p.add_argument("--path", choices=("auto", "gpu"), default="auto",
                   help="gpu: count on this device the decode path a GPU runs")
    p.add_argument("--backend", choices=("auto", "dense", "torch", "flash", "flex"), default="auto",
                   help="FocusConfig.backend of the hard patterns (dense: the masked reference path, one "
                        "attention call a layer over a (T, T) mask)")
    p.add_argument("--steps", type=int, default=8, help="timed steps (median)")
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--device", default="cpu")
    p.add_argument("--top", type=int, default=6, help="callers shown per pattern")
    a = p.parse_args(argv)
    import focus_lab
    from focus_lab.patterns.legacy import parse_legacy_patterns as parse_patterns
    from focus_lab.hf.shipped import resolve_routers
    from focus_lab.method import core
    from focus_lab.method.config import ConfigError
    from focus_lab.hf.models import resolve_device
    try:
        device = resolve_device(a.device)
    except ValueError as e:
        print(f"error: {e}", file=sys.stderr)
        sys.exit(2)
    torch.set_num_threads(a.threads)
    model, _ = focus_lab.load_model(a.model)
    model.to(device)
    positions = model.config.max_position_embeddings
    if a.length < 1 or a.steps < 1 or a.length + 2 + a.steps > positions:
        print(f"error: --length {a.length} --steps {a.steps}: need length >= 1, steps >= 1 and length + steps "
              f"<= {positions - 2} (the model's {positions} positions, less 2 untimed steps)", file=sys.stderr)
        sys.exit(2)
    try:
        cfg = focus_lab.load_routers(model, resolve_routers(a.routers, a.model))
        patterns = parse_patterns(a.patterns, cfg.num_groups)
    except (ConfigError, FileNotFoundError, ValueError) as e:
        print(f"error: {e}", file=sys.stderr)
        sys.exit(2)
    saved = core.HOST_DEVICES
    if a.path == "gpu":
        core.HOST_DEVICES = ()
    try:
        rows = [(label, measure(model, {**changes, "backend": a.backend}, a.length, a.steps))
                for label, changes in patterns]
    finally:
        core.HOST_DEVICES = saved
    first, base = rows[0]
    lines = [f"A prefill of {a.length} tokens and one decode step after it, {device}, path {a.path}, backend {a.backend} "
             f"({torch.get_num_threads()} threads); ratios over {first}.", "",
             "| pattern | phase | kernels | views | host syncs | time (ms) | kernels / first | time / first |",
             "|---|---|---:|---:|---:|---:|---:|---:|"]
    for label, phases in rows:
        for phase, (c, t) in phases.items():
            c0, t0 = base[phase]
            lines.append(f"| {label} | {phase} | {c.kernels} | {c.views} | {sum(c.syncs.values())} | {t * 1e3:.1f} | "
                         f"{c.kernels / c0.kernels:.2f}x | {t / t0:.2f}x |")
    for label, phases in rows:
        for phase, (c, _) in phases.items():
            lines += ["", f"{label}, {phase}: kernels by caller: "
                      + "; ".join(f"{k} {v}" for k, v in c.by_caller.most_common(a.top)),
                      f"{label}, {phase}: host syncs by caller: "
                      + ("; ".join(f"{k} {v}" for k, v in c.syncs.most_common(a.top)) or "none")]
    text = "\n".join(lines)
    print(text)
    return text


if __name__ == "__main__":
    main()
