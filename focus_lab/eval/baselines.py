"""Baselines in the Focus harness: one mask rule, one gate, one attention path.

Every baseline is either a FocusConfig (sliding window only, random groups) or a ``core.Router``
subclass that changes *how scores become groups* through the one extension point
``Router.assign`` (or how scores are made, ``Router.forward``). The hard mask
(``core.hard_mask``: window + sinks + same group), the soft gate (``core.soft_gate_bias``),
the attention path (``retrofit.focus_attention``, the decomposition in hard mode), the
evaluation (``evaluate.evaluate``) and the recorder (``focus_lab.recording.recorder``) are those of Focus,
so the numbers are comparable at matched sparsity (the fraction of distant causal pairs a
mask keeps, ``core.distant_pairs_kept``, is reported for every hard pattern).

| baseline | what it is | source |
|---|---|---|
| ``window`` | local pairs only (+ sink tokens): ``mode="window"`` | Longformer's local attention (Beltagy et al. 2020) |
| ``window_matched`` | a wider window with as many kept pairs as Focus top-k | equal-sparsity control [ours] |
| ``random`` | fixed random groups, ``assignment="random"`` | control at equal sparsity |
| ``kmeans`` | ``KMeansRouter``: scikit-learn k-means on the router inputs, score ``-||x - mu_c||^2`` | the recorder's k-means baseline |
| ``online_kmeans`` | ``OnlineKMeansRouter``: centroids = EMA of assigned router inputs over a pass of training text, no gradient | Routing Transformer (Roy et al. 2021) |
| ``moba`` | ``MoBARouter``: key group = its block of positions; a query picks its top-k past blocks by ``q . mean(k)`` | MoBA (Lu et al. 2025), training-free |
| ``lora`` | peft LoRA on q/v at the router's parameter budget, trained like the router | Hu et al. 2022; docs/method.md §7 |

Two more Router subclasses serve the analyses: ``SoftmaxRouter`` (plain softmax over groups
instead of Sinkhorn: the collapse, docs/method.md §1) and ``PrefixCausalRouter`` (Sinkhorn over the
prefix ``<= i`` only: the causal variant of the soft gate, docs/method.md §1 [ours]).
"""

from __future__ import annotations

import math
import time
from pathlib import Path
from typing import Callable, Iterable, Sequence

import numpy as np
import pandas as pd
import torch
import torch.nn as nn

from focus_lab.method.config import FocusConfig, TrainConfig
from focus_lab.method import core
from focus_lab.method.core import Router, distant_pairs_kept, sinkhorn
from focus_lab.eval.evaluate import add_speedup, evaluate, standard_patterns
from focus_lab.hf.hooks import hooks
from focus_lab.hf.retrofit import attach, attention_modules, detach, forward_state, is_attached, load_routers

__all__ = [
    "SoftmaxRouter", "PrefixCausalRouter", "KMeansRouter", "OnlineKMeansRouter", "MoBARouter",
    "prefix_sinkhorn", "swap_routers", "restore_routers", "capture_router_inputs",
    "fit_kmeans_routers", "fit_online_kmeans_routers", "use_moba", "moba_distant_kept", "moba_matched_top_k", "matched_window_size", "window_distant_kept",
    "router_parameter_count", "lora_param_count", "lora_rank_for_budget", "train_lora",
    "evaluate_baselines", "BASELINES",
]

BASELINES = ("focus", "window", "window_matched", "random", "kmeans", "online_kmeans", "moba")


# --------------------------------------------------------------------------------------------
# router subclasses

def _normalized(h: torch.Tensor, config: FocusConfig) -> torch.Tensor:
    """The router's own input normalization (``core.Router.forward``): RMS over d_model."""
    return core.rms_normalize(h) if config.normalize_input else h.float()


class SoftmaxRouter(Router):
    """Focus router whose soft assignment is a plain softmax over groups, ``P_ig =
    softmax_g(S_ig / tau)``, with no Sinkhorn balancing (docs/method.md §1: "with plain softmax one
    group absorbs almost every token"). No column potential, so the group bias stays 0.
    Hard assignment: ``core.hard_groups`` as for Focus."""

    key_router_allowed = False  # one projection for both roles

    def assign(self, scores, config, token_mask=None, start=0):
        log_p = None
        if config.mode == "soft" or self.training:
            log_p = torch.log_softmax(scores.float() / config.tau, dim=-1)  # (B, T, K)
        qg, kg = core.hard_groups(scores, config, self.layer_idx, self.group_bias)
        return log_p, None, qg, kg


def prefix_sinkhorn(scores: torch.Tensor, tau: float, iters: int, token_mask: torch.Tensor | None = None,
                    chunk: int = 64) -> torch.Tensor:
    """Prefix-causal Sinkhorn: row ``i`` of ``core.sinkhorn`` run over the tokens ``j <= i`` only.

    ``P_i = sinkhorn(S[:i+1], tau, N)[i]``: token i's soft groups depend on tokens <= i, so
    the soft gate has no look-ahead (docs/method.md §1 [ours], the causal leak). Computed with
    ``core.sinkhorn``'s token mask, ``chunk`` prefixes at a time: O(T^2 K N).

    scores: (B, T, K); token_mask: optional (B, T) bool (padding). Returns log_p (B, T, K).
    """
    B, T, K = scores.shape
    out = scores.new_empty(B, T, K, dtype=torch.float32)
    pos = torch.arange(T, device=scores.device)
    for a in range(0, T, chunk):
        b = min(T, a + chunk)
        c = b - a
        s = scores[:, None, :b].expand(B, c, b, K).reshape(B * c, b, K)
        m = pos[None, :b] <= pos[a:b, None]  # (c, b): prefix of each query
        m = m[None].expand(B, c, b)
        if token_mask is not None:
            m = m & token_mask[:, None, :b]
        lp, _ = sinkhorn(s, tau, iters, m.reshape(B * c, b))
        lp = lp.view(B, c, b, K)
        out[:, a:b] = lp[:, torch.arange(c), pos[a:b]]
    return out


class PrefixCausalRouter(Router):
    """Focus router whose soft assignment is ``prefix_sinkhorn`` (no look-ahead); the hard
    assignment is Focus's causal ``core.hard_groups``. Same parameters as ``Router``."""

    key_router_allowed = False  # one projection for both roles

    def assign(self, scores, config, token_mask=None, start=0):
        log_p = None
        if config.mode == "soft" or self.training:
            log_p = prefix_sinkhorn(scores, config.tau, config.sinkhorn_iters, token_mask)
        qg, kg = core.hard_groups(scores, config, self.layer_idx, self.group_bias)
        return log_p, None, qg, kg


class KMeansRouter(Router):
    """k-means groups: ``S_ig = -||x_i - mu_g||^2`` with ``x`` the router input after the
    router's RMS normalization and ``mu`` the (K, d_model) buffer ``means`` (fitted by
    scikit-learn ``KMeans`` in ``fit_kmeans_routers``). Top-1 = nearest centroid, top-k = the k
    nearest; no training, hard mode (soft mode would apply Sinkhorn to ``-dist / tau``)."""

    key_router_allowed = False  # one projection for both roles

    def __init__(self, d_model: int, config: FocusConfig, layer_idx: int, means: torch.Tensor | None = None):
        super().__init__(d_model, config, layer_idx)
        K = config.num_groups
        self.register_buffer("means", torch.zeros(K, d_model) if means is None else means.float().clone())

    def forward(self, h: torch.Tensor, config: FocusConfig | None = None, start: int = 0) -> torch.Tensor:
        x = _normalized(h, config or self.config)  # (B, T, d)
        mu = self.means.to(x.device)
        d2 = x.pow(2).sum(-1, keepdim=True) - 2 * x @ mu.T + mu.pow(2).sum(-1)  # (B, T, K)
        return -d2


class OnlineKMeansRouter(KMeansRouter):
    """Routing-Transformer-style online k-means (Roy et al. 2021): while ``learning`` is True,
    every forward assigns each router input to its nearest centroid and moves the centroid
    ``mu_g <- decay * mu_g + (1 - decay) * mean(x assigned to g)`` (no gradient). Centroids start
    at K distinct tokens of the first batch (seeded). [ours] squared Euclidean distance on
    RMS-normalized inputs instead of the paper's dot product on unit vectors (the same order
    for vectors of equal norm)."""

    def __init__(self, d_model: int, config: FocusConfig, layer_idx: int, decay: float = 0.9):
        super().__init__(d_model, config, layer_idx)
        self.decay = float(decay)
        self.learning = False
        self.register_buffer("initialized", torch.tensor(False))

    def forward(self, h: torch.Tensor, config: FocusConfig | None = None, start: int = 0) -> torch.Tensor:
        if self.learning:
            with torch.no_grad():
                x = _normalized(h, config or self.config).reshape(-1, h.shape[-1])  # (N, d)
                if not bool(self.initialized):
                    g = torch.Generator().manual_seed(core.layer_seed(self.config.seed, self.layer_idx))
                    idx = torch.randperm(x.shape[0], generator=g)[: self.means.shape[0]]
                    self.means[: len(idx)] = x[idx].to(self.means)
                    self.initialized.fill_(True)
                d2 = torch.cdist(x, self.means.to(x))  # (N, K)
                c = d2.argmin(-1)
                K = self.means.shape[0]
                sums = torch.zeros(K, x.shape[1], dtype=x.dtype).index_add_(0, c, x)
                counts = torch.bincount(c, minlength=K).to(x.dtype)
                hit = counts > 0
                new = sums[hit] / counts[hit, None]
                self.means[hit] = self.decay * self.means[hit] + (1 - self.decay) * new.to(self.means)
        return super().forward(h, config, start)


class MoBARouter(Router):
    """MoBA-style block gate (Lu et al. 2025), training-free.

    Keys: token j's group is its block ``floor(j / block_size)`` (so ``num_groups`` must cover
    ``ceil(T / block_size)`` blocks). Queries: token i scores every block by the similarity of
    its query to the block's mean key, ``s_ib = mean_h (q_i^h . mean_{j in b} k_j^h) * scale``,
    with the layer's own ``q_proj`` / ``k_proj`` (before RoPE; GQA: query head h reads kv head
    h // (H / Hkv)), or of the RMS-normalized router inputs when the layer has no such
    projections; and keeps its ``top_k`` highest *strictly past* blocks. Its current block is
    kept through the local window (``block_size <= window`` is required). Blocks at or after
    the query's own only fill the top-k slots of early queries; the causal mask removes them.

    KV-cache decoding: the router keeps the gate's keys (or normalized inputs) of every position
    it has seen, in a buffer of ``num_groups * block_size`` positions; a forward from ``start``
    keeps the first ``start`` of them and writes its own after them, so a decode step scores the
    same block means as a full forward, and a decode that restarts from an earlier position (a
    copied prefill cache) drops what followed.
    """

    key_router_allowed = False  # one projection for both roles

    def __init__(self, d_model: int, config: FocusConfig, layer_idx: int, block_size: int,
                 attention: nn.Module | None = None):
        super().__init__(d_model, config, layer_idx)
        if block_size > config.window:
            raise ValueError(f"MoBA block_size={block_size} must be <= window={config.window}: the "
                             "current block is kept through the local window")
        self.block_size = int(block_size)
        self._seen: torch.Tensor | None = None  # (B, K * block_size, Hkv, D) or (..., d_model): the gate's keys
        self._n = 0  # positions written in _seen
        self._qk = None
        if attention is not None and hasattr(attention, "q_proj") and hasattr(attention, "k_proj"):
            cfg = getattr(attention, "config", None)
            hd = getattr(attention, "head_dim", None) or (cfg.hidden_size // cfg.num_attention_heads)
            self._qk = (attention.q_proj, attention.k_proj, int(hd), float(getattr(attention, "scaling", hd ** -0.5)))

    def _blocks(self, T: int, device, start: int = 0) -> torch.Tensor:
        """(T,) block of positions ``start .. start + T - 1``."""
        blk = torch.arange(start, start + T, device=device) // self.block_size
        if int(blk[-1]) >= self.config.num_groups:
            n = start + T
            raise ValueError(f"MoBA: {n} tokens make {int(blk[-1]) + 1} blocks of {self.block_size}, more "
                             f"than num_groups={self.config.num_groups}; use use_moba(..., seq_len={n})")
        return blk

    def _block_sums(self, x: torch.Tensor, start: int) -> torch.Tensor:
        """(B, K, ...) per-block sums of the gate's keys of positions ``0 .. start + T - 1``: the
        first ``start`` seen, then ``x`` (B, T, ...). The keys live in a buffer of ``num_groups *
        block_size`` positions, written in place (no copy of the history per decode step); a
        restart from an earlier position zeroes what followed it. Raises RuntimeError on a
        decode step with no history (no forward from position 0)."""
        B, T = x.shape[:2]
        buf, n_old = self._seen, self._n
        if start > 0 and (buf is None or buf.shape[0] != B or buf.shape[2:] != x.shape[2:] or n_old < start):
            raise RuntimeError(
                f"MoBA gate of layer {self.layer_idx}: a decode step from position {start} but "
                f"{0 if buf is None else n_old} positions seen: start with a forward from position 0")
        K, bs = self.config.num_groups, self.block_size
        if start == 0:
            buf = self._seen = x.new_zeros(B, K * bs, *x.shape[2:])  # (B, K * bs, ...)
        elif start + T < n_old:
            buf[:, start + T:n_old] = 0  # a restart: forget the positions after this forward's
        buf[:, start:start + T] = x
        self._n = start + T
        return buf.view(B, K, bs, *x.shape[2:]).sum(2)  # (B, K, ...)

    def forward(self, h: torch.Tensor, config: FocusConfig | None = None, start: int = 0) -> torch.Tensor:
        B, T, _ = h.shape
        K = self.config.num_groups
        self._blocks(start + T, h.device)  # raises when the positions outgrow num_groups blocks
        first = torch.arange(K, device=h.device) * self.block_size  # (K,) each block's first position
        counts = (start + T - first).clamp(1, self.block_size).float()  # (K,) its positions seen (>= 1)
        if self._qk is not None:
            q_proj, k_proj, D, scale = self._qk
            with torch.no_grad():
                q = q_proj(h).float().view(B, T, -1, D)  # (B, T, H, D)
                ksum = self._block_sums(k_proj(h).float().view(B, T, -1, D), start)  # (B, K, Hkv, D)
            H, Hkv = q.shape[2], ksum.shape[2]
            kmean = (ksum / counts[None, :, None, None]).repeat_interleave(H // Hkv, dim=2)  # (B, K, H, D)
            return torch.einsum("bthd,bkhd->btk", q, kmean) * scale / H  # (B, T, K)
        x = _normalized(h, config or self.config)  # (B, T, d_model)
        xmean = self._block_sums(x, start) / counts[None, :, None]  # (B, K, d_model)
        return x @ xmean.transpose(1, 2) / math.sqrt(x.shape[-1])

    def assign(self, scores, config, token_mask=None, start=0):
        if config.mode == "soft" or self.training:
            raise ValueError("the MoBA baseline is training-free and hard only: use mode='hard'")
        B, T, K = scores.shape

        def block_top_k(k: int):  # the layer's k past blocks by gate score; a key's group: its block
            blk = self._blocks(T, scores.device, start)  # (T,)
            past = torch.arange(K, device=scores.device)[None, :] < blk[:, None]  # (T, K)
            s = scores.float().masked_fill(~past, float("-inf"))
            # ties among -inf (no past block) resolve to any block: the causal mask removes them
            return s.topk(k, dim=-1).indices, blk[None].expand(B, T)  # (B, T, k), (B, T)
        return (None, None, *core.hard_groups(scores, config, self.layer_idx, pick=block_top_k))


# --------------------------------------------------------------------------------------------
# swapping routers in and out of an attached model

def swap_routers(model, factory: Callable[[Router, nn.Module], Router]) -> dict[int, Router]:
    """Replace every layer's router by ``factory(old_router, attention_module)``; returns the
    old routers ({layer: Router}) for ``restore_routers``. The new router keeps the old one's
    training mode and device."""
    old = {}
    for i, m in attention_modules(model):
        r = getattr(m, "focus_router", None)
        if r is None:
            continue
        new = factory(r, m)
        new.to(r.proj.device)
        new.train(r.training)
        old[i] = r
        m.focus_router = new
    return old


def restore_routers(model, old: dict[int, Router]) -> None:
    """Put back the routers ``swap_routers`` returned."""
    for i, m in attention_modules(model):
        if i in old:
            m.focus_router = old[i]


def _same_weights(cls, **kw):
    """A factory building ``cls`` with the old router's config and weights."""
    def make(r: Router, module: nn.Module) -> Router:
        new = cls(r.proj.shape[0], r.config, r.layer_idx, **kw)
        new.load_state_dict(r.state_dict(), strict=False)
        return new
    return make


# --------------------------------------------------------------------------------------------
# k-means and online k-means

@torch.no_grad()
def capture_router_inputs(model, windows: Sequence, max_tokens: int | None = None) -> dict[int, np.ndarray]:
    """Router inputs of every routed layer under the dense model, RMS-normalized as the router
    normalizes them: {layer: (N, d_model) float32}. A forward pre-hook on each attention module
    captures its input (the ``router_in`` hook point); the forwards run with ``mode="dense"``
    (exactly the pretrained model) in their own FocusForward, the model's config unchanged."""
    state = forward_state(model, mode="dense")
    cfg = state.config
    got: dict[int, list] = {}
    seen = 0

    def keep(h, hook):  # (1, T, d_model)
        got.setdefault(hook.layer_idx, []).append(_normalized(h, cfg).reshape(-1, h.shape[-1]).cpu())
    with hooks(model, {"router_in": keep}):
        for w in windows:
            model(input_ids=w.input_ids[None], use_cache=False, focus=state)
            seen += int(w.input_ids.numel())
            if max_tokens is not None and seen >= max_tokens:
                break
    return {i: torch.cat(v)[:max_tokens].numpy() for i, v in got.items()}


def fit_kmeans_routers(model, windows: Sequence, max_tokens: int | None = 4096, seed: int = 0,
                       n_init: int = 4) -> dict[int, Router]:
    """Fit scikit-learn ``KMeans(K, n_init, random_state=seed)`` per layer on the captured router
    inputs (``capture_router_inputs``) and swap in ``KMeansRouter``s. Returns the old routers."""
    from sklearn.cluster import KMeans
    cfg = forward_state(model).config
    x = capture_router_inputs(model, windows, max_tokens)
    means = {}
    for i, xi in x.items():
        km = KMeans(n_clusters=min(cfg.num_groups, len(xi)), n_init=n_init, random_state=seed).fit(xi)
        mu = torch.zeros(cfg.num_groups, xi.shape[1])
        mu[: km.cluster_centers_.shape[0]] = torch.from_numpy(km.cluster_centers_).float()
        means[i] = mu

    def make(r: Router, module: nn.Module) -> Router:
        return KMeansRouter(r.proj.shape[0], r.config, r.layer_idx, means[r.layer_idx])
    return swap_routers(model, make)


@torch.no_grad()
def fit_online_kmeans_routers(model, windows: Sequence, decay: float = 0.9, passes: int = 1) -> dict[int, Router]:
    """Swap in ``OnlineKMeansRouter``s and run ``passes`` over ``windows`` in hard mode with
    learning on (each layer's centroids follow the inputs routed by the layers below, as in the
    Routing Transformer); then learning off. Returns the old routers."""
    old = swap_routers(model, lambda r, m: OnlineKMeansRouter(r.proj.shape[0], r.config, r.layer_idx, decay))
    from focus_lab.hf.retrofit import routers
    rs = [r for r in routers(model).values() if isinstance(r, OnlineKMeansRouter)]
    state = forward_state(model, mode="hard")
    try:
        for r in rs:
            r.learning = True
        for _ in range(passes):
            for w in windows:
                model(input_ids=w.input_ids[None], use_cache=False, focus=state)
    finally:
        for r in rs:
            r.learning = False
    return old


# --------------------------------------------------------------------------------------------
# MoBA

def moba_distant_kept(seq_len: int, block_size: int, top_k: int, window: int, sinks: int = 0) -> float:
    """Expected fraction of the distant causal pairs (``i - j >= window``) that MoBA's mask keeps
    at block top-k, with the chosen past blocks drawn uniformly (``MoBARouter``: query i in block
    ``b_i = i // block_size`` keeps ``min(top_k, b_i)`` of its ``b_i`` strictly past blocks, and
    the sink keys): ``sum_i [min(k, b_i) / b_i * far_i + sink_i] / sum_i (i - window + 1)^+``,
    ``far_i`` the distant non-sink keys in past blocks, ``sink_i`` the distant sink keys. Exact
    when every query's past blocks all fit in its top-k; otherwise the mean over block choices."""
    i = np.arange(seq_len)
    distant = np.clip(i - window + 1, 0, None)  # (T,) distant keys per query
    b = i // block_size
    far = np.clip(np.minimum(b * block_size, i - window + 1) - sinks, 0, None)  # non-sink, in past blocks
    sink = np.clip(np.minimum(sinks, i - window + 1), 0, None)
    frac = np.where(b > 0, np.minimum(top_k, b) / np.maximum(b, 1), 0.0)
    total = distant.sum()
    return float((frac * far + sink).sum() / total) if total else float("nan")


def moba_matched_top_k(focus_kept: float, seq_len: int, block_size: int, window: int,
                       sinks: int = 0) -> int:
    """The MoBA block top-k whose expected distant pairs kept (``moba_distant_kept``) is nearest
    to ``focus_kept``, a Focus pattern's (matched sparsity, docs/method.md §7: MoBA's blocks are
    positions, and early queries keep all their past blocks, so k / num_blocks underestimates
    what it keeps). Used by ``evaluate_baselines`` and the figures' recorded MoBA run."""
    num_blocks = math.ceil(seq_len / block_size)
    kept = [moba_distant_kept(seq_len, block_size, k, window, sinks) for k in range(1, num_blocks + 1)]
    return int(np.argmin([abs(x - focus_kept) for x in kept])) + 1


def use_moba(model, config: FocusConfig, seq_len: int, block_size: int | None = None) -> FocusConfig:
    """Attach Focus to ``model`` (detaching any current routers) with ``MoBARouter``s: blocks of
    ``block_size`` (default ``min(window, ceil(seq_len / config.num_groups))``) and ``num_groups
    = ceil(seq_len / block_size)``. Returns the attached config (mode "hard")."""
    bs = block_size or min(config.window, math.ceil(seq_len / config.num_groups))
    nb = math.ceil(seq_len / bs)
    cfg = config.replace(num_groups=nb, top_k=min(config.top_k, nb), mode="hard", assignment="router")
    if is_attached(model):
        detach(model)
    attach(model, cfg)
    swap_routers(model, lambda r, m: MoBARouter(r.proj.shape[0], r.config, r.layer_idx, bs, attention=m))
    return forward_state(model).config


# --------------------------------------------------------------------------------------------
# matched sparsity

def window_distant_kept(seq_len: int, window: int, wider: int, sinks: int = 0) -> float:
    """Fraction of the distant causal pairs ``i - j >= window`` that a sliding window of
    ``wider >= window`` tokens (plus ``sinks`` sink tokens) keeps: ``(window_pairs(T, wider, s) -
    window_pairs(T, window, 0)) / #distant`` (``metrics.window_pairs``). For ``wider == window``
    only the sink pairs count, as in ``evaluate``."""
    from focus_lab.method.metrics import window_pairs
    distant = sum(max(0, i - window + 1) for i in range(seq_len))
    if distant == 0:
        return float("nan")
    return (window_pairs(seq_len, max(wider, window), sinks) - window_pairs(seq_len, window, 0)) / distant


def matched_window_size(kept_fraction: float, seq_len: int, window: int, sinks: int = 0) -> int:
    """The sliding window ``w'`` whose kept causal pairs (with the same sink rule) equal those of
    a mask keeping ``kept_fraction`` of the distant pairs ``i - j >= window`` plus all local
    pairs (``metrics.matched_window``)."""
    from focus_lab.method.metrics import matched_window, window_pairs
    distant = sum(max(0, i - window + 1) for i in range(seq_len))
    pairs = window_pairs(seq_len, window, 0) + kept_fraction * distant
    return int(matched_window(int(round(pairs)), seq_len, sinks))


# --------------------------------------------------------------------------------------------
# LoRA at the router's parameter budget

def router_parameter_count(model, config: FocusConfig | None = None) -> int:
    """Trainable parameters of Focus routers on ``model``: per routed layer
    ``d_model * d_g + K * d_g`` (docs/method.md §1; 278,400 for SmolLM2-135M with K = 4, d_g = 16)."""
    config = config or FocusConfig()
    d = int(model.config.hidden_size)
    n = len(attention_modules(model)) if config.layers is None else len(config.layers)
    return n * (d * config.router_dim + config.num_groups * config.router_dim)


def _lora_targets(model, targets: Sequence[str]) -> list[nn.Linear]:
    mods = [m for name, m in model.named_modules()
            if isinstance(m, nn.Linear) and name.split(".")[-1] in targets]
    if not mods:
        raise ValueError(f"no Linear modules named {list(targets)} in this model")
    return mods


def lora_param_count(model, rank: int, targets: Sequence[str] = ("q_proj", "v_proj")) -> int:
    """LoRA parameters: ``rank * (in + out)`` per target Linear."""
    return sum(rank * (m.in_features + m.out_features) for m in _lora_targets(model, targets))


def lora_rank_for_budget(model, budget: int, targets: Sequence[str] = ("q_proj", "v_proj")) -> int:
    """The rank >= 1 whose LoRA parameter count is closest to ``budget``."""
    per = lora_param_count(model, 1, targets)
    return max(1, int(round(budget / per)))


def train_lora(model, windows: list, train_cfg: TrainConfig, rank: int,
               targets: Sequence[str] = ("q_proj", "v_proj"), alpha: float | None = None,
               progress: bool = False) -> tuple[nn.Module, pd.DataFrame]:
    """Train LoRA adapters (peft) on a plain (non-Focus) model with the router's schedule:
    the same windows in the same order (``train.batch_for_step``), AdamW, the same warm-up +
    cosine learning rate (``train.lr_at``), ``train_cfg.steps`` steps.

    Returns (the model with the adapters merged into its weights, a log DataFrame: step, loss,
    lr, seconds, lora_parameters). ``alpha`` defaults to ``2 * rank``."""
    from peft import LoraConfig, get_peft_model
    from focus_lab.train.loop import lr_at, batch_for_step
    torch.manual_seed(train_cfg.seed)
    pcfg = LoraConfig(r=rank, lora_alpha=alpha or 2 * rank, target_modules=list(targets), lora_dropout=0.0,
                      bias="none", task_type="CAUSAL_LM")
    pm = get_peft_model(model, pcfg)
    params = [p for p in pm.parameters() if p.requires_grad]
    n_params = sum(p.numel() for p in params)
    opt = torch.optim.AdamW(params, lr=train_cfg.lr, weight_decay=train_cfg.weight_decay)
    rows = []
    pm.eval()  # no dropout anywhere; LoRA weights still get gradients
    for step in range(train_cfg.steps):
        t0 = time.perf_counter()
        for g in opt.param_groups:
            g["lr"] = lr_at(step, train_cfg)
        ids = batch_for_step(windows, step, train_cfg)
        loss = pm(input_ids=ids, labels=ids, use_cache=False).loss
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
        rows.append({"step": step, "loss": float(loss.detach()), "lr": opt.param_groups[0]["lr"],
                     "seconds": time.perf_counter() - t0, "lora_parameters": n_params})
        if progress:
            print(f"lora step {step + 1}/{train_cfg.steps} loss {float(loss):.4f}", flush=True)
    merged = pm.merge_and_unload()
    for p in merged.parameters():
        p.requires_grad_(False)
    return merged.eval(), pd.DataFrame(rows)


# --------------------------------------------------------------------------------------------
# the harness

def _hard(ks) -> list[tuple[str, dict]]:
    """Hard top-k patterns for k in ``ks`` (an int K: k = 1..K)."""
    ks = range(1, ks + 1) if isinstance(ks, int) else ks
    return [(f"hard_top{k}", {"mode": "hard", "top_k": k}) for k in ks]


def evaluate_baselines(model, router_file: str | Path | None, fit_windows: Sequence, eval_windows: Sequence,
                       methods: Iterable[str] = BASELINES, config: FocusConfig | None = None,
                       log: Callable[[str], None] | None = None, top_ks: Sequence[int] | None = None,
                       focus_top_ks: Sequence[int] | None = None, soft: bool = True,
                       per_window: bool = False) -> pd.DataFrame:
    """Held-out perplexity of Focus and every baseline on the same windows, one table.

    Args:
        model: a plain model (Focus not attached; it is detached again at the end).
        router_file: trained Focus routers (their config is used for every baseline: K, window,
            top-k range, sink tokens); or None with ``config`` (then "focus" is the untrained router).
        fit_windows: training-text windows for k-means (fit) and online k-means (one pass).
        eval_windows: held-out windows, identical for every method.
        methods: subset of ``BASELINES``.
        top_ks: the top-k values every baseline runs at (default 1..K); ``focus_top_ks`` those
            of Focus itself (default ``top_ks``). MoBA, whose block count grows with the length,
            runs at the block top-k whose fraction of blocks matches each Focus top-k's
            distant pairs kept (at least one top-k, its own blocks' count otherwise).
        soft: include Focus soft (its float bias is O(T^2): costly at 4K tokens).
        per_window: one row per (window, pattern) with a ``window`` column
            (``evaluate.pool_windows`` pools them); ``speedup`` is then per window.
    Returns:
        ``evaluate.evaluate``'s columns plus ``method`` (focus / dense / window / window_matched /
        random / kmeans / online_kmeans / moba), ``window_size`` and ``speedup`` (tokens/s over
        the dense pattern's, same run), seq_len, num_groups, attention_window (tokens),
        sink_tokens. Dense and window rows come with "focus".
    """
    say = log or (lambda s: None)
    methods = list(methods)
    if router_file is not None:
        cfg = load_routers(model, router_file)
    else:
        attach(model, config or FocusConfig())
        cfg = forward_state(model).config
    K = cfg.num_groups
    T = int(eval_windows[0].input_ids.shape[0])
    ks = list(top_ks) if top_ks is not None else list(range(1, K + 1))
    fks = list(focus_top_ks) if focus_top_ks is not None else ks
    frames = []

    def run(method, patterns, **extra):
        t0 = time.perf_counter()
        df = evaluate(model, list(eval_windows), patterns, progress=False, per_window=per_window)
        df.insert(0, "method", method)
        for k, v in extra.items():
            df[k] = v
        frames.append(df)
        say(f"  {method}: " + ", ".join(f"{r.label}={r.perplexity:.3f}" for r in df.itertuples())
            + f" ({time.perf_counter() - t0:.0f}s)")
        return df

    focus_df = None
    if "focus" in methods or "window_matched" in methods:
        pats = [p for p in standard_patterns(K) if p[0] in ("dense", "window") or (soft and p[0] == "soft")] \
            if "focus" in methods else []
        focus_df = run("focus", pats + _hard(sorted(set(fks) | set(ks))))
        focus_df.loc[focus_df["label"] == "dense", "method"] = "dense"
        focus_df.loc[focus_df["label"] == "window", "method"] = "window"
    if "window" in methods and (focus_df is None or "window" not in set(focus_df["label"])):
        run("window", [("window", {"mode": "window"})])
    if "window_matched" in methods:
        pats = []
        for k in ks:
            frac = float(focus_df.loc[focus_df["label"] == f"hard_top{k}", "distant_pairs_kept"].mean())
            w = matched_window_size(frac, T, cfg.window, cfg.sink_tokens)
            pats.append((f"window_matched_top{k}", {"mode": "window", "window": w}))
        df = run("window_matched", pats)
        size = {label: ch["window"] for label, ch in pats}
        df["window_size"] = df["label"].map(size)
        # evaluate() counts "distant" from the pattern's own (wider) window; re-express it from the
        # Focus window, like every other row
        df["distant_pairs_kept"] = df["label"].map(
            {label: window_distant_kept(T, cfg.window, w, cfg.sink_tokens) for label, w in size.items()})
    if "random" in methods:
        run("random", [(label, {**changes, "assignment": "random"}) for label, changes in _hard(ks)])
    if "kmeans" in methods:
        old = fit_kmeans_routers(model, fit_windows, seed=cfg.seed)
        run("kmeans", _hard(ks))
        restore_routers(model, old)
    if "online_kmeans" in methods:
        old = fit_online_kmeans_routers(model, fit_windows)
        run("online_kmeans", _hard(ks))
        restore_routers(model, old)
    if "moba" in methods:
        mcfg = use_moba(model, cfg, T)
        from focus_lab.hf.retrofit import routers
        nb = mcfg.num_groups
        if top_ks is None and nb <= K:
            mks = list(range(1, nb + 1))
        elif focus_df is not None:
            fr = [float(focus_df.loc[focus_df["label"] == f"hard_top{k}", "distant_pairs_kept"].mean()) for k in ks]
            bs = next(iter(routers(model).values())).block_size
            mks = sorted({moba_matched_top_k(f, T, bs, cfg.window, cfg.sink_tokens) for f in fr})
        else:
            mks = [k for k in ks if k <= nb]
        run("moba", _hard(mks), block_size=next(iter(routers(model).values())).block_size)
    if is_attached(model):
        detach(model)
    out = pd.concat(frames, ignore_index=True)
    if "window_size" not in out:
        out["window_size"] = np.nan
    out.loc[out["mode"] == "window", "window_size"] = out.loc[out["mode"] == "window", "window_size"].fillna(cfg.window)
    out = add_speedup(out, by=("window",) if per_window else ())
    out["seq_len"] = T
    out["num_groups"] = K
    out["attention_window"] = cfg.window
    out["sink_tokens"] = cfg.sink_tokens
    return out
