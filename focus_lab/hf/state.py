"""The state of a forward: ``FocusForward`` (the config in force, the router inputs in flight,
the token ids for token-match pairs) and ``FocusCache`` (the key groups of every token seen, for
hard-mode decoding through a KV cache).
Source: docs/method.md §1-§4.
"""

from __future__ import annotations

import weakref
from dataclasses import dataclass, field

import torch

from focus_lab.hf.model_mask import ModelMask
from focus_lab.method.config import FocusConfig
from focus_lab.method.core import PairStep, Routing
from focus_lab.method.decomposition import GroupedKV


def is_plain_causal(keep: "torch.Tensor | ModelMask") -> bool:
    """True when ``keep`` (B, Tq, Tk) bool (a tensor or a ``ModelMask``), a mask that never keeps
    a future key, is plain causality for queries at positions Tk-Tq..Tk-1 (no padding, no sliding
    window): query i sees exactly its i + 1 first keys (``ModelMask.plain_causal``)."""
    return (keep if isinstance(keep, ModelMask) else ModelMask.of(keep)).plain_causal


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
    # {layer_idx: {rule name: tensor}}: the causal state the rules in force carry from one forward
    # to the next (core.Routing.carry: the key shift's next key group, the capacity's counts)
    carried: dict[int, dict[str, torch.Tensor]] = field(default_factory=dict)
    grouped: dict[int, GroupedKV] = field(default_factory=dict, repr=False)
    token_ids: torch.Tensor | None = field(default=None, repr=False)  # (B, T_seen), for rules that read ids

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
        for d in (self.key_groups, *self.carried.values()):
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
    put on the model (replaced when the default config changes), with the model's own FocusCache.

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
    shared: dict = field(default_factory=dict, repr=False, compare=False)

    def layer_pairs(self, layer_idx: int, routing: Routing, query: torch.Tensor, key: torch.Tensor,
                    scaling: float | None, offset: int) -> tuple[Routing, torch.Tensor | None]:
        """Run every rule in force's ``pairs`` hook for one routed layer (``core.PairStep``).

        Args: routing: the layer's Routing; query: (B, H, Tq, D); key: (B, Hkv, Tk, D); scaling:
            logit scale; offset: absolute position of the first key (tokens).
        Returns: (the routing to attend with, the pairs to keep beyond the groups (P, 3) long
            rows (b, i, j) sorted, or None). Raises what a rule's hook raises (e.g. the token-match
            pairs without input_ids)."""
        step = PairStep(self.config, layer_idx, routing, query, key, scaling, offset, self)
        for rule in self.config.rules_in_force():
            rule.pairs(step)
        return step.routing, step.pairs

    def is_plain_causal(self, attention_mask: torch.Tensor | None, keep: torch.Tensor) -> bool:
        """``is_plain_causal(keep)`` for transformers' mask (None: plain causality), computed
        once for the mask tensor of this forward (``PlainCausalCheck``)."""
        return self._plain(attention_mask, keep)


class PlainCausalCheck:
    """``is_plain_causal(keep)`` computed once per transformers mask tensor, not once per layer:
    every layer of a forward gets the same mask object (summing a (B, T, T) bool mask costs
    35-60 ms a layer at 4K tokens). Used by ``FocusForward`` and by the recorder.

    Call: ``check(attention_mask, keep)`` with transformers' 4-D mask (or None: plain causality)
    and its (B, Tq, Tk) bool keep mask -> bool.

    The result is reused while the mask is the same tensor object of the same shape, unchanged
    in place (its version counter). Inference tensors (made under ``torch.inference_mode()``)
    keep no version counter: for them the object and shape alone decide (transformers builds a
    new mask per forward and never writes into it)."""

    def __init__(self) -> None:
        self._entry: tuple | None = None  # (weakref to the mask, (version, shape), result)

    def __call__(self, attention_mask: "torch.Tensor | ModelMask | None", keep: "torch.Tensor | ModelMask") -> bool:
        if attention_mask is None:
            return True
        if isinstance(attention_mask, ModelMask):  # the mask object holds its own answer
            return is_plain_causal(keep)
        version = None if attention_mask.is_inference() else attention_mask._version
        key = (version, tuple(keep.shape))
        e = self._entry
        if e is not None and e[0]() is attention_mask and e[1] == key:
            return e[2]
        ok = is_plain_causal(keep)
        self._entry = (weakref.ref(attention_mask), key, ok)
        return ok


def state_of(focus) -> FocusForward | None:
    """The ``focus`` keyword checked: a FocusForward or None. A bare FocusConfig is refused: one
    state must serve every layer of a forward (the plain-causality check and the KV cache live in
    it), so it is built once, by the caller."""
    if focus is None or isinstance(focus, FocusForward):
        return focus
    raise TypeError(f"focus= takes a FocusForward, not {type(focus).__name__}: pass "
                    "focus_lab.forward_state(model, **changes) or FocusForward(config)")


def rewind_point(past, focus_cache: FocusCache | None):
    """Remember the caches of a prefill so that decoding can restart from it after more tokens
    went through them (a teacher-forced answer, then the greedy answer from the prompt).

    Args:
        past: the model's KV cache (a transformers ``Cache``) holding the prefill's T tokens,
            (batch, kv_heads, T, head_dim) per layer.
        focus_cache: the ``FocusCache`` of the same forwards (key groups, first-choice counts,
            next key groups: no keys or values right after a prefill), or None.
    Returns:
        ``restore()`` -> (past, focus_cache) holding the first T tokens again, usable once. A
        cache whose every layer is a plain ``DynamicLayer`` is cropped back to T in place (no
        second copy of the keys and values: about 377 MB at 8192 tokens for SmolLM2-135M in
        fp32); any other cache (sliding window, static, quantized) is deep-copied now. The
        FocusCache is deep-copied now: its counts and next key groups cannot be cropped back.
    Source: docs/method.md §4 (KV cache).
    """
    import copy

    from transformers.cache_utils import DynamicLayer
    layers = getattr(past, "layers", None)
    crop = bool(layers) and all(type(layer) is DynamicLayer for layer in layers)
    seen = past.get_seq_length() if crop else None
    kept_past = past if crop else copy.deepcopy(past)
    kept_focus = copy.deepcopy(focus_cache)

    def restore():
        if crop and (extra := kept_past.get_seq_length() - seen) > 0:
            kept_past.crop(-extra)  # (.., T, head_dim) again (crop takes the tokens to remove)
        return kept_past, kept_focus
    return restore
