"""The "focus" attention function, registered with transformers' ``AttentionInterface`` (and
its mask function with ``AttentionMaskInterface``, so causality, padding and sliding windows
still reach it) when this module is imported. Per layer call: route -> fire the patchable hook
points -> choose the path -> compute -> fire the rest (``focus_lab.hf.hooks``).
Source: docs/method.md §1-§4.
"""

from __future__ import annotations

import dataclasses
import time
from contextlib import contextmanager

import torch
import torch.nn as nn
import torch.nn.functional as F
from transformers import AttentionInterface
from transformers.masking_utils import AttentionMaskInterface

from focus_lab.hf.hooks import LayerCall, Pairs, fire, has_hooks, note_unfired
from focus_lab.hf.model_mask import ModelMask
from focus_lab.hf.state import FocusForward, state_of
from focus_lab.method import core
from focus_lab.method.core import (Router, Routing, focus_bias, masked_attention, merge_pairs, pairs_mask, route,
                                   window_only_groups)
from focus_lab.method.decomposition import GroupedKV, hard_focus_attention

ATTN_NAME = "focus"
_RECOMPUTING = [False]
PAIRS_DENSE = 16  # rule pairs above 1/16 of the (B, Tq, Tk) grid take the masked reference path  # True while checkpointed_layers recomputes a layer for its backward


def _focus_mask(**kwargs) -> ModelMask:
    """Mask function for "focus" (transformers' ``AttentionMaskInterface``, the keywords of
    ``sdpa_mask``): the model's mask as a rule (``ModelMask``), never None, never built whole
    until a path asks for it (1 GiB a layer type at 32K tokens otherwise)."""
    return ModelMask.rule(**kwargs)


def _model_mask(attention_mask: ModelMask | torch.Tensor | None, B: int, Tq: int, Tk: int,
                device: torch.device) -> ModelMask:
    """The (B, Tq, Tk) model mask of one attention call from what transformers passed: our
    ``ModelMask``, a 4-D tensor (bool or float bias), or None (plain causality)."""
    if isinstance(attention_mask, ModelMask):
        return attention_mask.sized(B, Tq, Tk)
    return ModelMask.tensor(attention_mask, B, Tq, Tk, device)


def focus_attention(module: nn.Module, query: torch.Tensor, key: torch.Tensor, value: torch.Tensor,
                    attention_mask: torch.Tensor | None, scaling: float | None = None,
                    dropout: float = 0.0, **kwargs) -> tuple[torch.Tensor, None]:
    """The "focus" attention function (transformers' AttentionInterface signature).

    Args:
        module: the attention module; its ``focus_router`` (if any) and the forward's state
            decide the mask. A module without a router attends with the model's own mask.
        query: (B, H, Tq, D); key, value: (B, Hkv, Tk, D); attention_mask: the model's
            mask: a ``ModelMask`` (what the "focus" mask function returns), transformers' 4-D
            mask (B, 1, Tq, Tk) bool/float, or None (then plain causality is applied).
        focus (kwarg): the forward's FocusForward (config, router inputs, KV-cache key groups),
            put there by the caller (``model(..., focus=...)``) or by attach's pre-hook.
        softcap (kwarg): attention-logit soft-capping (Gemma-2), applied to every layer's
            logits before the mask, routed or not; ``sliding_window`` needs nothing here, the
            model's window is already in ``attention_mask``.
    Returns:
        (attn_output (B, Tq, H, D), None).
    Raises:
        NotImplementedError: for a KV-cache decode step (Tq < Tk) in soft mode.
        RuntimeError: no Focus state reached a routed layer (call the attached model), or a
            hard-mode KV-cache step whose earlier tokens' key groups are unknown.

    Reads as route -> choose path -> compute. Hard mode (and window mode, as a hard mask whose
    queries share no group with any key) uses
    ``decomposition.hard_focus_attention`` (two attention calls + LSE merge, docs/method.md §4)
    unless ``config.backend == "dense"`` or the mask hides more than causality (padding, a
    model's own sliding window) or the model soft-caps its logits: then the dense masked
    reference (``core.masked_attention``, with ``softcap``). With a KV cache, a step's queries
    see their window plus the earlier keys of their groups (``FocusCache``).
    """
    focus = kwargs.get("focus")
    timings = focus.timings if isinstance(focus, FocusForward) else None
    if timings is None:
        return _focus_attention(module, query, key, value, attention_mask, scaling, **kwargs)
    with _phase(timings, "attention_fn"):
        return _focus_attention(module, query, key, value, attention_mask, scaling, **kwargs)


@contextmanager
def _phase(timings: dict | None, name: str):
    """Add the enclosed block's wall seconds to ``timings[name]`` (no-op when timings is None)."""
    if timings is None:
        yield
        return
    t = time.perf_counter()
    try:
        yield
    finally:
        timings[name] = timings.get(name, 0.0) + time.perf_counter() - t


def _focus_attention(module, query, key, value, attention_mask, scaling, **kwargs):
    """The body of ``focus_attention`` (same arguments and result)."""
    softcap = kwargs.get("softcap")
    B, H, Tq, _ = query.shape
    Tk = key.shape[2]
    router: Router | None = getattr(module, "focus_router", None)
    hooked = has_hooks(module)
    if router is None:  # an unrouted layer (e.g. a sliding layer of Gemma): the model's own mask
        keep = _model_mask(attention_mask, B, Tq, Tk, query.device)  # (B, Tq, Tk), by rows
        if not hooked:
            out = masked_attention(query, key, value, keep, scaling, softcap=softcap)
            return out.transpose(1, 2).contiguous(), None
        call = _layer_call(module, None, attention_mask, None, query, key, value, keep, scaling, softcap)
        call.set_kept(keep.dense)
        mask = _patched_mask(call, keep, None, "dense")
        bias = keep if mask is None else mask
        out = masked_attention(query, key, value, bias, scaling, softcap=softcap)
        return _finish(call, out, None)
    state = state_of(kwargs.get("focus"))
    if state is None:
        raise RuntimeError("Focus state missing in a routed layer: call the model itself (its "
                           "attach() pre-hooks pass it), or attach() the model again")
    cfg, tm = state.config, state.timings
    with _phase(tm, "mask"):
        keep = _model_mask(attention_mask, B, Tq, Tk, query.device)  # (B, Tq, Tk), by rows
    call = None
    if hooked:  # the points fire where their tensors are made
        with _phase(tm, "hooks"):
            call = _layer_call(module, state, attention_mask, state.inputs.get(router.layer_idx), query, key, value,
                               keep, scaling, softcap)
    # 1. route: the layer's groups (and those of every cached token in a hard decode step)
    with _phase(tm, "route"):
        routing, offset, h = _route_layer(router, state, keep, attention_mask, Tq, Tk, call)
    pairs = None  # (P, 3) long: pairs the rules keep beyond the groups (token-match pairs, the oracle)
    if routing is not None:
        with _phase(tm, "mask"):
            routing, pairs = state.layer_pairs(router.layer_idx, routing, query, key, scaling, offset)
    if call is not None:
        with _phase(tm, "hooks"):
            call.rule_pairs = pairs
            routing = _patch_groups(call, routing, state, offset)
    # 2. choose the path, 3. compute
    with _phase(tm, "mask"):
        path = _attention_path(state, query, key, attention_mask, keep, Tq, Tk, offset, softcap,
                               cfg.top_k_at(router.layer_idx))
        if path == "decomposition" and pairs is not None and pairs.shape[0] * PAIRS_DENSE > B * Tq * Tk:
            path = "reference"  # pairs this dense (the oracle's) cost less as one masked pass than gathered (part D)
    def pos() -> tuple[torch.Tensor, torch.Tensor]:  # absolute positions (Tq,), (Tk,): only where a mask is built
        return (torch.arange(offset + Tk - Tq, offset + Tk, device=query.device),
                torch.arange(offset, offset + Tk, device=query.device))
    match = (lambda: pairs_mask(pairs, (B, Tq, Tk))) if pairs is not None else (lambda: None)  # (B, Tq, Tk)
    if path == "decomposition":
        def built() -> torch.Tensor:  # the dense mask the decomposition attends with (O(T^2), on demand)
            return focus_bias(cfg, routing, *pos(), B, match()) & keep.dense()
    elif path == "causal_sdpa":
        def built() -> torch.Tensor:
            return keep.dense()
    else:
        with _phase(tm, "attn_reference"):
            fb = focus_bias(cfg, routing, *pos(), B, match())  # (B, Tq, Tk) bool mask or float bias
            m = keep.dense()  # (B, Tq, Tk)
            bias = fb & m if fb.dtype == torch.bool else fb.masked_fill(~m, float("-inf"))

        def built() -> torch.Tensor:
            return bias
    mask = None  # a kept patch: the mask or bias the layer attends with instead
    if call is not None:
        with _phase(tm, "hooks"):
            call.routing, call.rule_pairs = routing, pairs
            call.set_kept(built)
            mask = _patched_mask(call, keep, path, cfg.mode)
            if isinstance(mask, tuple):  # ("add", pairs): added pairs only, on the decomposition path
                pairs = merge_pairs(pairs, mask[1], Tq, Tk)
                call.rule_pairs = pairs
                mask = None
            elif mask is not None:
                path = "reference"
    if path == "decomposition":
        if routing is None:  # window mode: the hard mask with no group shared (window + sinks only)
            qg, kg = window_only_groups(B, Tk, query.device)  # (B, Tk, 1), (B, Tk)
            qg = qg[:, Tk - Tq:]  # (B, Tq, 1)
        else:
            qg, kg = routing.query_groups, routing.key_group
        grouped = None
        if (Tq == 1 < Tk and routing is not None and state.cache is not None
                and core.on_host(query)):  # a decode step on the CPU: the group store
            grouped = state.cache.grouped.setdefault(router.layer_idx, GroupedKV())
        out = hard_focus_attention(query, key, value, qg, kg, cfg.window, scaling, backend=cfg.backend,
                                   sinks=cfg.sink_tokens, timings=tm, grouped=grouped, extra_pairs=pairs)
    elif path == "causal_sdpa":  # dense through the flash kernel, no (B, Tq, Tk) mask: ~2x at 4K
        # Tq == Tk: top-left causal; Tq == 1 (a decode step): the last query sees every key
        with _phase(tm, "attn_dense"):
            out = F.scaled_dot_product_attention(query, key, value, is_causal=Tq > 1, scale=scaling,
                                                 enable_gqa=query.shape[1] != key.shape[1])
    else:
        with _phase(tm, "attn_reference"):
            out = masked_attention(query, key, value, bias if mask is None else mask, scaling, softcap=softcap)
    if call is None:
        return out.transpose(1, 2).contiguous(), None
    with _phase(tm, "hooks"):
        return _finish(call, out, cfg.mode)


def _layer_call(module, state: FocusForward | None, attention_mask, h, query, key, value, keep: ModelMask,
                scaling, softcap) -> LayerCall:
    """The layer's ``LayerCall`` (``hooks``), with ``router_in``, ``query``, ``key`` and ``value``
    fired (read-only points)."""
    def plain() -> bool:  # on demand: O(Tq Tk) on an unrouted layer (once per forward on a routed one)
        return (state.is_plain_causal(attention_mask, keep) if state is not None
                else attention_mask is None or keep.plain_causal)
    call = LayerCall(module.__dict__["_focus_layer"], module, state.config if state else None, h, query, key,
                     value, None, keep, _plain=plain, scaling=scaling, softcap=softcap)
    mode = state.config.mode if state is not None else None
    if h is not None:
        fire(call, "router_in", h, mode)
    for point, x in (("query", query), ("key", key), ("value", value)):
        fire(call, point, x, mode)
    if state is not None and mode not in ("soft", "hard"):
        note_unfired(module, mode)
    return call


def _patch_groups(call: LayerCall, routing: Routing | None, state: FocusForward, offset: int) -> Routing | None:
    """Fire ``query_groups`` and ``key_group``; a patched ``key_group`` is also written into the
    forward's FocusCache (the slice of the keys this call holds), so later steps see it."""
    if routing is None:
        return None
    call.routing = routing
    mode = state.config.mode
    qg = fire(call, "query_groups", routing.query_groups, mode)
    if qg is not routing.query_groups:
        call.routing = routing = dataclasses.replace(routing, query_groups=qg)
    kg = fire(call, "key_group", routing.key_group, mode)
    if kg is not routing.key_group:
        call.routing = routing = dataclasses.replace(routing, key_group=kg)
        layer = call.module.focus_router.layer_idx
        if state.cache is not None and layer in state.cache.key_groups:
            seen = state.cache.key_groups[layer].clone()
            seen[:, offset:offset + kg.shape[1]] = kg
            state.cache.key_groups[layer] = seen
            state.cache.grouped.pop(layer, None)  # its group-ordered store holds the old groups
    return routing


def _patched_mask(call: LayerCall, keep: ModelMask, path: str | None, mode: str):
    """Fire ``kept`` when a hook sits there: None (no patch), ("add", pairs (P, 3)) when the
    hooks only added pairs on the decomposition path (they join its part D), else the mask
    (bool) or soft bias (float) to attend with; always within the model's own mask ``keep``."""
    if not has_hooks(call.module, "kept"):
        return None
    x = call.kept
    y = fire(call, "kept", x, mode)
    if y is x:
        return None
    keep = keep.dense()  # (B, Tq, Tk): a patched layer attends through the reference path
    y = y & keep if y.dtype == torch.bool else y.masked_fill(~keep, float("-inf"))
    call.set_kept(y)
    edits = call.kept_edits
    if path == "decomposition" and all(isinstance(e, Pairs) and e.remove is None for e in edits):
        add = torch.cat([e.add.to(keep.device) for e in edits if e.add is not None])
        return ("add", add[keep[add[:, 0], add[:, 1], add[:, 2]]])  # the model's own mask still applies
    return y


def _finish(call: LayerCall, out: torch.Tensor, mode: str | None) -> tuple[torch.Tensor, None]:
    """Fire ``pattern`` (when a hook sits there) and ``attn_out`` with ``out`` (B, H, Tq, D);
    return transformers' (B, Tq, H, D) (an ``attn_out`` hook may patch it)."""
    call.attn_out = None
    if has_hooks(call.module, "pattern"):
        fire(call, "pattern", attention_pattern(call.query, call.key, call.kept, call.scaling, call.softcap), mode)
    call.attn_out = out
    out = fire(call, "attn_out", out, mode)
    call.attn_out = out
    return out.transpose(1, 2).contiguous(), None


def attention_pattern(query: torch.Tensor, key: torch.Tensor, kept: torch.Tensor, scaling: float | None = None,
                      softcap: float | None = None, chunk_elements: int = 1 << 24) -> torch.Tensor:
    """Attention probabilities over the kept keys: softmax over the keys of
    ``q . k * scaling`` (soft-capped when ``softcap``) plus the mask or bias ``kept``.

    Args:
        query: (B, H, Tq, D); key: (B, Hkv, Tk, D), H a multiple of Hkv (GQA);
        kept: (B, Tq, Tk) bool (True = kept) or float bias; a query row with no kept key keeps
            its own diagonal, as ``core.masked_attention`` does.
        chunk_elements: logits computed at a time (queries in chunks), so the O(T^2) work
            needs memory for the result only.
    Returns:
        (B, H, Tq, Tk) float32; each row sums to 1, 0 on the keys not kept.
    """
    B, H, Tq, D = query.shape
    Hkv, Tk = key.shape[1], key.shape[2]
    scale = scaling if scaling is not None else D ** -0.5
    q = query.float().view(B, Hkv, H // Hkv, Tq, D)
    k = key.float()[:, :, None].transpose(-1, -2)  # (B, Hkv, 1, D, Tk)
    out = torch.empty(B, H, Tq, Tk, dtype=torch.float32, device=query.device)
    o = out.view(B, Hkv, H // Hkv, Tq, Tk)
    diag = torch.arange(Tq, device=query.device) + (Tk - Tq)
    step = max(1, chunk_elements // max(1, B * H * Tk))
    for s in range(0, Tq, step):
        e = min(Tq, s + step)
        logits = (q[:, :, :, s:e] @ k) * scale  # (B, Hkv, G, c, Tk)
        if softcap is not None:
            logits = softcap * torch.tanh(logits / softcap)
        m = kept[:, s:e]  # (B, c, Tk)
        if m.dtype == torch.bool:
            empty = ~m.any(-1)  # (B, c)
            if empty.any():
                m = m.clone()
                b_idx, r_idx = empty.nonzero(as_tuple=True)
                m[b_idx, r_idx, diag[s:e][r_idx]] = True
            logits = logits.masked_fill(~m[:, None, None], float("-inf"))
        else:
            empty = torch.isneginf(m).all(-1)
            if empty.any():
                m = m.clone()
                b_idx, r_idx = empty.nonzero(as_tuple=True)
                m[b_idx, r_idx, diag[s:e][r_idx]] = 0.0
            logits = logits + m[:, None, None].float()
        o[:, :, :, s:e] = torch.softmax(logits, dim=-1)
    return out


def _route_layer(router: Router, state: FocusForward, keep: ModelMask, attention_mask,
                 Tq: int, Tk: int, call: LayerCall | None = None) -> tuple[Routing | None, int, torch.Tensor | None]:
    """(routing, offset, h) of one routed layer's forward; routing is None in dense / window
    mode; h: (B, Tq, d_model) the router input the pre-hook stored. ``call``: the layer's
    ``LayerCall`` when hooks are registered: ``router_logits`` fires between the router's
    logits and the groups drawn from them.

    In hard mode with a KV cache (Tq < Tk) the key groups of the cached tokens come from the
    state's FocusCache (filled by the earlier forwards), since the router needs hidden states.
    ``offset``: the absolute position of the first key (> 0 only under a sliding-window cache,
    Mistral). In training the group bias follows Sinkhorn's column potentials (docs/method.md §1.3).
    Raises: NotImplementedError (soft mode with a KV cache), RuntimeError (input not captured,
    or a hard decode step whose earlier tokens' groups are unknown)."""
    cfg = state.config
    h = state.inputs.pop(router.layer_idx, None)
    if cfg.mode not in ("soft", "hard"):
        return None, 0, h
    if Tq != Tk and cfg.mode == "soft":
        raise NotImplementedError(
            "Focus soft attention with a KV cache (decode steps) is not supported; "
            "call the model with use_cache=False, or use mode='hard'")
    if h is None:
        raise RuntimeError("Focus router input was not captured: attach() the model again")
    token_mask = keep.diagonal() if attention_mask is not None else None  # (B, Tq)
    step = state.cache is not None and Tq < Tk
    start = state.cache.seen(router.layer_idx) if step else Tk - Tq
    carried = state.cache.carried.get(router.layer_idx) if step else None  # the rules' causal state
    routing = route(router if call is None or not has_hooks(call.module, "router_logits")
                    else _LogitsHooked(router, call), h, token_mask, cfg, start,
                    carried)  # start: position of h[:, 0]
    if router.training and routing.col_potential is not None and router.routes(cfg) and not _RECOMPUTING[0]:
        router.update_bias(routing.col_potential, cfg.bias_momentum)  # once a step, not again in a recompute
    if cfg.mode != "hard":
        return routing, 0, h
    if state.cache is None:
        if Tq < Tk:
            raise RuntimeError(
                f"hard-mode KV-cache step with {Tk - Tq} cached tokens, but this forward's "
                "FocusForward has no FocusCache: pass FocusForward(config, cache=FocusCache()) "
                "to the prefill and to every step, or omit focus= to use the model's default")
        return routing, 0, h
    seen = state.cache.extend(router.layer_idx, routing.key_group, Tq, Tk)  # (B, T_seen)
    if routing.carry:
        state.cache.carried[router.layer_idx] = routing.carry
    offset = seen.shape[1] - Tk  # a sliding-window cache keeps only the latest keys
    return dataclasses.replace(routing, key_group=seen[:, offset:]), offset, h


class _LogitsHooked:
    """A router whose logits (the query role) pass through the ``router_logits`` hook point
    before ``core.route`` draws the groups from them; every other attribute is the router's."""

    def __init__(self, router: Router, call: LayerCall) -> None:
        self._router, self._call = router, call

    def __call__(self, h: torch.Tensor, config=None, start: int = 0) -> torch.Tensor:
        cfg = config or self._router.config
        return fire(self._call, "router_logits", self._router(h, cfg, start), cfg.mode)

    def __getattr__(self, name: str):
        return getattr(self._router, name)


def _attention_path(state: FocusForward, query, key, attention_mask, keep: ModelMask, Tq: int, Tk: int,
                    offset: int, softcap, layer_k: int | None = None) -> str:
    """"decomposition" (hard mode, two attention calls, docs/method.md §4; window mode too, as
    the hard mask whose queries share no group with any key), "causal_sdpa" (dense
    mode, the flash kernel with no mask: a full causal forward or a one-token decode step) or
    "reference" (the dense masked O(T^2) path). The fast
    paths need plain causality (no padding, no model sliding window), keys from position 0, no
    logit soft-capping, and for the decomposition no autograd. ``layer_k``: the layer's k in
    hard mode (``FocusConfig.top_k_at``); k >= num_groups joins every group, so the hard mask
    keeps every causal pair and the layer takes "causal_sdpa" (docs/method.md §2.7)."""
    cfg = state.config
    simple = softcap is None and offset == 0 and state.is_plain_causal(attention_mask, keep)
    needs_grad = torch.is_grad_enabled() and (query.requires_grad or key.requires_grad)
    every_group = cfg.mode == "hard" and layer_k is not None and layer_k >= cfg.num_groups
    if (cfg.mode == "dense" or every_group) and (Tq == Tk or Tq == 1) and simple:
        return "causal_sdpa"
    if cfg.mode in ("hard", "window") and cfg.backend != "dense" and not needs_grad and simple:
        return "decomposition"
    return "reference"


# registered once, when this module is imported: transformers then finds "focus" by name
AttentionInterface.register(ATTN_NAME, focus_attention)
AttentionMaskInterface.register(ATTN_NAME, _focus_mask)


@contextmanager
def _recomputing():
    _RECOMPUTING[0] = True
    try:
        yield
    finally:
        _RECOMPUTING[0] = False
