"""The levers of an attention pattern, one rule class per module (docs/api.md "Patterns").

A rule is a small frozen value: its spelling inside a pattern (``name(args)``), how a FocusConfig
holds it, its bounds (``check``) and what it does to a forward, through two hooks the forward
calls for every rule in force (``FocusConfig.rules_in_force``), in ``order``:

- ``top_k_at(layer_idx, k)`` and ``assignment_at(layer_idx, a)``: a layer's k and groups (the
  per-layer k, the random-group layers);
- ``route(step)``: change the layer's hard groups (``core.RouteStep``) and hand causal state to
  the next KV-cache step (``step.carry[name]``, given back as ``step.carried[name]``);
- ``pairs(step)``: add kept pairs, or replace the groups' pairs, at attention time
  (``core.PairStep``: the layer's query and key, its routing, the forward's token ids).

A rule owns no FocusConfig field: the config holds its spelling in ``FocusConfig.rules``. The
levers written before patterns were values (``owns_fields``) keep their fields for one release:
their value when the rule is absent (``neutral``: the paper's rule), when it is present
(``changes``) and the file's rule read back from a config (``from_config``). Every module of this
folder is loaded and each ``Rule`` subclass it defines is registered by its ``name``: adding a
lever is its module and its test, nothing else (``oracle`` is one).

Source: docs/method.md §2.6-§2.9 (per-layer k, random-group layers, key shift, token-match
pairs, group capacity), §6 (sinks).
"""

from __future__ import annotations

import importlib
import pkgutil
import re
from dataclasses import dataclass
from typing import Any, ClassVar

from focus_lab.method.spec import ConfigError, format_int_list, parse_int_list


class PatternError(ConfigError):
    """A pattern that does not parse or a rule that cannot apply; the message is one line naming
    the failing token or rule, the bound, and an example."""


@dataclass(frozen=True)
class Rule:
    """Base of every rule. Subclasses are frozen dataclasses with hashable fields.

    Class attributes:
        name: the rule's spelling in a pattern (``capacity``).
        neutral: {FocusConfig field: value} when the rule is absent (the paper's rule).
        modes: the pattern modes it applies in ("hard", "soft", "window").
        assignments: the group assignments it acts under (a rule that acts on no group of
            random groups, such as the capacity, is refused there).
        example: a spelling shown in error messages.
        order: where its hooks run among the rules in force (ascending; ties by name).
        owns_fields: True for the levers held in FocusConfig fields of their own (``neutral``);
            False (a new rule): FocusConfig.rules holds its spelling.
    """

    name: ClassVar[str] = ""
    neutral: ClassVar[dict[str, Any]] = {}
    modes: ClassVar[tuple[str, ...]] = ("hard",)
    assignments: ClassVar[tuple[str, ...]] = ("router", "random", "shuffled")
    example: ClassVar[str] = ""
    order: ClassVar[int] = 50
    owns_fields: ClassVar[bool] = False

    # ---- what it does to a forward (docs/api.md "Writing a rule")
    def top_k_at(self, layer_idx: int, top_k: int) -> int:
        """The groups a query joins at layer ``layer_idx`` (hard mode) given ``top_k`` there so
        far (``FocusConfig.top_k_at`` folds every rule in force); the default keeps it."""
        return top_k

    def assignment_at(self, layer_idx: int, assignment: str) -> str:
        """The groups' assignment at layer ``layer_idx`` given ``assignment`` so far
        (``FocusConfig.assignment_at``); the default keeps it."""
        return assignment

    def route(self, step) -> None:
        """Change the layer's hard groups in place on ``step`` (``core.RouteStep``): its
        ``query_groups`` (B, T, k), ``key_group`` (B, T), ``key_log_p`` (B, T, K) or None; read
        ``step.carried.get(self.name)``, write ``step.carry[self.name]`` for the next KV-cache
        step. Called by ``core.route`` in every routed layer; the default changes nothing."""

    def soft_keys(self, log_p_keys):
        """The key role's log probabilities (B, T, K) of the layer-local training objectives
        (``core.soft_roles``) under this rule; the default returns them unchanged."""
        return log_p_keys

    def pairs(self, step) -> None:
        """Change the pairs a layer attends with, in place on ``step`` (``core.PairStep``): add
        (b, i, j) rows to ``step.pairs`` (``step.add``) or replace ``step.routing``'s groups.
        Called by the attention function in every routed layer in hard and soft mode; the
        default changes nothing."""

    @classmethod
    def from_args(cls, args: list[str], kwargs: dict[str, str]) -> "Rule":
        """The rule from its parsed arguments (strings). Raises PatternError."""
        if args or kwargs:
            raise cls.error(f"takes no arguments (got {', '.join(args + [f'{k}={v}' for k, v in kwargs.items()])})")
        return cls()

    def arguments(self) -> list[str]:
        """The canonical arguments, in order (``key=value`` for keyword ones); [] prints the bare name."""
        return []

    def __str__(self) -> str:
        a = self.arguments()
        return f"{self.name}({','.join(a)})" if a else self.name

    def changes(self) -> dict[str, Any]:
        """FocusConfig changes of a rule that ``owns_fields`` (the fields of ``neutral``); {} for
        the others (``Pattern.changes`` puts their spelling in FocusConfig.rules)."""
        return {}

    @classmethod
    def from_config(cls, config, top_k: int | None) -> "Rule | None":
        """The rule of this kind ``config`` (a router file's FocusConfig) puts in force for a hard
        pattern at ``top_k`` (None: not a hard pattern); None when it puts none in force. The
        default reads FocusConfig.rules."""
        return next((r for r in config.extra_rules() if isinstance(r, cls)), None)

    def check(self, num_groups: int, num_layers: int | None) -> None:
        """Raise PatternError when the rule cannot apply to a model with ``num_layers`` layers
        (None: unknown) and ``num_groups`` groups."""

    @classmethod
    def error(cls, why: str) -> PatternError:
        return PatternError(f"rule {cls.name!r} {why}; e.g. hard_top2+{cls.example or cls.name}")

    def check_layers(self, layers, num_layers: int | None) -> None:
        if num_layers is not None and layers and max(layers) >= num_layers:
            raise self.error(f"names layer {max(layers)}, but the routed layers are 0-{num_layers - 1}")


@dataclass(frozen=True)
class TokenCount(Rule):
    """Base of the rules that set one FocusConfig field to a count of tokens, spelled ``name(N)``
    (``window(256)``, ``sinks(64)``). Without the rule a pattern keeps the router file's value:
    its routers were trained with it; every result records it."""

    tokens: int = 0
    field: ClassVar[str] = ""
    minimum: ClassVar[int] = 0
    neutral: ClassVar[dict[str, Any]] = {}
    modes: ClassVar[tuple[str, ...]] = ("hard", "soft", "window")
    owns_fields = True

    @classmethod
    def from_config(cls, config, top_k):
        return None  # the file's count is kept as is, not a rule of its pattern

    @classmethod
    def from_args(cls, args, kwargs):
        if len(args) != 1 or kwargs:
            raise cls.error("needs one count of tokens")
        n = read_int(cls, args[0], "tokens")
        if n < cls.minimum:
            raise cls.error(f"needs at least {cls.minimum} token(s)")
        return cls(n)

    def arguments(self):
        return [str(self.tokens)]

    def changes(self):
        return {self.field: self.tokens}


def read_layers(rule: type[Rule], text: str) -> tuple[int, ...]:
    """'[13,15-16]' or '13' or '1-9' -> sorted unique layer indices. Raises PatternError."""
    t = text.strip()
    if t.startswith("[") and t.endswith("]"):
        t = t[1:-1]
    try:
        out = parse_int_list(t)
    except ValueError:
        out = None
    if not out or min(out) < 0:
        raise rule.error(f"cannot read layers {text!r}: write indices and ranges in brackets, e.g. [13,15-16]")
    return tuple(sorted(set(out)))


def write_layers(layers) -> str:
    """Sorted layer indices -> '[13,15-16]'."""
    return f"[{format_int_list(layers)}]"


def read_int(rule: type[Rule], text: str, what: str) -> int:
    if not text.strip().isdigit():
        raise rule.error(f"cannot read {what} {text!r}: need an integer >= 0")
    return int(text)


def split_top_level(text: str, sep: str) -> list[str]:
    """``text`` split at ``sep`` outside parentheses and brackets."""
    out, depth, cur = [], 0, ""
    for ch in text:
        if ch in "([":
            depth += 1
        elif ch in ")]":
            depth -= 1
        if ch == sep and depth == 0:
            out.append(cur)
            cur = ""
        else:
            cur += ch
    return out + [cur]


ARG = re.compile(r"^([a-z_]+)(?:\((.*)\))?$", re.S)


def known_rules() -> str:
    """One line: the rules a pattern may add, each by an example."""
    return "rules joined by '+': " + ", ".join(RULES[n].example or n for n in sorted(RULES))


def parse_rule(text: str, whole: str | None = None) -> Rule:
    """One rule from its spelling (``capacity(0.5,evict)``); ``whole``: the pattern it came from,
    for the message. Raises PatternError naming the token that failed and the rules known."""
    text, whole = text.strip(), whole or text.strip()
    m = ARG.match(text)
    if not m:
        raise PatternError(f"pattern {whole!r}: cannot read the rule {text!r}; {known_rules()}")
    name, body = m.group(1), m.group(2)
    cls = RULES.get(name)
    if cls is None:
        raise PatternError(f"pattern {whole!r}: unknown rule {name!r}; {known_rules()}")
    args, kwargs = [], {}
    for a in (split_top_level(body, ",") if body and body.strip() else []):
        a = a.strip()
        key, eq, value = a.partition("=")
        if eq and re.fullmatch(r"[a-z_0-9]+", key.strip()):
            kwargs[key.strip()] = value.strip()
        else:
            args.append(a)
    return cls.from_args(args, kwargs)


RULES: dict[str, type[Rule]] = {}


def _register() -> None:
    for mod in pkgutil.iter_modules(__path__):
        m = importlib.import_module(f"{__name__}.{mod.name}")
        for obj in vars(m).values():
            if isinstance(obj, type) and issubclass(obj, Rule) and obj is not Rule and obj.name:
                if obj.name in RULES and RULES[obj.name] is not obj:
                    raise RuntimeError(f"two rules named {obj.name!r}")
                RULES[obj.name] = obj


_register()
