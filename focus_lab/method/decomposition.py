"""Hard Focus attention as two standard attention calls merged by log-sum-exp (docs/method.md §4).

The hard mask of ``core.hard_mask`` (docs/method.md §2, plus the project's sink tokens, §6),

    M(i, j) = [j <= i] and (g(j) in G_k(i) or i - j < w or j < sinks),

splits into disjoint sets of pairs, each computed by an ordinary attention kernel that also
returns the logsumexp (LSE) of its logits:

A. same-group causal pairs: ``g(j) in G_k(i)`` and ``j <= i``. Keys are stably sorted by
   (group, position), which keeps causal order inside a group; for each slot s of the queries'
   top-k, queries are sorted the same way by their s-th group. Each (batch row, slot, group)
   is a variable-length segment ("plan_segments"). Slot 1 of ``core.hard_assign`` (the key's
   own group) gives square causal segments: they are padded to a common length in buckets
   (at most 20% padding work) and run as ONE batched causal kernel call per bucket. Slots
   2..k give "staircase" segments (query m sees the first ``counts[m]`` keys of the group),
   cut into pieces whose rows share all but at most a chunk of their keys: the shared keys go
   in one unmasked call per piece, the ragged rest in a few batched masked calls, merged by
   LSE (``_stairs``).
   A key lives in exactly one group and repeated query groups count once, so no pair is
   counted twice. Cost O(k n^2 / K) for balanced groups.
B. local pairs in other groups: ``0 <= i - j < w`` and ``g(j) not in G_k(i)``: query blocks
   of c tokens against the ``c + w - 1`` keys ending at the block, read as overlapping strided
   windows of K/V (no copy), with the band and group condition as the mask. Cost O(n (c + w)).
C. (only with ``sinks > 0``) sink pairs ``j < sinks`` outside the window and in other groups:
   one call against the first ``sinks`` keys.
D. (only with ``extra_pairs``, the token-match pairs of docs/method.md §2.8) listed distant pairs
   in other groups: each query's keys gathered and attended, rows bucketed by their number of
   pairs so that padding stays under 25% (``_pairs_part``). Cost O(P H D) for P pairs.

KV-cache steps with at most FEW_QUERIES queries skip the parts: per batch row the keys the step
keeps (window, sinks, its groups' cached keys) are gathered and attended in ONE call
(``_few_queries``); a decoding step then touches the kept keys only.

The partial results are merged in fp32: ``o = sum_p e^{lse_p} o_p / sum_p e^{lse_p}``; an
empty part has ``lse = -inf`` and weight 0. Every query keeps its own diagonal pair (in A when
its key group is among its query groups, else in B), so the merged lse is always finite.

Backends (``backend=``):
    "torch": torch's fused CPU flash-attention kernel
        ``aten._scaled_dot_product_flash_attention_for_cpu`` (returns (out, logsumexp); accepts
        GQA directly, so K/V are never repeated per query head; accepts any strides and an
        additive float mask; a fully masked row comes back as out 0 / lse 0, its lse is set to
        -inf here). On CUDA "torch" uses torch's memory-efficient attention kernel
        (``aten._scaled_dot_product_efficient_attention``, which returns the LSE; fp32, fp16,
        bf16; K/V heads repeated for GQA; ``_cuda_attn_lse``). Elsewhere (and for fp64 on
        CUDA) an exact chunked math implementation (correct, not fast).
    "flash": a varlen flash-attention kernel, causal, with its softmax LSE, for every causal
        segment of part A packed into ONE call, GQA native, fp16/bf16 only: flash-attn's
        ``flash_attn_varlen_func`` when the optional package imports (``pip install
        'focus-lab[gpu]'``), else torch's bundled copy (``aten._flash_attention_forward``,
        Ampere or newer). Staircase segments and part B use the "torch" path. The packing, LSE
        unpacking and merge are tested on CPU against a stand-in kernel written from
        flash-attn's documented semantics (tests/test_decomposition.py), torch's kernel on an
        H100 (tests/test_cuda.py); the flash-attn package itself is untested here.
    "flex": part A (causal segments and staircases alike) as ONE block-sparse call of
        FlexAttention (``torch.nn.attention.flex_attention``, compiled on CUDA, with its LSE) over
        the packed layout of ``flex_layout``, planned by tensor ops on the device with no host
        synchronization; part B as "torch". Any dtype; on the CPU it runs eager FlexAttention,
        which materializes the scores (tests only: compiled CPU FlexAttention refuses
        ``return_lse`` in torch 2.13). The first call at a new shape compiles (4-20 s on an H200).
    "auto": on CUDA with fp16/bf16 inputs "flex" for top_k >= 2, "flash" for top_k = 1 (when a
        varlen flash kernel is there); else "torch" (measured on an H200,
        figures/bench_attention/gpu_h200.md).

Options: the CPU performance knobs (scratch-buffer reuse, stair chunk size, serial
bookkeeping) live in one frozen ``DecompositionOptions`` with fixed defaults, passed per call;
results do not depend on them. Serial bookkeeping toggles ``torch.set_num_threads``
(process-global) during a call, so do not call this from several Python threads at once on CPU
with it enabled. Library code never reads the machine's load: a benchmark may choose the
options per run (``analyses/bench_attention.py`` does, and records its choice).

Shapes: B batch, H query heads, Hkv key/value heads (H a multiple of Hkv), Tq queries,
Tk keys (Tq <= Tk; query i sits at position ``Tk - Tq + i``), D head_dim, k = top_k.
Intended for inference (hard mode); gradients are not supported (the retrofit falls back to
the dense reference when autograd needs them).
"""

from __future__ import annotations

import functools
import math
import time
from bisect import bisect_left
from contextlib import contextmanager
from contextlib import nullcontext as _nullcontext
from dataclasses import dataclass

import torch
import torch.nn.functional as F

from focus_lab.method import core
from focus_lab.method.core import other_group_pairs
from focus_lab.method.cpu import torch_threads

BACKENDS = ("auto", "torch", "flash", "flex")
_NEG_INF = float("-inf")

@dataclass(frozen=True)
class DecompositionOptions:
    """CPU performance knobs of ``hard_focus_attention``; the output never depends on them.

    workspace: reuse scratch buffers between calls (CPU only; CUDA has its caching allocator).
        A fresh 75 MB CPU buffer (32K tokens x 9 heads x 64 x fp32) pays its page faults on
        first touch: measured 0.07-0.22 s per buffer on a 2-core VM, i.e. the whole "gather"
        and "scatter" phases at 32K tokens. What is returned to the caller never comes from it.
    stair_chunk: the most query rows, and the most ragged keys, of a piece of a stair
        segment (None: STAIR_CHUNK; ``_stairs``).
    serial_bookkeeping: run everything but the attention kernels on one thread. Each
        multi-threaded op waits for every worker thread; on an oversubscribed 2-core machine
        the ~30 small bookkeeping ops then stall (measured at 2K tokens under load ~9: 282 ms
        -> 140 ms median), while on a quiet machine serial is slower (4K tokens, K = 4, k = 2:
        0.153 s serial vs 0.146 s). Default off; a caller that knows its machine is loaded turns
        it on (the benchmark's ``--serial-bookkeeping auto`` decides from the load average).
    serial_max_elements: with serial bookkeeping, only for queries of at most this many
        elements (None: no limit).
    """
    workspace: bool = True
    stair_chunk: int | None = None
    serial_bookkeeping: bool = False
    serial_max_elements: int | None = None


DEFAULT_OPTIONS = DecompositionOptions()
STAIR_CHUNK = 256  # default rows and ragged keys per stair piece: at most ~128 extra keys computed per query



# The scratch buffers themselves (a cache, not a knob): ``clear_workspace()`` frees them.
_workspace: dict[tuple, torch.Tensor] = {}


def _scratch(name: str, shape: tuple, dtype: torch.dtype, device: torch.device, call: "_Call") -> torch.Tensor:
    """An uninitialized (shape) tensor, a view of the workspace buffer ``name`` (grown as
    needed) on CPU with ``call.options.workspace``, else a fresh ``torch.empty``. Valid until
    the next call that asks for the same name: never return one to a caller."""
    numel = math.prod(shape)
    if not call.options.workspace or torch.device(device).type != "cpu":
        return torch.empty(shape, dtype=dtype, device=device)
    key = (name, dtype)
    buf = _workspace.get(key)
    if buf is None or buf.numel() < numel:
        _workspace.pop(key, None)
        buf = torch.empty(numel, dtype=dtype)
        _workspace[key] = buf
    return buf[:numel].view(shape)


def _is_scratch(t: torch.Tensor) -> bool:
    """True when ``t`` shares memory with a workspace buffer."""
    return any(t.data_ptr() == b.data_ptr() for b in _workspace.values())


def clear_workspace() -> None:
    """Free the CPU scratch buffers kept between calls (``DecompositionOptions.workspace``)."""
    _workspace.clear()


# --------------------------------------------------------------------------------------------
# backends

@functools.lru_cache(maxsize=None)
def _flash_attn_package():
    """flash-attn's ``flash_attn_varlen_func`` when the optional package imports, else None.
    Cached: a failed import would otherwise search the import path again on every call."""
    try:
        from flash_attn import flash_attn_varlen_func
    except Exception:
        return None
    return flash_attn_varlen_func


def flash_attn_available() -> bool:
    """True when a CUDA device exists and a varlen flash-attention kernel is there: the optional
    ``flash_attn`` package, or torch's bundled copy (``aten._flash_attention_forward``, which
    needs an Ampere or newer GPU)."""
    if not torch.cuda.is_available():
        return False
    if _flash_attn_package() is not None:
        return True
    return (hasattr(torch.ops.aten, "_flash_attention_forward") and torch.backends.cuda.flash_sdp_enabled()
            and torch.cuda.get_device_capability() >= (8, 0))


def _varlen_flash(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, cu_q: torch.Tensor, cu_k: torch.Tensor,
                  max_q: int, max_k: int, scale: float) -> tuple[torch.Tensor, torch.Tensor]:
    """Causal (bottom-right aligned) varlen flash attention over packed sequences, GQA native:
    flash-attn's ``flash_attn_varlen_func`` when the package imports, else torch's bundled copy
    of the same kernel. q: (total_q, H, D), k, v: (total_k, Hkv, D) fp16/bf16; cu_q, cu_k: int32
    cumulative lengths. Returns out (total_q, H, D) and lse (H, total_q) fp32 (flash-attn < 2.4:
    (nseq, H, max_q), padded)."""
    fn = _flash_attn_package()
    if fn is not None:
        out, lse, _ = fn(q, k, v, cu_q, cu_k, max_q, max_k, dropout_p=0.0, softmax_scale=scale, causal=True,
                         return_attn_probs=True)
        return out, lse
    out, lse = torch.ops.aten._flash_attention_forward(q, k, v, cu_q, cu_k, max_q, max_k, 0.0, True, False,
                                                       scale=scale)[:2]
    return out, lse


def available_backends(device: torch.device | str = "cpu") -> list[str]:
    """Concrete backends usable on ``device`` (for tests and benchmarks)."""
    device = torch.device(device)
    out = ["torch"]
    if device.type == "cuda" and flash_attn_available():
        out.append("flash")
    if device.type == "cuda" and _flex_module() is not None:
        out.append("flex")
    return out


def resolve_backend(backend: str, device: torch.device, dtype: torch.dtype = torch.float32,
                    top_k: int = 1) -> str:
    """Map "auto" to a concrete backend; raises ValueError for an unknown or unusable one.

    "auto" on CUDA with fp16/bf16 inputs picks "flex" when queries join ``top_k >= 2`` groups
    (their staircase segments run inside one block-sparse kernel instead of being cut into
    pieces: measured 2.9-3.6x faster than "flash" at 128K tokens, bf16, K = 4, k = 2, on an
    H200, figures/bench_attention/gpu_h200.md), else "flash" when a varlen flash kernel is there;
    fp32 and the CPU stay on "torch" (on that GPU torch's fp32 kernel beat FlexAttention's)."""
    if backend not in BACKENDS:
        raise ValueError(f"backend={backend!r} is unknown; choose one of {', '.join(BACKENDS)}")
    half = dtype in (torch.float16, torch.bfloat16)
    if backend == "auto":
        if device.type != "cuda" or not half:
            return "torch"
        if top_k >= 2 and _flex_module() is not None:
            return "flex"
        return "flash" if flash_attn_available() else "torch"
    if backend == "flex":
        if _flex_module() is None:
            raise ValueError("backend='flex' needs torch.nn.attention.flex_attention (torch >= 2.5); "
                             "use backend='torch'")
        return backend
    if backend == "flash":
        if not (device.type == "cuda" and flash_attn_available()):
            raise ValueError("backend='flash' needs a CUDA device (Ampere or newer, or the flash-attn "
                             "package: pip install 'focus-lab[gpu]'); use backend='torch' or 'auto'")
        if not half:
            raise ValueError(f"backend='flash' needs float16/bfloat16 inputs, got {dtype}; "
                             "use backend='torch' for fp32")
    return backend


# --------------------------------------------------------------------------------------------
# timing of the phases (for the benchmark)

class _Call:
    """The state of one ``hard_focus_attention`` call: its options, the thread count the
    attention kernels get, and the phase call (``call("gather")`` accumulates wall seconds
    per phase into ``sink``, a dict, when given; else a no-op)."""

    def __init__(self, sink: dict | None, device: torch.device, options: DecompositionOptions,
                 kernel_threads: int):
        self.sink = sink
        self.cuda = device.type == "cuda"
        self.options = options
        self.kernel_threads = kernel_threads

    def kernels(self):
        """Context: the attention kernels run on ``kernel_threads`` threads."""
        return torch_threads(self.kernel_threads)

    @contextmanager
    def __call__(self, name: str):
        if self.sink is None:
            yield
            return
        if self.cuda:
            torch.cuda.synchronize()
        t = time.perf_counter()
        try:
            yield
        finally:
            if self.cuda:
                torch.cuda.synchronize()
            self.sink[name] = self.sink.get(name, 0.0) + time.perf_counter() - t


# --------------------------------------------------------------------------------------------
# attention primitives returning (out, lse)

_cpu_flash = torch.ops.aten._scaled_dot_product_flash_attention_for_cpu


def _math_attn_lse(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, allowed: torch.Tensor | None,
                   scale: float, causal: bool = False, max_scores: int = 1 << 26
                   ) -> tuple[torch.Tensor, torch.Tensor]:
    """Exact attention with its logsumexp by explicit scores (any device), fp32.

    q: (N, H, L, D); k, v: (N, Hkv, S, D); allowed: bool broadcastable to (N, 1, L, S) or None;
    causal: top-left causal (key n <= query m). Queries go in chunks so that at most
    ``max_scores`` scores (256 MB) exist at once. Returns out (N, H, L, D) fp32 (0 on rows with
    no allowed key) and lse (N, H, L) fp32 (-inf on such rows).
    """
    N, H, L, D = q.shape
    Hkv, S = k.shape[1], k.shape[2]
    g = H // Hkv
    kf = k.float().transpose(-1, -2)  # (N, Hkv, D, S)
    vf = v.float()
    out = torch.empty(N, H, L, D, device=q.device)
    lse = torch.empty(N, H, L, device=q.device)
    step = max(1, max_scores // max(1, N * H * S))
    for a in range(0, L, step):
        e = min(a + step, L)
        qf = q[:, :, a:e].float().reshape(N, Hkv, g * (e - a), D)
        s = (qf @ kf).mul_(scale).view(N, Hkv, g, e - a, S)
        keep = None
        if allowed is not None:
            keep = allowed[..., a:e, :] if allowed.shape[-2] == L else allowed
            keep = keep.reshape(keep.shape[0], 1, 1, keep.shape[-2], S)
        if causal:
            c = (torch.arange(S, device=q.device)[None, :] <= torch.arange(a, e, device=q.device)[:, None])
            keep = c if keep is None else keep & c
        if keep is not None:
            s = s.masked_fill(~keep, _NEG_INF)
        l = torch.logsumexp(s, dim=-1)  # (N, Hkv, g, e - a)
        p = torch.exp(s - torch.where(torch.isinf(l), 0.0, l)[..., None])
        out[:, :, a:e] = (p.view(N, Hkv, g * (e - a), S) @ vf).view(N, H, e - a, D)
        lse[:, :, a:e] = l.view(N, H, e - a)
    return out, lse


def _attn_lse(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, scale: float, *,
              causal: bool = False, allowed: torch.Tensor | None = None, call: "_Call | None" = None
              ) -> tuple[torch.Tensor, torch.Tensor]:
    """(out (N, H, L, D) in q.dtype or fp32, lse (N, H, L) fp32) with the best kernel for q.device.

    ``allowed``: bool (N or 1, 1, L, S) extra mask. Rows with no allowed key come back with
    out 0 and lse -inf (the CPU kernel returns lse 0 there; it is fixed here).
    """
    if q.device.type == "cpu" and q.dtype in (torch.float32, torch.bfloat16, torch.float16, torch.float64):
        mask = None
        if allowed is not None:
            shape = torch.broadcast_shapes(allowed.shape)
            mask = torch.where(allowed, torch.zeros((), dtype=q.dtype), torch.full((), _NEG_INF, dtype=q.dtype),
                               out=_scratch("mask", shape, q.dtype, q.device, call) if call else None)
        with call.kernels() if call else _nullcontext():
            out, lse = _cpu_flash(q, k, v, 0.0, causal, attn_mask=mask, scale=scale)
        if allowed is not None:  # the kernel's out is already 0 on such rows: only lse is fixed
            empty = ~allowed.any(-1)  # (N|1, 1, L)
            if bool(empty.any()):
                lse = lse.masked_fill(empty, _NEG_INF)
        return out, lse
    if _cuda_kernel_ok(q):
        with call.kernels() if call else _nullcontext():
            return _cuda_attn_lse(q, k, v, scale, causal, allowed)
    return _math_attn_lse(q, k, v, allowed, scale, causal)


_cuda_efficient = getattr(torch.ops.aten, "_scaled_dot_product_efficient_attention", None)


def _cuda_kernel_ok(t: torch.Tensor) -> bool:
    """Whether torch's CUDA attention kernels take ``t``: on a GPU, in fp32, fp16 or bf16."""
    return t.device.type == "cuda" and t.dtype in (torch.float32, torch.float16, torch.bfloat16)


def repeat_kv_heads(x: torch.Tensor, heads: int, dim: int = 1) -> torch.Tensor:
    """K or V with its ``Hkv`` heads (along ``dim``) repeated to ``heads``, for kernels without
    GQA: query head h reads KV head ``h // (heads / Hkv)``. ``x`` itself when nothing to repeat."""
    hkv = x.shape[dim]
    return x if hkv == heads else x.repeat_interleave(heads // hkv, dim=dim)


def _cu_seqlens(lengths: list[int]) -> torch.Tensor:
    """(n + 1,) int64 cumulative sequence lengths on the host, starting at 0."""
    return torch.tensor([0] + lengths).cumsum(0)


def _unpad_lse(lse: torch.Tensor, lengths: list[int]) -> torch.Tensor:
    """A varlen kernel's per-sequence LSE, padded (nseq, H, >= max length), as (H, total) in
    packing order: sequence i's first ``lengths[i]`` entries."""
    seq = torch.repeat_interleave(torch.arange(len(lengths)), torch.tensor(lengths))  # (total,)
    row = torch.arange(seq.numel()) - _cu_seqlens(lengths)[seq]
    return lse[seq.to(lse.device), :, row.to(lse.device)].transpose(0, 1)  # (H, total)


def _cuda_attn_lse(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, scale: float, causal: bool,
                   allowed: torch.Tensor | None) -> tuple[torch.Tensor, torch.Tensor]:
    """``_attn_lse`` on CUDA: torch's memory-efficient attention kernel
    (``aten._scaled_dot_product_efficient_attention`` with ``compute_log_sumexp=True``; fp32,
    fp16, bf16). It takes no GQA, so K/V heads are repeated per query group; ``allowed`` becomes
    an additive bias whose rows are padded to 16 elements (the kernel's alignment); its LSE comes
    padded to a multiple of 32 queries and is cut back. ``causal`` is top-left, used for square
    segments only. Rows with no allowed key come back as out 0 / lse -inf.

    q: (N, H, L, D); k, v: (N, Hkv, S, D); allowed: bool (N or 1, 1, L, S) or None.
    Returns out (N, H, L, D) in q.dtype and lse (N, H, L) fp32."""
    N, H, L, D = q.shape
    S = k.shape[2]
    k, v = repeat_kv_heads(k, H), repeat_kv_heads(v, H)  # (N, H, S, D)
    q, k, v = (x if x.stride(-1) == 1 else x.contiguous() for x in (q, k, v))
    bias = None
    if allowed is not None:
        allowed = allowed.expand(allowed.shape[0], 1, L, S)
        Sp = -(-S // 16) * 16
        padded = torch.full((allowed.shape[0], 1, L, Sp), _NEG_INF, dtype=q.dtype, device=q.device)
        padded[..., :S].masked_fill_(allowed, 0.0)
        bias = padded[..., :S].expand(N, H, L, S)  # (N, H, L, S) view, row stride Sp
    out, lse = _cuda_efficient(q, k, v, bias, True, 0.0, causal, scale=scale)[:2]
    lse = lse[..., :L]  # (N, H, L)
    if allowed is not None:  # no host sync to ask whether any row is empty: fill unconditionally
        empty = ~allowed.any(-1)  # (N|1, 1, L)
        out = out.masked_fill(empty[..., None], 0.0)
        lse = lse.masked_fill(empty, _NEG_INF)
    return out, lse.float()


# --------------------------------------------------------------------------------------------
# the segment plan of part A

@dataclass
class Segment:
    """One (batch row, top-k slot, group) segment of part A.

    Attributes:
        b, slot, group: where it comes from.
        q_idx: (Lq,) long query indices (0..Tq-1), increasing; k_idx: (Lk,) long key indices
            (positions 0..Tk-1) of the group, increasing.
        counts: (Lq,) long, keys allowed per query (a prefix of k_idx: ``pos(key) <= pos(query)``).
        kind: "causal" (Lq == Lk, query m sees keys 0..m: top-left causal), "bottom_right"
            (query m sees keys 0..m + Lk - Lq) or "stair" (any nondecreasing prefix counts).
    """

    b: int
    slot: int
    group: int
    q_idx: torch.Tensor
    k_idx: torch.Tensor
    counts: torch.Tensor | None
    kind: str


def _dedup_slots(query_groups: torch.Tensor) -> torch.Tensor:
    """Copy of (B, Tq, k) groups with a repeated group in a query's row replaced by
    ``core.NO_GROUP``: a repeated slot joins no group, like a slot a hook emptied."""
    qg = query_groups.clone()
    k = qg.shape[-1]
    for s in range(1, k):
        dup = (query_groups[..., s:s + 1] == query_groups[..., :s]).any(-1)
        qg[..., s] = qg[..., s].masked_fill(dup, core.NO_GROUP)
    return qg


def _causal_rows(counts: torch.Tensor, ar: torch.Tensor, lk: int) -> int | None:
    """c when a segment's query m sees keys ``0 .. m - c`` (``counts == ar - c``) for c = 0, or
    c = 1 with the first row seeing none: the segment is then a causal square of its last
    ``lq - c`` rows against its first ``lq - c`` keys. c = 1 is every segment of slot 1 under
    ``FocusConfig.key_shift`` (docs/method.md §1.7), whose keys are the successors of the
    group's queries. None otherwise. counts, ar: (Lq,) long, ar = 1..Lq."""
    lq = counts.numel()
    if lk >= lq and torch.equal(counts, ar):
        return 0
    if lq > 1 and lk >= lq - 1 and int(counts[0]) == 0 and torch.equal(counts[1:], ar[:-1]):
        return 1
    return None


def plan_segments(query_groups: torch.Tensor, key_group: torch.Tensor) -> list[Segment]:
    """Stable sort by (group, position) and cut into segments (part A's layout, docs/method.md §4).

    query_groups: (B, Tq, k) long >= -1 (-1: no group); key_group: (B, Tk) long >= 0; Tq <= Tk (queries are the
    last Tq positions). Returns the non-empty segments (a group with queries but no earlier
    key gives none: those queries' slot is empty, lse -inf).
    """
    B, Tq, k = query_groups.shape
    Tk = key_group.shape[1]
    P = Tk - Tq
    qg = _dedup_slots(query_groups)
    G = int(max(int(query_groups.max()), int(key_group.max()))) + 1
    segs: list[Segment] = []
    for b in range(B):
        kg = key_group[b]
        korder = torch.argsort(kg, stable=True)
        kcount = torch.bincount(kg, minlength=G).tolist()
        koff = [0]
        for c in kcount[:-1]:
            koff.append(koff[-1] + c)
        for s in range(k):
            qgs = qg[b, :, s]
            same_as_keys = P == 0 and torch.equal(qgs, kg)
            if same_as_keys:  # slot 0 of hard_assign: each segment is a plain causal square
                qorder, qcount, qoff = korder, kcount, koff
            else:
                qorder = torch.argsort(qgs, stable=True)
                qcount = torch.bincount(qgs + 1, minlength=G + 1).tolist()
                qoff = [qcount[0]]
                for c in qcount[1:-1]:
                    qoff.append(qoff[-1] + c)
                qcount = qcount[1:]
            for g in range(G):
                lq, lk = qcount[g], kcount[g]
                if lq == 0 or lk == 0:
                    continue
                qi = qorder[qoff[g]:qoff[g] + lq]
                ki = korder[koff[g]:koff[g] + lk]
                if same_as_keys:
                    segs.append(Segment(b, s, g, qi, ki, None, "causal"))
                    continue
                counts = torch.searchsorted(ki, qi + P, right=True)  # (Lq,) prefix lengths
                if int(counts[-1]) == 0:
                    continue
                ar = torch.arange(1, lq + 1, device=counts.device)
                c = _causal_rows(counts, ar, lk)
                if c is not None:  # rows c.. see keys 0..m-c: a causal square of lq - c rows
                    segs.append(Segment(b, s, g, qi[c:], ki[:lq - c], None, "causal"))
                    continue
                if lk >= lq and torch.equal(counts, ar + (lk - lq)):
                    kind = "bottom_right"
                else:
                    kind = "stair"
                segs.append(Segment(b, s, g, qi, ki, counts, kind))
    return segs


# --------------------------------------------------------------------------------------------
# part A
#
# Internally every tensor is in "rows" layout: (B*T, heads, D), i.e. (B, T, H, D) memory, the
# layout transformers produces. Kernel inputs are (N, H, L, D) views of gathered rows, and the
# CPU kernel then returns outputs in the same (N, L, H, D) memory, so no transposing copies.

def _buckets(segs: list[Segment], waste: float = 1.2) -> list[list[Segment]]:
    """Group equal-shape work: segments sorted by length, a bucket padded to its longest one
    costs at most ``waste`` x the sum of its members' causal costs (L^2)."""
    segs = sorted(segs, key=lambda s: -s.q_idx.numel())
    out: list[list[Segment]] = []
    for sg in segs:
        L = sg.q_idx.numel()
        if out:
            b = out[-1]
            L0 = b[0].q_idx.numel()
            if L0 * L0 * (len(b) + 1) <= waste * (sum(x.q_idx.numel() ** 2 for x in b) + L * L):
                b.append(sg)
                continue
        out.append([sg])
    return out


def _stairs(qrows, krows, vrows, segs: list[Segment], Tq: int, Tk: int, scale: float,
            outA_flat, lseA_flat, nrows: int, call, chunk: int | None = None,
            waste: float = 1.2) -> None:
    """All "stair" / "bottom_right" segments: query m of a segment attends keys
    ``0 .. counts[m]-1`` of its group (counts nondecreasing).

    Every segment is cut into pieces of at most ``chunk`` query rows (default
    ``call.options.stair_chunk``, else STAIR_CHUNK) whose counts span at most ``chunk`` keys:
    a piece's rows all see its first ``lo = counts[first row]`` keys, and only the next
    ``hi - lo <= chunk`` keys (``hi`` = its last row's count) are ragged. So each piece is

    * a ragged part, keys ``lo .. hi-1`` with the stair as the mask. The ragged parts of every
      segment are sorted by width and batched: a batch is padded to its largest member (rows
      and keys) while that costs at most ``waste`` x the members' own work, and runs as ONE
      masked kernel call (padding query rows write to the dummy row ``nrows - 1``, padding keys
      are masked);
    * a rectangle, keys ``0 .. lo-1``, one UNMASKED call per piece on a prefix of the
      segment's keys (gathered once per segment), merged into the ragged result by LSE. On
      CUDA all rectangles go in ONE varlen call instead (``_rectangles_varlen``).

    Pairs computed: the stair plus at most about ``chunk / 2`` keys per query, and only the
    ragged part pays for a mask (building it and adding it in the kernel), where one masked
    call per piece over all its keys made a stair pair cost well above a causal one.
    Writes rows of outA_flat / lseA_flat ((k*nrows, H, D) / (k*nrows, H)); the caller has
    zeroed them (lse -inf).
    """
    if not segs:
        return
    dev = qrows.device
    H, D = qrows.shape[1], qrows.shape[2]
    ck = chunk or call.options.stair_chunk or STAIR_CHUNK
    with call("plan"):
        pieces = []  # (segment, first row, end row, lo, hi)
        prefix: dict[int, int] = {}  # id(segment) -> keys its rectangles need (its last piece's lo)
        # id(segment) -> (q_idx, k_idx, counts) in host memory: the per-piece index bookkeeping
        # below is many tiny slices, which on a GPU would each be a kernel launch
        host = {id(sg): (sg.q_idx.cpu(), sg.k_idx.cpu(), sg.counts.cpu()) for sg in segs}
        for sg in segs:
            counts = host[id(sg)][2].tolist()
            Lq, a = len(counts), 0
            while a < Lq:
                lo = counts[a]
                e = min(a + ck, bisect_left(counts, lo + ck + 1, lo=a + 1))  # rows with count <= lo + ck
                e = max(e, a + 1)
                if counts[e - 1] > 0:
                    pieces.append((sg, a, e, lo, counts[e - 1]))
                    if lo > 0:
                        prefix[id(sg)] = lo  # counts are nondecreasing: the last one is the largest
                a = e
        ragged = sorted((p for p in pieces if p[4] > p[3]), key=lambda p: -(p[4] - p[3]))
        batches: list[list] = []
        for pc in ragged:
            if batches:
                b = batches[-1]
                rows = max(x[2] - x[1] for x in b + [pc])
                width = b[0][4] - b[0][3]
                if len(b + [pc]) * rows * width <= waste * sum((x[2] - x[1]) * (x[4] - x[3]) for x in b + [pc]):
                    b.append(pc)
                    continue
            batches.append([pc])
    for batch in batches:  # the ragged parts, masked
        N, S = len(batch), batch[0][4] - batch[0][3]
        L = max(e - a for _, a, e, _, _ in batch)
        with call("gather"):  # built in host memory, moved to the device once
            src_q = torch.zeros(N, L, dtype=torch.long)
            src_k = torch.zeros(N, S, dtype=torch.long)
            dst = torch.full((N, L), nrows - 1, dtype=torch.long)  # padding -> dummy row
            cnt = torch.zeros(N, L, dtype=torch.long)
            for i, (sg, a, e, lo, hi) in enumerate(batch):
                q_idx, k_idx, counts = host[id(sg)]
                src_q[i, :e - a] = q_idx[a:e] + sg.b * Tq
                src_k[i, :hi - lo] = k_idx[lo:hi] + sg.b * Tk
                dst[i, :e - a] = q_idx[a:e] + sg.b * Tq + sg.slot * nrows
                cnt[i, :e - a] = counts[a:e] - lo
            src_q, src_k, dst, cnt = (x.to(dev) for x in (src_q, src_k, dst, cnt))
            allowed = (torch.arange(S, device=dev) < cnt[..., None])[:, None]  # (N, 1, L, S)
            qb, kb, vb = _gather_qkv(qrows, krows, vrows, src_q, src_k, "S", call)
        with call("attn_A"):
            o, lse = _attn_lse(qb, kb, vb, scale, allowed=allowed, call=call)  # (N, H, L, D), (N, H, L)
        with call("scatter"):
            _scatter_rows(o, lse, dst, outA_flat, lseA_flat)
    rect = [p for p in pieces if p[3] > 0]  # pieces with a rectangle: keys 0 .. lo-1
    if not rect:
        return
    if _pack_rectangles(qrows):
        outR, lseR = _rectangles_varlen(qrows, krows, vrows, rect, prefix, host, Tq, Tk, scale, call)
        _merge_rectangles(rect, outR, lseR, host, Tq, nrows, outA_flat, lseA_flat, call)
        return
    R = sum(e - a for _, a, e, _, _ in rect)
    outR = _scratch("outR", (R, H, D), torch.float32, dev, call)  # (R, H, D) the rectangles' rows
    lseR = _scratch("lseR", (R, H), torch.float32, dev, call)  # (R, H)
    keys: dict[int, tuple] = {}  # id(segment) -> its keys' prefix (Lk, Hkv, D) twice, gathered once
    r = 0
    for sg, a, e, lo, hi in rect:  # the rectangles, unmasked
        with call("gather"):
            if id(sg) not in keys:
                kidx = sg.k_idx[:prefix[id(sg)]] + sg.b * Tk
                keys[id(sg)] = (krows.index_select(0, kidx), vrows.index_select(0, kidx))
            kp, vp = keys[id(sg)]
            qs = qrows.index_select(0, sg.q_idx[a:e] + sg.b * Tq).transpose(0, 1)[None]  # (1, H, L, D)
        with call("attn_A"):
            o, l = _attn_lse(qs, kp[:lo].transpose(0, 1)[None], vp[:lo].transpose(0, 1)[None], scale, call=call)
        with call("scatter"):
            outR[r:r + e - a] = o[0].transpose(0, 1)  # (L, H, D)
            lseR[r:r + e - a] = l[0].transpose(0, 1)  # (L, H), finite: lo > 0 keys
        r += e - a
    _merge_rectangles(rect, outR, lseR, host, Tq, nrows, outA_flat, lseA_flat, call)


def _merge_rectangles(rect, outR, lseR, host, Tq, nrows, outA_flat, lseA_flat, call) -> None:
    """Merge the rectangles' rows ``outR`` (R, H, D) / ``lseR`` (R, H), in ``rect`` order, into
    the ragged results already in ``outA_flat`` / ``lseA_flat`` (lse -inf where a row's ragged
    part is empty). ``host``: id(segment) -> its (q_idx, k_idx, counts) in host memory."""
    with call("merge"):
        dst = torch.cat([host[id(sg)][0][a:e] + sg.b * Tq + sg.slot * nrows
                         for sg, a, e, _, _ in rect]).to(outA_flat.device)  # (R,)
        o, l = merge_lse([outR, outA_flat.index_select(0, dst)], [lseR, lseA_flat.index_select(0, dst)])
        outA_flat.index_copy_(0, dst, o)  # (R, H, D)
        lseA_flat.index_copy_(0, dst, l)  # (R, H)


_cuda_efficient_varlen = getattr(torch.ops.aten, "_efficient_attention_forward", None)


def _pack_rectangles(qrows: torch.Tensor) -> bool:
    """Whether ``_stairs`` packs its rectangles into one varlen call (CUDA, fp32/fp16/bf16): on a
    GPU one call per piece means thousands of small kernel launches per layer."""
    return _cuda_kernel_ok(qrows)


def _rectangles_varlen(qrows, krows, vrows, rect, prefix, host, Tq, Tk, scale, call
                       ) -> tuple[torch.Tensor, torch.Tensor]:
    """Every rectangle of ``_stairs`` in ONE call of torch's memory-efficient kernel in its
    varlen form (``aten._efficient_attention_forward``): the pieces' query rows packed one after
    another (``cu_seqlens_q``), each segment's key prefix gathered once, and piece i reading the
    first ``lo_i`` keys of its segment (``cu_seqlens_k[i]`` = the segment's offset, ``seqlen_k[i]``
    = lo_i, so the pieces of one segment share their keys, as in xformers' padded-keys layout).
    K/V heads repeated for GQA. Returns out (R, H, D) fp32 and lse (R, H) fp32, rows in ``rect``
    order (R = the pieces' rows). ``host``: id(segment) -> its (q_idx, k_idx, counts) in host
    memory, where the index bookkeeping is done."""
    H, dev = qrows.shape[1], qrows.device
    with call("gather"):
        offset: dict[int, int] = {}  # id(segment) -> first row of its keys in the packed keys
        kidx, total = [], 0
        for sg, *_ in rect:
            if id(sg) not in offset:
                offset[id(sg)] = total
                kidx.append(host[id(sg)][1][:prefix[id(sg)]] + sg.b * Tk)
                total += prefix[id(sg)]
        kidx = torch.cat(kidx).to(dev)  # (total,)
        lq = [e - a for _, a, e, _, _ in rect]
        lk = [lo for *_, lo, _ in rect]
        cu_q = _cu_seqlens(lq).to(dev, torch.int32)  # (pieces + 1,)
        starts = torch.tensor([offset[id(sg)] for sg, *_ in rect] + [total], dtype=torch.int32, device=dev)
        seqlen_k = torch.tensor(lk, dtype=torch.int32, device=dev)  # (pieces,)
        qidx = torch.cat([host[id(sg)][0][a:e] + sg.b * Tq for sg, a, e, _, _ in rect]).to(dev)  # (R,)
        q = qrows.index_select(0, qidx)  # (R, H, D)
        k = repeat_kv_heads(krows.index_select(0, kidx), H)  # (total, H, D)
        v = repeat_kv_heads(vrows.index_select(0, kidx), H)
    with call("attn_A"):
        out, lse = _cuda_efficient_varlen(q[None], k[None], v[None], None, cu_q, starts, max(lq), max(lk), 0.0, 0,
                                          True, scale=scale, seqlen_k=seqlen_k)[:2]
    with call("scatter"):  # lse: (pieces, H, max_q padded to 32) -> (R, H)
        return out[0].float(), _unpad_lse(lse, lq).transpose(0, 1).float()


def _gather_qkv(qrows, krows, vrows, src_q: torch.Tensor, src_k: torch.Tensor, tag: str, call
                ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Rows of q (B*Tq, H, D) and k, v (B*Tk, Hkv, D) picked by ``src_q: (N, L)`` and
    ``src_k: (N, S)`` into scratch buffers named by ``tag``: (N, H, L, D), (N, Hkv, S, D) twice."""
    (N, L), S = src_q.shape, src_k.shape[1]
    H, D, Hkv, dev = qrows.shape[1], qrows.shape[2], krows.shape[1], qrows.device
    qb = torch.index_select(qrows, 0, src_q.view(-1), out=_scratch(
        "q" + tag, (N * L, H, D), qrows.dtype, dev, call)).view(N, L, H, D).transpose(1, 2)
    kb = torch.index_select(krows, 0, src_k.view(-1), out=_scratch(
        "k" + tag, (N * S, Hkv, D), krows.dtype, dev, call)).view(N, S, Hkv, D).transpose(1, 2)
    vb = torch.index_select(vrows, 0, src_k.view(-1), out=_scratch(
        "v" + tag, (N * S, Hkv, D), vrows.dtype, dev, call)).view(N, S, Hkv, D).transpose(1, 2)
    return qb, kb, vb


def _scatter_rows(o: torch.Tensor, lse: torch.Tensor, dst: torch.Tensor, out_flat: torch.Tensor,
                  lse_flat: torch.Tensor) -> None:
    """Write ``o: (N, H, L, D)`` and ``lse: (N, H, L)`` into the flat rows ``dst: (N, L)`` of
    ``out_flat`` (rows, H, D) and ``lse_flat`` (rows, H)."""
    N, H, L, D = o.shape
    out_flat.index_copy_(0, dst.view(-1), o.transpose(1, 2).reshape(N * L, H, D).float())
    lse_flat.index_copy_(0, dst.view(-1), lse.transpose(1, 2).reshape(N * L, H))


def _part_a_torch(qrows, krows, vrows, segs, B, Tq, Tk, scale, call, outA_flat, lseA_flat):
    """Part A with the CPU flash kernel (math elsewhere): causal segments padded into buckets,
    one kernel call per bucket; staircase segments batched per query chunk (``_stairs``)."""
    nrows = B * Tq + 1  # + a dummy row that receives the padding
    dev = qrows.device
    for bucket in _buckets([s for s in segs if s.kind == "causal"]):
        N, L = len(bucket), bucket[0].q_idx.numel()
        with call("gather"):
            src_q = torch.zeros(N, L, dtype=torch.long, device=dev)
            src_k = torch.zeros(N, L, dtype=torch.long, device=dev)
            dst = torch.full((N, L), B * Tq, dtype=torch.long, device=dev)
            for i, sg in enumerate(bucket):
                n = sg.q_idx.numel()
                src_q[i, :n] = sg.q_idx + sg.b * Tq
                src_k[i, :n] = sg.k_idx + sg.b * Tk
                dst[i, :n] = sg.q_idx + sg.b * Tq + sg.slot * nrows
            qb, kb, vb = _gather_qkv(qrows, krows, vrows, src_q, src_k, "A", call)
        with call("attn_A"):
            o, lse = _attn_lse(qb, kb, vb, scale, causal=True, call=call)  # (N, H, L, D), (N, H, L)
        with call("scatter"):
            _scatter_rows(o, lse, dst, outA_flat, lseA_flat)
    _stairs(qrows, krows, vrows, [s for s in segs if s.kind != "causal"], Tq, Tk, scale,
            outA_flat, lseA_flat, nrows, call)


def _part_a_flash(qrows, krows, vrows, segs, B, Tq, Tk, scale, call, outA_flat, lseA_flat):
    """Part A on CUDA with a varlen flash kernel (``_varlen_flash``: flash-attn's
    ``flash_attn_varlen_func`` or torch's bundled copy): every causal / bottom-right segment
    packed into one call (``causal=True`` is bottom-right aligned in flash-attn >= 2.1, GQA
    native, with the LSE); staircase segments through ``_stairs`` (``_attn_lse``). Glue tested on
    CPU with a stand-in kernel; torch's bundled kernel tested on an H100 (tests/test_cuda.py);
    the flash-attn package itself untested (it installs only with CUDA)."""
    nrows = B * Tq + 1
    dev = qrows.device
    packed = [s for s in segs if s.kind in ("causal", "bottom_right")]
    if packed:
        with call("gather"):
            qidx = torch.cat([s.q_idx + s.b * Tq for s in packed])
            kidx = torch.cat([s.k_idx + s.b * Tk for s in packed])
            dst = torch.cat([s.q_idx + s.b * Tq + s.slot * nrows for s in packed])
            lq = [s.q_idx.numel() for s in packed]
            lk = [s.k_idx.numel() for s in packed]
            cu_q, cu_k = _cu_seqlens(lq).to(dev, torch.int32), _cu_seqlens(lk).to(dev, torch.int32)
            qp, kp, vp = qrows[qidx], krows[kidx], vrows[kidx]  # (total, H|Hkv, D)
        with call("attn_A"):
            o, lse = _varlen_flash(qp, kp, vp, cu_q, cu_k, max(lq), max(lk), scale)
            if lse.dim() == 3:  # flash-attn < 2.4: (nseq, H, max_seqlen_q), padded
                lse = _unpad_lse(lse, lq)
        with call("scatter"):
            outA_flat.index_copy_(0, dst, o.float())
            lseA_flat.index_copy_(0, dst, lse.float().transpose(0, 1))  # lse: (H, total)
    _stairs(qrows, krows, vrows, [s for s in segs if s.kind not in ("causal", "bottom_right")],
            Tq, Tk, scale, outA_flat, lseA_flat, nrows, call)


@functools.lru_cache(maxsize=None)
def _flex_module():
    """``torch.nn.attention.flex_attention`` when this torch has it (>= 2.5), else None."""
    try:
        from torch.nn.attention import flex_attention
    except Exception:
        return None
    return flex_attention


@functools.lru_cache(maxsize=None)
def _flex_function(device_type: str):
    """FlexAttention for ``device_type``: compiled (``torch.compile``, one kernel per shape) on
    CUDA; eager on CPU, where it materializes the scores (for tests only: compiled CPU
    FlexAttention returns no LSE in torch 2.13)."""
    fa = _flex_module().flex_attention
    if device_type == "cuda":
        compiled = torch.compile(fa, dynamic=False)

        def run(*args, **kwargs):
            # one graph per (packed queries, packed keys) shape: a forward at one length has a
            # few (one per top-k in use); allow more than dynamo's default 8 before it falls
            # back to eager FlexAttention, which materializes the scores
            with torch._dynamo.config.patch(recompile_limit=max(64, torch._dynamo.config.recompile_limit)):
                return compiled(*args, **kwargs)
        return run
    import warnings

    def eager(*args, **kwargs):
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # "flex_attention called without torch.compile()"
            return fa(*args, **kwargs)
    return eager


#: FlexAttention's block size (tokens): the packed queries and keys are padded to a multiple of it
FLEX_BLOCK = 128
_POS_BITS, _GROUP_BITS = 32, 20  # sort keys: (b << 52) | (group << 32) | position


def flex_layout(query_groups: torch.Tensor, key_group: torch.Tensor, block: int = FLEX_BLOCK) -> dict:
    """Part A as ONE block-sparse attention over a packed layout (the "flex" backend), built on
    the groups' device with no host round trip.

    Keys are sorted by (batch row, group, position) and queries, one packed row per (query,
    slot) with its repeated slots dropped, the same way by their slot's group. A packed query
    attends a packed key iff both carry the same (batch row, group) id and ``pos(key) <=
    pos(query)``: exactly part A's pairs (docs/method.md §4), staircases included, with no cut
    into pieces. The ids are constant over runs of the packed order, so a (query block, key
    block) tile is needed only where the blocks' id ranges overlap and the key block starts at
    or before the query block's last position, and is "full" (no mask) when both blocks hold
    one id, no padding, and the key block ends at or before the query block's first position.

    query_groups: (B, Tq, k) long >= -1 (-1: no group; queries at positions Tk - Tq ..); key_group: (B, Tk).
    Returns a dict of long tensors: ``q_src`` (Lq,) rows of (B*Tq) for the packed queries,
    ``dst`` (Lq,) rows ``row + slot * (B*Tq + 1)`` of part A's output (``B*Tq``, the dummy row,
    for padding), ``k_src`` (Lk,), ``q_id``/``q_pos`` (Lq,), ``k_id``/``k_pos`` (Lk,) (id -1 / -2
    on padding), and ``needed``/``full`` (Lq/block, Lk/block) bool tiles; Lq, Lk are B*Tq*k and
    B*Tk rounded up to ``block``. Raises ValueError for more than 2^20 groups or 2^11 rows.
    """
    B, Tq, k = query_groups.shape
    Tk = key_group.shape[1]
    P = Tk - Tq
    dev = key_group.device
    if B >= 1 << (63 - _POS_BITS - _GROUP_BITS) or Tk >= 1 << _POS_BITS:
        raise ValueError(f"flex layout: batch {B} / {Tk} keys exceed its sort-key range")
    qg = _dedup_slots(query_groups)  # (B, Tq, k), NO_GROUP on a repeated slot
    nrows = B * Tq + 1
    bq = torch.arange(B, device=dev)[:, None]  # (B, 1)
    kpos = torch.arange(Tk, device=dev).expand(B, Tk)  # (B, Tk)
    ksort = (bq << 52) | (key_group << _POS_BITS) | kpos  # (B, Tk) unique
    korder = torch.argsort(ksort.reshape(-1))  # (B*Tk,) flat rows b*Tk + pos
    qpos = (torch.arange(Tq, device=dev) + P)[None, :, None].expand(B, Tq, k)  # (B, Tq, k)
    qsort = (bq[..., None] << 52) | (qg.clamp(min=0) << _POS_BITS) | qpos
    qsort = torch.where(qg < 0, torch.iinfo(torch.long).max, qsort)  # repeated slots last
    qorder = torch.argsort(qsort.reshape(-1))  # (B*Tq*k,) flat entries (b*Tq + i)*k + s
    Lq, Lk = -(-B * Tq * k // block) * block, -(-B * Tk // block) * block
    gid = (bq << _GROUP_BITS) | key_group  # (B, Tk) the (row, group) id
    k_id = torch.full((Lk,), -2, dtype=torch.long, device=dev)
    k_pos = torch.full((Lk,), -1, dtype=torch.long, device=dev)
    k_src = torch.zeros(Lk, dtype=torch.long, device=dev)
    k_id[:B * Tk] = gid.reshape(-1)[korder]
    k_pos[:B * Tk] = korder % Tk
    k_src[:B * Tk] = korder
    qid_all = torch.where(qg < 0, -1, (bq[..., None] << _GROUP_BITS) | qg.clamp(min=0)).reshape(-1)
    q_id = torch.full((Lq,), -1, dtype=torch.long, device=dev)
    q_pos = torch.full((Lq,), -1, dtype=torch.long, device=dev)
    q_src = torch.zeros(Lq, dtype=torch.long, device=dev)
    dst = torch.full((Lq,), nrows - 1, dtype=torch.long, device=dev)
    row, slot = qorder // k, qorder % k  # (B*Tq*k,)
    q_id[:B * Tq * k] = qid_all[qorder]
    valid = q_id[:B * Tq * k] >= 0
    q_pos[:B * Tq * k] = torch.where(valid, row % Tq + P, -1)
    q_src[:B * Tq * k] = row
    dst[:B * Tq * k] = torch.where(valid, row + slot * nrows, nrows - 1)
    big = torch.iinfo(torch.long).max

    def tiles(ids, pos):  # per block: id min / max over valid rows, position min / max, all valid
        ok = (ids >= 0).view(-1, block)
        i, p = ids.view(-1, block), pos.view(-1, block)
        return (torch.where(ok, i, big).amin(1), torch.where(ok, i, -1).amax(1),
                torch.where(ok, p, big).amin(1), torch.where(ok, p, -1).amax(1), ok.all(1))

    qi0, qi1, qp0, qp1, qfull = tiles(q_id, q_pos)  # (Lq/block,) each
    ki0, ki1, kp0, kp1, kfull = tiles(k_id, k_pos)  # (Lk/block,) each
    needed = (qi0[:, None] <= ki1[None, :]) & (ki0[None, :] <= qi1[:, None]) & (kp0[None, :] <= qp1[:, None])
    one = (qi0 == qi1) & qfull
    full = needed & one[:, None] & (ki0 == ki1)[None, :] & kfull[None, :] & (qi0[:, None] == ki0[None, :]) \
        & (kp1[None, :] <= qp0[:, None])
    return dict(q_src=q_src, dst=dst, k_src=k_src, q_id=q_id, q_pos=q_pos, k_id=k_id, k_pos=k_pos,
                needed=needed, full=full)


def _flex_block_mask(layout: dict, block: int = FLEX_BLOCK):
    """FlexAttention's ``BlockMask`` for a ``flex_layout``: the needed tiles that are not full
    run with the mask ``same id and pos(key) <= pos(query)``, the full ones without it."""
    fa = _flex_module()
    q_id, q_pos, k_id, k_pos = layout["q_id"], layout["q_pos"], layout["k_id"], layout["k_pos"]

    def mask_mod(b, h, q_idx, kv_idx):
        return (q_id[q_idx] == k_id[kv_idx]) & (k_pos[kv_idx] <= q_pos[q_idx])

    def ordered(m):  # (nq, nk) bool -> counts (1, 1, nq) int32, indices (1, 1, nq, nk) int32
        return (m.sum(-1, dtype=torch.int32)[None, None],
                torch.argsort(m.to(torch.int8), dim=-1, descending=True, stable=True).to(torch.int32)[None, None])

    partial = layout["needed"] & ~layout["full"]
    num, idx = ordered(partial)
    fnum, fidx = ordered(layout["full"])
    kw = dict(BLOCK_SIZE=block, mask_mod=mask_mod, seq_lengths=(q_id.numel(), k_id.numel()))
    try:  # no transposed (query-block) index: it serves the backward only
        return fa.BlockMask.from_kv_blocks(num, idx, fnum, fidx, compute_q_blocks=False, **kw)
    except TypeError:  # torch without that argument
        return fa.BlockMask.from_kv_blocks(num, idx, fnum, fidx, **kw)


def _part_a_flex(qrows, krows, vrows, query_groups, key_group, scale, call, outA_flat, lseA_flat):
    """Part A with FlexAttention (backend "flex"): ``flex_layout`` packs every slot's segments
    and staircases into ONE block-sparse call (compiled on CUDA), GQA native, with its LSE;
    written into rows ``row + slot * nrows`` of outA_flat / lseA_flat (padding into the dummy
    row). No host synchronization: the plan is built by tensor ops on the device."""
    fa = _flex_module()
    H = qrows.shape[1]
    with call("plan"):
        layout = flex_layout(query_groups, key_group)
        block_mask = _flex_block_mask(layout)
    with call("gather"):
        q = qrows.index_select(0, layout["q_src"]).transpose(0, 1)[None]  # (1, H, Lq, D)
        k = krows.index_select(0, layout["k_src"]).transpose(0, 1)[None]  # (1, Hkv, Lk, D)
        v = vrows.index_select(0, layout["k_src"]).transpose(0, 1)[None]
    with call("attn_A"):
        fn = _flex_function(qrows.device.type)
        kw = dict(block_mask=block_mask, scale=scale, enable_gqa=k.shape[1] != H)
        if hasattr(fa, "AuxRequest"):
            o, aux = fn(q, k, v, return_aux=fa.AuxRequest(lse=True), **kw)
            lse = aux.lse
        else:
            o, lse = fn(q, k, v, return_lse=True, **kw)
    with call("scatter"):
        outA_flat.index_copy_(0, layout["dst"], o[0].transpose(0, 1).float())  # (Lq, H, D)
        lseA_flat.index_copy_(0, layout["dst"], lse[0].transpose(0, 1).float())  # (Lq, H)


# --------------------------------------------------------------------------------------------
# part B

def _local_other_groups(qn, kn, vn, query_groups, key_group, window, scale, call,
                        block: int | None = None, max_rows: int | None = None):
    """Part B: pairs ``0 <= i - j < window`` with ``key_group[j] not in query_groups[i]``.

    qn: (B, Tq, H, D), kn, vn: (B, Tk, Hkv, D) rows layout. Queries go in blocks of ``c``
    (default ``clamp(w // 4, 32, 256)``); a block attends the ``W = c + w - 1`` keys ending at
    its last query, read as overlapping strided windows of the keys (no copy, except a small
    zero-padded one for the first blocks, whose windows start before position 0); the band, key
    validity and the other-group condition form the mask. Blocks go ``max_rows`` queries per
    kernel call (CPU and CUDA: 65536; else 8192, the math path materializes scores).
    Returns outB (B, Tq, H, D) and lseB (B, Tq, H) fp32 (-inf where a query has no such pair).
    """
    B, Tq, H, D = qn.shape
    Tk, Hkv = kn.shape[1], kn.shape[2]
    P = Tk - Tq
    w = min(window, Tk)
    c = block or min(max(w // 4, 32), 256)
    dev = qn.device
    max_rows = max_rows or (1 << 16 if dev.type in ("cpu", "cuda") else 8192)
    n_full = Tq // c
    n_head = min(n_full, max(0, -(-(w - 1 - P) // c)))  # blocks whose window starts before 0
    step = max(1, max_rows // c)
    pieces = [(0, n_head, c)] if n_head else []
    pieces += [(s0, min(n_full, s0 + step) - s0, c) for s0 in range(n_head, n_full, step)]
    if Tq % c:
        pieces.append((n_full, 1, Tq % c))  # the last, shorter block
    single = B == 1 and len(pieces) == 1
    if not single:  # scratch: the merge writes the caller's output elsewhere
        outB = _scratch("outB", (B, Tq, H, D), torch.float32, dev, call)
        lseB = _scratch("lseB", (B, Tq, H), torch.float32, dev, call)
    bands = {}
    for b in range(B):
        for blk0, n, cc in pieces:
            W = cc + w - 1
            s0 = blk0 * c  # first query index of the piece
            with call("gather"):
                if (cc, W) not in bands:
                    r = torch.arange(cc, device=dev)[:, None]
                    col = torch.arange(W, device=dev)[None, :]
                    bands[(cc, W)] = (col >= r) & (col <= r + w - 1)  # (cc, W): 0 <= i - j < w
                band = bands[(cc, W)]
                lo = P + s0 - (w - 1)  # position of the first key row of the piece
                hi = lo + (n - 1) * cc + W
                if lo >= 0:
                    ks, vs, kgs = kn[b, lo:hi], vn[b, lo:hi], key_group[b, lo:hi]
                else:  # zero keys (group -1: invalid) before position 0
                    pad = -lo
                    ks = torch.cat([kn.new_zeros(pad, Hkv, D), kn[b, :hi]])
                    vs = torch.cat([vn.new_zeros(pad, Hkv, D), vn[b, :hi]])
                    kgs = torch.cat([key_group.new_full((pad,), -1), key_group[b, :hi]])
                q4 = qn[b, s0:s0 + n * cc].view(n, cc, H, D).transpose(1, 2)  # (n, H, cc, D)
                k4 = ks.unfold(0, W, cc).permute(0, 1, 3, 2)  # (n, Hkv, W, D) view
                v4 = vs.unfold(0, W, cc).permute(0, 1, 3, 2)
                kgw = kgs.unfold(0, W, cc)  # (n, W)
                qgb = query_groups[b, s0:s0 + n * cc].view(n, cc, -1)  # (n, cc, k)
                allowed = kgw[:, None, :] != qgb[..., :1]  # (n, cc, W)
                for s_ in range(1, qgb.shape[-1]):  # k > 1: differs from every group of the query
                    allowed &= kgw[:, None, :] != qgb[..., s_:s_ + 1]
                allowed &= band
                if lo < 0:
                    allowed &= (kgw >= 0)[:, None, :]
            with call("attn_B"):
                o, l = _attn_lse(q4, k4, v4, scale, allowed=allowed[:, None], call=call)
            o = o.transpose(1, 2).reshape(n * cc, H, D)  # no copy: the kernel writes (n, cc, H, D)
            l = l.transpose(1, 2).reshape(n * cc, H)
            if single:
                return o.float().view(1, Tq, H, D), l.view(1, Tq, H)
            with call("scatter"):
                outB[b, s0:s0 + n * cc] = o
                lseB[b, s0:s0 + n * cc] = l
    return outB, lseB


def _sink_other_groups(qn, kn, vn, query_groups, key_group, window, sinks, scale, call):
    """Sink pairs not covered by A or B: ``j < sinks``, ``i - j >= window``, ``g(j)`` not in
    ``G_k(i)`` (core.local_mask's sink rule, docs/method.md §6 [ours]). One call against the first
    ``sinks`` keys. Returns (out (B, Tq, H, D) fp32, lse (B, Tq, H)) or None when no such pair."""
    B, Tq, H, D = qn.shape
    Tk = kn.shape[1]
    S = min(sinks, Tk)
    P = Tk - Tq
    if S <= 0 or P + Tq - 1 < window:  # no query is far enough from any sink
        return None
    with call("gather"):
        qpos = torch.arange(P, Tk, device=qn.device)[:, None]  # (Tq, 1)
        j = torch.arange(S, device=qn.device)[None, :]  # (1, S)
        far = (qpos - j) >= window  # (Tq, S), implies j <= i
        kg = key_group[:, :S]  # (B, S)
        other = (kg[:, None, :, None] != query_groups[:, :, None, :]).all(-1)  # (B, Tq, S)
        allowed = (other & far)[:, None]  # (B, 1, Tq, S)
    with call("attn_B"):
        o, l = _attn_lse(qn.transpose(1, 2), kn[:, :S].transpose(1, 2), vn[:, :S].transpose(1, 2),
                         scale, allowed=allowed, call=call)
    return o.transpose(1, 2).float(), l.transpose(1, 2)


# --------------------------------------------------------------------------------------------
# KV-cache steps: a few queries against a long cache

#: Steps with at most this many queries (and keys before them, Tq < Tk) take ``_few_queries``, but
#: a one-token step: ``GroupedKV`` on the CPU, ``_one_query`` elsewhere.
FEW_QUERIES = 16


def _one_query(query, key, value, query_groups, key_group, window, sinks, scale, return_lse, call):
    """A one-token decode step off the ``core.HOST_DEVICES`` (a GPU): the step's
    row of ``core.hard_mask`` and ONE attention call over the whole cache under it (SDPA; with
    ``return_lse``, ``_attn_lse``). Not ``core.masked_attention``: its guard for rows with no
    kept key costs 6 kernels a layer, and this row always keeps its own key. No gather and
    no host sync: a small model's decode step on a GPU is bound by kernel launches and by the
    host waiting for the device, not by reading the cache (``analyses.kernel_counts``). Work O(Tk),
    as in dense decoding.

    query: (B, H, 1, D) at position Tk - 1; key, value: (B, Hkv, Tk, D); query_groups: (B, 1, k);
    key_group: (B, Tk). Returns out (B, H, 1, D) in query.dtype and lse (B, H, 1) fp32, or None
    without ``return_lse`` (with it, the CUDA kernel repeats the KV heads: ``_cuda_attn_lse``).
    Source: docs/method.md §4 (KV cache)."""
    Tk = key.shape[2]
    with call("plan"):
        k_pos = torch.arange(Tk, device=query.device)  # (Tk,)
        keep = core.hard_mask(query_groups, key_group, window, k_pos[-1:], k_pos, sinks)  # (B, 1, Tk)
    with call("attn_A"):
        if return_lse:
            out, lse = _attn_lse(query, key, value, scale, allowed=keep[:, None], call=call)
            return out.to(query.dtype), lse
        with call.kernels():
            out = F.scaled_dot_product_attention(query, key, value, attn_mask=keep[:, None], scale=scale,
                                                 enable_gqa=key.shape[1] != query.shape[1])  # (B, H, 1, D)
    return out, None


def _few_queries(query, key, value, query_groups, key_group, window, sinks, scale, call):
    """A KV-cache step (``Tq <= FEW_QUERIES < Tk`` typical of decoding): per batch row, the keys
    any of the step's queries keeps (``core.hard_mask``: its window, the sinks, the cached keys of
    its groups) are gathered and ONE attention call runs over them, with the mask restricted to
    those keys when Tq > 1 (a single query keeps every gathered key). Work O(Tk) integer
    bookkeeping plus attention over the kept keys only, about ``(k/K) Tk + w + sinks`` per query
    for balanced groups, instead of the decomposition's per-segment calls over the whole cache.

    query: (B, H, Tq, D); key, value: (B, Hkv, Tk, D); query_groups: (B, Tq, k); key_group:
    (B, Tk). Returns out (B, H, Tq, D) in query.dtype (a view of (B, Tq, H, D) memory) and lse
    (B, H, Tq) fp32."""
    from focus_lab.method.core import hard_mask

    B, H, Tq, D = query.shape
    Tk = key.shape[2]
    dev = query.device
    with call("plan"):
        q_pos = torch.arange(Tk - Tq, Tk, device=dev)
        keep = hard_mask(query_groups, key_group, window, q_pos, torch.arange(Tk, device=dev), sinks)  # (B, Tq, Tk)
    out = torch.empty(B, Tq, H, D, dtype=query.dtype, device=dev)
    lse = torch.empty(B, H, Tq, dtype=torch.float32, device=dev)
    for b in range(B):
        with call("gather"):
            idx = keep[b].any(0).nonzero().squeeze(1)  # (n,) kept keys, increasing
            kb = key[b:b + 1].index_select(2, idx)  # (1, Hkv, n, D)
            vb = value[b:b + 1].index_select(2, idx)
            allowed = keep[b:b + 1, None][..., idx] if Tq > 1 else None  # (1, 1, Tq, n)
        with call("attn_A"):
            o, l = _attn_lse(query[b:b + 1], kb, vb, scale, allowed=allowed, call=call)
        out[b] = o[0].transpose(0, 1)
        lse[b] = l[0]
    return out.transpose(1, 2), lse


class GroupedKV:
    """One routed layer's KV cache ordered by key group, for one-token decode steps (Tq == 1).

    Per batch row and group: the cached keys and values of that group's tokens in position
    order, in buffers grown by doubling, with their positions. A decode step's query at
    position t then attends to contiguous slices only, one attention call each, merged by
    logsumexp like the parts of the prefill (``merge_lse``):

    * the sinks, keys ``0 .. min(sinks, t - w + 1) - 1`` of the position-ordered cache;
    * its window, keys ``t - w + 1 .. t`` of the same cache;
    * per group it joins, the group's keys between the sinks and the window (a slice of the
      group's buffer, its ends found by bisection on the positions).

    These sets are disjoint and their union is the step's row of ``core.hard_mask``, so the
    result equals the masked reference. No per-step mask over the cache and no gather: work
    O(kept keys) plus O(k log n) bookkeeping, against ``_few_queries``' O(Tk) mask and copy
    of the kept keys. Costs a second copy of the layer's keys and values.

    The store is a cache of (keys, values, key groups): ``step`` checks that it holds the
    tokens before the step (their count and the newest key, compared with the KV cache's)
    and rebuilds it from the KV cache otherwise (the first step after a prefill, a reordered
    or replaced cache). Source: docs/method.md §4 (KV cache).
    """

    GROW = 16  # spare slots a group's buffer gets beyond its tokens when it is built or grown

    def __init__(self) -> None:
        self.rows: list[dict[int, list]] = []  # per batch row: {group: [keys, values, positions]}
        self.seen = 0  # tokens held (positions 0 .. seen - 1)
        self.newest: torch.Tensor | None = None  # (B, Hkv, D) the key of token seen - 1

    def _build(self, key: torch.Tensor, value: torch.Tensor, key_group: torch.Tensor) -> None:
        """Hold the T tokens of key, value (B, Hkv, T, D) with their key_group (B, T)."""
        B, Hkv, T, D = key.shape
        self.rows = []
        for b in range(B):
            order = torch.argsort(key_group[b, :T], stable=True)  # (T,) by group, then position
            groups, counts = torch.unique_consecutive(key_group[b, order], return_counts=True)
            kb = key[b].transpose(0, 1).index_select(0, order)  # (T, Hkv, D) group-ordered
            vb = value[b].transpose(0, 1).index_select(0, order)
            pos = order.tolist()
            row, a = {}, 0
            for g, c in zip(groups.tolist(), counts.tolist()):
                kbuf = kb.new_empty(c + max(self.GROW, c // 4), Hkv, D)
                vbuf = torch.empty_like(kbuf)
                kbuf[:c] = kb[a:a + c]
                vbuf[:c] = vb[a:a + c]
                row[g] = [kbuf, vbuf, pos[a:a + c]]
                a += c
            self.rows.append(row)
        self.seen = T
        self.newest = key[:, :, T - 1].clone() if T else None

    def _append(self, key: torch.Tensor, value: torch.Tensor, groups: list[int]) -> None:
        """Add one token: key, value (B, Hkv, D) at position ``seen``, of groups[b] in row b."""
        for b, g in enumerate(groups):
            entry = self.rows[b].get(g)
            if entry is None:
                entry = self.rows[b][g] = [key.new_empty(self.GROW, *key.shape[1:]),
                                           value.new_empty(self.GROW, *value.shape[1:]), []]
            kbuf, vbuf, pos = entry
            n = len(pos)
            if n == kbuf.shape[0]:  # full: double
                entry[0] = kbuf = torch.cat([kbuf, torch.empty_like(kbuf)])
                entry[1] = vbuf = torch.cat([vbuf, torch.empty_like(vbuf)])
            kbuf[n] = key[b]
            vbuf[n] = value[b]
            pos.append(self.seen)
        self.seen += 1
        self.newest = key.clone()

    def step(self, query: torch.Tensor, key: torch.Tensor, value: torch.Tensor,
             query_groups: torch.Tensor, key_group: torch.Tensor, window: int, sinks: int,
             scale: float, call: "_Call") -> tuple[torch.Tensor, torch.Tensor]:
        """Attention of one decode step, exactly ``masked_attention(q, k, v, hard_mask(...))``.

        query: (B, H, 1, D) at position Tk - 1; key, value: (B, Hkv, Tk, D) the whole KV cache,
        this step's token last; query_groups: (B, 1, k) long; key_group: (B, Tk) long, every
        cached token's group. Returns out (B, H, 1, D) in query.dtype and lse (B, H, 1) fp32.
        """
        B, H, _, D = query.shape
        Tk = key.shape[2]
        t = Tk - 1  # the query's position
        with call("plan"):
            held = self.seen == t and len(self.rows) == B and t > 0 and \
                torch.equal(self.newest, key[:, :, t - 1])
            if held:
                self._append(key[:, :, t], value[:, :, t], key_group[:, t].tolist())
            else:  # the first step after a prefill, or a cache this store does not mirror
                self._build(key, value, key_group)
            lo_w = max(0, t - window + 1)  # the window: keys lo_w .. t
            s_end = min(sinks, lo_w)  # the sinks outside the window: keys 0 .. s_end - 1
            qgs = query_groups[:, 0].tolist()  # (B, k)
        outs, lses = [], []
        for b in range(B):
            with call("gather"):
                parts = [(key[b:b + 1, :, lo_w:], value[b:b + 1, :, lo_w:])]
                if s_end > 0:
                    parts.append((key[b:b + 1, :, :s_end], value[b:b + 1, :, :s_end]))
                for g in dict.fromkeys(qgs[b]):  # a repeated group counts once
                    entry = self.rows[b].get(g)
                    if entry is None:
                        continue
                    kbuf, vbuf, pos = entry
                    lo, hi = bisect_left(pos, sinks), bisect_left(pos, lo_w)
                    if hi > lo:  # (n, Hkv, D) -> (1, Hkv, n, D) views, no copy
                        parts.append((kbuf[lo:hi].transpose(0, 1)[None], vbuf[lo:hi].transpose(0, 1)[None]))
            with call("attn_A"):
                res = [_attn_lse(query[b:b + 1], k, v, scale, call=call) for k, v in parts]
            with call("merge"):
                o, l = merge_lse([r[0] for r in res], [r[1] for r in res])
            outs.append(o)
            lses.append(l)
        return torch.cat(outs).to(query.dtype), torch.cat(lses)


def merge_lse(outs: list[torch.Tensor], lses: list[torch.Tensor],
              inplace: bool = False) -> tuple[torch.Tensor, torch.Tensor]:
    """Merge attention results over disjoint key sets: ``o = sum_p e^{lse_p} o_p / sum_p e^{lse_p}``
    (docs/method.md §4). The one place this formula lives: the prefill's parts, the staircase
    pieces, the few-query steps and the token-match part all merge through it.

    outs: P tensors (..., D), e.g. (N, H, L, D); lses: P tensors (...), e.g. (N, H, L), -inf for
    an empty part (weight 0; at least one part finite per row). Returns (out (..., D) fp32,
    lse (...) fp32), the attention over the union and its logsumexp. ``inplace``: write ``out``
    over ``outs[0]`` (an fp32 tensor the caller no longer needs) instead of a new tensor.
    """
    lse_all = torch.stack([l.float() for l in lses])  # (P, ...)
    m = lse_all.amax(0)  # (...), finite
    wts = torch.exp(lse_all - m)  # (P, ...), 0 for an empty part
    den = wts.sum(0)  # (...)
    wts /= den
    first = outs[0].float()
    if inplace and first is outs[0]:
        out = first.mul_(wts[0][..., None])  # (..., D), over outs[0]
    else:
        out = first * wts[0][..., None]  # (..., D), a new tensor
    for o, w in zip(outs[1:], wts[1:]):
        out.addcmul_(o.float(), w[..., None])
    return out, m + torch.log(den)


# --------------------------------------------------------------------------------------------
# the public function

def hard_focus_attention(query: torch.Tensor, key: torch.Tensor, value: torch.Tensor,
                         query_groups: torch.Tensor, key_group: torch.Tensor, window: int,
                         scaling: float | None = None, backend: str = "auto",
                         return_lse: bool = False, timings: dict | None = None, sinks: int = 0,
                         options: DecompositionOptions | None = None, grouped: "GroupedKV | None" = None,
                         extra_pairs: torch.Tensor | None = None):
    """Hard Focus attention, exactly ``masked_attention(q, k, v, hard_mask(...))`` (docs/method.md §4).

    Args:
        query: (B, H, Tq, D); key, value: (B, Hkv, Tk, D), H a multiple of Hkv (GQA), Tq <= Tk:
            query i sits at position ``Tk - Tq + i`` (Tq < Tk is a KV-cache step). Any strides;
            the (B, T, H, D) memory layout transformers produces avoids a copy.
        query_groups: (B, Tq, k) long >= 0, the groups each query joins (docs/method.md §2 top-k);
            a slot -1 (``core.NO_GROUP``) joins none;
            a group repeated in a row counts once. (B, Tq) is read as k = 1.
        key_group: (B, Tk) long >= 0, the one group of each key (its top-1).
        window: w >= 1 in tokens; pairs with ``0 <= i - j < w`` are always kept.
        scaling: logit scale, default ``1 / sqrt(D)``.
        backend: "auto" | "torch" | "flash" | "flex" (see the module docstring).
        return_lse: also return the logsumexp of the kept (scaled) logits.
        timings: optional dict; wall seconds per phase are added under "plan" (sort, segment
            layout), "gather", "attn_A", "attn_B", "attn_D" (part D), "scatter" and "merge".
        sinks: keys at positions ``< sinks`` are always kept, like the window (the
            ``sinks`` argument of core.hard_mask, FocusConfig.sink_tokens); their pairs outside
            A and B form a third small part merged like the others.
        options: CPU performance knobs (``DecompositionOptions``; default ``DEFAULT_OPTIONS``).
        grouped: a one-token decode step (Tq == 1 < Tk) attends through this layer's
            ``GroupedKV`` (kept between steps by the caller, ``retrofit.FocusCache``): slices
            of group-ordered keys instead of a mask over the whole cache, on the
            ``core.HOST_DEVICES`` (the CPU). Ignored otherwise: elsewhere (a GPU) a
            one-token step attends to the whole cache under its row of the mask, one call and
            no host sync (``_one_query``).
        extra_pairs: (P, 3) long rows (b, i, j) of more pairs to keep (token-match pairs,
            docs/method.md §2.8): the mask becomes ``hard_mask(..., match=M)`` with M True on
            them. Pairs the mask already keeps (or non-causal ones) are dropped
            (``core.other_group_pairs``); the rest form part D.
    Returns:
        out (B, H, Tq, D) in query.dtype, a view of (B, Tq, H, D) memory; with ``return_lse``
        also lse (B, H, Tq) fp32.
    Raises:
        ValueError: bad shapes, dtypes, window, negative groups, or an unusable backend. A
            one-token step off the CPU does not look for negative groups (it would make the
            host wait for the device); there a negative group joins no key.
    """
    if query.dim() != 4 or key.dim() != 4 or value.shape != key.shape:
        raise ValueError(f"need query (B,H,Tq,D) and key/value (B,Hkv,Tk,D); got {tuple(query.shape)}, "
                         f"{tuple(key.shape)}, {tuple(value.shape)}")
    B, H, Tq, D = query.shape
    Bk, Hkv, Tk, Dk = key.shape
    if Bk != B or Dk != D or H % Hkv != 0 or Tq > Tk:
        raise ValueError(f"incompatible shapes: query {tuple(query.shape)}, key {tuple(key.shape)} "
                         "(need equal B and D, H a multiple of Hkv, Tq <= Tk)")
    if query_groups.dim() == 2:
        query_groups = query_groups[..., None]
    if query_groups.shape[:2] != (B, Tq) or key_group.shape != (B, Tk):
        raise ValueError(f"need query_groups (B,Tq,k)=({B},{Tq},k) and key_group (B,Tk)=({B},{Tk}); "
                         f"got {tuple(query_groups.shape)}, {tuple(key_group.shape)}")
    if query_groups.dtype != torch.long or key_group.dtype != torch.long:
        raise ValueError("query_groups and key_group must be torch.long group indices")
    if isinstance(window, bool) or not isinstance(window, int) or window < 1:
        raise ValueError(f"window={window!r}: need an integer >= 1")
    if isinstance(sinks, bool) or not isinstance(sinks, int) or sinks < 0:
        raise ValueError(f"sinks={sinks!r}: need an integer >= 0")
    options = DEFAULT_OPTIONS if options is None else options
    serial = query.device.type == "cpu" and options.serial_bookkeeping and \
        (options.serial_max_elements is None or query.numel() <= options.serial_max_elements)
    call = _Call(timings, query.device, options, kernel_threads=torch.get_num_threads())
    if extra_pairs is not None:
        with call("plan"):
            extra_pairs = other_group_pairs(extra_pairs.to(query.device), query_groups.to(query.device),
                                            key_group.to(query.device), Tq, Tk, window, sinks)
    if extra_pairs is None or extra_pairs.shape[0] == 0:
        with torch_threads(1) if serial else _nullcontext():
            return _hard_focus_attention(query, key, value, query_groups, key_group, window, scaling,
                                         backend, return_lse, sinks, call, grouped)
    with torch_threads(1) if serial else _nullcontext():
        out, lse = _hard_focus_attention(query, key, value, query_groups, key_group, window, scaling,
                                         backend, True, sinks, call, grouped)
    scale = 1.0 / math.sqrt(D) if scaling is None else float(scaling)
    out_d, lse_d = _pairs_part(query, key, value, extra_pairs, scale, call)
    with call("merge"):
        out, lse = merge_lse([out, out_d], [lse, lse_d])  # (B, H, Tq, D), (B, H, Tq) fp32
    out = out.to(query.dtype)
    return (out, lse) if return_lse else out


def _hard_focus_attention(query, key, value, query_groups, key_group, window, scaling, backend,
                          return_lse, sinks, call: _Call, grouped: GroupedKV | None = None):
    B, H, Tq, D = query.shape
    Hkv, Tk = key.shape[1], key.shape[2]
    be = resolve_backend(backend, query.device, query.dtype, top_k=query_groups.shape[-1])
    if Tq == 0 or B == 0:
        out = query.new_zeros(query.shape)
        return (out, query.new_zeros((B, H, Tq), dtype=torch.float32)) if return_lse else out
    scale = 1.0 / math.sqrt(D) if scaling is None else float(scaling)
    query_groups = query_groups.to(query.device)
    key_group = key_group.to(query.device)
    if Tq == 1 < Tk and not core.on_host(query):  # a GPU's decode step: no host sync
        out, lse = _one_query(query, key, value, query_groups, key_group, window, sinks, scale, return_lse, call)
        return (out, lse) if return_lse else out
    if int(query_groups.min()) < core.NO_GROUP or int(key_group.min()) < 0:
        raise ValueError("group indices must be >= 0 (a query slot: -1, core.NO_GROUP, joins no group)")
    k = query_groups.shape[-1]
    if Tq == 1 < Tk and grouped is not None:  # on the CPU (the GPU's step returned above): slices, no gather
        out, lse = grouped.step(query, key, value, query_groups, key_group, window, sinks, scale, call)
        return (out, lse) if return_lse else out
    if Tq < Tk and Tq <= FEW_QUERIES:  # a KV-cache step: gather the kept keys, one call per row
        out, lse = _few_queries(query, key, value, query_groups, key_group, window, sinks, scale, call)
        return (out, lse) if return_lse else out

    with call("gather"):
        qn = query.transpose(1, 2).contiguous()  # (B, Tq, H, D); no copy for transformers' layout
        kn = key.transpose(1, 2).contiguous()  # (B, Tk, Hkv, D)
        vn = value.transpose(1, 2).contiguous()
    nrows = B * Tq + 1
    rows = (qn.view(B * Tq, H, D), kn.view(B * Tk, Hkv, D), vn.view(B * Tk, Hkv, D))
    if be == "flex":  # part A in one block-sparse call, planned on the device (no segments)
        ka = k
        outA = _scratch("outA", (k * nrows, H, D), torch.float32, query.device, call).zero_()
        lseA = _scratch("lseA", (k * nrows, H), torch.float32, query.device, call).fill_(_NEG_INF)
        _part_a_flex(*rows, query_groups, key_group, scale, call, outA, lseA)
    else:
        with call("plan"):
            segs = plan_segments(query_groups, key_group)
        ka = k if segs else 0  # slots of part A in the merge (none in window mode: no shared group)
        # every row gets written when top-1 slots are causal segments covering all queries (k = 1
        # from hard_assign): then skip zero-filling the buffers (a full pass over q-sized memory)
        if k == 1 and all(sg.kind == "causal" for sg in segs) and sum(sg.q_idx.numel() for sg in segs) == B * Tq:
            outA = _scratch("outA", (nrows, H, D), torch.float32, query.device, call)
            lseA = _scratch("lseA", (nrows, H), torch.float32, query.device, call)
        elif ka:
            outA = _scratch("outA", (k * nrows, H, D), torch.float32, query.device, call).zero_()
            lseA = _scratch("lseA", (k * nrows, H), torch.float32, query.device, call).fill_(_NEG_INF)
        if ka:
            part_a = _part_a_flash if be == "flash" else _part_a_torch
            part_a(*rows, segs, B, Tq, Tk, scale, call, outA, lseA)
    outB, lseB = _local_other_groups(qn, kn, vn, query_groups, key_group, window, scale, call)
    sink = _sink_other_groups(qn, kn, vn, query_groups, key_group, window, sinks, scale, call)

    with call("merge"):
        n = B * Tq
        outs = [outB.view(n, H, D)] + [outA.view(k, nrows, H, D)[s, :n] for s in range(ka)]  # (n, H, D) each
        lses = [lseB.view(n, H)] + [lseA.view(k, nrows, H)[s, :n] for s in range(ka)]  # (n, H) each
        if sink is not None:
            outs.append(sink[0].reshape(n, H, D))
            lses.append(sink[1].reshape(n, H))
        fresh = _is_scratch(outB)  # then a fresh output: its first touch (page faults) on all threads
        with call.kernels() if fresh else _nullcontext():
            out, lse = merge_lse(outs, lses, inplace=not fresh)  # (n, H, D), (n, H) fp32
        out = out.view(B, Tq, H, D).to(query.dtype).transpose(1, 2)
    if return_lse:
        return out, lse.view(B, Tq, H).transpose(1, 2)
    return out


#: bytes of gathered keys (or values) per chunk of query rows in ``_pairs_part``
PAIRS_CHUNK_BYTES = 64 << 20


def _pairs_part(query, key, value, pairs, scale, call, waste: float = 1.25):
    """Part D: attention over a list of extra pairs disjoint from parts A-C (``core.other_group_pairs``).

    The pairs, sorted by query row, become per row a list of key indices; rows are ordered by
    their number of pairs and cut into buckets whose longest row is at most ``waste`` times the
    shortest, so padding stays small although a frequent token's row may hold hundreds of
    pairs and a rare one's one. Each bucket (in chunks of rows) gathers its keys and values and
    attends in two einsums with a padding mask.

    query: (B, H, Tq, D); key, value: (B, Hkv, Tk, D); pairs: (P, 3) long (b, i, j) sorted by
    (b, i). Returns out (B, H, Tq, D) fp32 and lse (B, H, Tq) fp32, -inf (and out 0) on a query
    row without a pair."""
    B, H, Tq, D = query.shape
    Hkv = key.shape[1]
    g = H // Hkv
    n = B * Tq
    with call("attn_D"):
        if n == 1:  # a one-token decode step: its pairs are one row, no table to build
            q = query[0, :, 0].float().view(Hkv, g, D)  # (Hkv, g, D)
            j = pairs[:, 2]
            lg = torch.einsum("kgd,kpd->kgp", q, key[0][:, j].float()) * scale  # (Hkv, g, P)
            l = torch.logsumexp(lg, -1)  # (Hkv, g)
            o = torch.einsum("kgp,kpd->kgd", torch.exp(lg - l[..., None]), value[0][:, j].float())
            return o.reshape(1, H, 1, D), l.reshape(1, H, 1)
        row = pairs[:, 0] * Tq + pairs[:, 1]  # (P,) non-decreasing
        rows, counts = torch.unique_consecutive(row, return_counts=True)  # (R,), (R,)
        first = counts.cumsum(0) - counts  # (R,) each row's first pair
        order = torch.argsort(counts, stable=True)  # rows by their number of pairs
        cs = counts[order].tolist()
        out = torch.zeros(n, H, D, dtype=torch.float32, device=query.device)  # (n, H, D)
        lse = torch.full((n, H), _NEG_INF, dtype=torch.float32, device=query.device)  # (n, H)
        a = 0
        while a < len(cs):
            e = bisect_left(cs, int(cs[a] * waste) + 1, lo=a)  # rows a..e-1: longest <= waste x shortest
            M = cs[e - 1]
            step = max(1, PAIRS_CHUNK_BYTES // (M * Hkv * D * 4))
            for c in range(a, e, step):
                sel = order[c:min(e, c + step)]  # (r,) rows of this chunk
                slot = torch.arange(M, device=row.device)  # (M,)
                ok = slot[None, :] < counts[sel, None]  # (r, M) real pairs, not padding
                at = (first[sel, None] + slot[None, :]).clamp(max=row.numel() - 1)  # (r, M) into pairs
                kk = pairs[at, 2]  # (r, M) key index
                b = (rows[sel] // Tq)[:, None]  # (r, 1) batch row
                q = query[b[:, 0], :, rows[sel] % Tq].float().view(-1, Hkv, g, D)  # (r, Hkv, g, D)
                k = key[b, :, kk].float()  # (r, M, Hkv, D): only the listed keys are read
                lg = torch.einsum("rkgd,rmkd->rkgm", q, k) * scale  # (r, Hkv, g, M)
                lg.masked_fill_(~ok[:, None, None, :], _NEG_INF)
                l = torch.logsumexp(lg, -1)  # (r, Hkv, g), finite: each row has a pair
                p = torch.exp(lg - l[..., None])
                o = torch.einsum("rkgm,rmkd->rkgd", p, value[b, :, kk].float())  # (r, Hkv, g, D)
                out[rows[sel]] = o.reshape(-1, H, D)
                lse[rows[sel]] = l.reshape(-1, H)
            a = e
    return out.view(B, Tq, H, D).transpose(1, 2), lse.view(B, Tq, H).transpose(1, 2)


def reference_hard_attention(query, key, value, query_groups, key_group, window, scaling=None,
                             sinks: int = 0, match: torch.Tensor | None = None):
    """The dense O(T^2) reference: ``core.masked_attention(q, k, v, core.hard_mask(...))``,
    same arguments as hard_focus_attention (``match``: (B, Tq, Tk) bool extra pairs, the mask
    form of ``extra_pairs``). Returns (B, H, Tq, D)."""
    from focus_lab.method.core import hard_mask, masked_attention

    Tq, Tk = query.shape[2], key.shape[2]
    q_pos = torch.arange(Tk - Tq, Tk, device=query.device)
    k_pos = torch.arange(Tk, device=query.device)
    if query_groups.dim() == 2:
        query_groups = query_groups[..., None]
    mask = hard_mask(query_groups, key_group, window, q_pos, k_pos, sinks, match)
    return masked_attention(query, key, value, mask, scaling)
