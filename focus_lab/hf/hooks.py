"""Named hook points of a Focus-attached model: the one way to watch (or patch) a forward.

Every attention layer ``i`` of an attached model has the points ``layers.{i}.{point}``,
fired after the layer's attention call, in this order (B batch, Tq queries, Tk keys, H query
heads, Hkv key/value heads, D head_dim, G num_groups, k the layer's top_k):

============== ==================================================================== ==================
point          tensor                                                               shape
============== ==================================================================== ==================
router_in      the router's input: the layer's hidden states after its input norm  (B, Tq, d_model)
query          queries                                                              (B, H, Tq, D)
key            keys (a decode step: the cached ones too)                            (B, Hkv, Tk, D)
value          values                                                               (B, Hkv, Tk, D)
scores         router logits, query role (soft and hard modes)                      (B, Tq, G)
query_groups   each query's groups, best first (soft and hard modes)                (B, Tq, k) long
key_group      each key's group; a decode step: the cached keys' too                (B, Tk) long
kept           the mask the layer attended with: bool (dense, window, hard; True =  (B, Tq, Tk)
               attended) or the soft gate's float bias (soft mode)
attn_out       attention output, before the output projection                       (B, H, Tq, D)
============== ==================================================================== ==================

A point fires only where its tensor exists: ``router_in`` on routed layers, the routing points
(``scores``, ``query_groups``, ``key_group``) when the forward's mode routes (soft, hard),
and every point on an unrouted layer (Gemma's sliding layers) but those. ``kept`` is
computed only when a hook asks for it (O(T^2) on the two-call path of docs/method.md §4).
The points fire in full forwards and in ``model.generate``'s decode steps alike.

A hook is ``fn(tensor, hook)``; ``hook`` is a ``HookPoint`` (its ``name``, ``point``,
``layer_idx`` and ``call``, the ``LayerCall`` with every tensor of this layer's call and the
forward's ``config``). It returns None, or at ``attn_out`` a tensor of the same shape that
replaces the layer's output (a patch). Hooks live only inside ``hooks(...)`` / ``cache(...)``
blocks, which always remove what they added (TransformerLens's ``hooks`` context manager, on
transformers' registered attention function).

Source: docs/api.md "Hook points"; docs/probe.md (write your own probe).
"""

from __future__ import annotations

import fnmatch
import functools
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Callable, Iterator

import torch
from torch import nn

POINTS = ("router_in", "query", "key", "value", "scores", "query_groups", "key_group", "kept", "attn_out")
# the points whose tensor comes from the routing (absent in dense and window modes)
_ROUTING_POINTS = {"scores": "scores", "query_groups": "query_groups", "key_group": "key_group"}

HookFn = Callable[[torch.Tensor, "HookPoint"], "torch.Tensor | None"]


class HookError(RuntimeError):
    """A hook raised: the message names the hook point and the layer (the original error is
    its ``__cause__``). Every hook of the block was removed."""


@dataclass
class LayerCall:
    """Everything one layer's attention call saw, as the hook points hand it out.

    Attributes:
        layer_idx: the layer; module: its attention module (``module.focus_router``, if routed).
        config: the FocusConfig of this forward (None on an unrouted layer).
        router_in: (B, Tq, d_model) or None (unrouted layer).
        query: (B, H, Tq, D); key, value: (B, Hkv, Tk, D).
        routing: ``core.Routing`` (scores, log_p, col_potential, query_groups, key_group; with
            a key router also key_scores, key_log_p) or None (dense and window modes, unrouted layers).
        model_mask: (B, Tq, Tk) bool, the model's own mask (causality, padding, a model's
            sliding window), True = visible.
        plain_causal: True when ``model_mask`` is plain causality (nothing hidden beyond it);
            a property, computed on first access.
        attn_out: (B, H, Tq, D).
        kept: (B, Tq, Tk), the mask or bias the layer attended with (a property: built on
            first access, O(Tq Tk)).
        match_pairs: (P, 3) long (b, i, j), the forward's token-match pairs
            (``FocusConfig.match_shifts``, docs/method.md §2.8; those the groups, window or
            sinks also keep included), or None.
    """

    layer_idx: int
    module: nn.Module
    config: object | None
    router_in: torch.Tensor | None
    query: torch.Tensor
    key: torch.Tensor
    value: torch.Tensor
    routing: object | None
    model_mask: torch.Tensor
    attn_out: torch.Tensor
    _kept: Callable[[], torch.Tensor] = field(repr=False, default=None)
    _plain: Callable[[], bool] = field(repr=False, default=None)
    match_pairs: torch.Tensor | None = field(repr=False, default=None)

    @functools.cached_property
    def kept(self) -> torch.Tensor:
        return self._kept()

    @functools.cached_property
    def plain_causal(self) -> bool:
        return self._plain()

    def tensor(self, point: str) -> torch.Tensor | None:
        """The tensor of ``point`` in this call (None where the point does not fire)."""
        if point in _ROUTING_POINTS:
            return None if self.routing is None else getattr(self.routing, _ROUTING_POINTS[point])
        return self.kept if point == "kept" else getattr(self, point)


@dataclass(frozen=True)
class HookPoint:
    """What a hook receives beside the tensor: ``name`` (``layers.{i}.{point}``), ``point``,
    ``layer_idx`` and ``call`` (the ``LayerCall``)."""

    name: str
    point: str
    layer_idx: int
    call: LayerCall


def _registry(module: nn.Module) -> list:
    return module.__dict__.get("_focus_hooks", [])


def has_hooks(module: nn.Module) -> bool:
    """Whether any hook is registered on ``module`` (the attention function skips the
    ``LayerCall`` otherwise)."""
    return bool(_registry(module))


def fire(call: LayerCall) -> torch.Tensor:
    """Run the hooks registered on ``call.module`` in ``POINTS`` order; return the (possibly
    patched) ``attn_out``. Called by the attention function (``retrofit``), once per layer call.

    Raises:
        HookError: a hook raised (names the point and the layer), or a hook at another point
            than ``attn_out`` returned a tensor, or a patch has the wrong shape."""
    registered = _registry(call.module)
    for point in POINTS:
        fns = [fn for p, fn in registered if p == point]
        if not fns:
            continue
        x = call.tensor(point)
        if x is None:
            continue
        hp = HookPoint(f"layers.{call.layer_idx}.{point}", point, call.layer_idx, call)
        for fn in fns:
            try:
                y = fn(x, hp)
            except Exception as e:
                raise HookError(f"hook {getattr(fn, '__name__', fn)!s} at {hp.name} (layer {call.layer_idx}, "
                                f"point {point}) raised {type(e).__name__}: {e}") from e
            if y is None:
                continue
            if point != "attn_out":
                raise HookError(f"hook at {hp.name} returned a value: only attn_out hooks may return a "
                                "replacement tensor; return None to only read")
            if not isinstance(y, torch.Tensor) or y.shape != x.shape:
                raise HookError(f"hook at {hp.name} returned {getattr(y, 'shape', type(y).__name__)}, not a "
                                f"tensor of shape {tuple(x.shape)}")
            call.attn_out = x = y
    return call.attn_out


def hook_names(model: nn.Module) -> list[str]:
    """Every hook point name of an attached model, ``layers.{i}.{point}``, in layer order.

    Raises ValueError when Focus is not attached."""
    from focus_lab.hf.retrofit import attention_modules, is_attached
    if not is_attached(model):
        raise ValueError("Focus is not attached to this model; call focus_lab.attach(model, config) first")
    return [f"layers.{i}.{p}" for i, _ in attention_modules(model) for p in POINTS]


def _resolve(model: nn.Module, key: str) -> list[tuple[nn.Module, str]]:
    """(module, point) pairs a name or pattern selects: ``layers.3.scores``, a glob
    (``layers.*.scores``, ``layers.1?.kept``) or a point alone (``scores`` = ``layers.*.scores``).
    Raises ValueError (one line) listing the valid names when nothing matches."""
    from focus_lab.hf.retrofit import attention_modules
    names = hook_names(model)
    pattern = f"layers.*.{key}" if key in POINTS else key
    chosen = set(fnmatch.filter(names, pattern))
    if not chosen:
        layers = [i for i, _ in attention_modules(model)]
        raise ValueError(f"no hook point matches {key!r}: names are layers.<i>.<point> with i in "
                         f"{layers[0]}..{layers[-1]} and point one of {', '.join(POINTS)} (a glob such as "
                         "'layers.*.scores', or a point alone, selects several)")
    return [(m, p) for i, m in attention_modules(model) for p in POINTS if f"layers.{i}.{p}" in chosen]


@contextmanager
def hooks(model: nn.Module, fns: dict[str, HookFn | list[HookFn]]) -> Iterator[None]:
    """Run ``fns`` at the named hook points of every forward inside the block.

    Args:
        model: a Focus-attached model.
        fns: {name or pattern: fn or [fn, ...]}; see the module docstring for the names, the
            tensors and ``fn(tensor, hook)``.
    Raises:
        ValueError: Focus not attached, or a name that matches no hook point (the message
            lists the valid names); nothing is registered then.
        HookError: (during a forward) a hook raised; the block is left and every hook removed.
    Every hook added is removed on exit, also when the block raises.
    """
    added: list[tuple[nn.Module, tuple]] = []
    resolved = [(_resolve(model, key), fn if isinstance(fn, (list, tuple)) else [fn]) for key, fn in fns.items()]
    try:
        for targets, fn_list in resolved:
            for module, point in targets:
                for fn in fn_list:
                    entry = (point, fn)
                    module.__dict__.setdefault("_focus_hooks", []).append(entry)
                    added.append((module, entry))
        yield
    finally:
        for module, entry in added:
            reg = module.__dict__.get("_focus_hooks", [])
            if entry in reg:
                reg.remove(entry)
            if not reg:
                module.__dict__.pop("_focus_hooks", None)


@contextmanager
def cache(model: nn.Module, names: list[str] | tuple[str, ...] | str = ("router_in",), every_call: bool = False,
          detach: bool = True) -> Iterator[dict]:
    """Cache the tensors of the named hook points while the block runs (``run_with_cache``).

    Args:
        names: names or patterns as for ``hooks`` (default: every layer's ``router_in``).
        every_call: keep a list per name, one tensor per layer call (a ``generate``: the prefill,
            then each decode step); False: the latest call's tensor only.
        detach: store ``tensor.detach()`` (no autograd graph kept).
    Yields:
        {name (``layers.{i}.{point}``): tensor, or [tensor, ...] with ``every_call``}, filled as
        the forwards run.
    Raises: as ``hooks``.
    """
    store: dict = {}

    def keep(x: torch.Tensor, hook: HookPoint) -> None:
        x = x.detach() if detach else x
        if every_call:
            store.setdefault(hook.name, []).append(x)
        else:
            store[hook.name] = x

    with hooks(model, {n: keep for n in ([names] if isinstance(names, str) else names)}):
        yield store
