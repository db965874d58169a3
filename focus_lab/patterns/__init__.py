"""Attention patterns as values (docs/api.md "Patterns"): ``Pattern``, its rules
(``focus_lab.patterns.rules``, one module per lever), the one parser and printer, and the
labels of tables written before (``focus_lab.patterns.legacy``)."""

from focus_lab.patterns.pattern import Pattern, known, legacy_label_pattern, parse_pattern_file
from focus_lab.patterns.rules import RULES, PatternError, Rule

__all__ = ["Pattern", "PatternError", "Rule", "RULES", "known", "legacy_label_pattern", "parse_pattern_file",
           "parse_patterns"]


def parse_patterns(spec: str, routers=None, num_groups: int | None = None,
                   num_layers: int | None = None) -> list[tuple[str, Pattern]]:
    """[(label, Pattern)] from a comma list (commas inside parentheses and brackets belong to
    the rule), each checked against ``num_groups`` (default ``routers.num_groups``) and
    ``num_layers``. ``all``: dense, window, soft, hard_top1..K. The label is the spelling given.
    Raises PatternError on an empty list or a pattern that does not parse or cannot apply."""
    from focus_lab.patterns.pattern import split_top_level
    K = num_groups or (routers.num_groups if routers is not None else None)
    if spec.strip() == "all":
        if K is None:
            raise PatternError("--patterns all needs the router file's num_groups")
        names = ["dense", "window", "soft"] + [f"hard_top{k}" for k in range(1, K + 1)]
    else:
        names = [x.strip() for x in split_top_level(spec, ",") if x.strip()]
    if not names:
        raise PatternError(f"--patterns is empty; {known()}")
    out = []
    for n in names:
        p = Pattern.parse(n, routers)
        if K is not None:
            p.check(K, num_layers)
        out.append((n, p))
    return out
