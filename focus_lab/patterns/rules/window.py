"""The local window: pairs with ``i - j < w`` are always kept (docs/method.md §2). ``window(256)``.
Without the rule a pattern keeps the router file's window (its routers were trained with it)."""

from __future__ import annotations

from dataclasses import dataclass

from focus_lab.patterns.rules import TokenCount


@dataclass(frozen=True)
class Window(TokenCount):
    name = "window"
    field = "window"
    minimum = 1
    example = "window(256)"
