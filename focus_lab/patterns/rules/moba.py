"""MoBA's block gate at matched sparsity, query by query: ``hard_top2+moba`` (docs/levers.md
"MoBA's gate as a rule").

Keys are cut into blocks of ``block`` positions; query i scores every block b by MoBA's gate
(Lu et al. 2025), ``s_ib = mean_h (q_i^h . mean_{j in b} k_j^h) * scale`` over the layer's query
heads (GQA: head h reads kv head h // (H / Hkv); the query and keys the attention reads), and
keeps, of its distant keys, as many as its groups keep (the pattern's budget, as the oracle),
taking whole blocks best first and the last one from its earliest keys. So it keeps the distant
pairs hard top-k keeps, query by query, chosen by the block gate instead of the router: the
MoBA baseline as a pattern of the same kind as the controls (``random_top2``,
``shuffled_top2``). ``block`` (tokens, default the window) must not exceed the window, so a
query's own block is local. ``eval.baselines.MoBARouter`` is the gate with MoBA's own fixed
block top-k (the retrieval suite's ``moba_matched``, matched on the mean).
"""

from __future__ import annotations

from dataclasses import dataclass

from focus_lab.patterns.rules import read_int
from focus_lab.patterns.rules.oracle import CHUNK_ELEMENTS, BudgetRule


@dataclass(frozen=True)
class MoBA(BudgetRule):
    """block: tokens per block, 0 for the window."""

    block: int = 0
    name = "moba"
    example = "moba(block=64)"

    @classmethod
    def from_args(cls, args, kwargs):
        given = args + [v for k, v in kwargs.items() if k == "block"]
        if len(given) > 1 or set(kwargs) - {"block"}:
            raise cls.error("takes one block size in tokens (block=N)")
        n = read_int(cls, given[0], "block") if given else 0
        return cls(n)

    def arguments(self):
        return [f"block={self.block}"] if self.block else []

    def pair_weights(self, step, far):
        """Each key's weight: its block's gate score for the query (ties: the earlier key first)."""
        import torch
        q, k = step.query, step.key
        B, H, Tq, D = q.shape
        Hkv, Tk = k.shape[1], k.shape[2]
        bs = self.block or step.config.window
        if bs > step.config.window:
            raise ValueError(f"rule 'moba' block={bs} exceeds the window ({step.config.window} tokens): a query's "
                             f"own block must be local; e.g. hard_top2+moba(block={step.config.window})")
        scale = step.scaling if step.scaling is not None else D ** -0.5
        kp = step.k_pos  # (Tk,) absolute positions
        blk = kp // bs  # (Tk,) each key's block
        nb = int(blk[-1]) + 1
        sums = k.float().new_zeros(B, Hkv, nb, D).index_add_(2, blk, k.float())  # (B, Hkv, nb, D)
        counts = torch.bincount(blk, minlength=nb).clamp(min=1).float()  # (nb,)
        kmean = (sums / counts[:, None]).repeat_interleave(H // Hkv, dim=1)  # (B, H, nb, D)

        def weights(s, e):
            gate = (q[:, :, s:e].float() @ kmean.transpose(-1, -2)).mean(1) * scale  # (B, c, nb)
            return gate[:, :, blk]  # (B, c, Tk)
        return weights, max(1, CHUNK_ELEMENTS // max(1, B * Tk))
