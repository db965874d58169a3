"""Token-match pairs: a distant pair (i, j) is also kept when ``ids[j - s] == ids[i]`` for a shift
s (docs/method.md §2.8); shift 1 is the induction pair, 0 the earlier occurrence itself.
``match`` (shifts 0 and 1, every match), ``match(shifts=[1],latest=16)`` (the nearest 16)."""

from __future__ import annotations

from dataclasses import dataclass

from focus_lab.patterns.rules import Rule, read_int, read_layers, write_layers

DEFAULT_SHIFTS = (0, 1)


@dataclass(frozen=True)
class Match(Rule):
    """shifts: sorted token shifts; latest: keep only the nearest ``latest`` matches (0: all)."""

    shifts: tuple[int, ...] = DEFAULT_SHIFTS
    latest: int = 0
    name = "match"
    neutral = {"match_shifts": None, "match_latest": 0}
    modes = ("hard", "soft")
    example = "match(shifts=[0-1],latest=16)"

    @classmethod
    def from_args(cls, args, kwargs):
        unknown = sorted(set(kwargs) - {"shifts", "latest"})
        if args or unknown:
            raise cls.error(f"takes only shifts=[...] and latest=N (got {', '.join(args + unknown)})")
        shifts = read_layers(cls, kwargs["shifts"]) if "shifts" in kwargs else DEFAULT_SHIFTS
        return cls(shifts, read_int(cls, kwargs.get("latest", "0"), "latest"))

    def arguments(self):
        out = [] if self.shifts == DEFAULT_SHIFTS else [f"shifts={write_layers(self.shifts)}"]
        return out + ([f"latest={self.latest}"] if self.latest else [])

    def changes(self):
        return {"match_shifts": list(self.shifts), "match_latest": self.latest}

    @classmethod
    def from_config(cls, config, top_k):
        if not config.match_shifts:
            return None
        return cls(tuple(sorted(set(config.match_shifts))), config.match_latest)
