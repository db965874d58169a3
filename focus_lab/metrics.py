"""The recorder's metrics, each defined once here with its formula (PAPER.md §1, §2, §6).

The recorder (``record.py``) calls these functions as the forward runs; the tests compare
them with brute-force computations; nothing else re-derives them. The Focus method itself
(router, Sinkhorn, hard mask, soft gate) comes from ``core.py`` and is never re-implemented.

Notation: ``B`` batch, ``T`` tokens, ``K`` groups, ``k`` top_k, ``w`` window, ``H`` query
heads, ``i`` a query position, ``j`` a key position, ``d = i - j`` their distance.

* ``P_ij`` dense attention: ``softmax_j(scale * q_i . k_j)`` over causal keys ``j <= i``
  (the pretrained model's own attention given this layer's queries and keys).
* ``M_ij`` the hard Focus mask ``core.hard_mask``:
  ``[j <= i] and (g(j) in G_k(i) or d < w)`` (PAPER.md §2).
* ``S_ij`` Focus soft attention: ``softmax_j(scale * q_i . k_j + bias_ij)``, ``bias`` the soft
  gate ``core.soft_gate_bias`` (``log max(p_i . p_j, eps)`` on distant pairs).
* local pairs: ``0 <= d < w``; distant pairs: ``d >= w``.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Sequence

import numpy as np
import pandas as pd
import torch

from . import core

__all__ = [
    "ASSIGNMENT_KINDS", "COVERAGE_PATTERNS", "assignment_distributions", "top1_margin",
    "group_shares", "normalized_entropy", "marginal_error", "balance_stats", "attention_scale",
    "expand_kv", "dense_logits", "kept_pairs", "window_pairs", "matched_window",
    "distance_edges", "AttentionMetrics", "attention_metrics", "contingency", "cluster_scores",
    "dominant_labels", "kmeans_groups", "random_groups",
]

#: Assignments whose balance is recorded (``balance_stats``): Sinkhorn as trained, plain
#: softmax (the collapse the paper reports), and the causal hard assignment the mask uses.
ASSIGNMENT_KINDS = ("sinkhorn", "softmax", "causal")
#: Masks whose coverage of the dense attention is recorded.
COVERAGE_PATTERNS = ("focus", "window", "window_matched", "random")


# ---------------------------------------------------------------------------------------------
# routing: assignments and balance (PAPER.md §1)

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
    hard_share = torch.bincount(hard.reshape(-1), minlength=num_groups).float() / max(T, 1)
    return soft, hard_share


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
    """Random groups at the Focus sparsity: ``core.hard_assign(core.random_scores(...), tau, k)``
    with the seed ``FocusConfig.assignment="random"`` uses for this layer (a function of the
    position only). Returns (query_groups (B, T, k), key_group (B, T))."""
    s = core.random_scores(batch, seq, config.num_groups, seed=config.seed * 1_000_003 + layer_idx)
    return core.hard_assign(s, config.tau, config.top_k)


# ---------------------------------------------------------------------------------------------
# dense attention, masks and their pair counts (PAPER.md §2, §6)

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


def dense_logits(query: torch.Tensor, key: torch.Tensor, scale: float, q_pos: torch.Tensor,
                 k_pos: torch.Tensor) -> torch.Tensor:
    """``scale * q_i . k_j`` with ``-inf`` where ``j > i``. query: (B, H, Tq, D), key:
    (B, H, Tk, D) (kv already expanded), positions (Tq,), (Tk,) -> (B, H, Tq, Tk) float32."""
    logits = torch.matmul(query.float(), key.float().transpose(-1, -2)) * scale
    return logits.masked_fill_(~core.causal_mask(q_pos, k_pos), float("-inf"))


def kept_pairs(query_groups: torch.Tensor, key_group: torch.Tensor, window: int) -> torch.Tensor:
    """``sum_{i,j} M_ij`` per batch element, without building the (T, T) mask:
    ``sum_i min(i + 1, w) + sum_{i >= w} sum_{g in G_k(i)} #{j <= i - w : g(j) = g}``.
    query_groups: (B, T, k) distinct groups per row; key_group: (B, T) -> (B,) long."""
    B, T = key_group.shape
    K = int(max(int(key_group.max()), int(query_groups.max()))) + 1 if T else 1
    onehot = torch.nn.functional.one_hot(key_group, K)  # (B, T, K)
    counts = onehot.cumsum(1)  # (B, T, K): #{j <= t : g(j) = g}
    local = window_pairs(T, window)
    if T <= window:
        return torch.full((B,), local, dtype=torch.long)
    before = counts[:, : T - window]  # row t = i - w for i = w..T-1
    far = before.gather(2, query_groups[:, window:]).sum((1, 2))
    return far + local


def window_pairs(seq: int, window: int) -> int:
    """Causal pairs with ``d < w`` among ``seq`` tokens: ``sum_i min(i + 1, w)``."""
    w = min(window, seq)
    return w * (w + 1) // 2 + (seq - w) * w


def matched_window(pairs: int, seq: int) -> int:
    """The sliding window ``w'`` in 1..seq whose pair count ``window_pairs(seq, w')`` is closest to
    ``pairs`` (ties to the smaller): the window-only mask at the sparsity of another mask."""
    cand = torch.arange(1, seq + 1)
    w = torch.minimum(cand, torch.tensor(seq))
    counts = w * (w + 1) // 2 + (seq - w) * w
    return int(cand[(counts - int(pairs)).abs().argmin()])


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

    Per query (``(B, Hs, T)`` float32, Hs = recorded heads), keys of ``per_query``:

    * ``coverage_<pattern>`` for each of ``COVERAGE_PATTERNS``: ``sum_j P_ij X_ij``, X the
      pattern's mask: ``focus`` = M, ``window`` = ``[0 <= d < w]``, ``window_matched`` =
      ``[0 <= d < w']`` with ``w' = matched_window(sum M, T)`` (the same pair count as M),
      ``random`` = the hard mask of ``random_groups`` (same K, k). Coverage is
      ``1 - TV(P, P restricted to X and renormalized)``.
    * ``dropped``: ``sum_j P_ij (1 - M_ij)``: the dense mass the hard mask drops
      (``coverage_focus + dropped = 1``).
    * ``dense_distant``: ``sum_{d >= w} P_ij``.
    * ``sink_mass``: ``sum_{j < n_sink} P_ij``; ``sink_dropped``: ``sum_{j < n_sink} P_ij (1 - M_ij)``.
    * ``soft_distant``: ``sum_{d >= w} S_ij``.
    * ``soft_crossing``: ``sum_{d >= w} S_ij [g(j) not in G_k(i)]``: the Focus soft model's mass
      on distant keys of other (hard) groups, i.e. what hard inference removes from it.
    * ``soft_crossing_expected``: ``sum_{d >= w} S_ij (1 - p_i . p_j)``: the same with soft
      (Sinkhorn) groups: the probability-weighted mass across groups (0 when K = 1).

    Per distance bucket ``[lo, hi)`` (``edges``), sums over queries, ``(B, Hs, nb)``:
    ``bucket_mass`` = ``sum_i sum_{lo <= d < hi} P_ij`` and ``bucket_kept[pattern]`` the same
    times ``X_ij``.

    ``pairs``: ``{pattern: (B,) kept causal pairs}`` and ``"causal"``, ``"local"`` totals.
    ``edges``: the dropped-dependency audit, 1-D tensors ``batch, head, query, key, weight
    (P_ij), soft_weight (S_ij, nan when crossing is off)``: pairs with ``M_ij = 0`` and
    ``P_ij > edge_threshold``, plus each query's ``edge_top_n`` largest dropped ``P_ij`` above
    ``edge_min_weight``. ``patterns``: ``{head: {"dense": (B, T, T), "soft": (B, T, T),
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


def _beyond(cum: torch.Tensor, q_pos: torch.Tensor, dist: torch.Tensor) -> torch.Tensor:
    """Mass at distance >= d from a key-cumsum: ``cum[..., i - d]`` (0 where ``i - d < 0``).
    cum: (B, H, c, Tk); q_pos: (c,); dist: (B, nd) -> (B, H, c, nd)."""
    B, H, c, _ = cum.shape
    idx = q_pos[None, :, None] - dist[:, None, :]  # (B, c, nd)
    valid = idx >= 0
    g = cum.gather(-1, idx.clamp(min=0)[:, None].expand(B, H, c, idx.shape[-1]))
    return g * valid[:, None]


@torch.no_grad()
def attention_metrics(query: torch.Tensor, key: torch.Tensor, scale: float,
                      query_groups: torch.Tensor, key_group: torch.Tensor, window: int, *,
                      random_query_groups: torch.Tensor | None = None,
                      random_key_group: torch.Tensor | None = None,
                      log_p: torch.Tensor | None = None, eps: float = 1e-6,
                      sink_tokens: int = 4, edge_threshold: float | None = None,
                      edge_top_n: int = 0, edge_min_weight: float = 0.0,
                      pattern_heads: Sequence[int] = (), chunk_elements: int = 1 << 21
                      ) -> AttentionMetrics:
    """All attention metrics of one layer, in chunks of queries (memory ``O(H c T)``).

    Args:
        query: (B, Hs, T, D) queries of the recorded heads; key: (B, Hs, T, D), kv heads
            already expanded (``expand_kv``); scale: the layer's logit scale.
        query_groups (B, T, k), key_group (B, T): the hard Focus assignment (``core.Routing``).
        random_query_groups, random_key_group: the random baseline (``random_groups``); when
            None, ``coverage_random`` is not computed.
        log_p: (B, T, K) Sinkhorn log probabilities; when None the soft metrics are skipped.
        sink_tokens: n_sink, the first positions counted as attention sinks (PAPER.md §6).
        edge_threshold / edge_top_n / edge_min_weight: the dropped-edge audit (off when
            edge_threshold is None and edge_top_n == 0).
        pattern_heads: indices into the recorded heads whose full (T, T) maps are kept.
        chunk_elements: bound on ``B * Hs * c * T`` per chunk.
    Returns:
        AttentionMetrics (definitions there).
    """
    B, H, T, _ = query.shape
    dev = query.device
    pos = torch.arange(T, device=dev)
    edges_d = distance_edges(T, window)
    nb = len(edges_d) - 1
    pairs = {"focus": kept_pairs(query_groups, key_group, window),
             "window": torch.full((B,), window_pairs(T, window), dtype=torch.long),
             "causal": torch.full((B,), T * (T + 1) // 2, dtype=torch.long)}
    pairs["local"] = pairs["window"]
    wm = torch.tensor([matched_window(int(p), T) for p in pairs["focus"]], dtype=torch.long)
    pairs["window_matched"] = torch.tensor([window_pairs(T, int(x)) for x in wm], dtype=torch.long)
    with_random = random_query_groups is not None
    if with_random:
        pairs["random"] = kept_pairs(random_query_groups, random_key_group, window)
    with_soft = log_p is not None
    p_soft = log_p.float().exp() if with_soft else None
    want_edges = edge_threshold is not None or edge_top_n > 0
    thr = float("inf") if edge_threshold is None else float(edge_threshold)
    min_w = min(edge_min_weight, thr)

    # distances to read from the key-cumsums: bucket edges, min(hi, w'), w', w
    e = torch.tensor(edges_d, dtype=torch.long)
    his = torch.minimum(e[1:][None, :], wm[:, None])  # (B, nb)
    dist = torch.cat([e[None].expand(B, -1), his, wm[:, None],
                      torch.full((B, 1), window, dtype=torch.long)], 1).to(dev)  # (B, nd)
    i_wm, i_w = 2 * nb + 1, 2 * nb + 2  # columns of w' and w in ``dist``

    names = ["coverage_focus", "coverage_window", "coverage_window_matched", "dropped",
             "dense_distant", "sink_mass", "sink_dropped"]
    if with_random:
        names.append("coverage_random")
    if with_soft:
        names += ["soft_distant", "soft_crossing", "soft_crossing_expected"]
    per_query = {n: torch.zeros(B, H, T) for n in names}
    bucket_mass = torch.zeros(B, H, nb)
    kept_names = ["focus", "window", "window_matched"] + (["random"] if with_random else [])
    bucket_kept = {n: torch.zeros(B, H, nb) for n in kept_names}
    edge_parts: list[tuple] = []
    pat = {h: {"dense": torch.zeros(B, T, T), "kept": torch.zeros(B, T, T, dtype=torch.bool),
               **({"soft": torch.zeros(B, T, T)} if with_soft else {})} for h in pattern_heads}
    lo_lt_wm = (e[:-1][None, :] < wm[:, None]).to(dev)  # (B, nb)
    local_bucket = (e[1:] <= window).to(dev)  # (nb,) buckets inside the window
    ns = max(0, int(sink_tokens))

    c = max(1, min(T, chunk_elements // max(1, B * H * T)))
    for a in range(0, T, c):
        b = min(T, a + c)
        q_pos, k_pos = pos[a:b], pos[:b]
        logits = dense_logits(query[:, :, a:b], key[:, :, :b], scale, q_pos, k_pos)  # (B,H,c,b)
        P = torch.softmax(logits, dim=-1)
        keep = core.hard_mask(query_groups[:, a:b], key_group[:, :b], window, q_pos, k_pos)  # (B,c,b)
        Pk = P * keep[:, None]
        cum_p, cum_k = P.cumsum(-1), Pk.cumsum(-1)
        bp, bk = _beyond(cum_p, q_pos, dist), _beyond(cum_k, q_pos, dist)  # (B,H,c,nd)
        total = bp[..., 0]
        pq = per_query
        pq["coverage_focus"][:, :, a:b] = bk[..., 0]
        pq["coverage_window"][:, :, a:b] = total - bp[..., i_w]
        pq["coverage_window_matched"][:, :, a:b] = total - bp[..., i_wm]
        pq["dense_distant"][:, :, a:b] = bp[..., i_w]
        D = P - Pk  # dropped dense mass per pair
        pq["dropped"][:, :, a:b] = D.sum(-1)
        if ns > 0:
            s = min(ns, b)
            pq["sink_mass"][:, :, a:b] = cum_p[..., s - 1]
            pq["sink_dropped"][:, :, a:b] = cum_p[..., s - 1] - cum_k[..., s - 1]
        bucket_mass += (bp[..., :nb] - bp[..., 1:nb + 1]).sum(2)
        bucket_kept["focus"] += (bk[..., :nb] - bk[..., 1:nb + 1]).sum(2)
        bucket_kept["window"] += (bp[..., :nb] - bp[..., 1:nb + 1]).sum(2) * local_bucket
        bucket_kept["window_matched"] += ((bp[..., :nb] - bp[..., nb + 1:2 * nb + 1])
                                          * lo_lt_wm[:, None, None]).sum(2)
        if with_random:
            rkeep = core.hard_mask(random_query_groups[:, a:b], random_key_group[:, :b], window,
                                   q_pos, k_pos)
            cum_r = (P * rkeep[:, None]).cumsum(-1)
            br = _beyond(cum_r, q_pos, dist[:, : nb + 1])
            pq["coverage_random"][:, :, a:b] = br[..., 0]
            bucket_kept["random"] += (br[..., :nb] - br[..., 1:nb + 1]).sum(2)
        S = None
        if with_soft:
            bias = core.soft_gate_bias(log_p[:, a:b], log_p[:, :b], window, q_pos, k_pos, eps)
            S = torch.softmax(logits + bias[:, None], dim=-1)
            distant = core.causal_mask(q_pos, k_pos) & ~core.local_mask(q_pos, k_pos, window)
            Sd = S * distant
            agree = p_soft[:, a:b] @ p_soft[:, :b].transpose(1, 2)  # (B, c, b) = p_i . p_j
            sd = Sd.sum(-1)
            pq["soft_distant"][:, :, a:b] = sd
            pq["soft_crossing"][:, :, a:b] = (Sd * ~keep[:, None]).sum(-1)
            pq["soft_crossing_expected"][:, :, a:b] = (Sd * (1 - agree)[:, None]).sum(-1)
        if want_edges:
            sel = D > thr
            if edge_top_n > 0:
                vals, idx = D.topk(min(edge_top_n, b), dim=-1)
                sel |= torch.zeros_like(sel).scatter_(-1, idx, vals > min_w)
            nz = sel.nonzero()  # (n, 4): batch, head, query - a, key
            if nz.numel():
                bi, hi, qi, kj = nz.unbind(1)
                w = D[bi, hi, qi, kj]
                sw = S[bi, hi, qi, kj] if S is not None else torch.full_like(w, float("nan"))
                edge_parts.append((bi, hi, qi + a, kj, w, sw))
        for h in pattern_heads:
            pat[h]["dense"][:, a:b, :b] = P[:, h]
            pat[h]["kept"][:, a:b, :b] = keep
            if S is not None:
                pat[h]["soft"][:, a:b, :b] = S[:, h]
    edges = {}
    if want_edges:
        cols = ("batch", "head", "query", "key", "weight", "soft_weight")
        if edge_parts:
            edges = {n: torch.cat([p[m] for p in edge_parts]) for m, n in enumerate(cols)}
        else:
            edges = {n: torch.zeros(0, dtype=torch.float32 if n.endswith("weight") else torch.long)
                     for n in cols}
    return AttentionMetrics(per_query, edges_d, bucket_mass, bucket_kept, pairs, wm, edges, pat)


# ---------------------------------------------------------------------------------------------
# linguistics: groups against POS / dependency labels (PAPER.md §5 "interpretability")

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
    from sklearn.metrics import completeness_score, homogeneity_score, normalized_mutual_info_score
    labels = np.asarray(labels)
    groups = np.asarray(groups)
    if len(labels) == 0:
        return {"nmi": float("nan"), "homogeneity": float("nan"), "completeness": float("nan")}
    return {"nmi": float(normalized_mutual_info_score(labels, groups)),
            "homogeneity": float(homogeneity_score(labels, groups)),
            "completeness": float(completeness_score(labels, groups))}


def dominant_labels(ct: pd.DataFrame, top: int = 2) -> dict:
    """Per group, its ``top`` labels by ``share_of_group`` (from ``contingency``), as
    ``{group: [(label, share), ...]}``."""
    out = {}
    for g, sub in ct.sort_values(["group", "tokens", "label"], ascending=[True, False, True]).groupby("group"):
        out[g] = list(zip(sub["label"].head(top), sub["share_of_group"].head(top).astype(float)))
    return out


def kmeans_groups(x: np.ndarray, num_groups: int, seed: int = 0) -> np.ndarray:
    """k-means baseline groups: scikit-learn ``KMeans(K, n_init=4, random_state=seed)`` on the
    router input after the router's own RMS normalization (``x`` as given: (N, d)), minimizing
    ``sum_t ||x_t - mu_{c(t)}||^2``. Returns (N,) int labels."""
    from sklearn.cluster import KMeans
    x = np.asarray(x, dtype=np.float32)
    k = min(num_groups, len(x))
    if k < 1:
        return np.zeros(0, dtype=np.int64)
    return KMeans(n_clusters=k, n_init=4, random_state=seed).fit_predict(x).astype(np.int64)
