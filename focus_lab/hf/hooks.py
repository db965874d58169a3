"""Named hook points of a Focus-attached model: the one way to watch or patch a forward.

Every attention layer ``i`` of an attached model has the points ``layers.{i}.{point}``, each
fired where its tensor is made, in this order (B batch, Tq queries, Tk keys, H query heads, Hkv
key/value heads, D head_dim, G num_groups, k the layer's top_k):

============== ===================================================================== ================== =======
point          tensor                                                                shape              patch
============== ===================================================================== ================== =======
router_in      the router's input: the layer's hidden states after its input norm   (B, Tq, d_model)   no
query          queries                                                               (B, H, Tq, D)      no
key            keys (a decode step: the cached ones too)                             (B, Hkv, Tk, D)    no
value          values                                                                (B, Hkv, Tk, D)    no
router_logits  the router's logits, query role, before the groups are drawn          (B, Tq, G) float   yes
query_groups   each query's groups, best first                                       (B, Tq, k) long    hard
key_group      each key's group; a decode step: the cached keys' too                 (B, Tk) long       hard
kept           the mask the layer attends with: bool (dense, window, hard; True =    (B, Tq, Tk)        yes
               attended) or the soft gate's float bias (soft mode)
pattern        attention probabilities over the kept keys                            (B, H, Tq, Tk) f32 no
attn_out       attention output, before the output projection                        (B, H, Tq, D)      yes
============== ===================================================================== ================== =======

A point fires only where its tensor exists: ``router_in`` on routed layers, the routing points
(``router_logits``, ``query_groups``, ``key_group``) on routed layers when the forward's mode
routes (soft, hard), every other point on every layer. ``kept`` and ``pattern`` are computed
only when a hook asks for them (O(Tq Tk) per layer; ``pattern`` in chunks of queries). The
points fire in full forwards and in ``model.generate``'s decode steps alike. A block whose hook
sits on a routing point that never fires because its forwards ran in dense or window mode
warns on exit, once per point (``HookWarning``).

A hook is ``fn(tensor, hook)``; ``hook`` is a ``HookPoint`` (its ``name``, ``point``,
``layer_idx`` and ``call``, the ``LayerCall`` with every tensor of this layer's call made so
far and the forward's ``config``). It returns None (read only) or, at a patchable point, the
tensor the rest of the layer uses instead (a patch), of the same shape and dtype:

* ``router_logits``: new logits; the groups are drawn from them (soft and hard modes; with a
  key router the keys keep their own logits, ``call.routing.key_scores``).
* ``query_groups`` / ``key_group``: new groups in 0..G-1 (hard mode: soft mode attends through
  the Sinkhorn probabilities, patch ``router_logits`` or ``kept`` there). A query slot may also
  hold -1, ``NO_GROUP``: the slot joins no group, so it keeps no distant key (the query keeps
  its window, its sinks and its other slots). A patched ``key_group`` is written into the
  forward's ``FocusCache``, so later decode steps see it.
* ``kept``: an edited mask (bool; soft mode: the float bias), or ``Pairs(add=, remove=)``, the
  (query, key) pairs to add to or remove from the mask. The model's own mask (causality,
  padding) still applies: a pair it hides stays hidden.
* ``attn_out``: a replacement output.

Hooks live only inside ``hooks(...)`` / ``cache(...)`` blocks, which always remove what they
added, also after an error (TransformerLens's ``hooks`` context manager, on transformers'
registered attention function).

Source: docs/api.md "Hook points"; docs/probe.md (write your own probe); docs/intervene.md.
"""

from __future__ import annotations

import fnmatch
import functools
import warnings
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Callable, Iterable, Iterator

import torch
from torch import nn

from focus_lab.hf.family import attention_modules, is_attached
from focus_lab.hf.model_mask import ModelMask

POINTS = ("router_in", "query", "key", "value", "router_logits", "query_groups", "key_group", "kept", "pattern",
          "attn_out")
#: the points whose hook may return a replacement tensor
PATCHABLE = ("router_logits", "query_groups", "key_group", "kept", "attn_out")
#: the points that exist only when the forward's mode routes (soft, hard) on a routed layer
ROUTING_POINTS = ("router_logits", "query_groups", "key_group")
#: old point names still accepted (each warns once with a DeprecationWarning)
ALIASES = {"scores": "router_logits"}
_ALIAS_WARNED: set[str] = set()

HookFn = Callable[[torch.Tensor, "HookPoint"], "torch.Tensor | Pairs | None"]


class HookError(RuntimeError):
    """A hook raised, or returned a patch that does not fit: the one-line message names the
    hook point and the layer (and, for a patch, the expected and the given shape or the mode
    that can take it); a hook's own error is its ``__cause__``. Every hook of the block was
    removed."""


class HookWarning(UserWarning):
    """A hook sits on a point that never fired in its block because the forwards ran in a
    mode where it cannot (e.g. ``router_logits`` in dense mode): warned once per point, on exit."""


@dataclass(frozen=True)
class Pairs:
    """A ``kept`` patch as pairs: ``add`` and ``remove``, each None or (P, 3) long rows
    (b, i, j), i a query of this layer call (0..Tq-1), j a key (0..Tk-1). Removals win over
    additions. In hard mode a patch that only adds pairs keeps the two-call decomposition (the
    pairs join its part D, docs/method.md §4); any other ``kept`` patch attends through the
    dense masked reference."""

    add: torch.Tensor | None = None
    remove: torch.Tensor | None = None


@dataclass
class LayerCall:
    """Everything one layer's attention call saw, as the hook points hand it out. A hook sees
    the tensors made before its point (later ones are None), patches of earlier points included.

    Attributes:
        layer_idx: the layer; module: its attention module (``module.focus_router``, if routed).
        config: the FocusConfig of this forward (None on an unrouted layer).
        router_in: (B, Tq, d_model) or None (unrouted layer).
        query: (B, H, Tq, D); key, value: (B, Hkv, Tk, D).
        routing: ``core.Routing`` (scores, log_p, col_potential, query_groups, key_group; with
            a key router also key_scores, key_log_p) or None (dense and window modes, unrouted
            layers, or before the routing points).
        mask: the model's own mask (causality, padding, a model's sliding window) as a
            ``model_mask.ModelMask``: ``mask.rows(start, stop)`` -> (B, stop - start, Tk) bool,
            True = visible, without the whole (B, Tq, Tk) tensor.
        model_mask: (B, Tq, Tk) bool, that mask whole (a property: built on first access,
            O(Tq Tk)).
        plain_causal: True when ``model_mask`` is plain causality (nothing hidden beyond it);
            a property, computed on first access.
        attn_out: (B, H, Tq, D), or None before the ``attn_out`` point.
        kept: (B, Tq, Tk), the mask or bias the layer attended with (a property: built on
            first access, O(Tq Tk); a ``kept`` patch included).
        rule_pairs: (P, 3) long (b, i, j), the pairs the rules in force keep beyond the groups
            (``Rule.pairs``: token-match pairs, docs/method.md §2.8; the oracle's; those the
            groups, window or sinks also keep included), or None.
        scaling: the layer's logit scale (None: 1 / sqrt(D)); softcap: its logit soft-capping.
    """

    layer_idx: int
    module: nn.Module
    config: object | None
    router_in: torch.Tensor | None
    query: torch.Tensor
    key: torch.Tensor
    value: torch.Tensor
    routing: object | None
    mask: ModelMask
    attn_out: torch.Tensor | None = None
    _kept: Callable[[], torch.Tensor] | None = field(repr=False, default=None)
    _plain: Callable[[], bool] | None = field(repr=False, default=None)
    rule_pairs: torch.Tensor | None = field(repr=False, default=None)
    scaling: float | None = field(repr=False, default=None)
    softcap: float | None = field(repr=False, default=None)
    kept_edits: list = field(repr=False, default_factory=list)  # what the kept hooks returned, in order

    @functools.cached_property
    def model_mask(self) -> torch.Tensor:
        return self.mask.dense()

    @functools.cached_property
    def kept(self) -> torch.Tensor:
        return self._kept()

    @functools.cached_property
    def plain_causal(self) -> bool:
        return self._plain()

    def set_kept(self, kept: torch.Tensor | Callable[[], torch.Tensor]) -> None:
        """Replace the mask ``kept`` returns (a tensor, or a function that builds it on demand)."""
        self.__dict__.pop("kept", None)
        self._kept = kept if callable(kept) else (lambda: kept)


@dataclass(frozen=True)
class HookPoint:
    """What a hook receives beside the tensor: ``name`` (``layers.{i}.{point}``), ``point``,
    ``layer_idx`` and ``call`` (the ``LayerCall``)."""

    name: str
    point: str
    layer_idx: int
    call: LayerCall


@dataclass(eq=False)
class _Block:
    """One ``hooks(...)`` block: the points that fired, and the modes in which a routing
    point could not (``note_unfired``)."""

    fired: set = field(default_factory=set)
    missed: dict = field(default_factory=dict)

    def warn(self) -> None:
        """HookWarning, once per point, for each routing point that never fired in the block
        though a forward ran in a mode without routing."""
        for point in sorted(set(self.missed) - self.fired):
            modes = " and ".join(sorted(self.missed[point]))
            warnings.warn(f"hook point {point} never fired: the forwards ran in {modes} mode, and it fires in "
                          "soft and hard modes only", HookWarning, stacklevel=4)


def _registry(module: nn.Module) -> list:
    return module.__dict__.get("_focus_hooks", [])


def has_hooks(module: nn.Module, point: str | None = None) -> bool:
    """Whether any hook (at ``point``, when given) is registered on ``module`` (the attention
    function skips the hook points, or building ``kept`` / ``pattern``, otherwise)."""
    reg = _registry(module)
    return bool(reg) if point is None else any(p == point for p, _, _ in reg)


def fire(call: LayerCall, point: str, x: torch.Tensor, mode: str | None = None):
    """Run the hooks registered at ``point`` on ``call.module`` in registration order, each
    with the tensor the previous one left; return the tensor the layer goes on with (a
    ``Pairs`` at ``kept`` when a hook returned one). Called by the attention function where
    the tensor is made. ``mode``: the forward's mode, for the patch checks.

    Raises:
        HookError: a hook raised (names the point and the layer), or returned a value where
            it may not, or a patch that does not fit (one line: the point, the layer, the
            expected and the given shape / dtype, or the mode that can take it)."""
    entries = [(fn, block) for p, fn, block in _registry(call.module) if p == point]
    if not entries:
        return x
    for _, block in entries:
        block.fired.add(point)
    fns = [fn for fn, _ in entries]
    name = f"layers.{call.layer_idx}.{point}"
    hp = HookPoint(name, point, call.layer_idx, call)
    for fn in fns:
        try:
            y = fn(x, hp)
        except Exception as e:
            raise HookError(f"hook {getattr(fn, '__name__', fn)!s} at {name} (layer {call.layer_idx}, "
                            f"point {point}) raised {type(e).__name__}: {e}") from e
        if y is None:
            continue
        y = _check_patch(point, name, call, x, y, mode)
        if point == "kept":  # the next hook sees the edited mask; the attention function reads the edits
            call.kept_edits.append(y)
            if isinstance(y, Pairs):
                y = with_pairs(x, y.add, y.remove)
            keep = call.model_mask  # the model's own mask (causality, padding) still applies
            y = y & keep if y.dtype == torch.bool else y.masked_fill(~keep, float("-inf"))
        x = y
    return x


def with_pairs(x: torch.Tensor, add: torch.Tensor | None, remove: torch.Tensor | None) -> torch.Tensor:
    """A copy of the mask (bool) or soft bias (float) ``x`` (B, Tq, Tk) with the pairs ``add``
    kept (True, bias 0) and ``remove`` dropped (False, bias -inf); (P, 3) long rows (b, i, j)."""
    y = x.clone()
    on, off = (True, False) if y.dtype == torch.bool else (0.0, float("-inf"))
    if add is not None and add.numel():
        add = add.to(y.device)
        y[add[:, 0], add[:, 1], add[:, 2]] = on
    if remove is not None and remove.numel():
        remove = remove.to(y.device)
        y[remove[:, 0], remove[:, 1], remove[:, 2]] = off
    return y


def _desc(t) -> str:
    return f"{tuple(t.shape)} {t.dtype}" if isinstance(t, torch.Tensor) else type(t).__name__


def _check_patch(point: str, name: str, call: LayerCall, x, y, mode: str | None):
    """The patch ``y`` a hook returned at ``point`` for the tensor ``x``, checked; HookError
    (one line) when it does not fit."""
    where = f"hook at {name} (layer {call.layer_idx})"
    if point not in PATCHABLE:
        raise HookError(f"{where} returned a value, but {point} is read-only: return None, or patch one of "
                        f"{', '.join(PATCHABLE)}")
    if point in ("query_groups", "key_group") and mode != "hard":
        raise HookError(f"{where}: {point} can be patched in hard mode only ({mode} mode attends through the "
                        "Sinkhorn probabilities: patch router_logits or kept there)")
    if point == "kept" and isinstance(y, Pairs):
        return _check_pairs(where, y, x)
    if not isinstance(y, torch.Tensor) or y.shape != x.shape or y.dtype != x.dtype:
        raise HookError(f"{where} returned {_desc(y)}, expected a tensor of shape {tuple(x.shape)} and dtype "
                        f"{x.dtype}" + (" (or focus_lab.hf.hooks.Pairs)" if point == "kept" else ""))
    if y.device != x.device:
        raise HookError(f"{where} returned a tensor on {y.device}, expected one on {x.device}")
    if point in ("query_groups", "key_group"):
        G = call.config.num_groups
        from focus_lab.method.core import NO_GROUP
        low = NO_GROUP if point == "query_groups" else 0  # a key always lives in a group
        if y.numel() and (int(y.min()) < low or int(y.max()) >= G):
            raise HookError(f"{where} returned groups in {int(y.min())}..{int(y.max())}, expected groups in "
                            f"{low}..{G - 1} (num_groups={G}" + ("; -1: the slot joins no group)"
                                                                  if low < 0 else ")"))
    if point == "router_logits" and not bool(torch.isfinite(y).all()):
        raise HookError(f"{where} returned logits that are not finite, expected finite {tuple(x.shape)} logits")
    return y


def _check_pairs(where: str, y: Pairs, kept: torch.Tensor) -> Pairs:
    B, Tq, Tk = kept.shape
    for part in ("add", "remove"):
        t = getattr(y, part)
        if t is None:
            continue
        if not isinstance(t, torch.Tensor) or t.dim() != 2 or t.shape[1] != 3 or t.dtype != torch.long:
            raise HookError(f"{where} returned Pairs.{part} {_desc(t)}, expected a (P, 3) torch.int64 tensor of "
                            "rows (b, i, j)")
        if t.numel() and not bool(((t >= 0) & (t < torch.tensor([B, Tq, Tk], device=t.device))).all()):
            raise HookError(f"{where} returned Pairs.{part} outside the call's (B, Tq, Tk) = {(B, Tq, Tk)}")
    return y


def note_unfired(module: nn.Module, mode: str) -> None:
    """Note, for each hook on a routing point of this routed layer, that the forward's ``mode``
    (dense, window) does not route; ``hooks`` warns on exit about a point that never fired."""
    for point, _, block in _registry(module):
        if point in ROUTING_POINTS:
            block.missed.setdefault(point, set()).add(mode)


def hook_names(model: nn.Module) -> list[str]:
    """Every hook point name of an attached model, ``layers.{i}.{point}``, in layer order.

    Raises ValueError when Focus is not attached."""
    if not is_attached(model):
        raise ValueError("Focus is not attached to this model; call focus_lab.attach(model, config) first")
    return [f"layers.{i}.{p}" for i, _ in attention_modules(model) for p in POINTS]


def _canonical(key: str) -> str:
    """``key`` with an old point name (``ALIASES``) replaced; a DeprecationWarning, once per
    old name, says so."""
    head, _, last = key.rpartition(".")
    if last in ALIASES:
        if last not in _ALIAS_WARNED:
            _ALIAS_WARNED.add(last)
            warnings.warn(f"hook point {last!r} is now {ALIASES[last]!r}; the old name will go",
                          DeprecationWarning, stacklevel=4)
        return f"{head}.{ALIASES[last]}" if head else ALIASES[last]
    return key


def _select(model: nn.Module, key) -> set[str]:
    """The hook point names a name, glob, point alone or callable selects (ValueError, one
    line listing the valid names, when nothing matches)."""
    names = hook_names(model)
    if callable(key):
        chosen = {n for n in names if key(n)}
        what = getattr(key, "__name__", "the filter")
    else:
        key = _canonical(key)
        pattern = f"layers.*.{key}" if key in POINTS else key
        chosen = set(fnmatch.filter(names, pattern))
        what = repr(key)
    if not chosen:
        layers = [i for i, _ in attention_modules(model)]
        raise ValueError(f"no hook point matches {what}: names are layers.<i>.<point> with i in "
                         f"{layers[0]}..{layers[-1]} and point one of {', '.join(POINTS)} (a glob such as "
                         "'layers.*.kept', or a point alone, selects several)")
    return chosen


def _resolve(model: nn.Module, key) -> list[tuple[nn.Module, str]]:
    """(module, point) pairs a name or pattern selects: ``layers.3.kept``, a glob
    (``layers.*.kept``, ``layers.1?.kept``), a point alone (``kept`` = ``layers.*.kept``) or a
    callable ``name -> bool``. Raises ValueError (one line) listing the valid names when nothing
    matches."""
    chosen = _select(model, key)
    return [(m, p) for i, m in attention_modules(model) for p in POINTS if f"layers.{i}.{p}" in chosen]


@contextmanager
def hooks(model: nn.Module, fns: dict, warn_unfired: bool = True) -> Iterator[None]:
    """Run ``fns`` at the named hook points of every forward inside the block.

    Args:
        model: a Focus-attached model.
        fns: {name, glob, point alone or callable ``name -> bool``: fn or [fn, ...]}; see the
            module docstring for the names, the tensors, ``fn(tensor, hook)`` and patches.
        warn_unfired: warn about routing points that never fired (False: for observers that
            watch every pattern and expect dense or window forwards, e.g. ``evaluate``).
    Raises:
        ValueError: Focus not attached, or a name that matches no hook point (the message
            lists the valid names); nothing is registered then.
        HookError: (during a forward) a hook raised or returned a patch that does not fit;
            the block is left and every hook removed.
    Warns:
        HookWarning: on exit, once per point, a routing point that never fired because the
            forwards ran in dense or window mode.
        DeprecationWarning: once, the old name ``scores`` (now ``router_logits``).
    Every hook added is removed on exit, also when the block raises.
    """
    block = _Block()
    added: list[tuple[nn.Module, tuple]] = []
    resolved = [(_resolve(model, key), fn if isinstance(fn, (list, tuple)) else [fn]) for key, fn in fns.items()]
    try:
        for targets, fn_list in resolved:
            for module, point in targets:
                for fn in fn_list:
                    entry = (point, fn, block)
                    module.__dict__.setdefault("_focus_hooks", []).append(entry)
                    added.append((module, entry))
        yield
        if warn_unfired:
            block.warn()
    finally:
        for module, entry in added:
            reg = module.__dict__.get("_focus_hooks", [])
            for k, e in enumerate(reg):
                if e is entry:
                    del reg[k]
                    break
            if not reg:
                module.__dict__.pop("_focus_hooks", None)


class ActivationCache(dict):
    """What ``cache`` yields: {name (``layers.{i}.{point}``): tensor, or [tensor, ...] per call
    with ``every_call``}, filled as the forwards run, plus ``stack`` and ``layers``. The old
    name ``layers.{i}.scores`` reads ``layers.{i}.router_logits``."""

    def __missing__(self, name: str):
        canonical = _canonical(name) if isinstance(name, str) else name
        if canonical != name and canonical in self:
            return self[canonical]
        raise KeyError(name)

    def layers(self, point: str) -> list[int]:
        """The layers whose ``point`` was cached, ascending."""
        point = _canonical(point)
        return sorted(int(n.split(".")[1]) for n in self if n.rsplit(".", 1)[1] == point)

    def stack(self, point: str, call: int | None = None) -> torch.Tensor:
        """The cached tensors of ``point`` over layers, stacked: (L, *shape), layers ascending
        (``layers(point)``). With ``every_call``, ``call`` picks one layer call of each list (e.g.
        -1: the latest). Raises KeyError (nothing cached at ``point``), ValueError (shapes differ,
        or lists without ``call``)."""
        point = _canonical(point)
        layers = self.layers(point)
        if not layers:
            have = sorted({n.rsplit(".", 1)[1] for n in self})
            raise KeyError(f"nothing cached at point {point!r} (cached points: {', '.join(have) or 'none'})")
        xs = [self[f"layers.{i}.{point}"] for i in layers]
        if isinstance(xs[0], list):
            if call is None:
                raise ValueError(f"{point} was cached every call: pass call= (e.g. -1, the latest) to stack one")
            xs = [x[call] for x in xs]
        shapes = {tuple(x.shape) for x in xs}
        if len(shapes) > 1:
            raise ValueError(f"{point}: the layers' tensors differ in shape ({sorted(shapes)}); read them one by one")
        return torch.stack(xs)


# the dimension of the heads in each point's tensor (query heads; key / value: key-value heads)
_HEAD_DIM = {"query": 1, "attn_out": 1, "pattern": 1, "key": 1, "value": 1}


@contextmanager
def cache(model: nn.Module, names: str | Iterable[str] | Callable[[str], bool] = ("router_in",),
          every_call: bool = False, detach: bool = True, device: str | torch.device | None = None,
          heads: int | Iterable[int] | None = None) -> Iterator[ActivationCache]:
    """Cache the tensors of the named hook points while the block runs (``run_with_cache``).

    Args:
        names: a name or glob, a list of them, or a callable ``name -> bool`` over
            ``hook_names(model)`` (default: every layer's ``router_in``).
        every_call: keep a list per name, one tensor per layer call (a ``generate``: the prefill,
            then each decode step); False: the latest call's tensor only.
        detach: store ``tensor.detach()`` (no autograd graph kept).
        device: move each tensor there (e.g. "cpu"); None: where it was made.
        heads: keep only these query heads of ``query``, ``attn_out`` and ``pattern`` (dim 1),
            and of ``key`` / ``value`` the key-value heads they read (GQA); None: every head.
    Yields:
        an ``ActivationCache``: {``layers.{i}.{point}``: tensor} with ``stack(point)`` (L, ...).
    Raises: as ``hooks``; a HookError during the forward when ``heads`` names a head the layer
        lacks.
    """
    store = ActivationCache()
    want = None if heads is None else ([heads] if isinstance(heads, int) else list(heads))

    def pick(x: torch.Tensor, hook: HookPoint) -> torch.Tensor:
        if want is None or hook.point not in _HEAD_DIM:
            return x
        H = hook.call.query.shape[1]
        if not all(0 <= h < H for h in want):
            raise ValueError(f"heads={want}: the layer has heads 0..{H - 1}")
        idx = want
        if hook.point in ("key", "value"):
            group = H // x.shape[1]
            idx = sorted({h // group for h in want})
        return x.index_select(_HEAD_DIM[hook.point], torch.as_tensor(idx, device=x.device))

    def keep(x: torch.Tensor, hook: HookPoint) -> None:
        if isinstance(x, torch.Tensor):
            x = pick(x.detach() if detach else x, hook)
            x = x.to(device) if device is not None else x
        if every_call:
            store.setdefault(hook.name, []).append(x)
        else:
            store[hook.name] = x

    keys = [names] if callable(names) or isinstance(names, str) else list(names)
    chosen = set().union(*(_select(model, k) for k in keys))  # each point once, however often named

    def selected(name: str) -> bool:
        return name in chosen
    with hooks(model, {selected: keep}):
        yield store
