"""Oracle top-k: each query keeps, beyond its window and sinks, as many distant keys as the
pattern's groups keep for it, the ones dense attention weighs most (docs/levers.md "Oracle").
``hard_top2+oracle``: the upper reference at matched sparsity, per query, that the dependency
audit lacks: no router can keep better distant keys at that budget by the dense weights.

The weight of key j for query i is dense attention's probability, softmax over i's causal keys,
averaged over the query heads; a query with n distant pairs in its groups keeps its n heaviest
distant keys instead (ties broken by position). It reads the layer's query and key (one dense
score pass per routed layer, in chunks of queries), so it costs a dense forward and more; the
groups still route (and a KV cache still stores them), they only set each query's budget.
Logit soft-capping (Gemma-2) is not applied to the weights.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

from focus_lab.patterns.rules import Rule

CHUNK_ELEMENTS = 1 << 24  # logits scored at a time: (B, H, queries, Tk) fp32, 64 MiB


def heaviest_pairs(weights, budget, far, Tq: int, chunk: int):
    """Each query's ``budget`` heaviest distant keys, as pairs.

    Args:
        weights: ``weights(s, e)`` -> (B, e - s, Tk) float, the weight of each key for queries
            s..e-1 (only the distant ones are read);
        budget: (B, Tq) long, the distant keys each query keeps;
        far: (Tq, Tk) bool, the distant pairs (``core.distant_mask``: the candidates);
        Tq: queries; chunk: queries weighed at a time.
    Returns:
        (P, 3) long rows (b, i, j) sorted by (b, i, j); ties go to the earlier key.
    """
    import torch
    out = []
    for s in range(0, Tq, chunk):
        e = min(Tq, s + chunk)
        w = weights(s, e).masked_fill(~far[s:e], float("-inf"))  # (B, c, Tk) distant keys only
        Tk = w.shape[-1]
        order = torch.sort(w, dim=-1, descending=True, stable=True).indices  # (B, c, Tk)
        rank = torch.empty_like(order).scatter_(-1, order, torch.arange(Tk, device=order.device).expand_as(order))
        keep = (rank < budget[:, s:e, None]) & far[s:e]  # (B, c, Tk)
        rows = keep.nonzero()  # (p, 3) sorted by (b, i, j) within the chunk
        rows[:, 1] += s
        out.append(rows)
    pairs = torch.cat(out) if out else torch.zeros(0, 3, dtype=torch.long, device=far.device)
    return pairs[torch.argsort(pairs[:, 0] * Tq + pairs[:, 1], stable=True)]  # (P, 3) by (b, i, j)


@dataclass(frozen=True)
class BudgetRule(Rule):
    """Base of the rules that keep, for each query, as many distant keys as its groups keep,
    chosen by a weight of their own (``weights``) instead of by the groups: a baseline or a
    reference at matched sparsity, query by query. The groups still route (and a KV cache still
    stores them); the routing attended with keeps no group (``core.window_only_groups``)."""

    modes = ("hard",)
    order = 90  # after every rule that changes the groups: they set the budget

    def pair_weights(self, step, far):
        """``weights(s, e)`` -> (B, e - s, Tk) for ``heaviest_pairs``, and its chunk (queries)."""
        raise NotImplementedError

    def pairs(self, step):
        from focus_lab.method.core import distant_mask, window_only_groups
        cfg, r = step.config, step.routing
        Tq = step.query.shape[2]
        far = distant_mask(step.q_pos, step.k_pos, cfg.window, cfg.sink_tokens)  # (Tq, Tk)
        qg = r.query_groups[:, -Tq:]  # (B, Tq, k)
        budget = ((qg[:, :, :, None] == r.key_group[:, None, None, :]).any(2) & far).sum(-1)  # (B, Tq)
        weights, chunk = self.pair_weights(step, far)
        pairs = heaviest_pairs(weights, budget, far, Tq, chunk)
        B, Tk = r.key_group.shape
        wq, wk = window_only_groups(B, Tk, r.key_group.device)  # (B, Tk, 1), (B, Tk)
        step.routing = dataclasses.replace(r, query_groups=wq[:, -r.query_groups.shape[1]:], key_group=wk)
        step.add(pairs)


@dataclass(frozen=True)
class Oracle(BudgetRule):
    name = "oracle"
    example = "oracle"

    def pair_weights(self, step, far):
        """Dense attention's probabilities (softmax over the causal keys), mean over query heads."""
        from focus_lab.method.core import causal_mask
        q, k = step.query, step.key
        B, H, Tq, D = q.shape
        Tk = k.shape[2]
        scale = step.scaling if step.scaling is not None else D ** -0.5
        kt = k.float().repeat_interleave(H // k.shape[1], dim=1).transpose(-1, -2)  # (B, H, D, Tk)
        causal = causal_mask(step.q_pos, step.k_pos)  # (Tq, Tk)

        def weights(s, e):
            logits = (q[:, :, s:e].float() @ kt) * scale  # (B, H, c, Tk)
            return logits.masked_fill(~causal[s:e], float("-inf")).softmax(-1).mean(1)  # (B, c, Tk)
        return weights, max(1, CHUNK_ELEMENTS // max(1, B * H * Tk))
