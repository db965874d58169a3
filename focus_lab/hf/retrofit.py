"""Retrofit Focus onto a pretrained transformers model: attach, detach, save and load routers.

Focus enters through transformers' ``AttentionInterface`` (an attention function named
"focus") and ``AttentionMaskInterface`` (so causality, padding and sliding windows still
reach it). A forward pre-hook on each attention module captures its input (after the
layer's input norm), which the layer's Router scores. Every original parameter is frozen.
Source: docs/method.md §1-§3.
"""

from __future__ import annotations

import dataclasses

import hashlib
import json
import re
import time
import weakref
from dataclasses import dataclass, field
from pathlib import Path
from contextlib import contextmanager, nullcontext
from typing import Callable

import torch
import torch.nn as nn
import torch.nn.functional as F
from safetensors import safe_open
from safetensors.torch import save_file
from transformers import AttentionInterface
from transformers.masking_utils import AttentionMaskInterface, sdpa_mask

from focus_lab.method.config import SHAPE_FIELDS, FocusConfig
from focus_lab.method.core import (Router, Routing, focus_bias, masked_attention, match_pairs, pairs_mask,
                                   route, window_only_groups)
from focus_lab.method.decomposition import GroupedKV, hard_focus_attention
from focus_lab.hf.hooks import LayerCall, fire, has_hooks
from focus_lab.hf.kv_cache import grow_in_place
from focus_lab.io import atomic_path, file_sha256

ATTN_NAME = "focus"
ROUTER_FORMAT = "focus-lab-router"
ROUTER_FORMAT_VERSION = "1"



@dataclass(frozen=True)
class FamilyAdapter:
    """What Focus needs to know about one architecture family (``config.model_type``).

    Everything else is one code path: the model calls ``focus_attention`` through transformers'
    AttentionInterface with its own q/k/v (after its biases, QK-norm and RoPE or learned
    positions), its ``scaling``, its mask (causality, padding, its own sliding window) and, for
    Gemma-2, ``softcap``.

    Attributes:
        attn_attr: attribute name of the self-attention module in a decoder layer.
        global_layers_only: Focus routes only the layers whose ``config.layer_types`` entry is
            not "sliding_attention" (Gemma's interleaved local/global layers); sliding layers
            keep their own window (they go through the same function with no router).
        softcap: the model passes attention-logit soft-capping (``softcap=``) to the interface.
        touches: what Focus changes in this family, for the README's compatibility table.
    """

    attn_attr: str = "self_attn"
    global_layers_only: bool = False
    softcap: bool = False
    touches: str = "every layer's attention mask"


ADAPTERS: dict[str, FamilyAdapter] = {
    "gpt2": FamilyAdapter("attn", touches="every layer (MHA, learned positions)"),
    "llama": FamilyAdapter(touches="every layer (GQA, RoPE)"),
    "mistral": FamilyAdapter(touches="every layer (GQA, RoPE), intersected with the model's sliding window"),
    "qwen2": FamilyAdapter(touches="every layer (GQA, q/k/v bias), intersected with a sliding window if enabled"),
    "olmo2": FamilyAdapter(touches="every layer (QK-norm; post-norm, the router sees the residual stream)"),
    "gemma2": FamilyAdapter(global_layers_only=True, softcap=True,
                            touches="global layers only (logit softcap kept); sliding layers unchanged"),
    "gemma3_text": FamilyAdapter(global_layers_only=True,
                                 touches="global layers only (QK-norm); sliding layers unchanged"),
}

# family (config.model_type) -> attribute name of the self-attention module in a decoder layer


class UnsupportedModelError(ValueError):
    """The model's architecture has no Focus adapter."""


class RouterMismatchError(ValueError):
    """A router file was trained on another base model or is not a router file."""


# --------------------------------------------------------------------------------------------
# the attention function and its mask function

def _focus_mask(*args, **kwargs):
    """Mask function for "focus": the sdpa boolean mask, always materialized (never None)."""
    kwargs["allow_is_causal_skip"] = False
    return sdpa_mask(*args, **kwargs)


def is_plain_causal(keep: torch.Tensor) -> bool:
    """True when ``keep`` (B, Tq, Tk) bool, a mask that never keeps a future key, is plain
    causality for queries at positions Tk-Tq..Tk-1 (no padding, no sliding window): query i
    sees exactly its i + 1 first keys."""
    Tq, Tk = keep.shape[-2:]
    q_pos = torch.arange(Tk - Tq, Tk, device=keep.device)
    return bool((torch.count_nonzero(keep, dim=-1) == q_pos + 1).all())


# --------------------------------------------------------------------------------------------
# the state of a forward: config, router inputs, KV-cache key groups

@dataclass
class FocusCache:
    """Hard-mode KV-cache state: the key group of every token seen so far, per routed layer.

    ``key_groups``: {layer_idx: (B, T_seen) int64}. A forward from position 0 (Tq == Tk) starts a
    layer's entry over; a decode step (Tq < Tk) appends its tokens' groups, since the router needs
    hidden states that the KV cache does not keep. ``grouped``: {layer_idx: GroupedKV}, the
    layer's keys and values ordered by group, which one-token steps attend through
    (``decomposition.GroupedKV``, built at the first step after a prefill).
    Source: docs/method.md §4 (KV cache).
    """

    key_groups: dict[int, torch.Tensor] = field(default_factory=dict)
    # {layer_idx: (B, 1)}: with key_shift, the key group of the next token (Routing.next_key_group)
    next_key_group: dict[int, torch.Tensor] = field(default_factory=dict)
    grouped: dict[int, GroupedKV] = field(default_factory=dict, repr=False)
    token_ids: torch.Tensor | None = field(default=None, repr=False)  # (B, T_seen), with match_shifts

    def seen(self, layer_idx: int) -> int:
        """Number of tokens whose key groups layer ``layer_idx`` holds (0 before a prefill)."""
        g = self.key_groups.get(layer_idx)
        return 0 if g is None else int(g.shape[1])

    def extend(self, layer_idx: int, key_group: torch.Tensor, Tq: int, Tk: int) -> torch.Tensor:
        """Record this forward's key groups (B, Tq) of layer ``layer_idx``; return the groups of
        every token seen so far, (B, T_seen), T_seen >= Tk (more under a sliding-window cache).

        Raises:
            RuntimeError: a decode step (Tq < Tk) whose earlier tokens' groups are unknown
                (no prefill went through this cache)."""
        past = self.key_groups.get(layer_idx) if Tq < Tk else None
        B = key_group.shape[0]
        if Tq < Tk and (past is None or past.shape[0] != B or past.shape[1] < Tk - Tq):
            raise RuntimeError(
                f"hard-mode KV-cache step with {Tk - Tq} cached tokens, but layer {layer_idx} saw "
                f"{None if past is None else tuple(past.shape)} key groups: start generation "
                "with a forward from position 0 through the same FocusCache (the model's default "
                "one, or the FocusForward's cache)")
        if past is None:
            self.grouped.pop(layer_idx, None)  # a forward from position 0: the old store is stale
        seen = key_group if past is None else torch.cat([past, key_group], 1)  # (B, T_seen)
        self.key_groups[layer_idx] = seen
        return seen

    def reorder(self, beam_idx: torch.Tensor) -> None:
        """Select batch rows ``beam_idx`` (B,) of every per-row state, as beam search does to
        the KV cache (the model's ``_reorder_cache``, installed by ``attach``); the group-ordered
        stores are dropped and rebuilt at the next step."""
        for d in (self.key_groups, self.next_key_group):
            for i, g in d.items():
                d[i] = g.index_select(0, beam_idx.to(g.device))
        if self.token_ids is not None:
            self.token_ids = self.token_ids.index_select(0, beam_idx.to(self.token_ids.device))
        self.grouped.clear()


@dataclass
class FocusForward:
    """The Focus state of one forward, passed as ``model(input_ids, focus=FocusForward(cfg))``.

    transformers hands the ``focus`` keyword to every attention module; the pre-hook that
    ``attach`` installs stores each routed layer's router input in it, and ``focus_attention``
    reads the config and the inputs from it. A forward without ``focus=`` (e.g. inside
    ``model.generate``) uses the model's default state, the one ``attach`` / ``load_routers``
    put on the model (its config is changed by ``set_config``), with the model's own FocusCache.

    Attributes:
        config: the FocusConfig in force for this forward (mode, top_k, assignment, window, ...).
            Shape fields (``config.SHAPE_FIELDS``) must be the attached ones.
        cache: a FocusCache for hard-mode decoding through a KV cache; None: no decode step
            possible with this state (full forwards only).
        inputs: {layer_idx: (B, T, d_model)} router inputs of the forward in flight (internal:
            filled by the pre-hook, consumed by the attention function).
        timings: None, or a dict into which every routed layer's attention function adds wall
            seconds per phase (for benchmarks, ``analyses/bench_attention.py``): "route" (router
            and groups), "mask" (transformers' mask read, path choice), "hooks" (the hook points), the
            decomposition's "plan", "gather", "scatter", "attn_A", "attn_B", "attn_D" (token-match pairs), "merge"
            (``decomposition.hard_focus_attention``), "attn_dense" (dense SDPA) or
            "attn_reference" (the masked reference), and "attention_fn", the whole function.
    Source: docs/method.md §1-§4.
    """

    config: FocusConfig
    cache: FocusCache | None = None
    inputs: dict[int, torch.Tensor] = field(default_factory=dict, repr=False)
    timings: dict[str, float] | None = field(default=None, repr=False, compare=False)
    token_ids: torch.Tensor | None = field(default=None, repr=False, compare=False)
    _plain: "PlainCausalCheck" = field(default_factory=lambda: PlainCausalCheck(), repr=False, compare=False)
    _match: tuple | None = field(default=None, repr=False, compare=False)

    def match_pairs(self, Tq: int, Tk: int) -> torch.Tensor | None:
        """The token-match pairs of this forward (``core.match_pairs`` with ``config.match_shifts``
        and ``config.match_latest``) as a list (P, 3) long of (b, i, j), j indexing the layer's
        Tk keys, built once per forward and shared by its layers; None when ``match_shifts`` is
        off or the mode is neither hard nor soft. The keys' ids are this forward's ``token_ids`` (B, Tq),
        after those of the cached tokens in a decode step.

        Raises RuntimeError: no ``input_ids`` reached the forward (called with ``inputs_embeds``,
        or through a submodule of the model that ``attach`` was given), or a decode step whose
        earlier tokens' ids are unknown."""
        cfg = self.config
        if not cfg.match_shifts or cfg.mode not in ("hard", "soft"):
            return None
        if self._match is not None and self._match[0] == (Tq, Tk):
            return self._match[1]
        ids = self.token_ids
        if ids is None or ids.shape[-1] != Tq:
            raise RuntimeError(
                "FocusConfig.match_shifts needs the token ids of each forward: call the model that "
                "attach() was given (or its base_model) with input_ids= (not inputs_embeds), or set "
                "match_shifts=None")
        seen = ids
        if Tq < Tk:
            past = self.cache.token_ids if self.cache is not None else None
            if past is None or past.shape[0] != ids.shape[0] or past.shape[1] < Tk - Tq:
                raise RuntimeError(
                    f"match_shifts in a KV-cache step with {Tk - Tq} cached tokens, but the FocusCache "
                    f"holds {None if past is None else tuple(past.shape)} token ids: start generation "
                    "with a forward from position 0 through the same FocusCache")
            seen = torch.cat([past, ids], 1)  # (B, T_seen), T_seen >= Tk under a sliding-window cache
        if self.cache is not None:
            self.cache.token_ids = seen
        T = seen.shape[1]
        pos = torch.arange(T, device=ids.device)  # absolute positions of every token seen
        pairs = match_pairs(ids, seen, cfg.match_shifts, pos[T - Tq:], pos, cfg.window, cfg.sink_tokens,
                            cfg.match_latest)  # (P, 3) over every token seen
        if T > Tk:  # a sliding-window cache: keep the keys the layer holds, index them from its first
            pairs = pairs[pairs[:, 2] >= T - Tk]
            pairs[:, 2] -= T - Tk
        self._match = ((Tq, Tk), pairs)
        return pairs

    def is_plain_causal(self, attention_mask: torch.Tensor | None, keep: torch.Tensor) -> bool:
        """``is_plain_causal(keep)`` for transformers' mask (None: plain causality), computed
        once for the mask tensor of this forward (``PlainCausalCheck``)."""
        return self._plain(attention_mask, keep)


class PlainCausalCheck:
    """``is_plain_causal(keep)`` computed once per transformers mask tensor, not once per layer:
    every layer of a forward gets the same mask object (summing a (B, T, T) bool mask costs
    35-60 ms a layer at 4K tokens). Used by ``FocusForward`` and by the recorder.

    Call: ``check(attention_mask, keep)`` with transformers' 4-D mask (or None: plain causality)
    and its (B, Tq, Tk) bool keep mask -> bool."""

    def __init__(self) -> None:
        self._entry: tuple | None = None  # (weakref to the mask, (version, shape), result)

    def __call__(self, attention_mask: torch.Tensor | None, keep: torch.Tensor) -> bool:
        if attention_mask is None:
            return True
        key = (attention_mask._version, tuple(keep.shape))
        e = self._entry
        if e is not None and e[0]() is attention_mask and e[1] == key:
            return e[2]
        ok = is_plain_causal(keep)
        self._entry = (weakref.ref(attention_mask), key, ok)
        return ok


@dataclass
class _Attachment:
    """What ``attach`` leaves on a model (``model._focus_state``): the default forward state and
    what ``detach`` restores."""

    default: FocusForward
    hooks: list
    requires_grad: dict[str, bool]
    attn_implementation: str


def _state_of(focus) -> FocusForward | None:
    """The ``focus`` keyword checked: a FocusForward or None. A bare FocusConfig is refused: one
    state must serve every layer of a forward (the plain-causality check and the KV cache live in
    it), so it is built once, by the caller."""
    if focus is None or isinstance(focus, FocusForward):
        return focus
    raise TypeError(f"focus= takes a FocusForward, not {type(focus).__name__}: pass "
                    "focus_lab.forward_state(model, **changes) or FocusForward(config)")


def _keep_from_hf_mask(attention_mask: torch.Tensor | None, B: int, Tq: int, Tk: int,
                       device: torch.device) -> torch.Tensor:
    """(B, Tq, Tk) bool from transformers' 4-D mask; plain causality when it is None."""
    if attention_mask is None:
        q = torch.arange(Tk - Tq, Tk, device=device)
        k = torch.arange(Tk, device=device)
        return (k[None, :] <= q[:, None]).expand(B, Tq, Tk)
    m = attention_mask[:, 0, :, :Tk]  # (B, Tq, Tk)
    if m.dtype != torch.bool:
        m = m > torch.finfo(m.dtype).min / 2
    return m.expand(B, Tq, Tk)


def focus_attention(module: nn.Module, query: torch.Tensor, key: torch.Tensor, value: torch.Tensor,
                    attention_mask: torch.Tensor | None, scaling: float | None = None,
                    dropout: float = 0.0, **kwargs) -> tuple[torch.Tensor, None]:
    """The "focus" attention function (transformers' AttentionInterface signature).

    Args:
        module: the attention module; its ``focus_router`` (if any) and the forward's state
            decide the mask. A module without a router attends with the model's own mask.
        query: (B, H, Tq, D); key, value: (B, Hkv, Tk, D); attention_mask: transformers' 4-D
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
    if router is None:  # an unrouted layer (e.g. a sliding layer of Gemma): the model's own mask
        keep = _keep_from_hf_mask(attention_mask, B, Tq, Tk, query.device)  # (B, Tq, Tk)
        out = masked_attention(query, key, value, keep, scaling, softcap=softcap)
        return _emit(module, None, attention_mask, None, query, key, value, None, keep, lambda: keep, out)
    state = _state_of(kwargs.get("focus"))
    if state is None:
        raise RuntimeError("Focus state missing in a routed layer: call the model itself (its "
                           "attach() pre-hooks pass it), or attach() the model again")
    cfg, tm = state.config, state.timings
    with _phase(tm, "mask"):
        keep = _keep_from_hf_mask(attention_mask, B, Tq, Tk, query.device)  # (B, Tq, Tk)
    # 1. route: the layer's groups (and those of every cached token in a hard decode step)
    with _phase(tm, "route"):
        routing, offset, h = _route_layer(router, state, keep, attention_mask, Tq, Tk)
    # 2. choose the path, 3. compute
    with _phase(tm, "mask"):
        path = _attention_path(state, query, key, attention_mask, keep, Tq, Tk, offset, softcap,
                               cfg.top_k_at(router.layer_idx))
    q_pos = torch.arange(offset + Tk - Tq, offset + Tk, device=query.device)  # absolute positions
    k_pos = torch.arange(offset, offset + Tk, device=query.device)
    with _phase(tm, "mask"):
        pairs = state.match_pairs(Tq, Tk) if routing is not None else None  # (P, 3) long or None
    match = (lambda: pairs_mask(pairs, (B, Tq, Tk))) if pairs is not None else (lambda: None)  # (B, Tq, Tk)
    if path == "decomposition":
        if routing is None:  # window mode: the hard mask with no group shared (window + sinks only)
            qg, kg = window_only_groups(B, Tk, query.device)  # (B, Tk, 1), (B, Tk)
            qg = qg[:, Tk - Tq:]  # (B, Tq, 1)
        else:
            qg, kg = routing.query_groups, routing.key_group
        grouped = None
        if Tq == 1 < Tk and routing is not None and state.cache is not None:  # a decode step
            grouped = state.cache.grouped.setdefault(router.layer_idx, GroupedKV())
        out = hard_focus_attention(query, key, value, qg, kg, cfg.window, scaling, backend=cfg.backend,
                                   sinks=cfg.sink_tokens, timings=tm, grouped=grouped, extra_pairs=pairs)
        # a hook on "kept" gets the same dense mask as on the reference path (O(T^2), built on demand)
        with _phase(tm, "hooks"):
            return _emit(module, state, attention_mask, h, query, key, value, routing, keep,
                         lambda: focus_bias(cfg, routing, q_pos, k_pos, B, match()) & keep, out, pairs)
    if path == "causal_sdpa":  # dense through the flash kernel, no (B, Tq, Tk) mask: ~2x at 4K
        # Tq == Tk: top-left causal; Tq == 1 (a decode step): the last query sees every key
        with _phase(tm, "attn_dense"):
            out = F.scaled_dot_product_attention(query, key, value, is_causal=Tq > 1, scale=scaling,
                                                 enable_gqa=query.shape[1] != key.shape[1])
        with _phase(tm, "hooks"):
            return _emit(module, state, attention_mask, h, query, key, value, routing, keep, lambda: keep, out)
    with _phase(tm, "attn_reference"):
        fb = focus_bias(cfg, routing, q_pos, k_pos, B, match())  # (B, Tq, Tk) bool mask or float bias
        bias = fb & keep if fb.dtype == torch.bool else fb.masked_fill(~keep, float("-inf"))
        out = masked_attention(query, key, value, bias, scaling, softcap=softcap)
    with _phase(tm, "hooks"):
        return _emit(module, state, attention_mask, h, query, key, value, routing, keep, lambda: bias, out, pairs)


def _emit(module, state: FocusForward | None, attention_mask, h, query, key, value, routing, keep: torch.Tensor,
          kept: Callable[[], torch.Tensor], out: torch.Tensor,
          match_pairs: torch.Tensor | None = None) -> tuple[torch.Tensor, None]:
    """Fire the layer's hook points (``hooks.fire``, when any is registered) with ``out``
    (B, H, Tq, D); return transformers' (B, Tq, H, D) (a hook at ``attn_out`` may patch it).
    ``match_pairs``: the forward's token-match pairs (P, 3), or None."""
    if has_hooks(module):
        def plain() -> bool:  # on demand: O(Tq Tk) on an unrouted layer (once per forward on a routed one)
            return (state.is_plain_causal(attention_mask, keep) if state is not None
                    else attention_mask is None or is_plain_causal(keep))
        out = fire(LayerCall(module.__dict__["_focus_layer"], module, state.config if state else None, h,
                             query, key, value, routing, keep, out, kept, plain, match_pairs=match_pairs))
    return out.transpose(1, 2).contiguous(), None


def _route_layer(router: Router, state: FocusForward, keep: torch.Tensor, attention_mask: torch.Tensor | None,
                 Tq: int, Tk: int) -> tuple[Routing | None, int, torch.Tensor | None]:
    """(routing, offset, h) of one routed layer's forward; routing is None in dense / window
    mode; h: (B, Tq, d_model) the router input the pre-hook stored.

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
    token_mask = keep.diagonal(dim1=1, dim2=2, offset=Tk - Tq) if attention_mask is not None else None
    step = state.cache is not None and Tq < Tk
    start = state.cache.seen(router.layer_idx) if step else Tk - Tq
    prev = state.cache.next_key_group.get(router.layer_idx) if step else None  # (B, 1), key_shift
    routing = route(router, h, token_mask, cfg, start, prev)  # start: absolute position of h[:, 0]
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
    if routing.next_key_group is not None:
        state.cache.next_key_group[router.layer_idx] = routing.next_key_group
    offset = seen.shape[1] - Tk  # a sliding-window cache keeps only the latest keys
    return dataclasses.replace(routing, key_group=seen[:, offset:]), offset, h


def _attention_path(state: FocusForward, query, key, attention_mask, keep, Tq: int, Tk: int,
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


# --------------------------------------------------------------------------------------------
# attach / detach

def attention_modules(model: nn.Module) -> list[tuple[int, nn.Module]]:
    """[(layer_idx, self-attention module)] of a supported model, in layer order.

    Raises UnsupportedModelError naming the supported families.
    """
    attr = family_adapter(model).attn_attr
    family = model.config.model_type
    pattern = re.compile(rf"(^|\.)(\d+)\.{attr}$")
    found = []
    for name, module in model.named_modules():
        m = pattern.search(name)
        if m:
            found.append((int(getattr(module, "layer_idx", None) or m.group(2)), module))
    if not found:
        raise UnsupportedModelError(f"no '{attr}' attention modules found in this {family} model")
    return sorted(found, key=lambda t: t[0])


_RECOMPUTING = [False]  # True while checkpointed_layers recomputes a layer for its backward


@contextmanager
def _recomputing():
    _RECOMPUTING[0] = True
    try:
        yield
    finally:
        _RECOMPUTING[0] = False


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


def family_adapter(model: nn.Module) -> FamilyAdapter:
    """The FamilyAdapter of ``model``; UnsupportedModelError naming the supported families."""
    family = getattr(getattr(model, "config", None), "model_type", None)
    if family not in ADAPTERS:
        raise UnsupportedModelError(
            f"Focus has no adapter for model_type {family!r}; supported families: "
            f"{', '.join(sorted(ADAPTERS))}")
    return ADAPTERS[family]


def sliding_layers(model: nn.Module) -> list[int]:
    """Layer indices whose ``config.layer_types`` entry is "sliding_attention" (none when the
    config has no layer types)."""
    types = getattr(model.config, "layer_types", None) or []
    return [i for i, t in enumerate(types) if t == "sliding_attention"]


def focus_layers(model: nn.Module) -> list[int]:
    """Layers that get a router by default: all of them, or, for families with interleaved
    local/global attention (Gemma-2/3), the global (full-attention) layers only."""
    layers = [i for i, _ in attention_modules(model)]
    if family_adapter(model).global_layers_only:
        local = set(sliding_layers(model))
        layers = [i for i in layers if i not in local]
    return layers


def _state_hook(attachment: _Attachment) -> Callable:
    """The forward pre-hook ``attach`` puts on every attention module (``with_kwargs=True``:
    decoder layers pass ``hidden_states`` by keyword). It makes sure the module's call carries a
    FocusForward (the caller's ``focus=``, else the model's default) and stores the routed
    layer's input (after the layer's input norm) in it for the router."""
    def hook(module: nn.Module, args: tuple, kwargs: dict):
        state = _state_of(kwargs.get("focus")) or attachment.default
        router = getattr(module, "focus_router", None)
        if router is not None:
            state.inputs[router.layer_idx] = kwargs.get("hidden_states", args[0] if args else None)
        return args, {**kwargs, "focus": state}
    return hook


def _ids_hooks(attachment: _Attachment) -> tuple[Callable, Callable]:
    """The forward pre-hook and hook ``attach`` puts on the model itself and on its base model
    (``model.base_model``: the decoder without its head, which some callers run alone): the pre-hook hands
    the forward's ``input_ids`` (B, Tq) to its FocusForward (token-match pairs,
    ``FocusConfig.match_shifts``, docs/method.md §2.8), the hook drops them when it returns. The
    pre-hook also makes an empty ``DynamicCache`` in ``past_key_values`` append in place
    (``kv_cache.grow_in_place``: transformers' own copies the whole cache every decode step)."""
    def state(kwargs: dict) -> FocusForward:
        return _state_of(kwargs.get("focus")) or attachment.default

    def pre(module: nn.Module, args: tuple, kwargs: dict):
        grow_in_place(kwargs.get("past_key_values"))  # generate's default cache appends in place
        st = state(kwargs)
        ids = kwargs.get("input_ids", args[0] if args else None)
        st.token_ids = ids if isinstance(ids, torch.Tensor) and not ids.is_floating_point() else None
        st._match = None
        return None

    def post(module: nn.Module, args: tuple, kwargs: dict, output):
        st = state(kwargs)
        st.token_ids, st._match = None, None
        return None
    return pre, post


def is_attached(model: nn.Module) -> bool:
    return hasattr(model, "_focus_state")


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
            module.focus_router = Router(d_model, config, idx).to(device).eval()
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


# --------------------------------------------------------------------------------------------
# base model identity, router files

def model_identity(model: nn.Module) -> dict[str, str]:
    """Identity of a base model: name, sha256 of its config and of its input embedding.

    The config digest ignores fields that do not change the weights' meaning (attention
    implementation, dtype, name, library version); the embedding is hashed in bfloat16 so
    fp32 and bf16 loads of the same weights agree.
    """
    cfg = model.config.to_dict()
    for k in ("_attn_implementation", "_attn_implementation_internal", "torch_dtype", "dtype",
              "_name_or_path", "transformers_version", "architectures", "use_cache",
              "_attn_implementation_autoset", "output_attentions", "return_dict"):
        cfg.pop(k, None)
    config_sha = hashlib.sha256(json.dumps(cfg, sort_keys=True, default=str).encode()).hexdigest()
    emb = model.get_input_embeddings().weight.detach().to("cpu", torch.bfloat16)
    embed_sha = hashlib.sha256(emb.view(torch.int16).numpy().tobytes()).hexdigest()
    name = getattr(model.config, "_name_or_path", "") or getattr(model, "name_or_path", "")
    return {"name": str(name), "model_type": model.config.model_type,
            "config_sha256": config_sha, "embedding_sha256": embed_sha}


def save_routers(model: nn.Module, path: str | Path, extra: dict | None = None,
                 config: FocusConfig | None = None) -> Path:
    """Write the routers as safetensors (atomically), with the FocusConfig (``config``, default
    the model's default config) and the base model's identity in the metadata.
    Tensors: ``layers.{i}.proj (d_model, d_g)``, ``layers.{i}.centroids (K, d_g)``,
    ``layers.{i}.group_bias (K,)``, and ``layers.{i}.key_proj (d_model, d_g)`` with
    ``config.key_router``."""
    path = Path(path)
    tensors = {}
    for i, r in routers(model).items():
        for name, t in router_tensors(r).items():
            tensors[f"layers.{i}.{name}"] = t.detach().to("cpu", torch.float32).contiguous()
    return write_router_file(path, tensors, config or _default(model).config, model_identity(model), extra)


def router_tensors(router: Router) -> dict[str, torch.Tensor]:
    """A router's saved tensors by name: proj, centroids, group_bias, and key_proj when it has one."""
    out = {"proj": router.proj, "centroids": router.centroids, "group_bias": router.group_bias}
    if router.key_proj is not None:
        out["key_proj"] = router.key_proj
    return out


def write_router_file(path: str | Path, tensors: dict[str, torch.Tensor], config: FocusConfig,
                      base: dict, extra: dict | None = None) -> Path:
    """The router file format, written once for every writer (``save_routers``,
    ``soup_router_files``): safetensors, atomically, with the format tag and version, the
    FocusConfig, the base model's identity (``model_identity``) and ``extra`` in the metadata."""
    path = Path(path)
    meta = {"format": ROUTER_FORMAT, "format_version": ROUTER_FORMAT_VERSION, "focus_config": config.to_json(),
            "base_model": json.dumps(base, sort_keys=True),
            "extra": json.dumps(extra or {}, sort_keys=True, default=str)}
    with atomic_path(path) as tmp:
        save_file(tensors, str(tmp), metadata=meta)
    return path


def read_router_file(path: str | Path) -> tuple[FocusConfig, dict, dict[str, torch.Tensor], dict]:
    """(config, base identity, tensors, extra) of a router file; RouterMismatchError if it is not one."""
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"router file {path} does not exist; train one with 'focus-lab train'")
    try:
        with safe_open(str(path), framework="pt") as f:
            meta = f.metadata() or {}
            tensors = {k: f.get_tensor(k) for k in f.keys()}
    except Exception as e:  # safetensors raises its own error types for garbage files
        raise RouterMismatchError(f"{path} is not a safetensors router file ({e})") from e
    if meta.get("format") != ROUTER_FORMAT:
        raise RouterMismatchError(f"{path} is not a focus-lab router file (no '{ROUTER_FORMAT}' metadata)")
    return (FocusConfig.from_json(meta["focus_config"]), json.loads(meta["base_model"]), tensors,
            json.loads(meta.get("extra", "{}")))


def base_model_mismatch(a: dict, b: dict) -> str | None:
    """The first identity checksum (``config_sha256``, then ``embedding_sha256``, as written by
    ``model_identity``) in which two base-model records differ; None when they name one model."""
    for key in ("config_sha256", "embedding_sha256"):
        if a.get(key) != b.get(key):
            return key
    return None


def soup_router_files(paths: list[str | Path], out: str | Path, weights: list[float] | None = None) -> Path:
    """Average router files tensor by tensor (a "model soup", Wortsman et al. 2022): ``proj``,
    ``centroids`` and ``group_bias`` of every layer become ``sum_i w_i * t_i``. Meant for files
    trained from a common start (e.g. a file and the same file trained further on other text,
    docs/recipes.md "A broader training mix"), whose groups still correspond; for independently trained files
    the groups are unrelated and the average means nothing.

    Args:
        paths: two or more router files of the same base model and the same FocusConfig.
        out: file to write (atomically); it may not be one of ``paths``.
        weights: one non-negative weight per file, normalized to sum 1; default equal weights.
    Returns: ``out``. Its metadata: the common FocusConfig and base model, and ``extra.soup``
        listing each input's name, sha256 and weight.
    Raises:
        ConfigError: fewer than two files, weights of the wrong count, negative or all zero.
        RouterMismatchError: the files differ in base model, FocusConfig or tensor names/shapes.
    """
    from focus_lab.method.config import ConfigError
    paths, out = [Path(x) for x in paths], Path(out)
    if len(paths) < 2:
        raise ConfigError("a router soup needs at least two router files")
    w = [1.0] * len(paths) if weights is None else [float(x) for x in weights]
    if len(w) != len(paths) or min(w) < 0 or sum(w) <= 0:
        raise ConfigError(f"--weights: give {len(paths)} non-negative numbers, not all zero (got {weights})")
    if any(out.resolve() == x.resolve() for x in paths):
        raise ConfigError(f"--out {out} is one of the input files; choose another path")
    w = [x / sum(w) for x in w]
    files = [read_router_file(x) for x in paths]
    config, base, first, _ = files[0]
    for x, (cfg, b, tensors, _) in zip(paths[1:], files[1:]):
        if base_model_mismatch(b, base):
            raise RouterMismatchError(f"{x} was trained on base model {b.get('name')!r}, {paths[0]} on "
                                      f"{base.get('name')!r}: a soup mixes files of one base model only")
        if cfg.to_dict() != config.to_dict():
            diff = sorted(k for k, v in cfg.to_dict().items() if config.to_dict().get(k) != v)
            raise RouterMismatchError(f"{x} and {paths[0]} differ in their FocusConfig ({', '.join(diff)}): "
                                      "a soup mixes files of one config only")
        if {k: t.shape for k, t in tensors.items()} != {k: t.shape for k, t in first.items()}:
            raise RouterMismatchError(f"{x} and {paths[0]} hold different tensors (names or shapes)")
    tensors = {k: sum(wi * f[2][k].float() for wi, f in zip(w, files)).contiguous() for k in sorted(first)}
    soup = [{"file": x.name, "sha256": file_sha256(x), "weight": wi}
            for x, wi in zip(paths, w)]
    return write_router_file(out, tensors, config, base, {"soup": soup})


def load_routers(model: nn.Module, path: str | Path, config_overrides: dict | None = None) -> FocusConfig:
    """Load a router file onto ``model`` (attaching Focus with the file's config if needed).

    Onto a model attached with ``key_router=True`` a file without key projections loads as the
    start of a key router: ``key_proj`` takes the file's ``proj`` (training then separates them,
    docs/method.md §1.6).

    Raises:
        RouterMismatchError: the file was trained on another base model (config or embedding
            checksum differ), or its routers do not fit this model.
    """
    config, base, tensors, _ = read_router_file(path)
    ident = model_identity(model)
    key = base_model_mismatch(base, ident)
    if key:
        raise RouterMismatchError(
            f"router file {path} was trained on base model {base.get('name')!r} "
            f"({key} {base.get(key, '?')[:12]}), not on this model {ident['name']!r} "
            f"({ident[key][:12]}): load it onto the model it was trained on, or train a new router")
    if config_overrides:
        config = config.replace(**config_overrides)
    if is_attached(model):
        cur = _default(model).config
        grown = cur.key_router and not config.key_router  # a key router started from a shared one
        if any(getattr(cur, k) != getattr(config, k) for k in SHAPE_FIELDS if k != "key_router") or \
                (config.key_router and not cur.key_router):
            raise RouterMismatchError("the attached Focus config differs in shape from the file's "
                                      f"({', '.join(SHAPE_FIELDS)}); detach first")
        keep = {k: v for k, v in config.to_dict().items() if k not in SHAPE_FIELDS}
        model._focus_state.default = FocusForward(cur.replace(**keep), FocusCache())
    else:
        grown = False
        attach(model, config)
    for i, r in routers(model).items():
        with torch.no_grad():
            for name, t in router_tensors(r).items():
                key = f"layers.{i}.{'proj' if grown and name == 'key_proj' else name}"
                if key not in tensors:
                    raise RouterMismatchError(f"router file {path} has no tensor {key}")
                t.copy_(tensors[key])
    return _default(model).config
