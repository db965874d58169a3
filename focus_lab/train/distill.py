"""Layer-local distillation of the routers at long context (``TrainConfig.objective == "distill"``).

Why ([ours]): the LM objective backpropagates the soft gate through the whole model,
an O(T^2) float bias in every layer: affordable at 512 tokens, not at 4K-8K on a CPU. Here each
router learns alone, from one dense forward of the frozen model, to make its layer's *output*
under the soft gate (docs/method.md §2) match the dense output, for a random subset of queries:

    loss_l = sum_i || W_o (o_soft(i) - o_dense(i)) ||^2 / sum_i || W_o o_dense(i) ||^2

``W_o`` is the layer's output projection (``o_proj`` / GPT-2's ``c_proj``), so the error is
measured in the residual stream the next layers read, and value vectors count: a dropped key
whose value looks like the kept ones costs nothing, unlike the attention-mass ``coverage``
objective (which kept more dense mass yet predicted worse, docs/recipes.md). This is the
per-layer distillation SeerAttention uses for its gate (there a KL on pooled attention maps),
with DuoAttention's output-distortion target.

Cost per step: one dense forward without gradients, then per layer a (B, H, n_q, T) soft
attention for ``n_q`` sampled queries, backpropagated into that layer's router only.
"""

from __future__ import annotations

import torch

from focus_lab.method.config import FocusConfig
from focus_lab.method.core import masked_attention, soft_gate_bias, soft_roles, soft_top_k_membership
from focus_lab.patterns.rules.match import match_mask


def sample_queries(T: int, window: int, n: int, generator: torch.Generator,
                   prefer: torch.Tensor | None = None, share: float = 0.0) -> torch.Tensor:
    """(n',) sorted query positions drawn without replacement from ``window..T-1`` (the
    queries that have distant keys), n' = min(n, T - window).

    ``prefer``: (T,) bool; ``round(share * n')`` of the queries (at most as many as ``prefer``
    marks there) are drawn from the marked positions, the rest uniformly from the others
    (``TrainConfig.distill_copy_share``). Raises ValueError if T <= window."""
    if T <= window:
        raise ValueError(f"distill objective: windows of {T} tokens have no distant pairs "
                         f"(window={window}); use --seq-len > window")
    cand = T - window
    n = min(n, cand)
    if prefer is None or share <= 0:
        pick = torch.randperm(cand, generator=generator)[:n] + window
        return pick.sort().values
    marked = prefer[window:].cpu()  # (cand,) bool
    pref, rest = marked.nonzero().flatten(), (~marked).nonzero().flatten()
    k = min(round(share * n), pref.numel())
    k = max(k, n - rest.numel())  # too few unmarked positions: take the rest from the marked
    a = pref[torch.randperm(pref.numel(), generator=generator)[:k]]
    b = rest[torch.randperm(rest.numel(), generator=generator)[:n - k]]
    return (torch.cat([a, b]) + window).sort().values


def copy_queries(ids: torch.Tensor, window: int, sinks: int) -> torch.Tensor:
    """(T,) bool: positions i of ``ids`` (B, T) whose next token a distant copy predicts, in
    some batch row: a key j of their induction pairs (``rules.match.match_mask`` with shift 1:
    ``ids[j-1] == ids[i]``, i - j >= window, past the sinks) holds ``ids[j] == ids[i+1]``.
    (About a quarter to two fifths of the positions of a 4096-token window; an earlier
    occurrence alone marks about 70%.) The last position, with no next token, is never marked.
    Unlike the "distant copy" class of ``analyses/studies/copy_loss.py`` (its *latest* earlier
    bigram lies beyond the window), a position counts here when any such bigram does."""
    B, T = ids.shape
    pos = torch.arange(T, device=ids.device)
    pairs = match_mask(ids, ids, (1,), pos, pos, window, sinks)  # (B, T, T)
    nxt = torch.cat([ids[:, 1:], torch.full_like(ids[:, :1], -1)], dim=1)  # (B, T) the next token
    return (pairs & (ids[:, None, :] == nxt[:, :, None])).any(-1).any(0)  # (T,)


def output_projection(module: torch.nn.Module):
    """The attention module's output projection (``o_proj``, GPT-2 ``c_proj``), or None."""
    for name in ("o_proj", "c_proj", "out_proj", "dense"):
        proj = getattr(module, name, None)
        if isinstance(proj, torch.nn.Module):
            return proj
    return None


def layer_distill_loss(module: torch.nn.Module, router, h: torch.Tensor, query: torch.Tensor,
                       key: torch.Tensor, value: torch.Tensor, dense_out: torch.Tensor,
                       q_pos: torch.Tensor, config: FocusConfig, scaling: float,
                       top_ks: tuple[int, ...] = (), match: torch.Tensor | None = None
                       ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """One layer's distillation loss (module docstring) and its Sinkhorn column potentials.

    With ``top_ks`` empty the query side of the gate is the query's Sinkhorn probabilities
    (``soft_gate_bias`` as in LM training: a top-1 model); with ``top_ks = (1, 2)`` the loss is
    the mean of the losses under a top-1 and a top-2 aware gate, the query side being
    ``core.soft_top_k_membership`` (recipe ``distill64_topk`` [ours]).

    Args:
        module: the attention module (its output projection weights the error).
        router: the layer's Router (gradients flow into it only).
        h: (B, T, d) router input; query: (B, H, T, D); key, value: (B, Hkv, T, D);
        dense_out: (B, H, T, D) the layer's dense attention output; q_pos: (n,) query positions;
        config: window, sinks, tau, Sinkhorn iterations, eps; scaling: logit scale;
        top_ks: the top-k values whose relaxed masks are distilled (empty: the soft gate);
        match: (B, n, T) bool, the sampled queries' token-match pairs (``rules.match.match_mask``,
            docs/method.md §2.8), kept by rule in the gate (bias 0), or None.
    Returns:
        (loss () float32, relative squared error; col_potential (B, K); scores (B, T, K) detached),
        the last two of the key role (``core.soft_roles``).
    """
    T = key.shape[2]
    log_p, log_p_k, col, scores = soft_roles(router, h, config)  # (B, T, K) x2, (B, K), (B, T, K)
    k_pos = torch.arange(T, device=key.device)
    q = query[:, :, q_pos].float()  # (B, H, n, D)
    o_dense = dense_out[:, :, q_pos].float()  # (B, H, n, D)
    B, H, n, D = o_dense.shape
    proj = output_projection(module)
    if proj is not None:
        w_dtype = next(proj.parameters()).dtype
        zero = proj(o_dense.new_zeros(1, 1, H * D).to(w_dtype)).float()  # (1, 1, d): the bias alone

    def residual(x: torch.Tensor) -> torch.Tensor:  # (B, H, n, D) -> (B, n, d) after W_o
        x = x.transpose(1, 2).reshape(B, n, H * D)  # (B, n, H*D)
        if proj is None:
            return x
        return proj(x.to(w_dtype)).float() - zero  # (B, n, d): the bias cancels in a difference

    ref_sq = residual(o_dense).pow(2).sum().clamp(min=1e-12)
    query_sides = [log_p[:, q_pos]] if not top_ks else \
        [soft_top_k_membership(log_p[:, q_pos], k) for k in top_ks]  # each (B, n, K)
    losses = []
    for log_q in query_sides:
        gate = soft_gate_bias(log_q, log_p_k, config.window, q_pos, k_pos, config.eps,
                              config.sink_tokens, match)  # (B, n, T)
        o_soft = masked_attention(q, key.float(), value.float(), gate, scaling)  # (B, H, n, D)
        losses.append(residual(o_soft - o_dense).pow(2).sum() / ref_sq)
    loss = torch.stack(losses).mean()
    return loss, col, scores.detach()


def distill_step(model, ids: torch.Tensor, config: FocusConfig, step: int, num_queries: int,
                 seed: int = 0, shares: dict | None = None, top_ks: tuple[int, ...] = (),
                 copy_share: float = 0.0) -> torch.Tensor:
    """Gradients of the distillation objective for one batch; returns the mean loss over layers.

    One dense forward of the frozen model's body (no output head: ``layerwise_step``) under
    ``torch.no_grad``; at each routed layer the
    captured router input, q/k/v and dense output give ``layer_distill_loss`` on
    ``num_queries`` query positions drawn from (seed, step), backpropagated into that layer's
    router alone (memory: one layer's (B, H, n_q, T) logits at a time). The group bias follows
    Sinkhorn's column potentials as in LM training (docs/method.md §1). With
    ``config.match_shifts`` the gate keeps the sampled queries' token-match pairs (built once per
    batch from ``ids``, docs/method.md §2.8), so the routers learn what those pairs leave.

    Args:
        model: Focus-attached causal LM (routers in train mode); ids: (B, T) input ids;
        config: the FocusConfig in force; step: optimizer step (seeds the query sample);
        num_queries: queries sampled per window; shares: optional dict filled with each
            layer's (K,) hard top-1 group shares; top_ks: see ``layer_distill_loss``;
        copy_share: the share of the queries drawn from positions whose next token a distant
            copy predicts (``copy_queries``, ``TrainConfig.distill_copy_share``).
    Returns:
        () float32 mean relative output error over routed layers (a fraction, not nats).
    Raises:
        RuntimeError: no routed layer ran (Focus not attached); ValueError: T <= window.
    """
    from focus_lab.method.metrics import attention_scale
    from focus_lab.train.layerwise import layerwise_step

    T = ids.shape[1]
    gen = torch.Generator().manual_seed(seed * 7919 + step)
    prefer = copy_queries(ids, config.window, config.sink_tokens) if copy_share > 0 else None
    q_pos = sample_queries(T, config.window, num_queries, gen, prefer, copy_share).to(ids.device)
    k_pos = torch.arange(T, device=ids.device)
    match = None if not config.match_shifts else match_mask(
        ids[:, q_pos], ids, config.match_shifts, q_pos, k_pos, config.window, config.sink_tokens,
        config.match_latest)  # (B, n, T) bool

    def distill(call, cfg: FocusConfig):
        return layer_distill_loss(call.module, call.module.focus_router, call.router_in.detach(), call.query,
                                  call.key, call.value, call.attn_out, q_pos, cfg,
                                  attention_scale(call.module, call.query.shape[-1]), top_ks, match)
    return layerwise_step(model, ids, config, distill, shares)
