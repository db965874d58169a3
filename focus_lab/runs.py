"""Run directories (schema v1): a manifest plus tidy parquet tables. See docs/run_schema.md.

Layout::

    <run>/manifest.json        schema_version, config, model identity, router checksum, corpus,
                               package versions, tables written
    <run>/tokens.parquet       one row per (window, position)
    <run>/assignments.parquet  one row per (window, position, layer_idx)
    <run>/pos.parquet          one row per (window, position): spaCy labels joined by offsets
    <run>/eval.parquet         optional: held-out perplexity table
    <run>/train_log.parquet    optional: per-step training log
    (+ the recorder's tables: balance, balance_layer, coverage, coverage_query,
       coverage_distance, crossing, crossing_query, dropped_edges, patterns, pos_contingency,
       linguistic_scores, group_labels, loss_delta, costly_drops; ``SCHEMA`` below lists every
       column)

A run directory is written under a temporary name and renamed when complete, so a reader
never sees half a run.
"""

from __future__ import annotations

import json
from functools import cached_property
from pathlib import Path

import pandas as pd

SCHEMA_VERSION = 1
MANIFEST = "manifest.json"

#: Every table of schema v1 and its columns, in order (described in docs/run_schema.md; the
#: tests check the recorder writes exactly these and that the document describes each one).
#: Adding a table or a column is compatible; renaming or removing one needs a new version.
SCHEMA: dict[str, tuple[str, ...]] = {
    "tokens": ("window", "position", "doc", "token_id", "token", "char_start", "char_end"),
    "pos": ("window", "position", "word_index", "word", "pos", "tag", "dep", "lemma", "head_word_index",
            "head_position", "ent_type", "ent_iob", "ent_index", "sent_index"),
    "assignments": ("window", "position", "layer_idx", "group", "top_k_groups", "prob", "margin", "scores"),
    "balance": ("layer_idx", "group", "hard_share", "soft_share", "softmax_share", "sinkhorn_hard_share",
                "softmax_hard_share", "query_share", "tokens"),
    "balance_layer": ("window", "layer_idx", "assignment", "tokens", "soft_largest_share",
                      "hard_largest_share", "soft_entropy", "hard_entropy", "empty_groups", "marginal_error"),
    "coverage": ("layer_idx", "head", "pattern", "coverage", "min_coverage", "p10_coverage",
                 "coverage_distant_queries", "density", "distant_density", "window_width", "queries"),
    "coverage_query": ("window", "layer_idx", "head", "position", "pattern", "coverage"),
    "coverage_distance": ("layer_idx", "head", "pattern", "distance_lo", "distance_hi", "coverage", "mass",
                          "kept_mass", "queries"),
    "crossing": ("layer_idx", "head", "dense_dropped", "dense_distant", "dense_sink_mass",
                 "dense_sink_dropped", "soft_distant", "soft_crossing", "soft_crossing_expected",
                 "dense_dropped_distant_queries", "soft_crossing_distant_queries", "queries"),
    "crossing_query": ("window", "layer_idx", "head", "position", "dense_dropped", "dense_distant",
                       "dense_sink_mass", "dense_sink_dropped", "soft_distant", "soft_crossing",
                       "soft_crossing_expected"),
    "dropped_edges": ("window", "layer_idx", "head", "query_position", "key_position", "distance", "weight",
                      "soft_weight", "query_group", "key_group", "key_is_sink", "query_token", "key_token",
                      "relation"),
    "patterns": ("window", "layer_idx", "head", "query_position", "key_position", "dense_weight",
                 "soft_weight", "kept"),
    "pos_contingency": ("layer_idx", "assignment", "group", "pos", "tokens", "share_of_group",
                        "share_of_pos", "lift"),
    "linguistic_scores": ("layer_idx", "assignment", "labels", "nmi", "homogeneity", "completeness",
                          "tokens", "groups_used"),
    "group_labels": ("layer_idx", "assignment", "group", "tokens", "share", "label", "top_pos",
                     "top_pos_share", "top_dep", "top_dep_share", "top_tokens"),
    "loss_delta": ("window", "position", "token", "next_token", "nll_dense", "nll_hard", "delta"),
    "costly_drops": ("window", "query_position", "query_rank", "delta", "nll_dense", "nll_hard", "query_token",
                     "next_token", "layer_idx", "head", "key_position", "distance", "weight", "soft_weight",
                     "key_token", "key_is_sink", "relation"),
    "eval": (),  # written by focus_lab.evaluate (copied in by ``focus-lab record``)
    "train_log": (),  # written by focus_lab.train (copied in by ``focus-lab record``)
}


class RunError(ValueError):
    """A run directory is missing, corrupted, or of another schema version."""


def _is_run(path: Path) -> bool:
    return (path / MANIFEST).is_file()


def list_runs(root: str | Path) -> list[Path]:
    """Run directories directly or one level below ``root``, sorted by name. Hidden
    (temporary) directories are skipped."""
    root = Path(root)
    if not root.is_dir():
        return []
    found = []
    for p in sorted(root.iterdir()):
        if p.name.startswith("."):
            continue
        if _is_run(p):
            found.append(p)
        elif p.is_dir():
            found += [q for q in sorted(p.iterdir()) if not q.name.startswith(".") and _is_run(q)]
    return found


class Run:
    """A recorded run, read-only. Tables load lazily as pandas DataFrames.

    Raises RunError (never a deep traceback) when the directory is not a run, its manifest is
    corrupted, its schema version differs from ``SCHEMA_VERSION``, or a table is missing.
    """

    def __init__(self, path: Path, manifest: dict):
        self.path = path
        self.manifest = manifest
        self._tables: dict[str, pd.DataFrame] = {}

    @classmethod
    def open(cls, path: str | Path) -> "Run":
        """Open the run directory ``path`` (reads only its manifest; tables load on demand).

        Raises:
            RunError: not a directory, no or a corrupted manifest, or another schema version;
                the message names the path and the command that records a run again.
        """
        path = Path(path)
        if not path.is_dir():
            raise RunError(f"{path} is not a directory; record a run with 'focus-lab record'")
        mf = path / MANIFEST
        if not mf.is_file():
            raise RunError(f"{path} has no {MANIFEST}: not a focus-lab run (or an interrupted one); "
                           "record it again with 'focus-lab record'")
        try:
            manifest = json.loads(mf.read_text())
        except (json.JSONDecodeError, UnicodeDecodeError) as e:
            raise RunError(f"{mf} is corrupted ({e}); record the run again") from e
        version = manifest.get("schema_version") if isinstance(manifest, dict) else None
        if version != SCHEMA_VERSION:
            raise RunError(f"run {path} has schema version {version!r}, this focus-lab reads version "
                           f"{SCHEMA_VERSION}: record it again with this version of focus-lab")
        return cls(path, manifest)

    @property
    def name(self) -> str:
        return self.path.name

    @property
    def tables(self) -> list[str]:
        return sorted(p.stem for p in self.path.glob("*.parquet"))

    def has(self, name: str) -> bool:
        return (self.path / f"{name}.parquet").is_file()

    def table(self, name: str) -> pd.DataFrame:
        """The table ``name`` as a DataFrame; RunError if missing or unreadable."""
        if name not in self._tables:
            p = self.path / f"{name}.parquet"
            if not p.is_file():
                raise RunError(f"run {self.path.name} has no table '{name}' (it has: "
                               f"{', '.join(self.tables) or 'none'}); record it with that metric enabled")
            try:
                self._tables[name] = pd.read_parquet(p)
            except Exception as e:  # pyarrow raises several types for corrupted files
                raise RunError(f"table {p} is corrupted ({type(e).__name__}: {e}); record the run again") from e
        return self._tables[name]

    def __getattr__(self, name: str) -> pd.DataFrame:
        if name.startswith("_"):
            raise AttributeError(name)
        return self.table(name)

    @cached_property
    def config(self) -> dict:
        return self.manifest.get("focus_config", {})

    @property
    def num_layers(self) -> int:
        return int(self.manifest.get("model", {}).get("num_layers", 0))

    def token_frame(self) -> pd.DataFrame:
        """tokens joined with pos on (window, position), when pos exists."""
        tok = self.table("tokens")
        if self.has("pos"):
            tok = tok.merge(self.table("pos"), on=["window", "position"], how="left")
        return tok
