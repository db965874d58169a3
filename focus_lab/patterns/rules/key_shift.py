"""Key shift: a key lives in the top-1 group of the token before it (docs/method.md §1.7), so a
query meets the key after an earlier occurrence of its own token. ``key_shift``."""

from __future__ import annotations

from dataclasses import dataclass

from focus_lab.patterns.rules import Rule


@dataclass(frozen=True)
class KeyShift(Rule):
    name = "key_shift"
    neutral = {"key_shift": 0}
    modes = ("hard", "soft")
    example = "key_shift"

    def changes(self):
        return {"key_shift": 1}

    @classmethod
    def from_config(cls, config, top_k):
        return cls() if config.key_shift else None
