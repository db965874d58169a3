"""Attach Focus to a model and detach it: routers on the attention modules, the pre-hooks that
hand each forward its state, the model's default forward state and its per-forward copies
(``forward_state``), and activation checkpointing of the decoder layers.
Source: docs/method.md §1-§3.
"""

from __future__ import annotations

from contextlib import contextmanager, nullcontext
from dataclasses import dataclass
from typing import Callable

import torch
import torch.nn as nn

from focus_lab.hf.attention import ATTN_NAME, _recomputing
from focus_lab.hf.family import attention_modules, focus_layers, is_attached
from focus_lab.hf.kv_cache import grow_in_place
from focus_lab.hf.state import FocusCache, FocusForward, state_of
from focus_lab.method.config import SHAPE_FIELDS, FocusConfig
from focus_lab.method.core import Router


@dataclass
class _Attachment:
    """What ``attach`` leaves on a model (``model._focus_state``): the default forward state and
    what ``detach`` restores."""

    default: FocusForward
    hooks: list
    requires_grad: dict[str, bool]
    attn_implementation: str


@contextmanager
def checkpointed_layers(model: nn.Module):
    """Activation checkpointing of every decoder layer while the block runs ([ours]).

    Each layer that holds a self-attention module (``attention_modules``) keeps only its inputs
    from the forward and recomputes its activations during the backward
    (``torch.utils.checkpoint``, non-reentrant, RNG state preserved), so the LM objective's soft
    gate, a (batch, heads, seq, seq) float graph per routed layer, is held for one layer at a time:
    at 2048 tokens SmolLM2-135M's LM step holds 14 GiB without it (docs/recipes.md). Gradients are
    those of the plain forward. The recompute runs the layer again, its Focus routing included:
    the group bias is updated once (not in the recompute), while hook points (``hooks``) fire a
    second time. Works whatever the model's train / eval mode (unlike transformers' own switch).
    The layers' ``forward`` is restored on exit, also after an error. Raises
    UnsupportedModelError as ``attention_modules``."""
    from torch.utils.checkpoint import checkpoint
    names = {id(m): n for n, m in model.named_modules()}
    layers = []
    for _, attn in attention_modules(model):
        name = names[id(attn)].rsplit(".", 1)[0]
        layers.append(model.get_submodule(name))

    def wrap(forward):
        def checkpointed(*args, **kwargs):
            return checkpoint(forward, *args, use_reentrant=False,
                              context_fn=lambda: (nullcontext(), _recomputing()), **kwargs)
        return checkpointed
    saved = [(layer, layer.__dict__.get("forward")) for layer in layers]
    try:
        for layer in layers:
            layer.forward = wrap(layer.forward)
        yield model
    finally:
        for layer, own in saved:
            if own is None:
                del layer.forward
            else:
                layer.forward = own


def _state_hook(attachment: _Attachment) -> Callable:
    """The forward pre-hook ``attach`` puts on every attention module (``with_kwargs=True``:
    decoder layers pass ``hidden_states`` by keyword). It makes sure the module's call carries a
    FocusForward (the caller's ``focus=``, else the model's default) and stores the routed
    layer's input (after the layer's input norm) in it for the router."""
    def hook(module: nn.Module, args: tuple, kwargs: dict):
        state = state_of(kwargs.get("focus")) or attachment.default
        router = getattr(module, "focus_router", None)
        if router is not None:
            state.inputs[router.layer_idx] = kwargs.get("hidden_states", args[0] if args else None)
        return args, {**kwargs, "focus": state}
    return hook


def _ids_hooks(attachment: _Attachment) -> tuple[Callable, Callable]:
    """The forward pre-hook and hook ``attach`` puts on the model itself and on its base model
    (``model.base_model``: the decoder without its head, which some callers run alone): the pre-hook hands
    the forward's ``input_ids`` (B, Tq) to its FocusForward (for the rules that read them: token-match pairs, docs/method.md §2.8), the hook drops them when it returns. The
    pre-hook also makes an empty ``DynamicCache`` in ``past_key_values`` append in place
    (``kv_cache.grow_in_place``: transformers' own copies the whole cache every decode step)."""
    def state(kwargs: dict) -> FocusForward:
        return state_of(kwargs.get("focus")) or attachment.default

    def pre(module: nn.Module, args: tuple, kwargs: dict):
        grow_in_place(kwargs.get("past_key_values"))  # generate's default cache appends in place
        st = state(kwargs)
        ids = kwargs.get("input_ids", args[0] if args else None)
        st.token_ids = ids if isinstance(ids, torch.Tensor) and not ids.is_floating_point() else None
        st.shared.clear()
        return None

    def post(module: nn.Module, args: tuple, kwargs: dict, output):
        st = state(kwargs)
        st.token_ids = None
        st.shared.clear()
        return None
    return pre, post


def attach(model: nn.Module, config: FocusConfig | None = None) -> nn.Module:
    """Retrofit Focus onto ``model`` in place and return it.

    Adds a Router (``focus_router``) to every selected attention layer (``config.layers``, by
    default ``focus_layers(model)``: every layer, or Gemma's global layers), registers and selects
    the "focus" attention function, and freezes every original parameter (only routers train).

    Raises:
        UnsupportedModelError: the architecture has no adapter.
        ValueError: the model already has Focus attached, or ``config.layers`` names a layer
            the model lacks or a sliding-window layer of an interleaved (Gemma) model.
    """
    if is_attached(model):
        raise ValueError("Focus is already attached to this model; detach() it first")
    config = (config or FocusConfig()).validate()
    modules = attention_modules(model)
    n_layers = len(modules)
    default = focus_layers(model)
    layers = config.layers if config.layers is not None else default
    missing = sorted(set(layers) - {i for i, _ in modules})
    if missing:
        raise ValueError(f"FocusConfig.layers names layers {missing}, but the model has layers "
                         f"0..{n_layers - 1}")
    local = sorted(set(layers) - set(default))
    if local:
        raise ValueError(f"FocusConfig.layers names sliding-window layers {local} of this "
                         f"{model.config.model_type} model: Focus applies to its global layers "
                         f"{default} only (local layers keep their own window)")
    d_model = model.config.hidden_size
    requires_grad = {n: p.requires_grad for n, p in model.named_parameters()}
    for p in model.parameters():
        p.requires_grad_(False)
    device = next(model.parameters()).device
    attachment = _Attachment(FocusForward(config, FocusCache()), [], requires_grad,
                             model.config._attn_implementation)
    for idx, module in modules:
        module.__dict__["_focus_layer"] = idx  # the layer index the hook points name
        if idx in layers:
            # routers start in eval mode: their group bias only moves inside focus_lab.train.loop
            # each router reads its own copy of the config (frozen: a forward's config is passed to it)
            module.focus_router = Router(d_model, config.replace(), idx).to(device).eval()
        attachment.hooks.append(module.register_forward_pre_hook(_state_hook(attachment), with_kwargs=True))
    pre, post = _ids_hooks(attachment)
    base = getattr(model, "base_model", model)  # the decoder without its head, called alone by some callers
    for top in (model,) if base is model else (model, base):
        attachment.hooks.append(top.register_forward_pre_hook(pre, with_kwargs=True))
        attachment.hooks.append(top.register_forward_hook(post, with_kwargs=True))
    model._focus_state = attachment
    model.__dict__["_reorder_cache"] = _beam_reorder(model, getattr(model, "_reorder_cache", None),
                                                     model.__dict__.get("_reorder_cache"))
    model.set_attn_implementation(ATTN_NAME)
    return model


def _beam_reorder(model: nn.Module, own: Callable | None, restore: Callable | None) -> Callable:
    """The model's ``_reorder_cache`` while Focus is attached: beam search (``generate`` with
    ``num_beams > 1``) calls it to pick the surviving beams' rows of the KV cache; the key groups
    of the model's default FocusCache must follow, or later steps attend with another beam's
    groups. ``own``: the model's own ``_reorder_cache``, if any (called first); ``restore``: an
    instance attribute of that name that ``detach`` puts back."""
    def reorder(past_key_values, beam_idx):
        if own is not None:
            past_key_values = own(past_key_values, beam_idx)
        else:
            past_key_values.reorder_cache(beam_idx)
        cache = model._focus_state.default.cache
        if cache is not None:
            cache.reorder(beam_idx)
        return past_key_values
    reorder.restore = restore
    return reorder


def detach(model: nn.Module) -> nn.Module:
    """Undo ``attach``: remove routers and hooks, restore the attention implementation and
    each parameter's ``requires_grad``. Outputs are then exactly the original ones."""
    state: _Attachment | None = model.__dict__.get("_focus_state")
    if state is None:
        raise ValueError("Focus is not attached to this model")
    for h in state.hooks:
        h.remove()
    for _, module in attention_modules(model):
        module.__dict__.pop("_focus_layer", None)
        if hasattr(module, "focus_router"):
            del module.focus_router
    restore = getattr(model.__dict__.pop("_reorder_cache", None), "restore", None)
    if restore is not None:
        model.__dict__["_reorder_cache"] = restore
    model.set_attn_implementation(state.attn_implementation)
    for n, p in model.named_parameters():
        p.requires_grad_(state.requires_grad.get(n, True))
    del model._focus_state
    return model


def routers(model: nn.Module) -> dict[int, Router]:
    """{layer_idx: Router} of an attached model."""
    return {i: m.focus_router for i, m in attention_modules(model) if hasattr(m, "focus_router")}


def _default(model: nn.Module) -> FocusForward:
    """The model's default FocusForward (what a forward without ``focus=`` uses); ValueError
    when Focus is not attached."""
    if not is_attached(model):
        raise ValueError("Focus is not attached to this model; call focus_lab.attach(model, config)")
    return model._focus_state.default


def focus_config(model: nn.Module) -> FocusConfig:
    """The model's default FocusConfig: the one a forward without ``focus=`` uses.

    Raises ValueError when Focus is not attached."""
    return _default(model).config


def _changed(old: FocusConfig, changes: dict) -> FocusConfig:
    bad = sorted(k for k in changes if k in SHAPE_FIELDS and changes[k] != getattr(old, k))
    if bad:
        raise ValueError(f"cannot change {bad} after attach: detach and attach a new config")
    return old.replace(**changes)


def forward_state(model: nn.Module, cache: bool = False, **changes) -> FocusForward:
    """A FocusForward for one or more forwards: the model's default config with ``changes``
    (e.g. ``mode="hard", top_k=1``), nothing on the model mutated. Use it as
    ``model(input_ids, focus=forward_state(model, mode="dense"))``; ``cache=True`` gives it a
    FocusCache for hard-mode decoding through a KV cache.

    Raises ValueError: Focus not attached, or a shape field (``config.SHAPE_FIELDS``: num_groups,
    router_dim, layers, key_router) changed (they are fixed at attach)."""
    return FocusForward(_changed(_default(model).config, changes), FocusCache() if cache else None)


def set_config(model: nn.Module, **changes) -> FocusConfig:
    """Change the model's default config (e.g. ``mode="hard", top_k=1``): what every forward
    without ``focus=`` uses from now on (``model.generate`` included). Library code passes a
    ``forward_state`` per forward instead. Shape fields (``config.SHAPE_FIELDS``) cannot
    change after attach (ValueError)."""
    new = _changed(_default(model).config, changes)
    model._focus_state.default = FocusForward(new, FocusCache())
    return new
