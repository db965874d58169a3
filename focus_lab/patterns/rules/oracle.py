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


def oracle_pairs(query, key, budget, far, causal, scaling=None, chunk_elements: int = CHUNK_ELEMENTS):
    """The pairs the oracle keeps.

    Args:
        query: (B, H, Tq, D); key: (B, Hkv, Tk, D), H a multiple of Hkv (GQA);
        budget: (B, Tq) long, the distant keys each query keeps;
        far: (Tq, Tk) bool, the distant pairs (``core.distant_mask``: candidates);
        causal: (Tq, Tk) bool, the keys each query's softmax runs over;
        scaling: logit scale (None: 1/sqrt(D)).
    Returns:
        (P, 3) long rows (b, i, j) sorted by (b, i, j), P = budget.sum() when every query has
        at least its budget of distant keys.
    """
    import torch
    B, H, Tq, D = query.shape
    Tk = key.shape[2]
    scale = scaling if scaling is not None else D ** -0.5
    k = key.float().repeat_interleave(H // key.shape[1], dim=1).transpose(-1, -2)  # (B, H, D, Tk)
    step = max(1, chunk_elements // max(1, B * H * Tk))
    out = []
    for s in range(0, Tq, step):
        e = min(Tq, s + step)
        logits = (query[:, :, s:e].float() @ k) * scale  # (B, H, c, Tk)
        logits = logits.masked_fill(~causal[s:e], float("-inf"))
        w = logits.softmax(-1).mean(1).masked_fill(~far[s:e], -1.0)  # (B, c, Tk) distant keys only
        order = torch.sort(w, dim=-1, descending=True, stable=True).indices  # (B, c, Tk)
        rank = torch.empty_like(order).scatter_(-1, order, torch.arange(Tk, device=order.device).expand_as(order))
        keep = (rank < budget[:, s:e, None]) & far[s:e]  # (B, c, Tk)
        rows = keep.nonzero()  # (p, 3) sorted by (b, i, j) within the chunk
        rows[:, 1] += s
        out.append(rows)
    pairs = torch.cat(out) if out else torch.zeros(0, 3, dtype=torch.long, device=query.device)
    return pairs[torch.argsort(pairs[:, 0] * Tq + pairs[:, 1], stable=True)]  # (P, 3) by (b, i, j)


@dataclass(frozen=True)
class Oracle(Rule):
    name = "oracle"
    modes = ("hard",)
    example = "oracle"
    order = 90  # after every rule that changes the groups: they set the budget

    def pairs(self, step):
        """Replace the groups' distant pairs of each query by as many of its heaviest distant keys
        (``oracle_pairs``); the routing attended with keeps no group (``core.window_only_groups``)."""
        from focus_lab.method.core import causal_mask, distant_mask, window_only_groups
        cfg, r = step.config, step.routing
        Tq = step.query.shape[2]
        q_pos, k_pos = step.q_pos, step.k_pos
        far = distant_mask(q_pos, k_pos, cfg.window, cfg.sink_tokens)  # (Tq, Tk)
        qg = r.query_groups[:, -Tq:]  # (B, Tq, k)
        same = (qg[:, :, :, None] == r.key_group[:, None, None, :]).any(2) & far  # (B, Tq, Tk)
        pairs = oracle_pairs(step.query, step.key, same.sum(-1), far, causal_mask(q_pos, k_pos), step.scaling)
        B = r.key_group.shape[0]
        wq, wk = window_only_groups(B, r.key_group.shape[1], r.key_group.device)  # (B, Tk, 1), (B, Tk)
        step.routing = dataclasses.replace(r, query_groups=wq[:, -r.query_groups.shape[1]:], key_group=wk)
        step.add(pairs)
