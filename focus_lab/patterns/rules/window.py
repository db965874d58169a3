"""The local window: pairs with ``i - j < w`` are always kept (docs/method.md §2). ``window(256)``.
Without the rule a pattern keeps the router file's window (its routers were trained with it)."""

from __future__ import annotations

from dataclasses import dataclass

from focus_lab.patterns.rules import Rule, read_int


@dataclass(frozen=True)
class Window(Rule):
    tokens: int = 128
    name = "window"
    neutral = {}  # absent: the router file's window
    modes = ("hard", "soft", "window")
    example = "window(256)"

    @classmethod
    def from_args(cls, args, kwargs):
        if len(args) != 1 or kwargs:
            raise cls.error("needs one window in tokens")
        w = read_int(cls, args[0], "window")
        if w < 1:
            raise cls.error("needs a window of at least 1 token")
        return cls(w)

    def arguments(self):
        return [str(self.tokens)]

    def changes(self):
        return {"window": self.tokens}
