"""The recorder's metrics, each defined once here with its formula (docs/method.md §1, §2, §6).

The recorder (``record.py``) calls these functions as the forward runs; the tests compare
them with brute-force computations; nothing else re-derives them. The Focus method itself
(router, Sinkhorn, hard mask, soft gate) comes from ``core.py`` and is never re-implemented.

Notation: ``B`` batch, ``T`` tokens, ``K`` groups, ``k`` top_k, ``w`` window, ``H`` query
heads, ``i`` a query position, ``j`` a key position, ``d = i - j`` their distance.

* ``P_ij`` dense attention: ``softmax_j(scale * q_i . k_j)`` over causal keys ``j <= i``
  (the pretrained model's own attention given this layer's queries and keys).
* ``M_ij`` the hard Focus mask ``core.hard_mask``:
  ``[j <= i] and (g(j) in G_k(i) or d < w)`` (docs/method.md §2).
* ``S_ij`` Focus soft attention: ``softmax_j(scale * q_i . k_j + bias_ij)``, ``bias`` the soft
  gate ``core.soft_gate_bias`` (``log max(p_i . p_j, eps)`` on distant pairs).
* local pairs: ``0 <= d < w``; distant pairs: ``d >= w``.
"""

from __future__ import annotations

import functools
import math
from dataclasses import dataclass, field
from typing import Sequence

import numpy as np
import pandas as pd
import torch

from focus_lab.method import core

__all__ = [
    "ASSIGNMENT_KINDS", "COVERAGE_PATTERNS", "assignment_distributions", "top1_margin",
    "group_shares", "normalized_entropy", "marginal_error", "balance_stats", "attention_scale",
    "expand_kv", "kept_pairs", "window_pairs", "matched_window",
    "distance_edges", "AttentionMetrics", "attention_metrics", "contingency", "cluster_scores",
    "dominant_labels", "kmeans_groups", "random_groups",
]

#: Assignments whose balance is recorded (``balance_stats``): Sinkhorn as trained, plain
#: softmax (the collapse the paper reports), and the causal hard assignment the mask uses.
ASSIGNMENT_KINDS = ("sinkhorn", "softmax", "causal")
#: Masks whose coverage of the dense attention is recorded.
COVERAGE_PATTERNS = ("focus", "window", "window_matched", "random")


# ---------------------------------------------------------------------------------------------
# routing: assignments and balance (docs/method.md §1)

def assignment_distributions(scores: torch.Tensor, tau: float, sinkhorn_iters: int,
                             group_bias: torch.Tensor | None = None
                             ) -> dict[str, tuple[torch.Tensor, torch.Tensor]]:
    """Row-stochastic assignments ``Q (B, T, K)`` and hard groups ``g (B, T)`` of one layer.

    * ``"sinkhorn"``: ``Q = core.sinkhorn(S, tau, N)`` (N = the configured iterations, over the
      whole window: non-causal), ``g_i = argmax_g Q_ig``.
    * ``"softmax"``: ``Q_ig = softmax_g(S_ig / tau)``, ``g_i = argmax_g Q_ig``: no balancing.
    * ``"causal"``: ``Q_ig = softmax_g(S_ig / tau + b_g)`` with the router's group bias ``b``,
      ``g_i = core.hard_assign(S, tau, 1, b)`` (= argmax Q): the key groups the hard mask uses.

    scores: (B, T, K) raw router scores; group_bias: (K,) in logit units or None.
    """
    s = scores.float()
    log_p, _ = core.sinkhorn(s, tau, sinkhorn_iters)
    q_sink = log_p.exp()
    q_soft = torch.softmax(s / tau, dim=-1)
    b = group_bias.to(s.device).float() if group_bias is not None else torch.zeros(s.shape[-1])
    q_causal = torch.softmax(s / tau + b, dim=-1)
    _, g_causal = core.hard_assign(s, tau, 1, group_bias)
    return {"sinkhorn": (q_sink, q_sink.argmax(-1)), "softmax": (q_soft, q_soft.argmax(-1)),
            "causal": (q_causal, g_causal)}


def top1_margin(scores: torch.Tensor, tau: float, group_bias: torch.Tensor | None = None) -> torch.Tensor:
    """Margin of the causal hard choice, in logit units: ``a_(1) - a_(2)`` where ``a = S / tau + b``
    sorted descending (``+inf`` when K = 1). scores: (..., K) -> (...)."""
    a = scores.float() / tau
    if group_bias is not None:
        a = a + group_bias.to(a.device).float()
    if a.shape[-1] < 2:
        return torch.full(a.shape[:-1], float("inf"))
    top2 = a.topk(2, dim=-1).values
    return top2[..., 0] - top2[..., 1]


def group_shares(q: torch.Tensor, hard: torch.Tensor, num_groups: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Group loads of one window: ``soft_g = (1/T) sum_i Q_ig`` and ``hard_g = (1/T) sum_i [g_i = g]``.

    q: (T, K) row-stochastic; hard: (T,) long. Returns two (K,) float tensors, each summing to 1.
    """
    T = q.shape[0]
    soft = q.float().sum(0) / max(T, 1)
    return soft, core.hard_group_shares(hard, num_groups)


def normalized_entropy(share: torch.Tensor) -> float:
    """``H(s) / log K = -sum_g s_g log s_g / log K`` (0 log 0 = 0): 1 for a uniform load, 0 when
    one group holds everything. Defined as 1 when K = 1."""
    K = share.numel()
    if K < 2:
        return 1.0
    s = share.double().clamp(min=0)
    s = s / s.sum().clamp(min=1e-30)
    h = -(torch.where(s > 0, s * s.log(), torch.zeros_like(s))).sum()
    return float(h / math.log(K))


def marginal_error(q: torch.Tensor) -> float:
    """Column marginal error of a row-stochastic ``Q (T, K)``: ``max_g |sum_i Q_ig - T/K| / (T/K)``.

    Sinkhorn's target is ``T/K`` per group; after its N iterations (ending on the row step) this
    is the remaining relative error of the columns. For plain softmax it measures the collapse.
    """
    T, K = q.shape
    target = T / K
    return float(((q.double().sum(0) - target).abs().max() / target).item()) if T else float("nan")


def balance_stats(q: torch.Tensor, hard: torch.Tensor, num_groups: int) -> dict[str, float]:
    """Balance of one window under one assignment (``q (T, K)``, ``hard (T,)``):

    * ``soft_largest_share = max_g soft_g``, ``hard_largest_share = max_g hard_g``
      (``group_shares``; 1/K is balanced, 1 is total collapse);
    * ``soft_entropy``, ``hard_entropy``: ``normalized_entropy`` of each load;
    * ``empty_groups = #{g : hard_g = 0}``;
    * ``marginal_error``: ``marginal_error(q)``.
    """
    soft, hard_share = group_shares(q, hard, num_groups)
    return {"soft_largest_share": float(soft.max()), "hard_largest_share": float(hard_share.max()),
            "soft_entropy": normalized_entropy(soft), "hard_entropy": normalized_entropy(hard_share),
            "empty_groups": int((hard_share == 0).sum()), "marginal_error": marginal_error(q)}


def random_groups(batch: int, seq: int, config, layer_idx: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Random groups at the Focus sparsity: ``core.hard_groups(core.random_scores(...))`` (the
    layer's k, ``FocusConfig.top_k_at``) with the seed ``FocusConfig.assignment="random"`` uses for
    this layer (a function of the position only). Returns (query_groups (B, T, k), key_group (B, T))."""
    s = core.random_scores(batch, seq, config.num_groups, seed=core.layer_seed(config.seed, layer_idx))
    return core.hard_groups(s, config, layer_idx)


# ---------------------------------------------------------------------------------------------
# dense attention, masks and their pair counts (docs/method.md §2, §6)

def attention_scale(module, head_dim: int) -> float:
    """The logit scale of a layer: ``module.scaling`` when the module has one, else ``1/sqrt(D)``."""
    s = getattr(module, "scaling", None)
    return float(s) if s is not None else 1.0 / math.sqrt(head_dim)


def expand_kv(key: torch.Tensor, num_heads: int, heads: Sequence[int] | None = None) -> torch.Tensor:
    """Keys (or values) per query head under GQA: query head ``h`` reads kv head
    ``h // (H / Hkv)`` (transformers' ``repeat_kv``). key: (B, Hkv, T, D) -> (B, len(heads), T, D)."""
    hkv = key.shape[1]
    if num_heads % hkv:
        raise ValueError(f"{num_heads} query heads are not a multiple of {hkv} kv heads")
    idx = torch.arange(num_heads) if heads is None else torch.as_tensor(list(heads))
    return key[:, idx // (num_heads // hkv)]


def head_mean_attention(query: torch.Tensor, key: torch.Tensor, scale: float) -> torch.Tensor:
    """Dense causal attention probabilities averaged over heads (what a layer's shared router
    sees: docs/method.md §1, one router per layer). query: (B, H, T, D); key: (B, Hkv, T, D) with H a
    multiple of Hkv (GQA) -> (B, T, T) float32, each row summing to 1 over its causal keys."""
    B, H, T, _ = query.shape
    k = expand_kv(key, H).float()  # (B, H, T, D)
    logits = (query.float() @ k.transpose(-1, -2)) * scale  # (B, H, T, T)
    pos = torch.arange(T, device=query.device)
    logits = logits.masked_fill(~core.causal_mask(pos, pos), float("-inf"))
    return torch.softmax(logits, dim=-1).mean(1)  # (B, T, T)


def rows_attention(query: torch.Tensor, key: torch.Tensor, scale: float, rows: torch.Tensor,
                   softcap: float | None = None) -> torch.Tensor:
    """Dense causal attention probabilities of some query rows (docs/method.md §2.4 ``dense``).

    query: (B, H, Tq, D), its queries at positions ``Tk - Tq .. Tk - 1``; key: (B, Hkv, Tk, D)
    (GQA through ``metrics.expand_kv``); rows: (r,) absolute query positions. Returns
    (B, H, r, Tk) float32, each row summing to 1 over keys ``j <= row``."""
    H, Tq = query.shape[1], query.shape[2]
    Tk = key.shape[2]
    q = query[:, :, rows - (Tk - Tq)].float()  # (B, H, r, D)
    k = expand_kv(key, H).float()  # (B, H, Tk, D)
    logits = torch.einsum("bhrd,bhtd->bhrt", q, k) * scale  # (B, H, r, Tk)
    if softcap:
        logits = softcap * torch.tanh(logits / softcap)
    future = torch.arange(Tk, device=key.device)[None, :] > rows.to(key.device)[:, None]  # (r, Tk)
    return torch.softmax(logits.masked_fill(future, float("-inf")), dim=-1)


def kept_pairs(query_groups: torch.Tensor, key_group: torch.Tensor, window: int, sinks: int = 0) -> torch.Tensor:
    """``sum_{i,j} M_ij`` per batch element, ``M = core.hard_mask(..., sinks)``: the local pairs
    (``0 <= i - j < window``, ``window_pairs`` without sinks) plus the distant pairs kept
    (``core.distant_kept_counts``, O(B T K)). query_groups: (B, T, k); key_group: (B, T) -> (B,) long."""
    T = key_group.shape[1]
    kept, _ = core.distant_kept_counts(query_groups, key_group, window, sinks)
    return kept.cpu() + window_pairs(T, window)


def window_pairs(seq: int, window, sinks: int = 0):
    """Pairs of ``core.local_mask(window, sinks)`` among ``seq`` tokens: the local pairs
    ``sum_i min(i + 1, w)`` plus the sink pairs beyond the window ``sum_{j < s} max(0, seq - j - w)``
    (closed forms; ``window`` an int, or an int array for several windows at once)."""
    w = np.asarray(window, dtype=np.int64)
    v = np.minimum(w, seq)
    local = v * (v + 1) // 2 + (seq - v) * v
    m = np.minimum(min(sinks, seq), np.maximum(0, seq - w))  # sink keys with a pair beyond the window
    total = local + m * (seq - w) - m * (m - 1) // 2
    return int(total) if total.ndim == 0 else total


def matched_window(pairs: int, seq: int, sinks: int = 0) -> int:
    """The sliding window ``w'`` in 1..seq whose pair count ``window_pairs(seq, w', sinks)`` is
    closest to ``pairs`` (ties to the smaller): the window-only mask at another mask's sparsity."""
    counts = window_pairs(seq, np.arange(1, seq + 1), sinks)  # (seq,)
    return 1 + int(np.argmin(np.abs(counts - int(pairs))))  # argmin: the first of equal minima


def distance_edges(seq: int, window: int) -> list[int]:
    """Distance bucket edges ``[0, w, 2w, 4w, ..., seq]``: buckets ``[e_m, e_{m+1})``; the local
    bucket is ``[0, w)``, then doubling widths; the last ends at ``seq`` (distances < seq)."""
    edges = [0]
    e = window
    while e < seq:
        edges.append(e)
        e *= 2
    edges.append(seq)
    return edges


@dataclass
class AttentionMetrics:
    """One layer's attention metrics for one forward (``attention_metrics``).

    Masks ``X`` compared (``COVERAGE_PATTERNS``), all built by ``core`` with the config's sink
    rule ``s`` (``FocusConfig.sink_tokens``, 0 = none): ``focus`` = the hard mask M;
    ``window`` = ``core.local_mask(w, s)`` (sliding window only); ``window_matched`` =
    ``core.local_mask(w', s)`` with ``w' = matched_window(sum M, T, s)`` (the window-only mask
    at M's pair count); ``random`` = the hard mask of ``random_groups`` (same K and k).
    Gated pairs: causal pairs outside ``core.local_mask(w, s)`` (where groups decide; with
    s = 0 these are the distant pairs ``d >= w``).

    Per query (``(B, Hs, T)`` float32, Hs = recorded heads), keys of ``per_query``:

    * ``coverage_<pattern>``: ``sum_j P_ij X_ij`` (= 1 - TV between P and P restricted to X
      and renormalized).
    * ``dropped``: ``sum_j P_ij (1 - M_ij)``: the dense mass the hard mask drops
      (``coverage_focus + dropped = 1``).
    * ``dense_distant``: ``sum_{gated j} P_ij`` (= 1 - coverage_window).
    * ``sink_mass``: ``sum_{j < n_sink} P_ij``; ``sink_dropped``: ``sum_{j < n_sink} P_ij (1 - M_ij)``
      (n_sink = ``sink_positions``, a reporting choice independent of the mask's rule).
    * ``soft_distant``: ``sum_{gated j} S_ij``.
    * ``soft_crossing``: ``sum_j S_ij (1 - M_ij)``: the Focus soft model's mass on gated keys
      outside the query's hard groups, i.e. what hard inference removes from it.
    * ``soft_crossing_expected``: ``sum_{gated j} S_ij (1 - max(p_i . p_j, eps))``: the same with
      soft (Sinkhorn) groups, the probability that the pair's groups differ (0 when K = 1; the
      agreement floored at eps as in the gate).

    Per distance bucket ``[lo, hi)`` (``edges_distance``), sums over queries, ``(B, Hs, nb)``:
    ``bucket_mass = sum_i sum_{lo <= d < hi} P_ij`` and ``bucket_kept[pattern]`` the same
    times ``X_ij``.

    ``pairs``: ``{pattern: (B,) kept causal pairs}`` and ``"causal"`` (all causal pairs).
    ``edges``: the dropped-dependency audit, 1-D tensors ``batch, head, query, key, weight
    (P_ij), soft_weight (S_ij, nan without log_p)``: pairs with ``M_ij = 0`` and
    ``P_ij > edge_threshold``, plus each query's ``edge_top_n`` largest dropped ``P_ij`` above
    ``edge_min_weight``. ``patterns``: ``{head: {"dense", "soft": (B, T, T) float,
    "kept": (B, T, T) bool}}`` for requested heads only.
    """

    per_query: dict[str, torch.Tensor]
    edges_distance: list[int]
    bucket_mass: torch.Tensor
    bucket_kept: dict[str, torch.Tensor]
    pairs: dict[str, torch.Tensor]
    matched_window: torch.Tensor
    edges: dict[str, torch.Tensor] = field(default_factory=dict)
    patterns: dict[int, dict[str, torch.Tensor]] = field(default_factory=dict)
    output_error: dict[str, torch.Tensor] = field(default_factory=dict)



# the classes of a pair for attention_metrics' one-pass histogram: bits (keep, rkeep, wm, win, sink)
_BITS = ("keep", "rkeep", "wm", "win", "sink")
_SELECT_NAMES = ("dense", "focus", "random", "window_matched", "window", "dropped", "dense_distant",
                 "sink_mass", "sink_dropped")


def _selection() -> torch.Tensor:
    """(32, n_sel) 0/1: which of the 32 bit combinations each selected sum adds up."""
    rules = {"dense": {}, "focus": {"keep": 1}, "random": {"rkeep": 1}, "window_matched": {"wm": 1},
             "window": {"win": 1}, "dropped": {"keep": 0}, "dense_distant": {"win": 0},
             "sink_mass": {"sink": 1}, "sink_dropped": {"sink": 1, "keep": 0}}
    sel = torch.zeros(32, len(_SELECT_NAMES))
    for x in range(32):
        bit = {n: (x >> i) & 1 for i, n in enumerate(_BITS)}
        for s, name in enumerate(_SELECT_NAMES):
            sel[x, s] = float(all(bit[k] == v for k, v in rules[name].items()))
    return sel


_SELECT = _selection()


_WHOLE_MAX = 2048  # longest window whose T x T tables and masks are built whole


def _pair_rows(T: int, window: int, sinks: int, n_sink: int, device: str, a: int, b: int
               ) -> dict[str, torch.Tensor]:
    """Pair tables of queries a..b-1 against keys 0..b-1 that depend on positions only: the
    static part of each pair's class code (32 * distance bucket + 8 [window] + 16 [j < n_sink]),
    the distance, non-causal pairs, the mask's own sink pairs, gated pairs, the diagonal.
    Whole T x T tables are cached (compact dtypes) for T <= _WHOLE_MAX, else built per chunk."""
    if T <= _WHOLE_MAX:
        full = _pair_tables(T, window, sinks, n_sink, device)
        return {k: v[a:b, :b] for k, v in full.items()}
    return _pair_table_rows(T, window, sinks, n_sink, device, a, b)


@functools.lru_cache(maxsize=2)
def _pair_tables(T: int, window: int, sinks: int, n_sink: int, device: str) -> dict[str, torch.Tensor]:
    return _pair_table_rows(T, window, sinks, n_sink, device, 0, T)


def _pair_table_rows(T, window, sinks, n_sink, device, a, b) -> dict[str, torch.Tensor]:
    q_pos = torch.arange(a, b, device=device)
    k_pos = torch.arange(b, device=device)
    d = q_pos[:, None] - k_pos[None, :]  # (c, b)
    edges = torch.tensor(distance_edges(T, window)[1:-1], dtype=torch.long, device=device)
    bucket = torch.bucketize(d.clamp(min=0), edges, right=True)
    local = core.local_mask(q_pos, k_pos, window, sinks)
    causal = core.causal_mask(q_pos, k_pos)
    code = 32 * bucket + 8 * local + 16 * (k_pos < n_sink)[None, :]  # + keep + 2 rkeep + 4 wm per layer
    return {"code": code.to(torch.int16), "dist": d.to(torch.int16 if T < 32768 else torch.int32),
            "noncausal": ~causal, "sinkrule": (k_pos < sinks)[None, :] & causal,
            "gated": causal & ~local, "diag": d == 0}


def _dropped_edges(D: torch.Tensor, thr: float, top_n: int, min_weight: float) -> list[tuple]:
    """The dropped-edge audit of one chunk. D: (B, H, c, T) dense weights with the kept pairs
    zeroed. Returns [(batch, head, query, key) index tensors]: every pair above ``thr``, plus
    each query's ``top_n`` heaviest dropped pairs with weight in (min_weight, thr]."""
    if top_n == 1:
        vals, idx = D.max(dim=-1, keepdim=True)
    elif top_n > 1:
        vals, idx = D.topk(min(top_n, D.shape[-1]), dim=-1)
    else:
        vals, idx = D.amax(dim=-1, keepdim=True), None
    found = []
    rows = (vals[..., 0] > thr).nonzero()  # rows holding at least one edge above thr
    if rows.numel():
        rb, rh, rq = rows.unbind(1)
        hit = (D[rb, rh, rq] > thr).nonzero()  # (n, 2): row, key
        r, kj = hit.unbind(1)
        found.append((rb[r], rh[r], rq[r], kj))
    if idx is not None:  # each query's heaviest dropped pairs not already above thr
        extra = ((vals > min_weight) & (vals <= thr)).nonzero()  # (n, 4): batch, head, query, rank
        if extra.numel():
            eb, eh, eq, er = extra.unbind(1)
            found.append((eb, eh, eq, idx[eb, eh, eq, er]))
    return found


@torch.no_grad()
def attention_metrics(query: torch.Tensor, key: torch.Tensor, scale: float,
                      query_groups: torch.Tensor, key_group: torch.Tensor, window: int, *,
                      sinks: int = 0, random_query_groups: torch.Tensor | None = None,
                      random_key_group: torch.Tensor | None = None,
                      log_p: torch.Tensor | None = None, log_p_k: torch.Tensor | None = None,
                      eps: float = 1e-6,
                      sink_positions: int = 4, edge_threshold: float | None = None,
                      edge_top_n: int = 0, edge_min_weight: float = 0.0,
                      pattern_heads: Sequence[int] = (), chunk_elements: int = 1 << 23,
                      model_mask: torch.Tensor | None = None, softcap: float | None = None,
                      cache: dict | None = None, value: torch.Tensor | None = None) -> AttentionMetrics:
    """All attention metrics of one layer, in chunks of queries (memory ``O(B Hs c T)``).

    Args:
        query: (B, Hs, T, D) queries of the recorded heads; key: (B, Hs, T, D), kv heads
            already expanded (``expand_kv``); scale: the layer's logit scale.
        query_groups (B, T, k), key_group (B, T): the hard Focus assignment (``core.Routing``).
        window: w; sinks: the mask's sink rule (``FocusConfig.sink_tokens``).
        random_query_groups, random_key_group: the random baseline (``random_groups``); when
            None, ``coverage_random`` is not computed.
        log_p: (B, T, K) Sinkhorn log probabilities; when None the soft metrics are skipped.
        log_p_k: (B, T, K) the key role's (a router with a ``key_proj``); default ``log_p``.
        sink_positions: n_sink, the first key positions reported as attention sinks (docs/method.md §6).
        edge_threshold / edge_top_n / edge_min_weight: the dropped-edge audit (off when
            edge_threshold is None and edge_top_n == 0).
        pattern_heads: indices into the recorded heads whose full (T, T) maps are kept.
        chunk_elements: bound on ``B * Hs * c * T`` per chunk of c queries.
        model_mask: (B, T, T) bool, the model's own mask when it hides more than causality (a
            sliding window, padding): P is then the model's attention under it. Pair counts
            (density, the matched window) ignore it.
        softcap: the model's attention-logit soft-capping ``c tanh(x / c)`` (Gemma-2), or None.
        cache: a dict kept by the caller across calls of one layer (the random mask is reused).
        value: (B, Hs, T, D) values of the recorded heads (kv heads expanded): the output error
            of each mask is computed too (``AttentionMetrics.output_error``), per chunk of
            queries, never a (T, T) map per head.
    Returns:
        AttentionMetrics (definitions there).
    """
    B, H, T, _ = query.shape
    dev = query.device
    edges_d = distance_edges(T, window)
    nb = len(edges_d) - 1
    with_random = random_query_groups is not None
    with_soft = log_p is not None
    ns = max(0, int(sink_positions))
    pos = torch.arange(T, device=dev)
    whole = T <= _WHOLE_MAX  # build the (B, T, T) masks once per layer; longer: per chunk of queries
    keep_all = core.hard_mask(query_groups, key_group, window, pos, pos, sinks) if whole else None
    pairs = {"focus": keep_all.sum((1, 2)).cpu() if whole else kept_pairs(query_groups, key_group, window, sinks),
             "window": torch.full((B,), window_pairs(T, window, sinks), dtype=torch.long),
             "causal": torch.full((B,), T * (T + 1) // 2, dtype=torch.long)}
    wm = [matched_window(int(p), T, sinks) for p in pairs["focus"]]
    pairs["window_matched"] = torch.tensor([window_pairs(T, x, sinks) for x in wm], dtype=torch.long)
    rkeep_all = None
    if with_random:
        ck = ("random", T, window, sinks)
        hit = cache.get(ck) if cache is not None else None
        if hit is None or not (torch.equal(hit[0], random_query_groups) and torch.equal(hit[1], random_key_group)):
            rk = core.hard_mask(random_query_groups, random_key_group, window, pos, pos, sinks) if whole else None
            n = rk.sum((1, 2)).cpu() if whole else kept_pairs(random_query_groups, random_key_group, window, sinks)
            hit = (random_query_groups, random_key_group, rk, n)
            if cache is not None and T <= 1024:  # at most T^2 bits per layer kept across windows
                cache[ck] = hit
        rkeep_all, pairs["random"] = hit[2], hit[3]
    want_edges = edge_threshold is not None or edge_top_n > 0
    thr = float("inf") if edge_threshold is None else float(edge_threshold)
    min_w = min(edge_min_weight, thr)
    wm_t = torch.tensor(wm, device=dev)[:, None, None]
    qs = query.float() * scale  # the scale folded into the queries
    kf = key.float()

    pattern_names = ["focus", "window", "window_matched"] + (["random"] if with_random else [])
    pq_all = torch.zeros(B, H, T, len(_SELECT_NAMES))
    bucket_all = torch.zeros(B, H, len(_SELECT_NAMES), nb)
    soft_all = torch.zeros(B, H, T, 3) if with_soft else None
    edge_parts: list[tuple] = []
    vf = value.float() if value is not None else None
    oerr = {n: torch.zeros(B, H, 2) for n in pattern_names} if value is not None else {}
    pat = {h: {"dense": torch.zeros(B, T, T), "kept": torch.zeros(B, T, T, dtype=torch.bool),
               **({"soft": torch.zeros(B, T, T)} if with_soft else {})} for h in pattern_heads}
    c = max(1, min(T, chunk_elements // max(1, B * H * T)))
    c = -(-T // -(-T // c))  # equal chunks
    for a in range(0, T, c):
        b = min(T, a + c)
        q_pos, k_pos = pos[a:b], pos[:b]
        st = _pair_rows(T, window, sinks, ns, str(dev), a, b)
        logits = torch.matmul(qs[:, :, a:b], kf[:, :, :b].transpose(-1, -2))  # (B, H, c, b)
        if softcap is not None:
            logits = torch.tanh(logits / softcap).mul_(softcap)
        logits.masked_fill_(st["noncausal"], float("-inf"))
        if model_mask is not None:
            allowed = model_mask[:, a:b, :b] | st["diag"]  # a row keeps at least itself
            logits.masked_fill_(~allowed[:, None], float("-inf"))
        P = torch.softmax(logits, dim=-1)
        del logits
        keep = keep_all[:, a:b, :b] if whole else \
            core.hard_mask(query_groups[:, a:b], key_group[:, :b], window, q_pos, k_pos, sinks)
        # Each pair's class: 32 * distance bucket + (keep + 2 rkeep + 4 wm + 8 win + 16 sink);
        # one scatter-add over P gives each query's mass per class (_SELECT sums classes).
        code = st["code"].long() + keep
        code += ((st["dist"] < wm_t) | st["sinkrule"]) * 4
        if with_random:
            rkeep = rkeep_all[:, a:b, :b] if whole else core.hard_mask(
                random_query_groups[:, a:b], random_key_group[:, :b], window, q_pos, k_pos, sinks)
            code += rkeep * 2
        if vf is not None:
            causal_rows = ~st["noncausal"]
            _output_error(P, vf[:, :, :b], oerr, {
                "focus": keep, "window": (causal_rows & ~st["gated"]).expand(B, -1, -1),
                "window_matched": ((st["dist"] < wm_t) | st["sinkrule"]) & causal_rows,
                **({"random": rkeep} if with_random else {})})
        hist = torch.zeros(B, H, b - a, nb << 5).scatter_add_(
            -1, code[:, None].expand(B, H, b - a, b), P).view(B, H, b - a, nb, 32)
        sel = torch.matmul(hist, _SELECT.to(dev))  # (B, H, c, nb, n_sel)
        pq_all[:, :, a:b] = sel.sum(-2)
        bucket_all += sel.sum(2).transpose(-1, -2)
        G = Z = None
        if with_soft:
            # S = softmax(logits + bias) = P G / Z with G = exp(bias) (core's gate: 1 local,
            # max(p_i . p_j, eps) gated, 0 non-causal) and Z_i = sum_j P_ij G_ij: every soft
            # reduction is a weighted row sum of P, one matmul for all of them.
            G = core.soft_gate_bias(log_p[:, a:b], (log_p if log_p_k is None else log_p_k)[:, :b],
                                    window, q_pos, k_pos, eps, sinks).exp_()
            gated = st["gated"].float()
            Gg = G * gated
            W = torch.stack([G, Gg, G * ~keep, Gg * (1 - G)], 2)  # (B, c, 4, b)
            red = torch.matmul(P.transpose(1, 2), W.transpose(-1, -2)).transpose(1, 2)  # (B, H, c, 4)
            Z = red[..., 0]
            soft_all[:, :, a:b] = red[..., 1:] / Z[..., None]
        for h in pattern_heads:
            pat[h]["dense"][:, a:b, :b] = P[:, h]
            pat[h]["kept"][:, a:b, :b] = keep
            if with_soft:
                pat[h]["soft"][:, a:b, :b] = P[:, h] * G / Z[:, h, :, None]
        if want_edges:
            D = P.masked_fill_(keep[:, None], 0.0)  # in place: P is not needed any more
            for bi, hi, qi, kj in _dropped_edges(D, thr, edge_top_n, min_w):
                w = D[bi, hi, qi, kj]
                sw = w * G[bi, qi, kj] / Z[bi, hi, qi] if with_soft else torch.full_like(w, float("nan"))
                edge_parts.append((bi, hi, qi + a, kj, w, sw))
    col = {n: i for i, n in enumerate(_SELECT_NAMES)}
    per_query = {f"coverage_{n}": pq_all[..., col[n]] for n in pattern_names}
    for n in ("dropped", "dense_distant", "sink_mass", "sink_dropped"):
        per_query[n] = pq_all[..., col[n]]
    if with_soft:
        for i, n in enumerate(("soft_distant", "soft_crossing", "soft_crossing_expected")):
            per_query[n] = soft_all[..., i]
    bucket_mass = bucket_all[:, :, col["dense"]]
    bucket_kept = {n: bucket_all[:, :, col[n]] for n in pattern_names}
    edges = {}
    if want_edges:
        cols = ("batch", "head", "query", "key", "weight", "soft_weight")
        if edge_parts:
            edges = {n: torch.cat([p[m] for p in edge_parts]) for m, n in enumerate(cols)}
        else:
            edges = {n: torch.zeros(0, dtype=torch.float32 if n.endswith("weight") else torch.long)
                     for n in cols}
    return AttentionMetrics(per_query, edges_d, bucket_mass, bucket_kept, pairs,
                            torch.tensor(wm, dtype=torch.long), edges, pat, oerr)


def _output_error(P: torch.Tensor, V: torch.Tensor, acc: dict, masks: dict) -> None:
    """Add one chunk's ``sum ||O - O^X||^2`` and ``sum ||O||^2`` per (B, H) into ``acc[name]``
    (``AttentionMetrics.output_error``). P: (B, H, c, b) dense probabilities; V: (B, H, b, D);
    masks: {name: (B, c, b) bool}, each row keeping at least one key of positive weight."""
    O = torch.matmul(P, V)  # (B, H, c, D)
    ref = O.pow(2).sum((-1, -2))  # (B, H)
    for name, m in masks.items():
        if name not in acc:
            continue
        PX = P * m[:, None]  # (B, H, c, b)
        OX = torch.matmul(PX, V) / PX.sum(-1, keepdim=True).clamp(min=1e-30)  # softmax over the kept keys
        acc[name][..., 0] += (O - OX).pow(2).sum((-1, -2))
        acc[name][..., 1] += ref


# ---------------------------------------------------------------------------------------------
# linguistics: groups against POS / dependency labels (docs/method.md §5 "interpretability")

def contingency(groups: np.ndarray, labels: np.ndarray) -> pd.DataFrame:
    """Group x label contingency: ``n_gl = #{tokens t : group_t = g, label_t = l}``.

    Returns long form: ``group, label, tokens (n_gl), share_of_group (n_gl / n_g.),
    share_of_label (n_gl / n_.l), lift (n_gl n / (n_g. n_.l))``, nonzero cells only."""
    df = pd.DataFrame({"group": np.asarray(groups), "label": np.asarray(labels)})
    ct = df.groupby(["group", "label"]).size().rename("tokens").reset_index()
    n = ct["tokens"].sum()
    ng = ct.groupby("group")["tokens"].transform("sum")
    nl = ct.groupby("label")["tokens"].transform("sum")
    ct["share_of_group"] = ct["tokens"] / ng
    ct["share_of_label"] = ct["tokens"] / nl
    ct["lift"] = ct["tokens"] * n / (ng * nl)
    return ct


def cluster_scores(groups: np.ndarray, labels: np.ndarray) -> dict[str, float]:
    """Agreement of groups with labels (scikit-learn, ``labels`` as the classes C, ``groups`` as
    the clusters G): ``nmi = I(C; G) / mean(H(C), H(G))`` (arithmetic), ``homogeneity =
    1 - H(C | G) / H(C)`` (each group holds one label), ``completeness = 1 - H(G | C) / H(G)``
    (each label falls in one group). With K groups and more labels, homogeneity stays below 1."""
    from sklearn.metrics import homogeneity_completeness_v_measure
    labels = np.asarray(labels)
    groups = np.asarray(groups)
    if len(labels) == 0:
        return {"nmi": float("nan"), "homogeneity": float("nan"), "completeness": float("nan")}
    # one pass over the contingency table; the V-measure (beta = 1) is the NMI with the
    # arithmetic mean of H(C) and H(G) (scikit-learn's normalized_mutual_info_score default)
    h, c, v = homogeneity_completeness_v_measure(labels, groups)
    return {"nmi": float(v), "homogeneity": float(h), "completeness": float(c)}


def dominant_labels(ct: pd.DataFrame, top: int = 2) -> dict:
    """Per group, its ``top`` labels by ``share_of_group`` (from ``contingency``), as
    ``{group: [(label, share), ...]}``."""
    out = {}
    for g, sub in ct.sort_values(["group", "tokens", "label"], ascending=[True, False, True]).groupby("group"):
        out[g] = list(zip(sub["label"].head(top), sub["share_of_group"].head(top).astype(float)))
    return out


def kmeans_groups(x: np.ndarray, num_groups: int, seed: int = 0, n_init: int = 1) -> np.ndarray:
    """k-means baseline groups: scikit-learn ``KMeans(K, n_init, random_state=seed)`` (k-means++
    initialization) on the router input after the router's own RMS normalization (``x`` as given:
    (N, d)), minimizing ``sum_t ||x_t - mu_{c(t)}||^2``. Returns (N,) int labels.

    ``n_init=1`` (scikit-learn's own default for k-means++): with 4 restarts it took
    34 s of a 4 x 4096-token recording (30 layers, 16,384 tokens of 576 dimensions each); the
    recorded runs behind figure 5 used 4."""
    from sklearn.cluster import KMeans
    x = np.asarray(x, dtype=np.float32)
    k = min(num_groups, len(x))
    if k < 1:
        return np.zeros(0, dtype=np.int64)
    return KMeans(n_clusters=k, n_init=n_init, random_state=seed).fit_predict(x).astype(np.int64)
