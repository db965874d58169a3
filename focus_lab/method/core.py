"""The Focus method in one place: router scores, Sinkhorn, the soft gate, the hard mask.

Every other module (retrofit, training, recording, analyses) calls these functions; none
re-implements them. Sources: docs/method.md §1 (routing), §2 (attention pattern).

Shapes use B = batch, T = tokens (Tq queries, Tk keys), K = num_groups, k = top_k,
H = query heads, Hkv = key/value heads, D = head_dim, d = d_model, d_g = router_dim.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Callable

import torch
import torch.nn as nn
import torch.nn.functional as F

from focus_lab.method.config import FocusConfig

#: devices whose results the host reads without waiting: the CPU. There a one-token decode step
#: checks its router scores and attends through a layer's group-ordered store
#: (``decomposition.GroupedKV``); elsewhere (a GPU) it skips the check and attends in one call
#: under its mask row (``decomposition._one_query``), so the host never waits for the device.
#: ``analyses.kernel_counts --path gpu`` empties it to count on a CPU what a GPU step runs.
HOST_DEVICES = ("cpu",)


def on_host(x: torch.Tensor) -> bool:
    """Whether ``x`` lives on one of the ``HOST_DEVICES`` (reading it never waits for a device)."""
    return x.device.type in HOST_DEVICES


def layer_seed(seed: int, layer_idx: int) -> int:
    """The per-layer seed of everything random about one layer (router init, random and
    shuffled control groups): ``seed * 1_000_003 + layer_idx``, so layers differ and a run
    is reproducible from ``FocusConfig.seed`` alone."""
    return seed * 1_000_003 + layer_idx


def rms_normalize(h: torch.Tensor, eps: float = 1e-6) -> torch.Tensor:
    """``h / RMS(h)`` over the last dim, in fp32: the router's input normalization
    (``FocusConfig.normalize_input``, docs/method.md §1.1 [ours]). h: (..., d_model)."""
    h = h.float()
    return h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + eps)


def hard_group_shares(key_group: torch.Tensor, num_groups: int) -> torch.Tensor:
    """(K,) float share of tokens in each hard top-1 group (sums to 1; 1/K each is perfect
    balance; less than 1 when the group capacity evicts keys, whose id K is no group).
    key_group: (...) long group ids in 0..K, e.g. (B, T)."""
    counts = torch.bincount(key_group.reshape(-1), minlength=num_groups).float()
    return counts[:num_groups] / counts.sum().clamp(min=1)


class Router(nn.Module):
    """One router per attention layer, shared by all heads and by the query and key roles.

    ``S = (norm(h) @ W_g) @ C.T`` (docs/method.md §1), ``W_g = proj: (d_model, router_dim)``,
    ``C = centroids: (num_groups, router_dim)``. ``norm`` divides by the RMS over d_model when
    ``config.normalize_input`` (an [ours] decision, see FocusConfig). With
    ``config.key_router`` the key role scores with its own ``key_proj: (d_model, router_dim)``
    against the same centroids (docs/method.md §1.6 [ours]); ``key_proj`` is None otherwise.

    Init: ``proj ~ N(0, 1/d_model)``, ``centroids ~ N(0, tau^2/d_g)``, so that with a
    unit-RMS input the logits ``S / tau`` start near N(0, 1) (soft, balanced Sinkhorn).

    Buffers:
        group_bias: (num_groups,) per-group offset in logit units (score / tau), an EMA of
            Sinkhorn's column potentials, added before the causal hard top-k (docs/method.md §1 [ours]).
        random_table: (max_positions, num_groups) fixed scores used when
            ``config.assignment == "random"`` (a control at equal sparsity).
    """

    key_router_allowed = True  # False in baselines (focus_lab.eval.baselines): one role only

    def __init__(self, d_model: int, config: FocusConfig, layer_idx: int):
        super().__init__()
        # the config the router was built with: its shape (num_groups, router_dim), seed and the
        # defaults of ``forward``; the config in force for a forward is passed to ``route``
        self.config = config
        self.layer_idx = layer_idx
        g = torch.Generator().manual_seed(layer_seed(config.seed, layer_idx))
        K, dg = config.num_groups, config.router_dim
        self.proj = nn.Parameter(torch.randn(d_model, dg, generator=g) / math.sqrt(d_model))
        # init so that S / tau ~ N(0, 1): Sinkhorn starts soft and balanced, then sharpens
        self.centroids = nn.Parameter(torch.randn(K, dg, generator=g) * (config.tau / math.sqrt(dg)))
        self.register_buffer("group_bias", torch.zeros(K))
        # the shuffled control's groups of the last forward from position 0, per role ({role: (B, T, ...)})
        self._shuffle_pool: dict[str, torch.Tensor] = {}
        # the key role's own projection, started equal to proj: the shared router is its start
        self.key_proj = (nn.Parameter(self.proj.detach().clone())
                         if config.key_router and self.key_router_allowed else None)

    def routes(self, config: FocusConfig | None = None) -> bool:
        """Whether this layer's groups come from this router under ``config`` (default the
        router's own): False for balanced random groups (``assignment="random"``, or the layer in
        ``random_layers``, docs/method.md §2.6). Training leaves a router that does not route
        untouched: no loss, no gradient, no group-bias update."""
        return (config or self.config).assignment_at(self.layer_idx) != "random"

    def forward(self, h: torch.Tensor, config: FocusConfig | None = None, start: int = 0) -> torch.Tensor:
        """Router scores. h: (B, T, d) attention input -> S: (B, T, K), fp32 (the query role;
        the key role too unless the router has a ``key_proj``, see ``key_scores``).

        ``config``: the forward's config (``assignment``, ``normalize_input``); default the
        router's own. ``start``: absolute position of the first token (random groups only: a
        KV-cache decode step)."""
        cfg = config or self.config
        if not self.routes(cfg):
            return random_scores(h.shape[0], h.shape[1], cfg.num_groups,
                                 seed=layer_seed(cfg.seed, self.layer_idx), device=h.device, start=start)
        return self._project(h, cfg, self.proj)

    def _project(self, h: torch.Tensor, cfg: FocusConfig, weight: torch.Tensor) -> torch.Tensor:
        """``(norm(h) @ weight) @ C.T``: h (B, T, d), weight (d, d_g) -> (B, T, K) fp32, also when
        the model (routers included) was cast to half precision after attaching."""
        h = rms_normalize(h) if cfg.normalize_input else h.float()  # (B, T, d)
        return (h @ weight.float()) @ self.centroids.float().T  # (B, T, K)

    def key_scores(self, h: torch.Tensor, config: FocusConfig | None = None) -> torch.Tensor | None:
        """The key role's scores ``(norm(h) @ W_k) @ C.T``: h (B, T, d) -> (B, T, K) fp32; None
        when the key role shares ``forward``'s scores (no ``key_proj``, or random groups here)."""
        cfg = config or self.config
        if self.key_proj is None or not self.routes(cfg):
            return None
        return self._project(h, cfg, self.key_proj)

    def assign(self, scores: torch.Tensor, config: FocusConfig, token_mask: torch.Tensor | None = None,
               start: int = 0) -> tuple[torch.Tensor | None, torch.Tensor | None, torch.Tensor, torch.Tensor]:
        """Soft and hard assignments from the scores; ``route`` calls this after ``forward``.

        The one extension point for baselines (``focus_lab.eval.baselines``): a subclass may
        change how scores become groups (plain softmax, prefix-causal Sinkhorn, MoBA blocks)
        while the mask rule, the gate and the attention path stay those of this module.
        Default: Sinkhorn in soft mode or training (docs/method.md §1), ``hard_assign`` always.
        A router with a ``key_proj`` assigns its keys in ``assign_keys`` afterwards.
        ``start``: absolute position of the first token (> 0 in a KV-cache decode step; the
        shuffled control and the MoBA gate need it).

        Returns: (log_p (B, T, K) or None, col_potential (B, K) or None,
        query_groups (B, T, k), key_group (B, T)).
        """
        log_p = col = None
        if config.mode == "soft" or self.training:
            log_p, col = sinkhorn(scores, config.tau, config.sinkhorn_iters, token_mask)
        qg, kg = hard_groups(scores, config, self.layer_idx, self._bias(config))
        if config.assignment_at(self.layer_idx) == "shuffled":  # control: same group sizes, random membership
            qg, kg = self._shuffle(qg, config, start, "query"), self._shuffle(kg, config, start, "key")
        return log_p, col, qg, kg

    def _shuffle(self, groups: torch.Tensor, config: FocusConfig, start: int = 0, role: str = "query"
                 ) -> torch.Tensor:
        """The shuffled control (``FocusConfig.assignment``): groups (B, T, ...) of positions
        ``start .. start + T - 1`` -> the groups those positions take.

        A forward from position 0 moves its groups by the layer's fixed permutation of its T
        positions and keeps the result, per ``role``, as the pool. A later forward (a KV-cache
        step, ``start`` > 0) gives a position the pool's groups there if the first forward covered
        it, else those of pool position ``shuffle_sources(...)``: a seeded draw, a function of
        (seed, layer, pool size, position) only, so one token at a time and a chunk agree, and a
        restart from an earlier position (a copied cache) sees the same groups.
        Raises RuntimeError on a step with no pool (no forward from position 0) or another batch.
        Source: docs/method.md §7 (controls at equal sparsity)."""
        seed = layer_seed(config.seed, self.layer_idx)
        B, T = groups.shape[:2]
        if start == 0:
            g = torch.Generator().manual_seed(seed)
            out = groups[:, torch.randperm(T, generator=g).to(groups.device)]  # (B, T, ...)
            self._shuffle_pool[role] = out
            return out
        pool = self._shuffle_pool.get(role)
        if pool is None or pool.shape[0] != B or pool.shape[2:] != groups.shape[2:]:
            raise RuntimeError(
                f"shuffled groups of layer {self.layer_idx}: a decode step from position {start} with no "
                "groups of a first forward to draw from: start with a forward from position 0")
        n0 = pool.shape[1]
        pos = torch.arange(start, start + T)  # (T,)
        src = torch.where(pos < n0, pos, shuffle_sources(seed, n0, start, T))  # (T,) pool positions
        return pool[:, src.to(groups.device)]  # (B, T, ...)

    def _bias(self, config: FocusConfig) -> torch.Tensor | None:
        # random groups are a fixed, balanced control: the router's calibrated bias does not apply
        return None if config.assignment_at(self.layer_idx) == "random" else self.group_bias

    def assign_keys(self, key_scores: torch.Tensor, config: FocusConfig, key_group: torch.Tensor,
                    token_mask: torch.Tensor | None = None, start: int = 0
                    ) -> tuple[torch.Tensor | None, torch.Tensor | None, torch.Tensor]:
        """The key role of a router with a ``key_proj`` (docs/method.md §1.6 [ours]).

        Each key lives in the top-1 group of ``key_scores / tau + group_bias``; the group bias
        follows the keys' Sinkhorn column potentials, since the keys' group sizes set the
        cost. A layer at k = 0 (``hard_groups``) keeps ``key_group``; the shuffled control
        moves the keys' groups by the same permutation as ``assign``.

        Args: key_scores (B, T, K); key_group (B, T) long, what ``assign`` gave; start: absolute
        position of the first token.
        Returns: (key_log_p (B, T, K) or None, key col_potential (B, K) or None, key_group (B, T)).
        """
        log_p = col = None
        if config.mode == "soft" or self.training:
            log_p, col = sinkhorn(key_scores, config.tau, config.sinkhorn_iters, token_mask)
        if config.top_k_at(self.layer_idx) > 0:
            key_group = hard_assign(key_scores, config.tau, 1, self._bias(config))[1]  # (B, T)
            if config.assignment_at(self.layer_idx) == "shuffled":
                key_group = self._shuffle(key_group, config, start, "key_proj")
        return log_p, col, key_group

    @torch.no_grad()
    def update_bias(self, col_potential: torch.Tensor, momentum: float | None = None) -> None:
        """EMA of Sinkhorn's column potentials. col_potential: (B, K) in logit units;
        ``momentum``: the forward's ``bias_momentum`` (default the router's config's).

        Under torch.distributed the batch mean is averaged over ranks, so every rank keeps the
        same bias, equal to a single process's on the same global batch."""
        v = col_potential.float().mean(0)
        if torch.distributed.is_available() and torch.distributed.is_initialized():
            torch.distributed.all_reduce(v)
            v = v / torch.distributed.get_world_size()
        v = v - v.mean()
        m = self.config.bias_momentum if momentum is None else momentum
        self.group_bias.mul_(1 - m).add_(m * v)


RANDOM_TABLE_ROWS = 64  # random_scores draws whole multiples of this many positions


def random_scores(batch: int, seq: int, num_groups: int, seed: int,
                  device: torch.device | str = "cpu", start: int = 0) -> torch.Tensor:
    """Fixed random scores (B, T, K) of positions ``start .. start + T - 1``: random groups.

    A function of (seed, absolute position) only, so a KV-cache decode step (``start`` > 0) sees
    the groups a full forward gives its tokens. The table is drawn in whole multiples of
    RANDOM_TABLE_ROWS positions: torch's CPU ``randn`` of n x K values is a prefix of a longer
    draw when n is such a multiple (its vectorized path works in blocks of 16 values), so every
    length agrees on shared positions. The longest table drawn per (seed, K) is kept (grown by
    doubling), so KV-cache decode steps slice it instead of redrawing every earlier position.
    """
    rows = -(-(start + seq) // RANDOM_TABLE_ROWS) * RANDOM_TABLE_ROWS
    key = (seed, num_groups)
    table = _RANDOM_TABLES.get(key)
    if table is None or table.shape[0] < rows:  # grow by doubling: decode steps reuse the draw
        rows = max(rows, 2 * table.shape[0] if table is not None else 0)
        if len(_RANDOM_TABLES) >= 512:
            _RANDOM_TABLES.clear()
        table = _RANDOM_TABLES[key] = torch.randn(rows, num_groups, generator=torch.Generator().manual_seed(seed))
    table = table[start:start + seq].clone()  # (T, K), a copy: the cached table stays intact
    return table.to(device).unsqueeze(0).expand(batch, seq, num_groups)


_RANDOM_TABLES: dict[tuple[int, int], torch.Tensor] = {}  # (seed, K) -> the longest table drawn

SHUFFLE_DRAW_ROWS = 4096  # shuffle_sources draws positions in blocks of this many


def shuffle_sources(seed: int, pool: int, start: int, seq: int) -> torch.Tensor:
    """(seq,) long in ``0 .. pool - 1``: the pool position whose shuffled groups position
    ``start + t`` takes, past the first forward of the shuffled control (``Router._shuffle``).
    Uniform draws, a function of (seed, pool, absolute position) only: block ``b`` of
    ``SHUFFLE_DRAW_ROWS`` positions is one ``randint`` from a generator seeded by (seed, pool, b),
    so any chunking of the positions gives the same draws."""
    pos = torch.arange(start, start + seq)  # (seq,)
    out = torch.empty(seq, dtype=torch.long)
    for b in torch.unique(pos // SHUFFLE_DRAW_ROWS).tolist():
        key = (seed, pool, b)
        draw = _SHUFFLE_DRAWS.get(key)
        if draw is None:
            if len(_SHUFFLE_DRAWS) >= 4096:
                _SHUFFLE_DRAWS.clear()
            g = torch.Generator().manual_seed(((seed * 1_000_003 + pool) * 1_000_003 + b) % 2 ** 62)
            draw = _SHUFFLE_DRAWS[key] = torch.randint(pool, (SHUFFLE_DRAW_ROWS,), generator=g)
        sel = pos // SHUFFLE_DRAW_ROWS == b
        out[sel] = draw[pos[sel] % SHUFFLE_DRAW_ROWS]
    return out


_SHUFFLE_DRAWS: dict[tuple[int, int, int], torch.Tensor] = {}  # (seed, pool, block) -> the block's draws


def sinkhorn(scores: torch.Tensor, tau: float, iters: int,
             token_mask: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """Log-domain Sinkhorn: ``P = Sinkhorn(exp(S / tau))`` (docs/method.md §1).

    Alternately (1) normalize over tokens so each group carries n/K mass (n valid tokens), then
    (2) over groups so each token's row sums to 1. Ends on step (2): rows are exact, columns
    approximate (their error is a recorded metric). Computed in log space: exp(S / 0.1)
    overflows in fp32. Step (1) looks at all tokens, later ones included: a causal leak
    acceptable for training only (docs/method.md §1 [ours]).

    Args:
        scores: (B, T, K) router scores.
        tau: temperature > 0.
        iters: number of (tokens, groups) normalization pairs, >= 1.
        token_mask: optional (B, T) bool, False for padding (excluded from the balance).
    Returns:
        log_p: (B, T, K) log assignment probabilities, rows sum to 1 (masked rows too).
        col_potential: (B, K) the column scaling ``v`` in logit units (score / tau).
    """
    logits = scores.float() / tau  # (B, T, K)
    B, T, K = logits.shape
    if token_mask is None:
        n = torch.full((B, 1, 1), float(T), device=logits.device)
        col_logits = logits
    else:
        n = token_mask.sum(-1).clamp(min=1).float().view(B, 1, 1)
        col_logits = logits.masked_fill(~token_mask[..., None], float("-inf"))
    log_target = torch.log(n / K)  # (B, 1, 1) mass per group
    u = torch.zeros(B, T, 1, device=logits.device)
    v = torch.zeros(B, 1, K, device=logits.device)
    for _ in range(iters):
        v = log_target - torch.logsumexp(col_logits + u, dim=1, keepdim=True)  # (B, 1, K)
        u = -torch.logsumexp(logits + v, dim=2, keepdim=True)  # (B, T, 1)
    return logits + u + v, v.squeeze(1)


def window_only_groups(batch: int, seq: int, device: torch.device | str = "cpu"
                       ) -> tuple[torch.Tensor, torch.Tensor]:
    """Groups under which no query shares a group with any key, so the hard mask keeps only the
    window and the sinks: every query in group 1, every key in group 0. Used by window mode and
    by a layer whose ``FocusConfig.top_k_at`` is 0 (docs/method.md §2.7).

    Returns: query_groups (batch, seq, 1) long, key_group (batch, seq) long."""
    qg = torch.ones(batch, seq, 1, dtype=torch.long, device=device)  # (B, T, 1)
    kg = torch.zeros(batch, seq, dtype=torch.long, device=device)  # (B, T)
    return qg, kg


def hard_groups(scores: torch.Tensor, config: FocusConfig, layer_idx: int,
                group_bias: torch.Tensor | None = None, pick=None) -> tuple[torch.Tensor, torch.Tensor]:
    """The hard groups of layer ``layer_idx``: ``hard_assign`` with the layer's k
    (``FocusConfig.top_k_at``), or ``window_only_groups`` where that k is 0 (docs/method.md §2.7).
    Every router (Focus, the baselines, the recorder's random groups) takes its hard groups here;
    ``pick(k) -> (query_groups, key_group)`` replaces ``hard_assign`` for k >= 1 (MoBA's block
    gate), the k = 0 rule staying this function's.

    scores: (B, T, K). Returns query_groups (B, T, max(k, 1)) long, key_group (B, T) long."""
    k = config.top_k_at(layer_idx)
    if k == 0:
        return window_only_groups(scores.shape[0], scores.shape[1], scores.device)
    return pick(k) if pick is not None else hard_assign(scores, config.tau, k, group_bias)


def hard_assign(scores: torch.Tensor, tau: float, top_k: int,
                group_bias: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """Causal hard assignment: token i's groups depend on token i alone (docs/method.md §1-§2 [ours]).

    ``a = S / tau + group_bias``; a query joins its ``top_k`` groups, a key lives in its
    top-1 group, so no (query, key) pair is counted twice.

    Args:
        scores: (B, T, K); tau > 0; top_k in 1..K; group_bias: (K,) logit units or None.
    Returns:
        query_groups: (B, T, top_k) long, best first; key_group: (B, T) long.
    """
    a = hard_logits(scores, tau, group_bias)  # (B, T, K)
    query_groups = a.topk(top_k, dim=-1).indices  # (B, T, k)
    return query_groups, query_groups[..., 0]


def hard_logits(scores: torch.Tensor, tau: float, group_bias: torch.Tensor | None = None) -> torch.Tensor:
    """The logits hard assignment ranks groups by: ``S / tau + group_bias``, (B, T, K) fp32
    (docs/method.md §1.3); ``hard_assign`` and the group capacity (§2.9) both rank by them."""
    a = scores.float() / tau  # (B, T, K)
    return a if group_bias is None else a + group_bias.to(a.device)


def local_mask(q_pos: torch.Tensor, k_pos: torch.Tensor, window: int, sinks: int = 0) -> torch.Tensor:
    """(Tq, Tk) bool, the always-kept causal pairs: ``0 <= i - j < window`` (docs/method.md §2), or
    ``j < sinks`` and ``j <= i`` (attention sinks, docs/method.md §6 [ours])."""
    d = q_pos[:, None] - k_pos[None, :]  # (Tq, Tk)
    m = (d >= 0) & (d < window)
    if sinks > 0:
        m = m | ((k_pos[None, :] < sinks) & (d >= 0))
    return m


def causal_mask(q_pos: torch.Tensor, k_pos: torch.Tensor) -> torch.Tensor:
    """(Tq, Tk) bool, True where ``j <= i``."""
    return k_pos[None, :] <= q_pos[:, None]


def distant_mask(q_pos: torch.Tensor, k_pos: torch.Tensor, window: int, sinks: int = 0) -> torch.Tensor:
    """(Tq, Tk) bool, the pairs the groups decide: causal and not in ``local_mask`` (docs/method.md §2.5)."""
    return causal_mask(q_pos, k_pos) & ~local_mask(q_pos, k_pos, window, sinks)


#: a query slot that joins no group (a ``query_groups`` patch, e.g. a group cut out): ``hard_mask``
#: never matches it to a key, the decomposition gives it no segment, ``distant_kept_counts``
#: counts nothing for it
NO_GROUP = -1


def hard_mask(query_groups: torch.Tensor, key_group: torch.Tensor, window: int,
              q_pos: torch.Tensor, k_pos: torch.Tensor, sinks: int = 0,
              match: torch.Tensor | None = None) -> torch.Tensor:
    """The hard Focus mask (docs/method.md §2): ``M(i,j) = [j<=i] and (g(j) in G_k(i) or i-j < w)``,
    plus ``j < sinks`` when sink tokens are kept (see ``local_mask``), plus the token-match
    pairs ``match`` when given (``match_mask``, docs/method.md §2.8 [ours]).

    Args:
        query_groups: (B, Tq, k) long, a slot ``NO_GROUP`` (-1) joins no group; key_group:
            (B, Tk) long >= 0; window: w in tokens;
        q_pos: (Tq,), k_pos: (Tk,) token positions; match: (B, Tq, Tk) bool or None.
    Returns:
        (B, Tq, Tk) bool, True where query i may attend to key j.
    """
    same = (query_groups[:, :, :, None] == key_group[:, None, None, :]).any(2)  # (B, Tq, Tk)
    if match is not None:
        same = same | match
    return causal_mask(q_pos, k_pos) & (same | local_mask(q_pos, k_pos, window, sinks))


def other_group_pairs(pairs: torch.Tensor, query_groups: torch.Tensor, key_group: torch.Tensor,
                      Tq: int, Tk: int, window: int, sinks: int) -> torch.Tensor:
    """The listed pairs the group mask does not already keep (docs/method.md §2.8; what the
    decomposition's parts A-C do not hold, so they form its part D): causal, ``i - j >= window``,
    ``j >= sinks`` and ``g(j)`` not in ``G_k(i)``.

    pairs: (P, 3) long rows (b, i, j), i a query index (position ``Tk - Tq + i``), j a key
    index; query_groups: (B, Tq, k); key_group: (B, Tk). Returns (P', 3) long, P' <= P."""
    b, i, j = pairs.unbind(1)
    far = (Tk - Tq + i - j >= window) & (j >= sinks)  # (P,) implies causal
    other = (query_groups[b, i] != key_group[b, j][:, None]).all(-1)  # (P,)
    return pairs[far & other]


def pairs_mask(pairs: torch.Tensor, shape: tuple[int, int, int]) -> torch.Tensor:
    """A (B, Tq, Tk) bool mask True on ``pairs`` (P, 3) rows (b, i, j) (``match_pairs``)."""
    m = torch.zeros(shape, dtype=torch.bool, device=pairs.device)
    m[pairs[:, 0], pairs[:, 1], pairs[:, 2]] = True
    return m


def soft_gate_bias(log_p_q: torch.Tensor, log_p_k: torch.Tensor, window: int,
                   q_pos: torch.Tensor, k_pos: torch.Tensor, eps: float, sinks: int = 0,
                   match: torch.Tensor | None = None) -> torch.Tensor:
    """Additive logit bias of the soft (training) gate (docs/method.md §2.3 [ours]).

    Local pairs get 0; a distant causal pair gets ``log(max(P_i . P_j, eps))`` (its weight is
    multiplied by the probability that i and j share a group); non-causal pairs get -inf. The
    token-match pairs ``match`` (``match_mask``, docs/method.md §2.8), kept by rule whatever the
    groups, get 0 like local pairs.

    Args:
        log_p_q: (B, Tq, K), log_p_k: (B, Tk, K) log assignment probabilities;
        match: (B, Tq, Tk) bool or None.
    Returns:
        (B, Tq, Tk) float32.
    """
    agree = log_p_q.exp() @ log_p_k.exp().transpose(1, 2)  # (B, Tq, Tk) = P_i . P_j
    gate = torch.log(agree.clamp(min=eps))  # (B, Tq, Tk)
    local = local_mask(q_pos, k_pos, window, sinks)  # (Tq, Tk)
    gate = gate.masked_fill(local if match is None else local | match, 0.0)
    return gate.masked_fill(~causal_mask(q_pos, k_pos), float("-inf"))


def soft_top_k_membership(log_p: torch.Tensor, top_k: int, temperature: float = 1.0) -> torch.Tensor:
    """Log of a soft "group g is among token i's top-k groups" indicator ([ours]).

    The hard rule lets a query use its ``top_k`` best groups (``hard_assign``); the soft gate of
    ``soft_gate_bias`` with Sinkhorn probabilities on both sides models ``top_k = 1`` only. This
    relaxation puts each group's logit against the midpoint ``m_i`` between the k-th and
    (k+1)-th largest logits of the token, ``Q_ig = sigmoid((log P_ig - m_i) / temperature)``,
    so with ``top_k = 2`` the query's second group counts as (nearly) kept, as at inference.
    Row ranks of Sinkhorn's ``log P`` equal those of ``S / tau + v`` (the column potentials the
    calibrated bias tracks, docs/method.md §1.3). Passed as ``log_p_q`` to ``soft_gate_bias``.

    Args:
        log_p: (B, T, K) log assignment probabilities (``sinkhorn``); top_k: 1..K;
        temperature: sigmoid temperature in logit units (> 0).
    Returns:
        (B, T, K) float32 log membership in (-inf, 0]; all zeros when ``top_k == K``.
    Raises:
        ValueError: top_k outside 1..K or temperature <= 0.
    """
    K = log_p.shape[-1]
    if not 1 <= top_k <= K:
        raise ValueError(f"soft_top_k_membership: top_k={top_k} outside 1..{K}")
    if temperature <= 0:
        raise ValueError(f"soft_top_k_membership: temperature={temperature} must be > 0")
    if top_k == K:
        return torch.zeros_like(log_p, dtype=torch.float32)
    ranked = log_p.float().topk(top_k + 1, dim=-1).values  # (B, T, k+1), descending
    mid = 0.5 * (ranked[..., top_k - 1] + ranked[..., top_k])  # (B, T)
    return F.logsigmoid((log_p.float() - mid[..., None]) / temperature)  # (B, T, K)


def coverage_loss(attn: torch.Tensor, log_p: torch.Tensor, window: int, sinks: int = 0,
                  log_p_k: torch.Tensor | None = None) -> torch.Tensor:
    """Coverage objective of router training (``TrainConfig.objective == "coverage"``, [ours]).

    ``1 - sum_{i,j far} A_ij P_i.P_j / sum_{i,j far} A_ij``: the share of the dense model's
    attention mass on distant pairs (``i - j >= window``, not a sink key) that the soft gate
    would drop. ``P_i.P_j`` is the probability that i and j share a group (the soft gate of
    ``soft_gate_bias``), so minimizing it teaches the router to put a query and the distant
    keys it attends to in the same group, which is what the hard mask keeps (docs/method.md §2);
    Sinkhorn's balance in ``log_p`` keeps the trivial one-group answer out of reach.

    Args:
        attn: (B, T, T) dense attention probabilities (rows sum to 1 over causal keys),
            averaged over the layer's heads; treated as a constant.
        log_p: (B, T, K) log Sinkhorn assignment probabilities (``sinkhorn``).
        window: w in tokens; sinks: keys at positions < sinks are always kept (excluded).
        log_p_k: (B, T, K) the key role's, when the router has a ``key_proj``; default ``log_p``.
    Returns:
        () float32 loss in [0, 1] (a fraction of attention mass, not nats); 0 when no distant
        pair carries mass.
    """
    T = attn.shape[-1]
    pos = torch.arange(T, device=attn.device)
    far = distant_mask(pos, pos, window, sinks)  # (T, T)
    target = attn.float() * far  # (B, T, T) dense mass on distant pairs
    p = log_p.exp()  # (B, T, K)
    p_k = p if log_p_k is None else log_p_k.exp()  # (B, T, K)
    kept = ((p @ p_k.transpose(1, 2)) * target).sum()  # P_i . P_j weighted by the dense mass
    total = target.sum()
    if float(total) <= 0:
        return kept * 0.0
    return 1.0 - kept / total


def soft_roles(router: Router, h: torch.Tensor, config: FocusConfig
               ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """Sinkhorn probabilities of both roles, for the layer-local objectives (distill, coverage).

    Args: router: the layer's Router; h: (B, T, d) its input; config: tau, Sinkhorn iterations.
    Returns: (log_p of the queries (B, T, K), log_p of the keys (B, T, K), the keys' column
        potentials (B, K) (they drive the group bias), the keys' scores (B, T, K)); the key
        role is the query role's tensors unless the router has a ``key_proj`` (docs/method.md §1.6);
        each rule in force may change the keys' log_p (``Rule.soft_keys``: the key shift moves
        it by one token).
    """
    scores = router(h, config)  # (B, T, K)
    log_p, col = sinkhorn(scores, config.tau, config.sinkhorn_iters)  # (B, T, K), (B, K)
    key_scores = router.key_scores(h, config)
    if key_scores is None:
        log_p_k, key_scores = log_p, scores
    else:
        log_p_k, col = sinkhorn(key_scores, config.tau, config.sinkhorn_iters)
    for rule in config.rules_in_force():  # e.g. the key shift: key j takes token j - 1's probabilities
        log_p_k = rule.soft_keys(log_p_k)
    return log_p, log_p_k, col, key_scores


@dataclass
class Routing:
    """What a layer's router decided for one forward (all tensors for the keys' tokens).

    Attributes:
        scores: (B, T, K) raw router scores S.
        log_p: (B, T, K) log Sinkhorn probabilities (None in hard-only paths).
        col_potential: (B, K) Sinkhorn column potentials in logit units, or None.
        query_groups: (B, T, k) long, causal hard top-k groups.
        key_group: (B, T) long, causal hard top-1 group.
        key_scores: (B, T, K) the key role's scores when the router has a ``key_proj``
            (docs/method.md §1.6), else None: the keys share ``scores``.
        key_log_p: (B, T, K) the key role's log Sinkhorn probabilities (when Sinkhorn ran) with
            a ``key_proj`` or ``key_shift``, else None. ``col_potential`` is the keys' with a
            ``key_proj`` (it drives the group bias).
        carry: the causal state each rule in force hands to the next KV-cache step, by the
            rule's name (``focus_lab.patterns.rules``), which ``route`` gets back as ``carried``:
            "key_shift": (B, 1) long, the key group of the token after this forward's last one
            (that token's own top-1 group); "capacity": (B, K) long, the keys' first-choice
            counts up to this forward's last token. Empty when no rule carries state.
    """

    scores: torch.Tensor
    log_p: torch.Tensor | None
    col_potential: torch.Tensor | None
    query_groups: torch.Tensor
    key_group: torch.Tensor
    key_scores: torch.Tensor | None = None
    key_log_p: torch.Tensor | None = None
    carry: dict[str, torch.Tensor] = field(default_factory=dict)

    @property
    def log_p_keys(self) -> torch.Tensor | None:
        """(B, T, K) log probabilities of the key role: ``key_log_p``, or ``log_p`` when shared."""
        return self.key_log_p if self.key_log_p is not None else self.log_p


def route(router: Router, h: torch.Tensor, token_mask: torch.Tensor | None = None,
          config: FocusConfig | None = None, start: int = 0,
          carried: dict[str, torch.Tensor] | None = None) -> Routing:
    """Run a router and derive both its soft and hard assignments.

    Args:
        router: the layer's Router; h: (B, T, d) its attention input;
        token_mask: (B, T) bool, False on padding; config: the forward's FocusConfig
            (``retrofit.FocusForward.config``); default ``router.config``, the one it was built with;
        start: absolute position of h's first token (> 0 in a KV-cache decode step);
        carried: in a KV-cache step, ``Routing.carry`` of the forward before (the rules' causal
            state by rule name: "key_shift", the group the first token's key takes; "capacity",
            the keys' first-choice counts before ``start``), or None.
    Returns:
        Routing: scores (B, T, K) fp32; log_p (B, T, K) and col_potential (B, K) when Sinkhorn
        ran (soft mode or training), else None; query_groups (B, T, k); key_group (B, T)
        (with ``key_shift`` each key in its predecessor's group, docs/method.md §1.7).
    Raises:
        FloatingPointError: the scores are not finite (a non-finite attention input, e.g. a
            half-precision overflow, or corrupted router weights); the message names the layer.
            Checked in every forward of more than one token, and in a one-token step on the
            CPU only (``HOST_DEVICES``): on a GPU the check would make the host wait for the
            device in every layer of every step.
    Source: docs/method.md §1.
    """
    cfg = config or router.config
    carried = carried or {}
    scores = router(h, cfg, start)  # (B, T, K)
    key_scores = router.key_scores(h, cfg)  # (B, T, K), or None: the keys share ``scores``
    checked = h.shape[1] > 1 or on_host(h)  # a GPU decode step does not wait on it
    if checked and not all(torch.isfinite(s).all() for s in (scores, key_scores) if s is not None):
        raise FloatingPointError(
            f"router scores of layer {router.layer_idx} contain NaN or inf: the layer's attention input "
            "is not finite (a half-precision overflow? load the model with dtype=torch.float32) or the "
            "router weights are corrupted (retrain or reload them)")
    if router.training and cfg.gumbel_noise > 0:  # Gumbel top-k: sample hard assignments
        scores = _gumbel(scores, cfg)
        key_scores = None if key_scores is None else _gumbel(key_scores, cfg)
    log_p, col, qg, kg = router.assign(scores, cfg, token_mask, start)
    key_log_p = None
    if key_scores is not None:
        key_log_p, col, kg = router.assign_keys(key_scores, cfg, kg, token_mask, start)
    step = RouteStep(cfg, router.layer_idx, start, scores, key_scores, router._bias(cfg), qg, kg, log_p,
                     key_log_p, carried)
    for rule in cfg.rules_in_force():  # docs/method.md §1.7 (key shift), §2.9 (capacity)
        rule.route(step)
    return Routing(scores, log_p, col, step.query_groups, step.key_group, key_scores=key_scores,
                   key_log_p=step.key_log_p, carry=step.carry)


@dataclass
class RouteStep:
    """What the rules in force (``Rule.route``, ``focus_lab.patterns.rules``) see and change of one
    layer's routing, in ``route``.

    Attributes:
        config: the forward's FocusConfig; layer_idx: the layer; start: absolute position of the
            first token (tokens); scores: (B, T, K) the query role's scores; key_scores: (B, T, K)
            the key role's, or None (shared); group_bias: (K,) or None.
        query_groups: (B, T, k) long; key_group: (B, T) long; log_p, key_log_p: (B, T, K) or None
            (a rule may replace the groups and the key role's probabilities).
        carried: {rule name: tensor} the state the rules carried from the KV-cache step before
            ({} from position 0); carry: what they hand to the next step (filled by the rules).
    """

    config: FocusConfig
    layer_idx: int
    start: int
    scores: torch.Tensor
    key_scores: torch.Tensor | None
    group_bias: torch.Tensor | None
    query_groups: torch.Tensor
    key_group: torch.Tensor
    log_p: torch.Tensor | None
    key_log_p: torch.Tensor | None
    carried: dict[str, torch.Tensor]
    carry: dict[str, torch.Tensor] = field(default_factory=dict)

    @property
    def assignment(self) -> str:
        """The layer's assignment ("router", "random", "shuffled"; ``FocusConfig.assignment_at``)."""
        return self.config.assignment_at(self.layer_idx)

    @property
    def top_k(self) -> int:
        """The layer's k in hard mode (``FocusConfig.top_k_at``; 0: window and sinks only)."""
        return self.config.top_k_at(self.layer_idx)

    def key_logits(self) -> torch.Tensor:
        """(B, T, K) fp32 the key role's ``hard_logits``: what hard assignment ranks groups by."""
        s = self.key_scores if self.key_scores is not None else self.scores
        return hard_logits(s, self.config.tau, self.group_bias)


@dataclass
class PairStep:
    """What the rules in force (``Rule.pairs``) see and change of the pairs one layer attends
    with, in the attention function (hard and soft mode).

    Attributes:
        config: the forward's FocusConfig; layer_idx: the layer; routing: the layer's Routing
            (groups of the Tq queries' tokens and of all Tk keys; a rule may replace it);
        query: (B, H, Tq, D); key: (B, Hkv, Tk, D); scaling: the logit scale (None: 1/sqrt(D));
        offset: absolute position of the first key (tokens; > 0 under a sliding-window cache);
        forward: the FocusForward in flight (``token_ids``, its ``cache``; ``shared``: a dict
            a rule may keep per-forward values in, e.g. pairs every layer shares);
        pairs: (P, 3) long rows (b, i, j) sorted, each once (i a query index, j a key index), or None.
    """

    config: FocusConfig
    layer_idx: int
    routing: Routing
    query: torch.Tensor
    key: torch.Tensor
    scaling: float | None
    offset: int
    forward: object
    pairs: torch.Tensor | None = None

    @property
    def q_pos(self) -> torch.Tensor:
        """(Tq,) absolute positions of the queries."""
        Tq, Tk = self.query.shape[2], self.key.shape[2]
        return torch.arange(self.offset + Tk - Tq, self.offset + Tk, device=self.query.device)

    @property
    def k_pos(self) -> torch.Tensor:
        """(Tk,) absolute positions of the keys."""
        return torch.arange(self.offset, self.offset + self.key.shape[2], device=self.query.device)

    def add(self, pairs: torch.Tensor) -> None:
        """Keep ``pairs`` (P, 3) long rows (b, i, j) too."""
        self.pairs = merge_pairs(self.pairs, pairs, self.query.shape[2], self.key.shape[2])


def merge_pairs(pairs: torch.Tensor | None, add: torch.Tensor, Tq: int, Tk: int) -> torch.Tensor:
    """Two lists of pairs (P, 3) long rows (b, i, j) as one sorted by (b, i, j), each pair once
    (``decomposition.hard_focus_attention``'s ``extra_pairs``); i < Tq, j < Tk."""
    if pairs is None:
        return add
    both = torch.cat([pairs.to(add.device), add])
    code = torch.unique((both[:, 0] * Tq + both[:, 1]) * Tk + both[:, 2])  # sorted
    return torch.stack([code // (Tq * Tk), (code // Tk) % Tq, code % Tk], 1)


def _gumbel(scores: torch.Tensor, cfg: FocusConfig) -> torch.Tensor:
    u = torch.rand_like(scores).clamp(1e-9, 1 - 1e-9)
    return scores + cfg.tau * cfg.gumbel_noise * -torch.log(-torch.log(u))


def focus_bias(config: FocusConfig, routing: Routing | None, q_pos: torch.Tensor,
               k_pos: torch.Tensor, batch: int, match: torch.Tensor | None = None) -> torch.Tensor:
    """Mask or bias of one layer under ``config.mode`` (docs/method.md §2).

    ``match``: (B, Tq, Tk) bool token-match pairs (``match_mask``), kept by the hard mask and
    given bias 0 by the soft gate.
    Returns a (B, Tq, Tk) tensor: bool for "hard" / "window" / "dense" (True = keep), float32
    (0 / log-agreement / -inf) for "soft". Raises ValueError when the mode needs a routing
    and none is given.
    """
    mode, w, sinks = config.mode, config.window, config.sink_tokens
    if mode == "dense":
        return causal_mask(q_pos, k_pos).expand(batch, -1, -1)
    if mode == "window":
        return local_mask(q_pos, k_pos, w, sinks).expand(batch, -1, -1)
    if routing is None:
        raise ValueError(f"mode {mode!r} needs the layer's routing; got None")
    tq = q_pos.numel()
    if mode == "hard":
        return hard_mask(routing.query_groups[:, -tq:], routing.key_group, w, q_pos, k_pos, sinks, match)
    gate = soft_gate_bias(routing.log_p[:, -tq:], routing.log_p_keys, w, q_pos, k_pos, config.eps, sinks, match)
    if config.straight_through:
        # forward: the hard mask (dropped pairs at log(eps)); backward: the soft gate's gradient
        keep = hard_mask(routing.query_groups[:, -tq:], routing.key_group, w, q_pos, k_pos, sinks, match)
        hard = torch.zeros_like(gate).masked_fill(~keep, math.log(config.eps))
        causal = causal_mask(q_pos, k_pos)
        gate = torch.where(causal, hard + gate - gate.detach(), gate)
    return gate


def masked_attention(query: torch.Tensor, key: torch.Tensor, value: torch.Tensor,
                     bias, scaling: float | None = None,
                     softcap: float | None = None) -> torch.Tensor:
    """Dense O(T^2) reference attention under a mask or additive bias.

    Args:
        query: (B, H, Tq, D); key, value: (B, Hkv, Tk, D) with H a multiple of Hkv (GQA);
        bias: (B, Tq, Tk) bool (True = keep) or float (added to logits), shared by heads; or a
            bool mask given by rows (``focus_lab.hf.model_mask.ModelMask``: ``rows(start, stop)``
            -> (B, stop - start, Tk), ``dense()``), which on the host is read a block of
            ``SDPA_QUERY_CHUNK`` queries at a time, so no (B, Tq, Tk) tensor is made;
        scaling: logit scale, default 1/sqrt(D);
        softcap: attention-logit soft-capping (Gemma-2): ``logits = softcap * tanh(logits /
            softcap)`` on the scaled logits, before the mask or bias is applied. SDPA has no
            soft-capping, so this path is explicit, in fp32, in chunks of queries.
    Returns:
        (B, H, Tq, D). A query row with no kept key keeps its own diagonal (so padding rows
        stay finite instead of NaN). Off the ``HOST_DEVICES`` (a GPU) the diagonal is filled
        in unconditionally (a no-op on rows with a kept key), so the host never waits to ask
        whether a row is empty.
    """
    off_host = not on_host(query)
    if not isinstance(bias, torch.Tensor):  # a mask given by rows
        if not off_host and softcap is None:
            return _key_sliced_attention(query, key, value, bias.rows, scaling, SDPA_QUERY_CHUNK)
        if not off_host:
            return _softcapped_attention(query, key, value, bias.rows, scaling, float(softcap))
        bias = bias.dense()  # (B, Tq, Tk): off the host the mask is small beside the memory
    if bias.dtype == torch.bool and not off_host and softcap is None and query.shape[2] > SDPA_QUERY_CHUNK:
        # block by block, each block's empty rows filled there: no pass over the whole mask
        return _key_sliced_attention(query, key, value, lambda s, e: bias[:, s:e], scaling, SDPA_QUERY_CHUNK)
    if bias.dtype == torch.bool:
        empty = ~bias.any(-1, keepdim=True)  # (B, Tq, 1)
        if off_host or empty.any():
            bias = bias | (empty & _diag_like(bias))
    else:
        empty = torch.isinf(bias).all(-1, keepdim=True) & (bias < 0).all(-1, keepdim=True)
        if off_host or empty.any():
            bias = bias.masked_fill(empty & _diag_like(bias), 0.0)
    if softcap is not None:
        return _softcapped_attention(query, key, value, bias, scaling, float(softcap))
    if bias.dtype != torch.bool:
        bias = bias.to(query.dtype)
    return F.scaled_dot_product_attention(
        query, key, value, attn_mask=bias[:, None], scale=scaling,
        enable_gqa=query.shape[1] != key.shape[1])  # (B, H, Tq, D)


SDPA_QUERY_CHUNK = 512  # queries per SDPA call of ``masked_attention`` under a long bool mask on the host


def _key_sliced_attention(query: torch.Tensor, key: torch.Tensor, value: torch.Tensor,
                          rows: Callable[[int, int], torch.Tensor], scaling: float | None,
                          chunk: int) -> torch.Tensor:
    """``masked_attention`` under a bool mask, ``chunk`` queries at a time, each chunk attending
    only to the keys from its first to its last kept column: the same result (a key no query of
    the chunk keeps adds nothing), in O(chunk x span) per chunk. Under a causal mask the work
    halves; under a sliding window of w keys (Gemma-3's local layers, w = 512) it is
    O(T x (w + chunk)) instead of O(T^2) (docs/studies/gemma-routers.md).

    query: (B, H, Tq, D); key, value: (B, Hkv, Tk, D); rows(start, stop) -> (B, stop - start,
    Tk) bool, the mask's rows; a row with no kept key keeps its own diagonal. Returns (B, H, Tq, D)."""
    gqa = query.shape[1] != key.shape[1]
    Tq, Tk = query.shape[2], key.shape[2]
    outs = []
    for s in range(0, Tq, chunk):
        k = _with_diagonal(rows(s, min(Tq, s + chunk)), s + Tk - Tq)  # (B, c, Tk)
        cols = k.any(1).any(0).nonzero()  # (n, 1): the keys some query of the chunk keeps
        lo, hi = int(cols[0]), int(cols[-1]) + 1
        outs.append(F.scaled_dot_product_attention(
            query[:, :, s:s + chunk], key[:, :, lo:hi], value[:, :, lo:hi], attn_mask=k[:, None, :, lo:hi],
            scale=scaling, enable_gqa=gqa))  # (B, H, c, D)
    return torch.cat(outs, dim=2)


def _softcapped_attention(query: torch.Tensor, key: torch.Tensor, value: torch.Tensor,
                          bias, scaling: float | None, softcap: float,
                          chunk_elements: int = 1 << 22) -> torch.Tensor:
    """``masked_attention`` with logit soft-capping, in fp32, ``chunk_elements`` logits at a time.

    query: (B, H, Tq, D); key, value: (B, Hkv, Tk, D); bias: (B, Tq, Tk) bool or float, or
    ``rows(start, stop)`` -> (B, stop - start, Tk) bool (a row with no kept key keeps its diagonal).
    GQA without repeating K/V: queries are viewed as (B, Hkv, H / Hkv, Tq, D).
    """
    B, H, Tq, D = query.shape
    Hkv, Tk = key.shape[1], key.shape[2]
    scale = scaling if scaling is not None else D ** -0.5
    q = query.float().view(B, Hkv, H // Hkv, Tq, D)
    k = key.float()[:, :, None].transpose(-1, -2)  # (B, Hkv, 1, D, Tk)
    v = value.float()[:, :, None]  # (B, Hkv, 1, Tk, D)
    step = max(1, chunk_elements // max(1, B * H * Tk))
    outs = []
    for s in range(0, Tq, step):
        logits = (q[:, :, :, s:s + step] @ k) * scale  # (B, Hkv, G, c, Tk)
        logits = softcap * torch.tanh(logits / softcap)
        b = (bias[:, s:s + step] if isinstance(bias, torch.Tensor)
             else _with_diagonal(bias(s, min(Tq, s + step)), s + Tk - Tq))[:, None, None]  # (B, 1, 1, c, Tk)
        if b.dtype == torch.bool:
            logits = logits.masked_fill(~b, float("-inf"))
        else:
            logits = logits + b.float()
        outs.append(torch.softmax(logits, dim=-1) @ v)  # (B, Hkv, G, c, D)
    return torch.cat(outs, dim=3).reshape(B, H, Tq, D).to(query.dtype)


def _with_diagonal(rows: torch.Tensor, first: int) -> torch.Tensor:
    """Rows (B, c, Tk) bool of a mask whose first row is query ``first`` (its own key's column),
    with the diagonal kept in every row that keeps no key (as ``masked_attention`` does)."""
    empty = ~rows.any(-1)  # (B, c)
    if not bool(empty.any()):
        return rows
    rows = rows.clone()
    b, r = empty.nonzero(as_tuple=True)
    rows[b, r, first + r] = True
    return rows


def _diag_like(m: torch.Tensor) -> torch.Tensor:
    tq, tk = m.shape[-2:]
    return torch.eye(tq, tk, dtype=torch.bool, device=m.device).roll(tk - tq, dims=1) if tq <= tk \
        else torch.eye(tq, tk, dtype=torch.bool, device=m.device)


def distant_kept_counts(query_groups: torch.Tensor, key_group: torch.Tensor, window: int,
                        sinks: int = 0) -> tuple[torch.Tensor, int]:
    """Distant causal pairs (``i - j >= window``) the hard mask keeps, counted in O(B T K)
    through per-group prefix counts (equal to counting ``hard_mask`` over the distant pairs;
    sink pairs count as kept). query_groups: (B, T, k) with distinct groups per row (as
    ``hard_assign`` gives them; ``NO_GROUP`` slots may repeat), key_group: (B, T).

    Returns (kept (B,) long: pairs kept per sequence, distant: int, distant pairs per sequence)."""
    B, T = key_group.shape
    K = int(max(int(query_groups.max()), int(key_group.max()))) + 1 if T else 1
    onehot = torch.nn.functional.one_hot(key_group, K).to(torch.int64)  # (B, T, K)
    before = torch.cat([onehot.new_zeros(B, 1, K), onehot.cumsum(1)], 1)  # (B, T+1, K): keys < t
    i = torch.arange(T, device=key_group.device)
    reach = (i - window + 1).clamp(min=0)  # distant keys of query i: j < reach
    m = reach.clamp(max=sinks)  # distant sink keys: j < m
    idx = lambda t: t.view(1, T, 1).expand(B, T, K)
    slot = query_groups >= 0  # (B, T, k): a NO_GROUP slot counts no key
    qg = query_groups.clamp(min=0)
    same = (before.gather(1, idx(reach)).gather(2, qg) * slot).sum(-1)  # (B, T)
    same_sink = (before.gather(1, idx(m)).gather(2, qg) * slot).sum(-1)  # (B, T)
    kept = same + (m - same_sink)  # (B, T)
    return kept.sum(1), int(reach.sum())


def distant_pairs_kept(query_groups: torch.Tensor, key_group: torch.Tensor, window: int,
                       sinks: int = 0, match_pairs: torch.Tensor | None = None) -> float:
    """Fraction of distant causal pairs (``i - j >= window``) the hard mask keeps, in [0, 1]
    (sink pairs count as kept: they are computed), from ``distant_kept_counts``, plus the
    token-match pairs ``match_pairs`` (P, 3) (b, i, j) the groups do not keep (docs/method.md
    §2.8; ``other_group_pairs``).

    query_groups: (B, T, k), key_group: (B, T). Returns nan when there is no distant pair.
    """
    kept, distant = distant_kept_counts(query_groups, key_group, window, sinks)
    total = distant * key_group.shape[0]
    extra = 0
    if match_pairs is not None and match_pairs.numel():
        T = key_group.shape[1]
        extra = other_group_pairs(match_pairs, query_groups, key_group, T, T, window, sinks).shape[0]
    return float((kept.sum() + extra) / total) if total > 0 else float("nan")
