"""Configuration of a Focus retrofit (``FocusConfig``, saved with every artifact) and of router
training (``TrainConfig``); a recording's options are ``focus_lab.recording.options``.

Source: docs/method.md §1 (routing), §2 (attention pattern), §3 (training).
"""

from __future__ import annotations

import dataclasses
import json
from dataclasses import dataclass, field
from typing import Any

from focus_lab.method.spec import ConfigError, format_int_list, parse_int_list  # noqa: F401 (public here too)

MODES = ("soft", "hard", "window", "dense")
ASSIGNMENTS = ("router", "random", "shuffled")
OBJECTIVES = ("lm", "coverage", "distill")
CAPACITY_OVERFLOWS = ("second", "evict")  # FocusConfig.capacity_overflow (docs/method.md §2.9)
# FocusConfig fields that fix the routers' tensors: set at attach, never changed by a forward
SHAPE_FIELDS = ("num_groups", "router_dim", "layers", "key_router")


def parse_random_layers(spec: str) -> list[int]:
    """The ``--random-layers`` spec (``FocusConfig.random_layers``): 'none' -> [] (every layer
    routed, whatever the router file says), else ``parse_int_list`` ('1-9' -> [1, ..., 9]).
    Raises ValueError as ``parse_int_list``."""
    return [] if spec.strip().lower() == "none" else parse_int_list(spec)


def parse_match_shifts(spec: str) -> list[int] | None:
    """The ``--match-shifts`` spec (``FocusConfig.match_shifts``, docs/method.md §2.8): '0,1' ->
    [0, 1]; 'none' or '' -> None (no token-match pairs). Raises ValueError on a bad spec."""
    return None if spec.strip().lower() in ("none", "") else parse_int_list(spec)


def parse_layer_top_k(spec: str) -> dict[int, int]:
    """The ``--layer-top-k`` spec (``FocusConfig.layer_top_k``): 'LAYERS:K' parts joined by ';',
    e.g. '1-9:0;10,14-16:2' -> {1: 0, ..., 9: 0, 10: 2, 14: 2, 15: 2, 16: 2}; 'none' -> {} (every
    layer at ``top_k``). Raises ValueError naming the spec and the accepted form."""
    if spec.strip().lower() == "none":
        return {}
    out: dict[int, int] = {}
    for part in spec.replace(" ", "").split(";"):
        if not part:
            continue
        layers, sep, k = part.rpartition(":")
        if not sep or not layers or not k.isdigit():
            raise ValueError(f"cannot read {part!r} of {spec!r}: write LAYERS:K parts joined by ';', "
                             "e.g. '1-9:0;10-14:2' (K = 0 keeps only the window and sinks)")
        for layer in parse_int_list(layers):
            out[layer] = int(k)
    return out


def format_layer_top_k(layer_top_k: dict) -> str:
    """The inverse of ``parse_layer_top_k``: {layer_idx: k} (int or str keys, as JSON gives them
    back) -> 'LAYERS:K' parts joined by ';', k ascending, runs of layers as ranges, e.g.
    {1: 0, 2: 0, 3: 0, 7: 2} -> '1-3:0;7:2'; {} -> 'none'."""
    by_k: dict[int, list[int]] = {}
    for layer, k in layer_top_k.items():
        by_k.setdefault(int(k), []).append(int(layer))
    return ";".join(f"{format_int_list(by_k[k])}:{k}" for k in sorted(by_k)) or "none"


# ---- the concerns of a FocusConfig (docs/api.md "Configuration")
@dataclass(frozen=True)
class ShapeConfig:
    """What fixes the routers' tensors, set at attach and never changed by a forward
    (``SHAPE_FIELDS``): num_groups, router_dim, layers, key_router (FocusConfig's attributes)."""

    num_groups: int = 4
    router_dim: int = 16
    layers: list[int] | None = None
    key_router: bool = False


@dataclass(frozen=True)
class RoutingConfig:
    """How scores become groups (tau, sinkhorn_iters, eps, normalize_input, bias_momentum, seed)
    and the training noise (straight_through, gumbel_noise) (FocusConfig's attributes)."""

    tau: float = 0.1
    sinkhorn_iters: int = 10
    eps: float = 1e-6
    normalize_input: bool = True
    bias_momentum: float = 0.05
    seed: int = 0
    straight_through: bool = False
    gumbel_noise: float = 0.0


@dataclass(frozen=True)
class PatternConfig:
    """The forward's pattern: mode, top_k, assignment, window and sink_tokens (tokens), and the
    spellings of its rules that own no field (``rules``; ``focus_lab.patterns``)."""

    mode: str = "soft"
    top_k: int = 2
    assignment: str = "router"
    window: int = 128
    sink_tokens: int = 0
    rules: tuple[str, ...] = ()


@dataclass(frozen=True)
class LeverConfig:
    """The levers held in fields before they were rules (deprecated for one release: write them
    as rules of a pattern, ``focus_lab.patterns.rules``): random_layers, layer_top_k,
    top_k_budgets, key_shift, match_shifts, match_latest, group_capacity, capacity_layers,
    capacity_overflow, capacity_top_k (FocusConfig's attributes)."""

    random_layers: list[int] | None = None
    layer_top_k: dict[int, int] | None = None
    top_k_budgets: dict[int, dict[int, int]] | None = None
    key_shift: int = 0
    match_shifts: list[int] | None = None
    match_latest: int = 0
    group_capacity: float = 0.0
    capacity_layers: list[int] | None = None
    capacity_overflow: str = "second"
    capacity_top_k: list[int] | None = None


CONCERNS = {"shape": ShapeConfig, "routing": RoutingConfig, "pattern": PatternConfig, "levers": LeverConfig}
HOME = {f.name: concern for concern, cls in CONCERNS.items() for f in dataclasses.fields(cls)}  # flat name -> concern
# the flat order of the saved form (to_dict): the order the fields had before the concerns
FLAT_ORDER = ("num_groups", "window", "router_dim", "tau", "sinkhorn_iters", "top_k", "mode", "eps",
              "normalize_input", "bias_momentum", "assignment", "layers", "random_layers", "layer_top_k",
              "top_k_budgets", "seed", "sink_tokens", "straight_through", "gumbel_noise", "key_router",
              "key_shift", "match_shifts", "match_latest", "group_capacity", "capacity_layers",
              "capacity_overflow", "capacity_top_k", "backend", "rules")
LEVER_RULES = {"random_layers": "random_layers([...])", "layer_top_k": "layer_top_k(K=[...])",
               "top_k_budgets": "a router file's default pattern", "key_shift": "key_shift",
               "match_shifts": "match(shifts=[...])", "match_latest": "match(latest=N)",
               "group_capacity": "capacity(SHARE)", "capacity_layers": "capacity(SHARE,layers=[...])",
               "capacity_overflow": "capacity(SHARE,evict)", "capacity_top_k": "a router file's default pattern"}
_WARNED: set[str] = set()


def _warn_levers(names) -> None:
    """One FutureWarning per lever field given as a flat keyword from outside focus_lab."""
    import sys
    import warnings
    caller = sys._getframe(2).f_globals.get("__name__", "")
    if caller.startswith("focus_lab") or caller == "dataclasses":
        return
    for n in sorted(set(names) - _WARNED):
        _WARNED.add(n)
        warnings.warn(f"FocusConfig({n}=...) is deprecated: write the lever as a rule of a pattern, "
                      f"{LEVER_RULES[n]} (focus_lab.patterns; docs/api.md \"Patterns\")", FutureWarning, stacklevel=3)


@dataclass(frozen=True, init=False)
class FocusConfig:
    """Hyper-parameters of Focus attention (docs/method.md §1-§3), one sub-config per concern
    (docs/api.md "Configuration"): ``shape`` (``ShapeConfig``, fixed at attach), ``routing``
    (``RoutingConfig``: how scores become groups, and training noise), ``pattern``
    (``PatternConfig``: the forward's mode, k, groups, window, sinks and rules), ``levers``
    (``LeverConfig``: the levers held in fields before they were rules, for one release), and
    ``backend``. Every field reads flat too (``config.tau``), and flat keywords build one
    (``FocusConfig(num_groups=4, mode="hard")``); a lever given as a flat keyword from outside
    focus_lab warns once (a FutureWarning naming its rule spelling). ``to_dict`` / ``from_dict``
    keep the flat form saved in every router file.

    Frozen: a config is never changed in place (assigning a field raises
    ``dataclasses.FrozenInstanceError``); ``replace(**changes)`` (or ``dataclasses.replace``)
    gives a validated copy. A router, a forward's state and a saved file may therefore share
    one config without one of them changing it under the others.

    Attributes:
        num_groups: K, number of groups (centroids) per layer. >= 1.
        window: w, local window in tokens: pairs with ``i - j < window`` are always kept. >= 1.
        router_dim: d_g, width of the router projection ``W_g: (d_model, d_g)``. >= 1.
        tau: Sinkhorn temperature; ``P = Sinkhorn(exp(S / tau))``. > 0.
        sinkhorn_iters: N, alternating normalizations (tokens, then groups). >= 1.
        top_k: k, groups a query joins in hard mode (a key joins only its top-1). 1 <= k <= K.
        mode: "soft" (training gate, §2), "hard" (top-k mask, §2), "window" (local pairs only,
            the sliding-window baseline) or "dense" (full causal attention through the same path).
        eps: floor of the agreement ``P_i . P_j`` before its log is added to a distant logit.
        normalize_input: divide the router input by its RMS over the hidden dimension before
            projecting ([ours]: SmolLM2's attention inputs differ in scale by layer, rms 0.05-0.4,
            which would make ``tau`` mean something different in every layer).
        bias_momentum: momentum of the per-group bias, an EMA of Sinkhorn's column potentials
            during training, added to the scores for the causal hard assignment (docs/method.md §1 [ours]).
        assignment: "router" (learned), "random" (fixed random groups, balanced: a control
            baseline) or "shuffled" (the router's own hard groups moved to random positions by a
            fixed permutation of each window: the same group sizes, hence the same sparsity, with
            random membership; a control for evaluation only, not causal across tokens; through a
            KV cache the prefill's positions are permuted and every later position takes the
            groups of a seeded random prefill position, ``core.Router._shuffle``).
        layers: attention layers (``layer_idx``) that get a router; None means every layer.
        layer_top_k: hard mode only, {layer_idx: k} overriding ``top_k`` in those layers; k = 0
            keeps only the window and sinks there (no distant group attention), k <= K. ``{}``:
            ``top_k`` everywhere; None: ``top_k_budgets``'s entry for ``top_k`` if any, else
            ``top_k`` everywhere. [ours] A per-layer budget at the same mean sparsity
            (docs/method.md §2.7). ``top_k_at`` gives a layer's k.
        top_k_budgets: hard mode only, {top_k: {layer_idx: k}}: the per-layer k in force when
            ``top_k`` is a key and ``layer_top_k`` is None ([ours] the shipped router file sets
            one for top-2, docs/method.md §2.7): a budget relative to the asked top-k, so asking
            for top-1 or top-3 stays uniform. None or empty: no budget.
        random_layers: routed layers whose groups are balanced random groups (as
            ``assignment="random"``) instead of the router's, whatever ``assignment`` says; None or
            empty: none. [ours] At 8192 tokens the shipped routers keep more dense mass than random
            groups in layers 1-9 yet predict worse; random groups there and the routers elsewhere
            beat both (docs/recipes.md). ``assignment_at`` gives a layer's assignment.
        seed: seed of the router's initialization and of random groups.
        sink_tokens: the first ``sink_tokens`` positions stay visible to every query in every
            pattern, like the local window (attention sinks, StreamingLLM; docs/method.md §6 [ours]).
        straight_through: in soft mode, the forward pass uses the hard top-k mask while the
            gradient is the soft gate's (a straight-through estimator).
        gumbel_noise: scale of Gumbel noise added to the router logits during training
            (Gumbel top-k; with straight_through, trains against sampled hard masks).
        key_router: [ours] give the key role its own projection ``W_k: (d_model, d_g)`` (the
            centroids stay shared): a query's groups come from ``norm(h_i) @ W_g``, a key's group
            from ``norm(h_j) @ W_k``, so a query can meet keys that do not look like itself,
            e.g. the token after an earlier occurrence of the query's own token (a copy).
            False (the paper's router, docs/method.md §1): one projection for both roles.
            A shape field: fixed at attach (docs/method.md §1.6).
        key_shift: [ours] 0 (the paper's rule) or 1: a key lives in the top-1 group of the token
            before it, not in its own (docs/method.md §1.7). A query then meets the keys that
            follow tokens routed like itself: the key after an earlier occurrence of the query's
            token (the pair an induction head reads to copy) when the router puts both
            occurrences in one group. The routers' weights are unchanged; the soft gate of
            training shifts the keys' probabilities the same way.
        match_shifts: [ours] token-match pairs (docs/method.md §2.8): in hard mode a distant
            pair (i, j) is also kept when ``ids[j - s] == ids[i]`` for a shift s in the list (in
            soft mode, i.e. training, the gate gives such a pair bias 0);
            shift 1 is the induction pair (the key right after an earlier occurrence of the
            query's token), shift 0 the earlier occurrence itself. Needs the forward's
            ``input_ids``; the two-call decomposition computes them as a part of its own.
            None or empty: none (the paper's mask).
        match_latest: with ``match_shifts``, a query keeps only its ``match_latest`` matching
            keys nearest to it (0: every one). Frequent tokens (punctuation, newlines) match
            hundreds of earlier keys; the cap bounds the pairs per query and the work.
        group_capacity: [ours] hard mode, routed layers (docs/method.md §2.9): a key at position
            i >= ``window`` whose top-1 group is the first choice of more than
            ``group_capacity * (i + 1)`` of positions 0..i moves to its second group. Causal and
            parallel over positions (it counts first choices, not final groups, so when nearly
            every token picks one group, nearly every later key of it moves). On repetitive text
            the router sends most tokens to one group, whose queries then keep most distant
            pairs; the rule splits that group. 0: off (the paper's rule); else
            1/num_groups < group_capacity <= 1.
        capacity_layers: [ours] the routed layers ``group_capacity`` applies to; None: every
            routed layer (docs/method.md §2.9). ``capacity_at`` gives a layer's capacity.
        capacity_top_k: [ours] the asked ``top_k`` values (the pattern's, before any per-layer
            budget) ``group_capacity`` applies to; None: every top_k (docs/method.md §2.9). The
            shipped file sets [2]: its capacity was chosen for top-2, so hard top-1 stays the
            paper's rule.
        capacity_overflow: [ours] where a key over ``group_capacity`` goes (docs/method.md §2.9):
            "second" (its second-best group) or "evict" (no group: only the local window, the
            sinks and token-match pairs keep it; its key group is ``num_groups``, which no
            query picks). "evict" leaves the other groups as they were.
        backend: how hard mode computes attention (docs/method.md §4): "auto" (the two-call
            decomposition of focus_lab.method.decomposition with the best kernel present: on a
            GPU in fp16/bf16 FlexAttention's block-sparse kernel for top_k >= 2 and a varlen
            flash kernel for top_k = 1, torch's memory-efficient kernel in fp32; else torch's
            CPU flash kernel), "torch", "flash" or "flex" (force that kernel; "flex" compiles
            one kernel per shape on first use, 4-20 s), or "dense" (the O(T^2) masked reference). All give the same outputs (max abs error <= 1e-5 in fp32
            on CPU, 1e-4 on CUDA); other modes always use the dense reference.
        rules: the canonical spellings of the pattern's rules that own no field here (e.g.
            ``("oracle",)``, ``focus_lab.patterns.rules``); ``rules_in_force`` gives every rule
            in force as a value. Sorted, each once.
    """

    shape: ShapeConfig
    routing: RoutingConfig
    pattern: PatternConfig
    levers: LeverConfig
    backend: str = "auto"

    def __init__(self, shape: ShapeConfig | None = None, routing: RoutingConfig | None = None,
                 pattern: PatternConfig | None = None, levers: LeverConfig | None = None,
                 backend: str = "auto", **flat: Any) -> None:
        unknown = sorted(set(flat) - set(HOME))
        if unknown:
            raise TypeError(f"FocusConfig() got unknown fields {unknown}; the fields are {', '.join(FLAT_ORDER)}")
        parts = {"shape": shape, "routing": routing, "pattern": pattern, "levers": levers}
        by: dict[str, dict[str, Any]] = {}
        for k, v in flat.items():
            by.setdefault(HOME[k], {})[k] = v
        for concern, cls in CONCERNS.items():
            part = parts[concern] if parts[concern] is not None else cls()
            if not isinstance(part, cls):
                raise TypeError(f"FocusConfig({concern}=...) takes a {cls.__name__}, not {type(part).__name__}")
            object.__setattr__(self, concern, dataclasses.replace(part, **by[concern]) if concern in by else part)
        object.__setattr__(self, "backend", backend)
        if "levers" in by:
            _warn_levers(by["levers"])
        self.validate()

    def _set(self, name: str, value: Any) -> None:
        """Normalize a field in place during validation (its concern replaced by a copy)."""
        concern = HOME[name]
        object.__setattr__(self, concern, dataclasses.replace(getattr(self, concern), **{name: value}))


    def validate(self) -> "FocusConfig":
        """Check every field; raises ConfigError naming the bad field and the accepted range."""
        def bad(name: str, why: str) -> None:
            raise ConfigError(f"FocusConfig.{name}={getattr(self, name)!r} is invalid: {why}")

        if not isinstance(self.num_groups, int) or self.num_groups < 1:
            bad("num_groups", "need an integer >= 1 (the paper uses 4 or 8)")
        if not isinstance(self.window, int) or self.window < 1:
            bad("window", "need an integer >= 1 token (the paper uses 128)")
        if not isinstance(self.router_dim, int) or self.router_dim < 1:
            bad("router_dim", "need an integer >= 1 (the paper uses 16)")
        if not (isinstance(self.tau, (int, float)) and self.tau > 0):
            bad("tau", "need a temperature > 0 (the paper uses 0.1)")
        if not isinstance(self.sinkhorn_iters, int) or self.sinkhorn_iters < 1:
            bad("sinkhorn_iters", "need an integer >= 1 (the paper uses 10)")
        if not isinstance(self.top_k, int) or not 1 <= self.top_k <= self.num_groups:
            bad("top_k", f"need an integer in 1..num_groups={self.num_groups}")
        if self.mode not in MODES:
            bad("mode", f"choose one of {', '.join(MODES)}")
        if self.assignment not in ASSIGNMENTS:
            bad("assignment", f"choose one of {', '.join(ASSIGNMENTS)}")
        if not 0 < self.eps < 1:
            bad("eps", "need 0 < eps < 1")
        if not 0 <= self.bias_momentum <= 1:
            bad("bias_momentum", "need 0 <= bias_momentum <= 1")
        if not isinstance(self.sink_tokens, int) or self.sink_tokens < 0:
            bad("sink_tokens", "need an integer >= 0 (0 keeps no sink tokens)")
        if not self.gumbel_noise >= 0:
            bad("gumbel_noise", "need a noise scale >= 0")
        if not isinstance(self.key_router, bool):
            bad("key_router", "need True (a separate key projection) or False (one router for both roles)")
        if isinstance(self.key_shift, bool) or self.key_shift not in (0, 1):
            bad("key_shift", "need 0 (a key in its own group) or 1 (a key in the group of the token before it)")
        if self.match_shifts is not None:
            if not (isinstance(self.match_shifts, (list, tuple))
                    and all(isinstance(x, int) and not isinstance(x, bool) for x in self.match_shifts)):
                bad("match_shifts", "need a list of token shifts, e.g. [0, 1], or None")
            self._set("match_shifts", sorted(set(self.match_shifts)))
            if not all(0 <= x < self.window for x in self.match_shifts):
                bad("match_shifts", f"need shifts in 0..window-1={self.window - 1} (1: the induction pair)")
        if isinstance(self.match_latest, bool) or not isinstance(self.match_latest, int) or self.match_latest < 0:
            bad("match_latest", "need an integer >= 0 (0: every matching key)")
        if (isinstance(self.group_capacity, bool) or not isinstance(self.group_capacity, (int, float))
                or not (self.group_capacity == 0 or 1 / self.num_groups < self.group_capacity <= 1)):
            bad("group_capacity", f"need 0 (no cap) or a share in (1/num_groups, 1] = "
                f"({1 / self.num_groups:.3g}, 1], e.g. 0.5")
        if self.capacity_layers is not None:
            if not (isinstance(self.capacity_layers, (list, tuple))
                    and all(isinstance(i, int) and not isinstance(i, bool) and i >= 0 for i in self.capacity_layers)):
                bad("capacity_layers", "need a list of layer indices >= 0 (e.g. [13, 14, 15]), or None for every layer")
            self._set("capacity_layers", sorted(set(self.capacity_layers)))
        if self.capacity_top_k is not None:
            if not (isinstance(self.capacity_top_k, (list, tuple))
                    and all(isinstance(k, int) and not isinstance(k, bool) and 1 <= k <= self.num_groups
                            for k in self.capacity_top_k)):
                bad("capacity_top_k", f"need a list of top_k values in 1..num_groups={self.num_groups} "
                    "(e.g. [2]), or None for every top_k")
            self._set("capacity_top_k", sorted(set(self.capacity_top_k)))
        if self.capacity_overflow not in CAPACITY_OVERFLOWS:
            bad("capacity_overflow", f"choose one of {', '.join(CAPACITY_OVERFLOWS)} (a key over the capacity "
                "moves to its second group, or leaves every group)")
        if isinstance(self.rules, str) or not all(isinstance(r, str) for r in self.rules):
            bad("rules", "need a tuple of rule spellings, e.g. ('oracle',)")
        self._set("rules", tuple(sorted(set(self.rules))))
        for r in self.extra_rules():
            if r.owns_fields:
                bad("rules", f"rule {r.name!r} is held in its own fields: give it through a pattern "
                    "(Pattern.parse(...).changes())")
            r.check(self.num_groups, None)
        if self.backend not in ("auto", "dense", "torch", "flash", "flex"):
            bad("backend", "choose one of auto, dense, torch, flash, flex")
        if self.layers is not None:
            if not all(isinstance(i, int) and i >= 0 for i in self.layers):
                bad("layers", "need a list of layer indices >= 0, or None for all layers")
            self._set("layers", list(self.layers))  # its own list: no caller's list aliased
        if self.random_layers is not None:
            if not all(isinstance(i, int) and i >= 0 for i in self.random_layers):
                bad("random_layers", "need a list of layer indices >= 0 (e.g. [1, 2, ..., 9]), or None")
            self._set("random_layers", list(self.random_layers))
        if self.layer_top_k is not None:
            try:  # a JSON round trip turns the keys into strings
                self._set("layer_top_k", {int(i): k for i, k in self.layer_top_k.items()})
            except (AttributeError, TypeError, ValueError):
                bad("layer_top_k", "need a dict {layer_idx: k}, e.g. {1: 0, 10: 2}, or None")
            if not all(i >= 0 and isinstance(k, int) and 0 <= k <= self.num_groups
                       for i, k in self.layer_top_k.items()):
                bad("layer_top_k", f"need layer indices >= 0 and k in 0..num_groups={self.num_groups} "
                    "(0: window and sinks only)")
        if self.top_k_budgets is not None:
            try:  # JSON turns both levels of keys into strings
                self._set("top_k_budgets", {int(t): {int(i): k for i, k in m.items()}
                                                           for t, m in self.top_k_budgets.items()})
            except (AttributeError, TypeError, ValueError):
                bad("top_k_budgets", "need a dict {top_k: {layer_idx: k}}, e.g. {2: {0: 1, 1: 3}}, or None")
            if not all(1 <= t <= self.num_groups and i >= 0 and isinstance(k, int) and 0 <= k <= self.num_groups
                       for t, m in self.top_k_budgets.items() for i, k in m.items()):
                bad("top_k_budgets", f"need top_k keys in 1..num_groups={self.num_groups}, layer indices "
                    f">= 0 and k in 0..{self.num_groups}")
        return self

    def extra_rules(self) -> tuple:
        """The rules of ``rules`` as values (``focus_lab.patterns.rules.Rule``). Raises
        PatternError (a ConfigError) naming a spelling that does not parse."""
        if not self.rules:
            return ()
        got = self.__dict__.get("_extra_rules")
        if got is None or got[0] != self.rules:  # validate() parses them once, the forward reuses them
            from focus_lab.patterns.rules import parse_rule
            got = (self.rules, tuple(parse_rule(t) for t in self.rules))
            object.__setattr__(self, "_extra_rules", got)
        return got[1]

    def rules_in_force(self) -> tuple:
        """Every rule this config puts in force, as values, in the order their hooks run
        (``Rule.order``, then name): the levers held in fields (``Rule.from_config`` at this
        config's ``top_k``) and ``rules``. Computed once per config (it is frozen)."""
        got = self.__dict__.get("_rules_in_force")
        if got is None:
            from focus_lab.patterns.rules import RULES
            found = [c.from_config(self, self.top_k) for c in RULES.values() if c.owns_fields]
            got = tuple(sorted([r for r in found if r is not None] + list(self.extra_rules()),
                               key=lambda r: (r.order, r.name)))
            object.__setattr__(self, "_rules_in_force", got)
        return got

    def layer_top_k_in_force(self) -> dict[int, int]:
        """The per-layer k overriding ``top_k`` in hard mode, {layer_idx: k}: ``layer_top_k`` when
        set (``{}``: none), else ``top_k_budgets[top_k]`` when present, else {} (docs/method.md §2.7)."""
        if self.layer_top_k is not None:
            return self.layer_top_k
        return (self.top_k_budgets or {}).get(self.top_k, {})

    def top_k_at(self, layer_idx: int) -> int:
        """Groups a query joins at layer ``layer_idx`` in hard mode: ``top_k`` as each rule in
        force sets it there (``Rule.top_k_at``: the per-layer k, docs/method.md §2.7; 0: window
        and sinks only)."""
        k = self.top_k
        for rule in self.rules_in_force():
            k = rule.top_k_at(layer_idx, k)
        return k

    def assignment_at(self, layer_idx: int) -> str:
        """The assignment in force at layer ``layer_idx``: ``assignment`` as each rule in force
        sets it there (``Rule.assignment_at``: "random" in the random-group layers,
        docs/method.md §2.6)."""
        a = self.assignment
        for rule in self.rules_in_force():
            a = rule.assignment_at(layer_idx, a)
        return a

    def capacity_at(self, layer_idx: int) -> float:
        """The group capacity in force at layer ``layer_idx``: ``group_capacity`` where
        ``capacity_layers`` is None or holds the layer and ``capacity_top_k`` is None or holds
        ``top_k``, else 0.0 (no cap; docs/method.md §2.9)."""
        if self.capacity_layers is not None and layer_idx not in self.capacity_layers:
            return 0.0
        return self.group_capacity if self.capacity_for_top_k() else 0.0

    def capacity_for_top_k(self) -> bool:
        """Whether ``group_capacity`` is set and applies to this config's ``top_k``
        (``capacity_top_k`` None or holding it; docs/method.md §2.9)."""
        return bool(self.group_capacity) and (self.capacity_top_k is None or self.top_k in self.capacity_top_k)

    def replace(self, **changes: Any) -> "FocusConfig":
        """A validated copy with ``changes`` applied (its own lists and dicts: nothing shared
        with this config but immutable values)."""
        return dataclasses.replace(self, **changes)

    def to_dict(self) -> dict[str, Any]:
        """The flat form every router file and run saves ({field: value} in ``FLAT_ORDER``;
        ``rules`` only when set, so files written before it read the same)."""
        d = {n: _copy(getattr(self, n)) for n in FLAT_ORDER}
        if not d["rules"]:
            del d["rules"]
        else:
            d["rules"] = list(d["rules"])
        return d

    def to_json(self) -> str:
        return json.dumps(self.to_dict(), sort_keys=True)

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> "FocusConfig":
        """Build from the flat form (``to_dict``), or from {concern: {field: value}} for the
        concerns given; unknown keys are a ConfigError (a config from a newer version)."""
        flat = {}
        for k, v in d.items():
            if k in CONCERNS and isinstance(v, dict):
                flat.update(v)
            else:
                flat[k] = v
        unknown = sorted(set(flat) - set(FLAT_ORDER))
        if unknown:
            raise ConfigError(
                f"unknown FocusConfig fields {unknown}: this file was written by another focus-lab "
                "version; upgrade focus-lab or remove those fields")
        return cls(**flat)

    @classmethod
    def from_json(cls, s: str) -> "FocusConfig":
        return cls.from_dict(json.loads(s))


def _copy(v: Any) -> Any:
    """A copy of a field's value: lists and dicts (two levels) of immutable values."""
    if isinstance(v, list):
        return list(v)
    if isinstance(v, dict):
        return {k: dict(x) if isinstance(x, dict) else x for k, x in v.items()}
    return v


def _flat(name: str) -> property:
    concern = HOME[name]
    return property(lambda self: getattr(getattr(self, concern), name),
                    doc=f"``{concern}.{name}`` (see the FocusConfig docstring).")


for _name in HOME:
    setattr(FocusConfig, _name, _flat(_name))


@dataclass
class LossConfig:
    """What router training minimizes (TrainConfig's attributes; docs/method.md §3)."""

    objective: str = "lm"
    distill_queries: int = 512
    distill_copy_share: float = 0.0
    distill_top_k: tuple[int, ...] = ()
    tau_final: float | None = None
    hard_phase: float = 0.0
    hard_phase_noise: float = 1.0


@dataclass
class OptimConfig:
    """How it is optimized: the schedule, the optimizer, checkpoints (TrainConfig's attributes)."""

    steps: int = 60
    batch_size: int = 2
    lr: float = 3e-3
    weight_decay: float = 0.0
    warmup: int = 5
    seed: int = 0
    stop_after: int | None = None
    checkpoint_every: int = 20
    gradient_checkpointing: bool = False


@dataclass
class DataConfig:
    """What it reads: window length (tokens), the file it starts from, the layers it leaves to
    random groups, free provenance (TrainConfig's attributes)."""

    seq_len: int = 512
    init_routers: str | None = None
    random_layers: list[int] | None = None
    extra: dict[str, Any] = field(default_factory=dict)


TRAIN_CONCERNS = {"loss": LossConfig, "optim": OptimConfig, "data": DataConfig}
TRAIN_HOME = {f.name: c for c, cls in TRAIN_CONCERNS.items() for f in dataclasses.fields(cls)}
TRAIN_FLAT_ORDER = ("steps", "seq_len", "batch_size", "lr", "weight_decay", "warmup", "checkpoint_every", "seed",
                    "tau_final", "hard_phase", "hard_phase_noise", "objective", "distill_queries",
                    "distill_copy_share", "distill_top_k", "init_routers", "stop_after", "random_layers",
                    "gradient_checkpointing", "extra")


@dataclass(init=False)
class TrainConfig:
    """Schedule of router-only training (docs/method.md §3). Saved with every checkpoint.

    One sub-config per concern (docs/api.md "Training"): ``loss`` (``LossConfig``: objective,
    distill_queries, distill_copy_share, distill_top_k, tau_final, hard_phase,
    hard_phase_noise), ``optim`` (``OptimConfig``: steps, batch_size, lr, weight_decay, warmup,
    seed, stop_after, checkpoint_every, gradient_checkpointing) and ``data`` (``DataConfig``:
    seq_len, init_routers, random_layers, extra). Every field reads and writes flat too
    (``cfg.steps``) and flat keywords build one; ``to_dict`` gives the flat form saved in
    ``train_config.json``.

    Attributes:
        steps: optimizer steps.
        seq_len: tokens per training window.
        batch_size: windows per step.
        lr: AdamW learning rate.
        weight_decay: AdamW weight decay (centroids and projection).
        warmup: linear warm-up steps.
        checkpoint_every: steps between atomic checkpoints.
        seed: seed of the window order and of the training RNG (Gumbel noise).
        tau_final: if set, tau is annealed geometrically from FocusConfig.tau to this value over
            the run (recipe (d): toward the hard limit).
        hard_phase: fraction of the final steps trained against sampled hard masks
            (straight-through + Gumbel top-k with noise ``hard_phase_noise``; recipe (e)).
        hard_phase_noise: Gumbel noise scale during the hard phase.
        objective: "lm" (the paper: next-token loss through the soft gate, docs/method.md §3) or
            "coverage" ([ours]: each layer's router alone learns to keep the dense model's
            distant attention mass in shared groups, ``core.coverage_loss``, from dense
            forwards without backpropagating through the model), or "distill" ([ours]: each
            layer's router alone learns to make the layer's soft-gated output match the dense
            output on ``distill_queries`` sampled queries, ``focus_lab.train.distill``; affordable at
            4K-8K tokens).
        distill_queries: queries sampled per window by the "distill" objective.
        distill_copy_share: the share of those queries drawn from the positions whose next
            token a distant copy predicts (an earlier occurrence of their token beyond the
            window is followed by their next token: ``distill.copy_queries``, docs/method.md
            §2.8); the rest uniformly. 0 (default): all uniformly [ours].
        distill_top_k: top-k values whose relaxed masks the "distill" objective matches
            (``core.soft_top_k_membership``; the loss is their mean); empty: the soft gate of
            LM training (a top-1 model). Recipe ``distill64_topk`` sets (1, 2).
        init_routers: optional router file to start from (a length curriculum: train at 512
            tokens, continue at 4K); its config must match the FocusConfig's shapes.
        stop_after: end the run after this many steps (None: after ``steps``); the learning-rate
            schedule still spans ``steps``. Reproduces a run stopped at a checkpoint (stage 2 of the
            shipped file's recipe: ``steps=40, stop_after=30``, docs/recipes.md).
        random_layers: layers given balanced random groups instead of their routers
            (``FocusConfig.random_layers``, docs/method.md §2.6); their routers are not trained.
            None: the init file's random layers with ``init_routers``, else the FocusConfig's.
        gradient_checkpointing: "lm" objective only: recompute each decoder layer in the
            backward instead of keeping its activations (``hf.retrofit.checkpointed_layers``),
            so the soft gate's (batch, heads, seq, seq) graph is held for one layer at a time;
            the same gradients, for one more forward of each layer [ours].
    """

    loss: LossConfig
    optim: OptimConfig
    data: DataConfig

    def __init__(self, loss: LossConfig | None = None, optim: OptimConfig | None = None,
                 data: DataConfig | None = None, **flat: Any) -> None:
        unknown = sorted(set(flat) - set(TRAIN_HOME))
        if unknown:
            raise TypeError(f"TrainConfig() got unknown fields {unknown}; the fields are {', '.join(TRAIN_FLAT_ORDER)}")
        given = {"loss": loss, "optim": optim, "data": data}
        for concern, cls in TRAIN_CONCERNS.items():
            part = given[concern] if given[concern] is not None else cls()
            if not isinstance(part, cls):
                raise TypeError(f"TrainConfig({concern}=...) takes a {cls.__name__}, not {type(part).__name__}")
            mine = {k: v for k, v in flat.items() if TRAIN_HOME[k] == concern}
            setattr(self, concern, dataclasses.replace(part, **mine))  # its own copy: no caller's part aliased
        self.validate()

    def validate(self) -> "TrainConfig":
        """Check every field; raises ConfigError naming the bad field and the accepted range."""
        if self.objective not in OBJECTIVES:
            raise ConfigError(f"TrainConfig.objective={self.objective!r}: choose one of "
                              f"{', '.join(OBJECTIVES)}")
        if not isinstance(self.distill_queries, int) or self.distill_queries < 1:
            raise ConfigError(f"TrainConfig.distill_queries={self.distill_queries!r}: need an integer >= 1")
        if not (isinstance(self.distill_copy_share, (int, float)) and 0 <= self.distill_copy_share <= 1):
            raise ConfigError(f"TrainConfig.distill_copy_share={self.distill_copy_share!r}: need a number in [0, 1]")
        if self.gradient_checkpointing and self.objective != "lm":
            raise ConfigError(f"TrainConfig.gradient_checkpointing: only the 'lm' objective backpropagates "
                              f"through the model; objective {self.objective!r} holds one layer's graph "
                              "at a time already (drop --gradient-checkpointing)")
        self.distill_top_k = tuple(self.distill_top_k)  # a list after a JSON round trip
        if not all(isinstance(k, int) and k >= 1 for k in self.distill_top_k):
            raise ConfigError(f"TrainConfig.distill_top_k={self.distill_top_k!r}: need integers >= 1")
        if self.stop_after is not None and not (isinstance(self.stop_after, int) and 1 <= self.stop_after <= self.steps):
            raise ConfigError(f"TrainConfig.stop_after={self.stop_after!r}: need an integer from 1 to "
                              f"steps={self.steps} (or None to run every step)")
        if self.random_layers is not None:
            if not all(isinstance(i, int) and i >= 0 for i in self.random_layers):
                raise ConfigError(f"TrainConfig.random_layers={self.random_layers!r}: need layer indices >= 0 "
                                  "(e.g. [1, ..., 9]), or None to keep the init file's")
            self.random_layers = list(self.random_layers)
        return self

    def to_dict(self) -> dict[str, Any]:
        """The flat form saved in ``train_config.json`` ({field: value} in ``TRAIN_FLAT_ORDER``)."""
        return {n: _copy(getattr(self, n)) for n in TRAIN_FLAT_ORDER}


def _train_flat(name: str) -> property:
    concern = TRAIN_HOME[name]
    return property(lambda self: getattr(getattr(self, concern), name),
                    lambda self, v: setattr(getattr(self, concern), name, v),
                    doc=f"``{concern}.{name}`` (see the TrainConfig docstring).")


for _name in TRAIN_HOME:
    setattr(TrainConfig, _name, _train_flat(_name))
