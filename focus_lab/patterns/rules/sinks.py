"""Attention sinks: the first ``n`` positions stay visible to every query (StreamingLLM;
docs/method.md §6). ``sinks(64)``. Without the rule a pattern keeps the router file's sinks."""

from __future__ import annotations

from dataclasses import dataclass

from focus_lab.patterns.rules import TokenCount


@dataclass(frozen=True)
class Sinks(TokenCount):
    name = "sinks"
    field = "sink_tokens"
    example = "sinks(64)"
