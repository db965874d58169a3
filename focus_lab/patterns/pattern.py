"""A pattern as a value: which pairs of tokens attend (docs/api.md "Patterns"; docs/method.md §2).

``Pattern`` is frozen: a mode ("dense", "window", "soft", "hard"), for hard mode the group
assignment ("router", "random", "shuffled") and k, and a set of rules
(``focus_lab.patterns.rules``). ``str(p)`` is its one canonical spelling and
``Pattern.parse(str(p)) == p``; rules may be written in any order. A bare name is the paper's
rule with every router file (``hard_top2``: each query joins its 2 best groups in every layer,
nothing else); what a router file adds (a per-layer budget, random-group layers, a capacity) is
reached by the file's own named patterns:

- ``default`` / ``default_topK``: the router file's rules for hard top-k at its own k / at K;
- ``random_default``, ``shuffled_default`` (and ``_topK``): the same rules on random or shuffled
  groups, the controls at matched sparsity.

Spellings written before patterns were values (suffixes such as ``hard_top2_uniform_match`` or
``hard_top2_evict@13+15-16``) still parse for one release, with one FutureWarning each (a
deprecation shown to users),
and mean what they meant: the router file's rules changed by the suffixes.
"""

from __future__ import annotations

import json
import re
import warnings
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from focus_lab.patterns.rules import RULES, PatternError, Rule, known_rules, parse_rule, split_top_level

MODES = ("dense", "window", "soft", "hard")
GROUP_FREE = ("dense", "window")  # modes in which no router acts: they run without a router file
ASSIGNMENTS = {"hard": "router", "random": "random", "shuffled": "shuffled"}  # head prefix -> groups
HEADS = {v: k for k, v in ASSIGNMENTS.items()}  # groups -> head prefix
HEAD = re.compile(r"^(hard|random|shuffled)_top(\d+)$")
NAMED = re.compile(r"^(?:(random|shuffled)_)?default(?:_top(\d+))?$")
EXAMPLE = "hard_top2+capacity(0.5,layers=[13,15-16],evict)"


@dataclass(frozen=True)
class Pattern:
    """One attention pattern.

    Attributes:
        mode: "dense", "window", "soft" or "hard".
        assignment: hard mode: "router" (learned groups), "random" (balanced random groups) or
            "shuffled" (the router's groups at permuted positions); "router" otherwise.
        top_k: hard mode: groups a query joins (1..num_groups); None otherwise.
        rules: the rules in force, sorted by name, at most one of each.
    Raises PatternError (a ConfigError) when a rule does not apply in the mode or assignment.
    """

    mode: str
    assignment: str = "router"
    top_k: int | None = None
    rules: tuple[Rule, ...] = ()

    def __post_init__(self) -> None:
        if self.mode not in MODES:
            raise PatternError(f"mode {self.mode!r}: choose one of {', '.join(MODES)}")
        if self.assignment not in HEADS:
            raise PatternError(f"groups {self.assignment!r}: choose one of {', '.join(HEADS)}")
        rules = tuple(sorted(self.rules, key=lambda r: r.name))
        names = [r.name for r in rules]
        if len(set(names)) != len(names):
            dup = next(n for n in names if names.count(n) > 1)
            raise PatternError(f"rule {dup!r} is given twice in one pattern; keep one")
        for r in rules:
            if self.mode not in r.modes:
                raise r.error(f"does not apply in {self.mode} mode (it applies in: {', '.join(r.modes)})")
            if self.mode == "hard" and self.assignment not in r.assignments:
                raise r.error(f"does not apply to {self.assignment} groups (it acts on: {', '.join(r.assignments)})")
        object.__setattr__(self, "rules", rules)

    # ---- spelling
    def __str__(self) -> str:
        head = self.mode if self.mode != "hard" else f"{HEADS[self.assignment]}_top{self.top_k}"
        return "+".join([head] + [str(r) for r in self.rules])

    @property
    def uses_groups(self) -> bool:
        """Whether the pattern needs trained routers: False for the ``GROUP_FREE`` modes (dense,
        window), whose masks no router acts on, so that they run without a router file."""
        return self.mode not in GROUP_FREE

    def rule(self, name: str) -> Rule | None:
        """The rule called ``name`` in force, or None."""
        return next((r for r in self.rules if r.name == name), None)

    def with_assignment(self, assignment: str) -> "Pattern":
        """The same k and rules on other groups (a control at matched sparsity); rules that act on
        no group of that assignment are dropped (a capacity under random groups)."""
        return Pattern(self.mode, assignment, self.top_k,
                       tuple(r for r in self.rules if assignment in r.assignments))

    # ---- meaning
    def changes(self) -> dict[str, Any]:
        """FocusConfig changes that run this pattern on any router file: every rule's ``neutral``
        (absent rules off), the mode, assignment and k, then each present rule's changes. Dense
        and window patterns change only the mode (and their own rules): no group rule acts there."""
        out: dict[str, Any] = {}
        extra = tuple(str(r) for r in self.rules if not r.owns_fields)  # FocusConfig.rules
        if not self.uses_groups:  # no group, so no rule acts: the file's fields stay (the
            # passkey audit routes its uniform top-1 / top-2 masks from a dense forward's config)
            return {"mode": self.mode, "assignment": "router", **({"rules": extra} if extra else {}),
                    **{k: v for r in self.rules for k, v in r.changes().items()}}
        out["rules"] = extra
        for cls in RULES.values():
            out.update(cls.neutral)
        if self.mode == "hard":
            out.update(mode="hard", top_k=self.top_k, assignment=self.assignment)
        else:
            out.update(mode=self.mode, assignment="router")
        for r in self.rules:
            out.update(r.changes())
        return out

    def check(self, num_groups: int, num_layers: int | None = None) -> "Pattern":
        """Raise PatternError when the pattern cannot run with ``num_groups`` groups and
        ``num_layers`` layers (None: unknown); returns self."""
        if self.mode == "hard" and not 1 <= (self.top_k or 0) <= num_groups:
            raise PatternError(f"pattern {str(self)!r}: top-{self.top_k} is outside 1..num_groups = {num_groups}")
        for r in self.rules:
            r.check(num_groups, num_layers)
        return self

    @classmethod
    def from_config(cls, config, mode: str | None = None, assignment: str | None = None,
                    top_k: int | None = None) -> "Pattern":
        """The pattern a FocusConfig runs (the config in force of a forward, or a router file's
        saved config with ``mode="hard"``): its mode, assignment, k and every rule it puts in
        force; rules that act on nothing under the assignment are left out."""
        mode = mode or config.mode
        kinds = [c for c in RULES.values() if c.neutral or not c.owns_fields]  # window and sinks: the file's counts
        if mode != "hard":
            rules = [c.from_config(config, None) for c in kinds if mode in c.modes]
            return cls(mode, "router", None, tuple(r for r in rules if r is not None))
        assignment = assignment or config.assignment
        k = top_k or config.top_k
        rules = [c.from_config(config, k) for c in kinds if assignment in c.assignments]
        return cls("hard", assignment, k, tuple(r for r in rules if r is not None))

    # ---- parsing
    @classmethod
    def parse(cls, text: str, routers=None) -> "Pattern":
        """One pattern from its spelling. ``routers``: the router file's FocusConfig (for
        ``default`` and the deprecated suffix spellings), or None (they are then refused).

        Raises PatternError naming the token that failed, the rules known and an example."""
        text = text.strip()
        if not text:
            raise PatternError(f"an empty pattern; e.g. {EXAMPLE}")
        if legacy := _legacy(text, routers):
            return legacy
        parts = split_top_level(text, "+")
        head, rule_texts = parts[0].strip(), parts[1:]
        base = _head(head, routers)
        rules = [parse_rule(t, text) for t in rule_texts]  # a rule given twice: Pattern refuses it
        own = {r.name for r in rules}  # ... and replaces a named pattern's rule of that name
        return Pattern(base.mode, base.assignment, base.top_k,
                       tuple(r for r in base.rules if r.name not in own) + tuple(rules))


def known() -> str:
    """One line: the heads, named patterns and rules a pattern may use."""
    return ("dense, window, soft, hard_topK, random_topK, shuffled_topK; the router file's default, default_topK, "
            "random_default, shuffled_default; " + known_rules())


def _head(head: str, routers) -> Pattern:
    if head in ("dense", "window", "soft"):
        return Pattern(head)
    if m := HEAD.match(head):
        return Pattern("hard", ASSIGNMENTS[m.group(1)], int(m.group(2)))
    if m := NAMED.match(head):
        if routers is None:
            raise PatternError(f"pattern {head!r} names the router file's rules, but no router file is given; "
                               "pass --routers (or use a bare name such as hard_top2)")
        k = int(m.group(2)) if m.group(2) else routers.top_k
        p = Pattern.from_config(routers, mode="hard", assignment="router", top_k=k)
        return p.with_assignment(m.group(1)) if m.group(1) else p
    raise PatternError(f"unknown pattern {head!r}; choose from {known()}; e.g. {EXAMPLE}")


# ---- the spellings before patterns were values (one release, deprecated)
_LEGACY_SUFFIX = re.compile(r"_(uniform|match|nomatch|keyshift|nokeyshift|cap|nocap|evict)(\d{2})?(@[0-9+\-]+)?$")


def _legacy(text: str, routers) -> Pattern | None:
    """A deprecated suffix spelling (``hard_top2_uniform_match``) as the pattern it meant: the
    router file's rules (``routers``; none without a file) with the suffixes' changes. None when
    ``text`` is not such a spelling."""
    if "(" in text or not _LEGACY_SUFFIX.search(text) or ("+" in text and "@" not in text):
        return None
    from focus_lab.method.config import FocusConfig
    base = routers if routers is not None else FocusConfig(num_groups=64)  # no file: no rule of a file's
    p = legacy_label_pattern(text, base)  # raises PatternError on a bad spelling
    # FutureWarning: a deprecation shown to the user; Python's registry shows it once per spelling
    warnings.warn(f"pattern spelling {text!r} is deprecated; write {str(p)!r}", FutureWarning, stacklevel=3)
    return p


def legacy_label_pattern(label: str, config) -> Pattern:
    """The ``Pattern`` a row of a table written before patterns were values ran, given its label
    (``dense``, ``hard_top2``, ``hard_top2_nocap``, ...) and the FocusConfig of the router file
    that made it: the label meant that file's rules changed by the suffixes (``legacy_changes``).
    Raises PatternError on a label that was never valid."""
    from focus_lab.patterns.legacy import legacy_changes
    return Pattern.from_config(config.replace(**legacy_changes(label, config.num_groups)))


def parse_pattern_file(path: str | Path, routers=None) -> list[tuple[str, Pattern]]:
    """``--pattern-file``: a JSON or YAML file holding a list of pattern spellings, or a mapping
    {label: spelling}. Returns [(label, Pattern)]. Raises PatternError naming the file and entry."""
    path = Path(path)
    if not path.is_file():
        raise PatternError(f"--pattern-file {path}: no such file; write a JSON list such as "
                           f'["dense", "{EXAMPLE}"]')
    text = path.read_text()
    try:
        data = json.loads(text)
    except json.JSONDecodeError:
        try:
            import yaml
            data = yaml.safe_load(text)
        except Exception as e:  # yaml missing or a YAML error
            raise PatternError(f"--pattern-file {path}: neither JSON nor YAML ({e})") from None
    items = list(data.items()) if isinstance(data, dict) else [(str(x), x) for x in data] \
        if isinstance(data, list) else None
    if not items or not all(isinstance(v, str) for _, v in items):
        raise PatternError(f"--pattern-file {path}: need a non-empty list of pattern spellings or a mapping "
                           "{label: spelling}")
    out = []
    for label, spelling in items:
        try:
            out.append((str(label), Pattern.parse(spelling, routers)))
        except PatternError as e:
            raise PatternError(f"--pattern-file {path}, entry {label!r}: {e}") from None
    return out
