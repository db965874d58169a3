"""Options of a recording (``RecordOptions``, saved in the run's manifest) and the metrics the
recorder knows (``ALL_METRICS``). Light: no torch import (the CLI reads the defaults)."""

from __future__ import annotations

import numbers
from dataclasses import dataclass, field


#: Metrics the recorder knows. ``coverage`` includes the distance buckets and the window /
#: matched-window / random baselines; ``linguistics`` needs spaCy labels (``record_run``) and
#: captures the router input for the k-means baseline; ``loss_delta`` (per-token NLL dense vs
#: hard, and with ``dropped_edges`` the ``costly_drops`` join) is computed by ``record_run`` from
#: the recorded forward's logits and one extra forward per window: ``record`` alone accepts it and
#: records nothing for it.
ALL_METRICS = ("assignments", "balance", "coverage", "crossing", "dropped_edges", "linguistics", "loss_delta",
               "output_error")
#: What a recording takes by default: all but ``output_error`` (the relative output error of each mask per
#: layer and head, ``metrics.attention_metrics(value=...)``: one more matmul per mask and chunk; opt in by
#: naming it, or ``--metrics all``).
DEFAULT_METRICS = tuple(m for m in ALL_METRICS if m != "output_error")


@dataclass
class RecordOptions:
    """What ``focus_lab.recording.recorder`` records (every field is written to the run manifest;
    ``focus-lab record`` takes its defaults from these fields).

    Attributes:
        metrics: subset of ``ALL_METRICS`` (default ``DEFAULT_METRICS``).
        layers: layer indices to record (default: every layer with a router).
        heads: query-head indices to record in the attention metrics (default: all).
        patterns: (layer, head) pairs whose full T x T dense / soft maps and hard mask are kept.
        edge_threshold: dropped-edge audit: keep dropped pairs with dense weight above this.
        edge_top_n: also keep each query's n heaviest dropped pairs ...
        edge_min_weight: ... when their weight exceeds this.
        sink_positions: the first key positions reported as attention sinks (sink metrics and
            ``key_is_sink``; docs/method.md §6). Independent of the mask's own rule
            ``FocusConfig.sink_tokens``, which every mask of the recorder follows.
        per_query: write the per-query tables (coverage_query, crossing_query).
        chunk_elements: bound on batch x heads x queries x keys per chunk of dense attention.
        costly_top_n: ``costly_drops`` keeps the dropped edges of the n queries (among those
            with a recorded dropped edge) whose loss delta is largest (``record_run`` only).
    """

    metrics: tuple[str, ...] = DEFAULT_METRICS
    layers: list[int] | None = None
    heads: list[int] | None = None
    patterns: list[tuple[int, int]] = field(default_factory=list)
    edge_threshold: float = 0.05
    edge_top_n: int = 1
    edge_min_weight: float = 0.01
    sink_positions: int = 4
    per_query: bool = True
    chunk_elements: int = 1 << 23
    costly_top_n: int = 200

    def validate(self) -> "RecordOptions":
        self.metrics = tuple(dict.fromkeys(self.metrics))
        unknown = [m for m in self.metrics if m not in ALL_METRICS]
        if unknown:
            raise ValueError(f"unknown metrics {unknown}; choose from {', '.join(ALL_METRICS)}")
        if self.edge_threshold is not None and not self.edge_threshold >= 0:
            raise ValueError(f"edge_threshold must be >= 0, got {self.edge_threshold}")
        if self.edge_top_n < 0:
            raise ValueError(f"edge_top_n must be >= 0, got {self.edge_top_n}")
        if isinstance(self.costly_top_n, bool) or not isinstance(self.costly_top_n, numbers.Integral) \
                or self.costly_top_n < 0:
            raise ValueError(f"costly_top_n must be an integer >= 0, got {self.costly_top_n!r}")
        self.patterns = [(int(a), int(b)) for a, b in self.patterns]
        return self
