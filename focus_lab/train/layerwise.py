"""The layer-local training objectives' shared step (coverage, distill; docs/method.md §3
[ours]): one dense forward of the frozen model, each routed layer's loss backpropagated into its
own router alone. Used by ``train.loop`` (coverage) and ``train.distill``."""

from __future__ import annotations

import torch

from focus_lab.hf.hooks import hooks
from focus_lab.hf.state import FocusForward
from focus_lab.method.config import FocusConfig
from focus_lab.method.core import hard_group_shares


def layerwise_step(model, ids: torch.Tensor, config: FocusConfig, layer_loss, shares: dict | None = None
                   ) -> torch.Tensor:
    """Gradients of a per-layer objective (coverage, distill): one dense forward of the frozen
    model's body (``model.base_model``: no output head, no logits) under ``torch.no_grad``; at
    each routed layer whose router routes (``Router.routes``) ``layer_loss(call, config)`` gives
    ``(loss, col_potential (B, K), scores (B, T, K))``, those of the key role
    (``core.soft_roles``), from the layer's ``hooks.LayerCall`` (router input, q/k/v, dense
    output); the loss is backpropagated into that layer's router alone (routers are independent:
    no gradient flows through the model) and the group bias follows Sinkhorn's column potentials
    as in LM training (docs/method.md §1.3). Memory: one layer's objective graph at a time.

    Args:
        model: Focus-attached causal LM (routers in train mode); ids: (B, T) input ids;
        config: the FocusConfig in force; shares: optional dict filled with each layer's (K,)
            hard top-1 group shares.
    Returns:
        () mean loss over the routed layers.
    Raises:
        RuntimeError: no routed layer ran (Focus not attached).
    """
    from focus_lab.method.core import hard_assign
    losses: list[torch.Tensor] = []

    def at_layer(out: torch.Tensor, hook) -> None:
        r = getattr(hook.call.module, "focus_router", None)
        if r is None or not r.routes(config):  # unrouted, or random groups here: nothing to learn
            return
        with torch.enable_grad():
            loss, col, scores = layer_loss(hook.call, config)
            loss.backward()
        r.update_bias(col, config.bias_momentum)
        losses.append(loss.detach())
        if shares is not None:
            _, kg = hard_assign(scores.detach(), config.tau, 1, r.group_bias)
            shares[r.layer_idx] = hard_group_shares(kg, config.num_groups)

    with hooks(model, {"attn_out": at_layer}), torch.no_grad():
        # the body alone (model.base_model): no layer loss reads the logits, which at Gemma-3's
        # 262K vocabulary take 4.3 GB at 4K tokens; attach's pre-hook on the body hands it the ids
        model.base_model(input_ids=ids, use_cache=False, focus=FocusForward(config.replace(mode="dense")))
    if not losses:
        name = getattr(layer_loss, "__name__", "per-layer").removesuffix("_layer_loss")
        raise RuntimeError(f"{name} objective: no routed layer ran (is Focus attached?)")
    return torch.stack(losses).mean()


def coverage_layer_loss(call, config: FocusConfig) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """One layer's coverage loss (``core.coverage_loss``, [ours]): the fraction of its head-mean
    dense attention (B, T, T) at distance >= window that the soft gate drops; with the Sinkhorn
    column potentials (B, K) and the router scores (B, T, K). ``call``: a ``hooks.LayerCall``."""
    from focus_lab.method.core import coverage_loss, soft_roles
    from focus_lab.method.metrics import attention_scale, head_mean_attention
    q, k = call.query, call.key
    attn = head_mean_attention(q, k, attention_scale(call.module, q.shape[-1]))  # (B, T, T)
    log_p, log_p_k, col, scores = soft_roles(call.module.focus_router, call.router_in.detach(), config)
    return coverage_loss(attn, log_p, config.window, config.sink_tokens, log_p_k), col, scores


def coverage_step(model, ids: torch.Tensor, config: FocusConfig, shares: dict | None = None) -> torch.Tensor:
    """Gradients of the coverage objective (``TrainConfig.objective == "coverage"``, [ours]):
    ``layerwise_step`` with ``coverage_layer_loss``. ids: (B, T); returns the () mean loss over
    layers (fraction of distant dense mass dropped by the soft gate)."""
    return layerwise_step(model, ids, config, coverage_layer_loss, shares)
