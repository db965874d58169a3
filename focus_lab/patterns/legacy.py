"""The pattern labels written before patterns were values (tables of ``schema_version`` 1, and
the deprecated suffix spellings): a label's FocusConfig changes *on top of the router file's
config*, so ``hard_top2`` meant "top-2 with whatever the file adds". ``Pattern.parse`` reads the
suffix spellings through ``legacy_changes`` (with a FutureWarning); ``analyses/`` reads the
committed tables' labels with it until those tables are rewritten with canonical patterns
(``pattern.legacy_label_pattern`` names what such a label ran).

Suffixes, stripped from the end in this order: ``_cap`` / ``_capNN`` / ``_evict`` /
``_evictNN``, each optionally ``@LAYERS`` (layers joined by '+'), else ``_nocap``; then
``_keyshift`` / ``_nokeyshift``; ``_match`` / ``_nomatch``; ``_uniform``.
Source: docs/api.md "Patterns" (the old spellings and their new forms).
"""

from __future__ import annotations

import re

from focus_lab.patterns.rules import PatternError
from focus_lab.patterns.rules.match import DEFAULT_SHIFTS

CAPACITY = 0.5  # the share of a bare _cap / _evict
_CAP = re.compile(r"_(cap|evict)(\d{2})?(?:@([0-9+\-]+))?$")
_PAIRS = (
    (("_nokeyshift", {"key_shift": 0}), ("_keyshift", {"key_shift": 1})),
    (("_nomatch", {"match_shifts": None}), ("_match", {"match_shifts": list(DEFAULT_SHIFTS)})),
    (("_uniform", {"layer_top_k": {}}),),
)


def split_legacy(name: str) -> tuple[str, dict]:
    """A legacy label's head and the FocusConfig changes of its suffixes:
    ``hard_top2_uniform_match`` -> ``("hard_top2", {"match_shifts": [0, 1], "layer_top_k": {}})``."""
    from focus_lab.method.config import parse_int_list
    base, extra = name, {}
    if m := _CAP.search(base):
        kind, nn, spec = m.groups()
        try:
            layers = parse_int_list(spec.replace("+", ",")) if spec else None
        except ValueError:
            raise PatternError(f"pattern {name!r}: cannot read the capacity layers {spec!r}; write "
                               "capacity(0.5,layers=[0,13-16])") from None
        base, extra = base[:m.start()], {"group_capacity": int(nn) / 100 if nn else CAPACITY,
                                         "capacity_layers": layers,
                                         "capacity_overflow": "evict" if kind == "evict" else "second",
                                         "capacity_top_k": None}
    for pair in ((() if extra else (("_nocap", {"group_capacity": 0.0}),)),) + _PAIRS:
        for suffix, change in pair:
            if base.endswith(suffix):
                base, extra = base.removesuffix(suffix), {**change, **extra}
                break
    return base, extra


def legacy_changes(name: str, num_groups: int) -> dict:
    """FocusConfig changes of a legacy label, applied on top of the router file's config
    (``dense``, ``window``, ``soft``, ``{hard,random,shuffled}_topK`` plus suffixes).
    Raises PatternError naming the label and the new spelling's example."""
    if name in ("dense", "window", "soft"):
        return {"mode": name, "assignment": "router"}
    base, extra = split_legacy(name)
    kind, _, k = base.partition("_top")
    assignment = {"hard": "router", "random": "random", "shuffled": "shuffled"}.get(kind)
    if assignment is None or not k.isdigit() or not 1 <= int(k) <= num_groups:
        raise PatternError(f"unknown pattern {name!r}: heads are dense, window, soft, hard_topK, random_topK, "
                           f"shuffled_topK with K in 1..{num_groups}; rules are written with '+', e.g. "
                           "hard_top2+capacity(0.5,layers=[13,15-16],evict)")
    return {"mode": "hard", "top_k": int(k), "assignment": assignment, **extra}


def parse_legacy_patterns(spec: str, num_groups: int) -> list[tuple[str, dict]]:
    """[(label, FocusConfig changes on top of the router file's config)] from a comma list of
    legacy labels (``all``: dense, window, soft, hard_top1..K): how ``analyses/`` runs and reuses
    the committed tables' cells, whose labels have this meaning. Raises PatternError."""
    if spec.strip() == "all":
        return legacy_standard_patterns(num_groups)
    names = [x.strip() for x in spec.split(",") if x.strip()]
    if not names:
        raise PatternError("--patterns is empty; e.g. dense,hard_top1,hard_top2")
    return [(n, legacy_changes(n, num_groups)) for n in names]


def legacy_standard_patterns(num_groups: int) -> list[tuple[str, dict]]:
    """dense, window, soft, hard_top1..K as legacy labels with their changes."""
    names = ["dense", "window", "soft"] + [f"hard_top{k}" for k in range(1, num_groups + 1)]
    return [(n, legacy_changes(n, num_groups)) for n in names]
