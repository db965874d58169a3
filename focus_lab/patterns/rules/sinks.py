"""Attention sinks: the first ``n`` positions stay visible to every query (StreamingLLM;
docs/method.md §6). ``sinks(64)``. Without the rule a pattern keeps the router file's sinks:
they are part of how its routers were trained, recorded beside every result."""

from __future__ import annotations

from dataclasses import dataclass

from focus_lab.patterns.rules import Rule, read_int


@dataclass(frozen=True)
class Sinks(Rule):
    tokens: int = 0
    name = "sinks"
    neutral = {}  # absent: the router file's sink_tokens
    modes = ("hard", "soft", "window")
    example = "sinks(64)"

    @classmethod
    def from_args(cls, args, kwargs):
        if len(args) != 1 or kwargs:
            raise cls.error("needs one token count")
        return cls(read_int(cls, args[0], "sink tokens"))

    def arguments(self):
        return [str(self.tokens)]

    def changes(self):
        return {"sink_tokens": self.tokens}
