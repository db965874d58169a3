"""Run directories (schema v1): a manifest plus tidy parquet tables. See docs/run_schema.md.

Layout::

    <run>/manifest.json        schema_version, config, model identity, router checksum, corpus,
                               package versions, tables written
    <run>/tokens.parquet       one row per (window, position)
    <run>/assignments.parquet  one row per (window, position, layer_idx)
    <run>/pos.parquet          one row per (window, position): spaCy labels joined by offsets
    <run>/eval.parquet         optional: held-out perplexity table (``focus-lab eval --run``: of the
                               recorded windows, described by the manifest's ``eval`` entry)
    <run>/train_log.parquet    optional: per-step training log
    (+ the recorder's tables: balance, balance_layer, coverage, coverage_query,
       coverage_distance, crossing, crossing_query, dropped_edges, patterns, pos_contingency,
       linguistic_scores, group_labels, loss_delta, costly_drops, output_error; the interventions
       restored_drops and group_ablation; ``SCHEMA`` below lists every column)

A run directory is written under a temporary name and renamed when complete, so a reader
never sees half a run; a table added later (``write_table``) is written the same way, then the
manifest.
"""

from __future__ import annotations

import json
from functools import cached_property
from pathlib import Path
from typing import Iterable, Sequence

import numpy as np
import pandas as pd

SCHEMA_VERSION = 1
MANIFEST = "manifest.json"

#: Every table of schema v1 and its columns, in order: the one column list (the recorder,
#: ``record_tables``, builds its frames from it; the tests check it writes exactly these and that
#: the tables of docs/run_schema.md name the same tables and columns in the same order).
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
    "output_error": ("layer_idx", "head", "pattern", "output_error", "queries"),
    # interventions on a recorded run (focus_lab.recording.restore, analyses/studies/restored_drops.py)
    "restored_drops": ("window", "query_position", "query_rank", "layer_idx", "head", "key_position", "distance",
                       "weight", "query_token", "key_token", "next_token", "relation", "edges_of_query", "nll_dense",
                       "nll_hard", "nll_restored", "recovered", "nll_all_restored", "recovered_all"),
    "group_ablation": ("window", "layer_idx", "group", "pos", "tokens", "tokens_in_group", "nll_hard", "nll_ablated",
                       "delta", "delta_in_group"),
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
    "eval": (),  # written by focus_lab.eval.evaluate (``focus-lab eval --run``, or copied in by ``focus-lab record``)
    "train_log": (),  # written by focus_lab.train.loop (copied in by ``focus-lab record``)
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
    """A recorded run, read-only. Tables load lazily as pandas DataFrames (kept by the instance).

    The one reader of run directories: ``focus_lab.runs`` users and the dashboard (whose
    ``app.lib.RunView`` is this class with its reads behind Streamlit's caches).

    Raises RunError (never a deep traceback) when the directory is not a run, its manifest is
    corrupted, its schema version differs from ``SCHEMA_VERSION``, or a table is missing.
    """

    def __init__(self, path: Path, manifest: dict, name: str | None = None):
        self.path = Path(path)
        self.manifest = manifest
        #: how the run is called: the folder's name, or what the opener chose (the dashboard:
        #: the path relative to its runs root)
        self.name = name or self.path.name
        self._tables: dict[str, pd.DataFrame] = {}

    @staticmethod
    def read_manifest(path: str | Path) -> dict:
        """The manifest of the run directory ``path``, checked.

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
        return manifest

    @classmethod
    def open(cls, path: str | Path) -> "Run":
        """Open the run directory ``path`` (reads only its manifest; tables load on demand).

        Raises:
            RunError: as ``read_manifest``.
        """
        return cls(Path(path), cls.read_manifest(path))

    def table_path(self, name: str) -> Path:
        """Where the table ``name`` is (or would be) stored."""
        return self.path / f"{name}.parquet"

    @property
    def tables(self) -> list[str]:
        return sorted(p.stem for p in self.path.glob("*.parquet"))

    def has(self, name: str) -> bool:
        return self.table_path(name).is_file()

    def _missing(self, name: str) -> RunError:
        return RunError(f"run {self.path.name} has no table '{name}' (it has: "
                        f"{', '.join(self.tables) or 'none'}); record it with that metric enabled")

    def read_table(self, name: str, columns: Sequence[str] | None = None) -> pd.DataFrame:
        """The table ``name`` (only ``columns`` when given: parquet reads only those), read from
        disk now, not kept. RunError if the table is missing, unreadable or lacks a column."""
        p = self.table_path(name)
        if not p.is_file():
            raise self._missing(name)
        try:
            return pd.read_parquet(p, columns=None if columns is None else list(columns))
        except Exception as e:  # pyarrow raises several types for corrupted files / missing columns
            what = "is corrupted" if columns is None else f"cannot be read with the columns {list(columns)}"
            raise RunError(f"table {p} {what} ({type(e).__name__}: {e}); record the run again") from e

    def table(self, name: str) -> pd.DataFrame:
        """The table ``name`` as a DataFrame (read once, then kept); RunError as ``read_table``."""
        if name not in self._tables:
            self._tables[name] = self.read_table(name)
        return self._tables[name]

    def columns(self, name: str, columns: Iterable[str]) -> pd.DataFrame:
        """Only ``columns`` of the table ``name`` (faster than ``table`` for wide or long
        tables; a kept whole table is sliced, else only those columns are read)."""
        columns = list(columns)
        if name in self._tables:
            df = self._tables[name]
            missing = [c for c in columns if c not in df.columns]
            if missing:
                raise RunError(f"table {self.table_path(name)} has no columns {missing}; record the run again")
            return df[columns]
        return self.read_table(name, columns)

    def __getattr__(self, name: str) -> pd.DataFrame:
        if name.startswith("_"):
            raise AttributeError(name)
        return self.table(name)

    @cached_property
    def config(self) -> dict:
        """The recorded ``FocusConfig`` as a dict ({} when the manifest has none)."""
        return self.manifest.get("focus_config", {}) or {}

    @property
    def num_layers(self) -> int:
        return int(self.manifest.get("model", {}).get("num_layers", 0))

    @property
    def num_groups(self) -> int:
        """K: from the config, else counted in the assignments table, else 0."""
        k = self.config.get("num_groups")
        if k:
            return int(k)
        if self.has("assignments"):
            return int(self.columns("assignments", ["group"])["group"].max()) + 1
        return 0

    def window_token_ids(self) -> dict[int, np.ndarray]:
        """{window: its token ids, shape (T,) int64, in position order} from the ``tokens`` table:
        the exact inputs the recorder saw (``focus-lab eval --run`` evaluates them again).
        RunError when the table is missing or a window's positions are not 0..T-1."""
        tok = self.columns("tokens", ["window", "position", "token_id"]).sort_values(["window", "position"])
        out = {}
        for w, g in tok.groupby("window", sort=True):
            if not np.array_equal(g["position"].to_numpy(), np.arange(len(g))):
                raise RunError(f"run {self.path}: window {w} of the tokens table does not hold positions "
                               f"0..{len(g) - 1}; record the run again")
            out[int(w)] = g["token_id"].to_numpy(dtype=np.int64)
        return out

    def token_frame(self, pos_columns: Iterable[str] | None = None) -> pd.DataFrame:
        """tokens joined with pos on (window, position), when pos exists (all its columns, or
        those of ``pos_columns`` it has)."""
        tok = self.table("tokens")
        if self.has("pos"):
            pos = self.table("pos")
            if pos_columns is not None:
                pos = pos[["window", "position"] + [c for c in pos_columns if c in pos.columns
                                                    and c not in ("window", "position")]]
            tok = tok.merge(pos, on=["window", "position"], how="left")
        return tok


def write_table(path: str | Path, name: str, df: pd.DataFrame, manifest_entry: dict | None = None) -> Path:
    """Add (or replace) the table ``name`` of the run directory ``path``, e.g. ``eval`` from
    ``focus-lab eval --run``. The parquet file is written under a temporary name and renamed,
    then the manifest likewise (its ``tables`` list gains ``name``; ``manifest_entry``, when
    given, becomes the manifest's entry ``name``: how the table was made), so a reader sees the
    run before or after, never a half-written file.

    Returns the table's path. Raises RunError (``Run.read_manifest``: not a run of this schema
    version), ValueError (``name`` is not a table of ``SCHEMA``).
    """
    from focus_lab.io import write_json, write_parquet
    if name not in SCHEMA:
        raise ValueError(f"{name!r} is not a table of the run schema (tables: {', '.join(SCHEMA)})")
    path = Path(path)
    manifest = Run.read_manifest(path)
    target = path / f"{name}.parquet"
    write_parquet(target, df)
    manifest["tables"] = sorted(set(manifest.get("tables", [])) | {name})
    if manifest_entry is not None:
        manifest[name] = manifest_entry
    write_json(path / MANIFEST, manifest)
    return target


def dropped_mass_by_distance(coverage_distance: pd.DataFrame, min_distance: int = 512,
                             pattern: str = "focus") -> pd.DataFrame:
    """Per layer, the dense attention mass the ``pattern`` drops and the share of it on edges at
    least ``min_distance`` tokens long, from a run's ``coverage_distance`` table.

    Dropped mass per query in a bucket is ``mass - kept_mass``; heads are averaged (every head
    has the same queries). Buckets are counted as "far" when ``distance_lo >= min_distance``,
    so ``min_distance`` should be a bucket edge (a power of two times the window).

    Returns: DataFrame (layer_idx, dropped_mass, far_dropped_mass, far_share): dropped dense
    mass per query and head (a fraction of 1), the part beyond ``min_distance``, and their
    ratio (nan when nothing is dropped). Raises RunError when the pattern was not recorded.
    Source: docs/method.md §6 (which dependencies the mask drops).
    """
    d = coverage_distance[coverage_distance["pattern"] == pattern]
    if d.empty:
        raise RunError(f"no '{pattern}' rows in coverage_distance (recorded patterns: "
                       f"{sorted(coverage_distance['pattern'].unique())})")
    dropped = (d["mass"] - d["kept_mass"]).clip(lower=0.0)
    far = d["distance_lo"] >= min_distance
    heads = d.groupby("layer_idx")["head"].nunique()
    out = pd.DataFrame({"dropped_mass": dropped.groupby(d["layer_idx"]).sum() / heads,
                        "far_dropped_mass": dropped.where(far, 0.0).groupby(d["layer_idx"]).sum() / heads})
    out["far_share"] = (out["far_dropped_mass"] / out["dropped_mass"]).where(out["dropped_mass"] > 0)
    return out.reset_index()
