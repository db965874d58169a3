"""The levers of an attention pattern, one rule class per module (docs/api.md "Patterns").

A rule is a small frozen value: its spelling inside a pattern (``name(args)``), the FocusConfig
fields it owns, their value when the rule is absent (``neutral``: the paper's rule), their value
when it is present (``changes``), the file's rule of its kind read back from a FocusConfig
(``from_config``) and its bounds (``check``). Every module of this folder is loaded and each
``Rule`` subclass it defines is registered by its ``name``: adding a lever is its module and
its test, nothing else.

Source: docs/method.md §2.6-§2.9 (per-layer k, random-group layers, key shift, token-match
pairs, group capacity), §6 (sinks).
"""

from __future__ import annotations

import importlib
import pkgutil
from dataclasses import dataclass
from typing import Any, ClassVar

from focus_lab.method.config import ConfigError, format_int_list, parse_int_list


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
    """

    name: ClassVar[str] = ""
    neutral: ClassVar[dict[str, Any]] = {}
    modes: ClassVar[tuple[str, ...]] = ("hard",)
    assignments: ClassVar[tuple[str, ...]] = ("router", "random", "shuffled")
    example: ClassVar[str] = ""

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
        """FocusConfig changes of this rule (the fields of ``neutral``)."""
        raise NotImplementedError

    @classmethod
    def from_config(cls, config, top_k: int | None) -> "Rule | None":
        """The rule of this kind ``config`` (a router file's FocusConfig) puts in force for a hard
        pattern at ``top_k`` (None: not a hard pattern); None when it puts none in force."""
        return None

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
