"""Dashboard helpers: the runs root, safe run selection, cached tables, HTML snippets.

Rules: the dashboard opens only run directories below its runs root (paths are
resolved and checked, so ``..`` or symlinks out of the root are refused), reads parquet and
JSON only (never unpickles), and turns every ``RunError`` into a message on the page.
It never recomputes what the recorder wrote, except on the live-probe page.
"""

from __future__ import annotations

import argparse
import html
import os
import sys
from pathlib import Path
from typing import Callable, Iterable

import numpy as np
import pandas as pd
import plotly.graph_objects as go
import streamlit as st

import focus_lab  # light: its public names resolve lazily
from focus_lab.runs import MANIFEST, Run, RunError, list_runs

#: the folder holding the installed ``focus_lab`` package: a checkout's root under ``pip install -e .``
#: (where relative paths in a run's manifest, recorded from the checkout, are resolved)
REPO = Path(focus_lab.__file__).resolve().parent.parent

ENV_RUNS = "FOCUS_LAB_RUNS"
RECORD_HINT = "record it with `focus-lab record`"
POS_ORDER = ["NOUN", "PROPN", "VERB", "AUX", "ADJ", "ADV", "PRON", "DET", "ADP", "CCONJ", "SCONJ", "PART",
             "NUM", "INTJ", "PUNCT", "SYM", "X", "SPACE", "(none)"]
GROUP_COLORS = ["#4e79a7", "#f28e2b", "#e15759", "#76b7b2", "#59a14f", "#edc948", "#b07aa1", "#ff9da7",
                "#9c755f", "#bab0ac", "#1f77b4", "#ff7f0e", "#2ca02c", "#d62728", "#9467bd", "#8c564b"]
POS_COLORS = {"NOUN": "#4e79a7", "PROPN": "#1f4e79", "VERB": "#e15759", "AUX": "#ff9da7", "ADJ": "#59a14f",
              "ADV": "#8cd17d", "PRON": "#f28e2b", "DET": "#edc948", "ADP": "#b07aa1", "CCONJ": "#d4a6c8",
              "SCONJ": "#9d7660", "PART": "#bab0ac", "NUM": "#76b7b2", "INTJ": "#d37295", "PUNCT": "#79706e",
              "SYM": "#a0a0a0", "X": "#c0c0c0", "SPACE": "#e0e0e0", "(none)": "#e8e8e8"}

#: Readable names of the recorder's balance columns (``<name>_share``; metrics.group_shares).
BALANCE_METHOD_NAMES = {"hard": "hard (causal top-1, the mask's key groups)", "soft": "Sinkhorn soft",
                        "softmax": "plain softmax (soft)", "sinkhorn_hard": "Sinkhorn argmax",
                        "softmax_hard": "plain softmax argmax"}


# -------------------------------------------------------------------------------------------
# runs root and selection

def parse_runs_root(argv: list[str] | None = None) -> Path:
    """The runs root: ``--runs`` after ``--`` on the streamlit command line, else the
    ``FOCUS_LAB_RUNS`` environment variable, else ``runs``; always resolved (absolute)."""
    argv = sys.argv[1:] if argv is None else argv
    parser = argparse.ArgumentParser(add_help=False, allow_abbrev=False)
    parser.add_argument("--runs", default=None)
    args, _ = parser.parse_known_args(argv)
    root = args.runs or os.environ.get(ENV_RUNS) or "runs"
    return Path(root).expanduser().resolve()


def safe_run_path(root: Path, name: str) -> Path:
    """``root / name`` resolved; RunError unless it lies strictly below ``root`` (no ``..``,
    no absolute path, no symlink out of the root)."""
    root = Path(root).resolve()
    if not name or "\x00" in name or Path(name).is_absolute():
        raise RunError(f"run {name!r} is not a run name below the runs root {root}")
    p = (root / name).resolve()
    if p == root or not p.is_relative_to(root):
        raise RunError(f"run {name!r} lies outside the runs root {root}: refused")
    return p


def available_runs(root: Path) -> list[str]:
    """Names (relative to ``root``, posix) of the run directories below ``root``."""
    root = Path(root).resolve()
    out = []
    for p in list_runs(root):
        try:
            rel = p.resolve().relative_to(root)
        except ValueError:  # a symlink pointing out of the root
            continue
        out.append(rel.as_posix())
    return out


def newest_run(root: Path, names: list[str]) -> str:
    """The run whose manifest was written last (the default pick)."""
    return max(names, key=lambda n: stat_key(Path(root) / n / MANIFEST)[0])


def runs_root() -> Path:
    return st.session_state.get("_runs_root") or parse_runs_root()


def stat_key(p: Path) -> tuple[int, int]:
    try:
        s = p.stat()
        return s.st_mtime_ns, s.st_size
    except OSError:
        return 0, 0


@st.cache_data(show_spinner=False, max_entries=64)
def _read_manifest(path: str, key: tuple) -> dict:
    return Run.read_manifest(path)


@st.cache_resource(show_spinner=False, max_entries=48)
def _read_table(path: str, name: str, key: tuple) -> pd.DataFrame:
    """A run table, shared (not copied) between reruns and sessions: pages treat tables as
    read-only (cache_data would unpickle a copy per use, ~0.1 s for the assignments table)."""
    return Run.open(path).read_table(name)


@st.cache_resource(show_spinner=False, max_entries=48)
def _read_columns(path: str, name: str, columns: tuple[str, ...], key: tuple) -> pd.DataFrame:
    """Some columns of a run table (parquet reads only those), shared like ``_read_table``."""
    return Run.open(path).read_table(name, columns)


class RunView(Run):
    """A run opened by the dashboard: ``focus_lab.runs.Run`` (every path, schema and version
    rule is Run's) whose manifest and tables go through Streamlit's caches, keyed by the run
    path and each file's mtime and size (a re-recorded run is re-read). ``name`` is the run's
    path relative to the runs root."""

    def __init__(self, name: str, path: Path):
        path = Path(path)
        super().__init__(path, _read_manifest(str(path), stat_key(path / MANIFEST)), name=name)

    def table(self, table: str) -> pd.DataFrame:
        return _read_table(str(self.path), table, stat_key(self.table_path(table)))

    def columns(self, table: str, columns: Iterable[str]) -> pd.DataFrame:
        """Only ``columns`` of ``table`` (cached; faster than ``table`` for wide or long tables)."""
        return _read_columns(str(self.path), table, tuple(columns), stat_key(self.table_path(table)))


def open_run(name: str, root: Path | None = None) -> RunView:
    """Open run ``name`` below the runs root; RunError with the reason otherwise."""
    root = runs_root() if root is None else root
    return RunView(name, safe_run_path(root, name))


def selected_run_name() -> str | None:
    return st.session_state.get("_run")


def current_run() -> RunView:
    """The run picked in the sidebar; stops the page with a message if there is none or it
    cannot be opened."""
    name = selected_run_name()
    if not name:
        root = runs_root()
        st.info(f"No run found below the runs root `{root}`. Record one with "
                "`focus-lab record --out runs/<name>` (or start the app with `--runs <folder>`).")
        st.stop()
    try:
        return open_run(name)
    except RunError as e:
        st.error(f"Cannot open run **{name}**: {e}")
        st.stop()


class PageEnd(Exception):
    """Ends a page body early, after it said why (``guarded`` shows nothing more)."""


def run_page(title: str, about: str | Callable[[RunView], str], need: tuple[str, str] | None = None
             ) -> RunView:
    """The start of a page about the picked run: the run (``current_run``: the page stops with
    a message when there is none), the title, and a caption ``run **name** · about`` (``about``
    may be a function of the run). ``need`` = (table, what the page shows with it): without
    that table the page ends after ``need_table``'s message (``PageEnd``)."""
    run = current_run()
    st.title(title)
    st.caption(f"run **{run.name}** · {about(run) if callable(about) else about}")
    if need is not None and need_table(run, *need) is None:
        raise PageEnd
    return run


def guarded(page: Callable[[], None], subject: Callable[[], str] | None = None) -> None:
    """Run a page body; a RunError (a corrupted or missing table) becomes its message, and any
    other error while reading a run (an unexpected table layout) a short message naming the
    run (or ``subject()``: what else the page shows, e.g. a passkey output), with the traceback
    in the server log only."""
    try:
        page()
    except PageEnd:
        pass
    except RunError as e:
        st.error(str(e))
    except Exception as e:  # streamlit's stop/rerun are BaseExceptions and pass through
        import logging
        logging.getLogger("focus_lab.app").exception("page failed")
        what = subject() if subject is not None else f"run **{selected_run_name()}**"
        st.error(f"This page cannot show {what}: {type(e).__name__}: {e}. The run may "
                 "be incomplete or written by another version of focus-lab; record it again (details in the "
                 "server log).")
    finally:  # a marker the browser test waits for: the page script has run to its end
        st.markdown('<span class="fl-page-done"></span>', unsafe_allow_html=True)


HOW_TO_RECORD = {
    "eval": "run `focus-lab eval --run <run folder>` (it evaluates the recorded windows and writes the table "
            "into the run)",
    "train_log": "train the routers with `focus-lab train` (it writes train_log.parquet next to them), then "
                 "`focus-lab record` with the same `--routers`",
    "pos": "record it with spaCy labels: `focus-lab record --pos`",
}


def need_table(run: RunView, table: str, what: str) -> pd.DataFrame | None:
    """The table, or None after an info message naming how to record it."""
    if not run.has(table):
        how = HOW_TO_RECORD.get(table, RECORD_HINT)
        st.info(f"This run has no **{table}** table, so {what} cannot be shown; {how}. "
                f"It has: {', '.join(run.tables) or 'no tables'}.")
        return None
    return run.table(table)


def col(df: pd.DataFrame, *names: str, required: bool = True) -> str | None:
    """The first of ``names`` that is a column of ``df``."""
    for n in names:
        if n in df.columns:
            return n
    if required:
        raise RunError(f"table has none of the columns {list(names)} (it has {list(df.columns)}); "
                       "the dashboard and the recorder disagree on the schema: record the run again")
    return None


# -------------------------------------------------------------------------------------------
# token text helpers

def show_token(tok: str) -> str:
    """A token made visible: surrounding whitespace stripped, newlines as ⏎, blank as ␣."""
    t = str(tok)
    s = t.strip()
    if s:
        return s
    if "\n" in t:
        return "⏎"
    return "␣"


def token_frame(run: RunView) -> pd.DataFrame:
    """tokens (+ pos when present) with a ``display`` column and ``pos`` always present."""
    tok = run.token_frame(pos_columns=("pos", "tag", "dep", "word", "lemma"))
    if "pos" not in tok.columns:
        tok = tok.assign(pos="(none)")
    tok = tok.assign(pos=tok["pos"].fillna("").replace("", "(none)"),
                     display=tok["token"].map(show_token))
    return tok


def layer_frame(run: RunView, layer: int) -> pd.DataFrame:
    """Tokens of every window joined with their assignment in ``layer``."""
    asg = run.table("assignments")
    a = asg[asg["layer_idx"] == layer][["window", "position", "group", "prob", "margin"]]
    return token_frame(run).merge(a, on=["window", "position"], how="inner")


def render_context(tokens: pd.DataFrame, window: int, position: int, radius: int = 12,
                   color: str = "#ffd54f") -> str:
    """HTML (escaped) of the tokens around ``position`` in ``window`` with that token marked.

    Spaces are restored from the character offsets (a gap between two tokens is one space);
    tokens that carry their own whitespace (byte-level BPE) keep it.
    """
    w = tokens[(tokens["window"] == window) & (tokens["position"].between(position - radius, position + radius))]
    w = w.sort_values("position")
    parts = []
    prev_end = None
    for r in w.itertuples(index=False):
        text = str(r.token)
        if prev_end is not None and r.char_start > prev_end and not text[:1].isspace():
            parts.append(" ")
        piece = html.escape(text).replace("\n", "⏎ ")
        if r.position == position:
            piece = (f'<mark style="background:{color};padding:0 2px;border-radius:3px">'
                     f'<b>{piece}</b></mark>')
        parts.append(piece)
        prev_end = r.char_end
    return "…" + "".join(parts) + "…"


def group_color(g: int) -> str:
    return GROUP_COLORS[int(g) % len(GROUP_COLORS)]


def pos_sorted(values: Iterable[str]) -> list[str]:
    vals = list(dict.fromkeys(values))
    return sorted(vals, key=lambda v: (POS_ORDER.index(v) if v in POS_ORDER else len(POS_ORDER), v))


def group_ids(num_groups: int, present) -> list[int]:
    """The group ids a table of groups shows: 0..num_groups-1, and ``num_groups`` (the keys the
    group capacity evicted, docs/run_schema.md) when ``present`` (ids found in the data) holds it."""
    return list(range(num_groups)) + ([num_groups] if num_groups in set(present) else [])


def group_label(g: int, num_groups: int) -> str:
    """``g0``.. for a group, ``evicted`` for id ``num_groups`` (no group: the group capacity)."""
    return f"g{g}" if g < num_groups else "evicted"


def hard_shares(asg: pd.DataFrame, num_groups: int) -> pd.DataFrame:
    """Per layer and group 0..num_groups-1: share of the layer's tokens whose hard (top-1) group it
    is. A key the group capacity evicted (group ``num_groups``, docs/run_schema.md) belongs to no
    group but counts among the tokens, so a layer's shares sum to 1 minus its evicted share."""
    every = asg.groupby(["layer_idx", "group"]).size().unstack(fill_value=0)
    counts = every.reindex(columns=range(num_groups), fill_value=0)
    shares = counts.div(every.sum(axis=1), axis=0)
    out = shares.stack().rename("share").reset_index()
    out.columns = ["layer_idx", "group", "share"]
    return out


def layer_xaxis(fig) -> None:
    """Integer ticks on an x axis of layer indices (plotly would label 0, 0.2, ... for 2 layers)."""
    xs = [v for tr in fig.data if tr.x is not None for v in np.asarray(tr.x).ravel() if v is not None]
    n = int(max(xs)) + 1 if len(xs) else 1
    fig.update_xaxes(tick0=0, dtick=max(1, round(n / 16)))


def layer_heatmap(z, x: list, layers: Iterable, *, title: str, xaxis_title: str, hovertemplate: str,
                  colorbar: dict, base_px: int = 160, row_px: int = 18, max_px: int = 760,
                  **heatmap) -> go.Figure:
    """A heatmap with one row per layer (``layers``: the row labels, layer 0 on top), its height
    growing with the rows (``base_px + row_px`` per row, at most ``max_px``); ``heatmap``: further
    ``go.Heatmap`` arguments (colorscale, zmin, text, ...)."""
    layers = [str(v) for v in layers]
    fig = go.Figure(go.Heatmap(z=z, x=x, y=layers, hovertemplate=hovertemplate, colorbar=colorbar, **heatmap))
    fig.update_layout(title=title, xaxis_title=xaxis_title, yaxis_title="layer",
                      height=min(base_px + row_px * len(layers), max_px), margin=dict(l=10, r=10, t=40, b=10),
                      yaxis_autorange="reversed", yaxis_type="category")
    return fig


def download_csv(df, name: str, label: str = "Download CSV") -> None:
    """A CSV download of ``df`` (a DataFrame, or a function returning one, e.g. a sort of a
    million rows that a page render should not pay for), generated only when clicked."""
    st.download_button(label, lambda: (df() if callable(df) else df).to_csv(index=False).encode(),
                       file_name=name, mime="text/csv", on_click="ignore")


# -------------------------------------------------------------------------------------------
# passkey probe outputs (``focus-lab probe passkey``, docs/passkey.md): not recorder runs

PASSKEY_FILES = ("cases.parquet", "needle_layers.parquet")
PASSKEY_HINT = "focus-lab probe passkey --out runs/passkey"
#: Columns the Passkey page reads (a subset of ``focus_lab.eval.passkey.CASES_COLUMNS`` /
#: ``LAYER_COLUMNS``; listed here so the dashboard does not import torch through passkey.py).
PASSKEY_CASE_COLUMNS = ("format", "length", "depth", "pattern", "seed", "key", "exact_match", "key_logprob",
                        "first_key_token_rank", "distant_pairs_kept", "needle_edges_kept", "needle_depth",
                        "needle_position", "continuation")
PASSKEY_LAYER_COLUMNS = ("format", "length", "depth", "seed", "key", "layer_idx", "dense_mass_to_needle",
                         "max_head_mass_to_needle", "kept_top1", "kept_top2")


def is_passkey_dir(path: Path) -> bool:
    """A passkey probe output: ``cases.parquet`` and ``needle_layers.parquet`` and no run manifest
    (``runs.list_runs`` counts only folders with ``manifest.json``, so it never lists these)."""
    return all((path / f).is_file() for f in PASSKEY_FILES) and not (path / MANIFEST).is_file()


def probe_dirs(root: Path, is_output: Callable[[Path], bool]) -> list[str]:
    """Names (relative to ``root``, posix, sorted) of the probe outputs (``is_output``) directly or
    one level below ``root``; hidden folders and folders resolving outside the root are skipped."""
    root = Path(root).resolve()
    if not root.is_dir():
        return []
    found = []
    for p in sorted(root.iterdir()):
        if p.name.startswith(".") or not p.is_dir():
            continue
        for q in [p] + sorted(c for c in p.iterdir() if c.is_dir() and not c.name.startswith(".")):
            if is_output(q):
                try:
                    found.append(q.resolve().relative_to(root).as_posix())
                except ValueError:  # a symlink out of the root
                    continue
    return found


def passkey_dirs(root: Path) -> list[str]:
    """The passkey outputs below ``root`` (``probe_dirs``)."""
    return probe_dirs(root, is_passkey_dir)


def pick_probe_output(what: str, names: list[str], key: str, root: Path, files: tuple[str, ...], hint: str,
                      doc: str) -> str | None:
    """The sidebar-free picker of a probe page: the output folder chosen among ``names`` (the
    newest by its cases table first), or None after saying, with the command ``hint`` that makes
    one, that the runs root holds none. ``what``: e.g. "Passkey"; ``key``: the selectbox key."""
    if not names:
        st.info(f"No {what.lower()} output below the runs root `{root}`. Make one with `{hint}` ({doc}), then "
                "reload this page.")
        return None
    if st.session_state.get(key) not in names:
        st.session_state[key] = newest_passkey(root, names)
    return st.selectbox(f"{what} output", names, key=key, help=f"folders below {root} holding {' and '.join(files)}")


def newest_passkey(root: Path, names: list[str]) -> str:
    """The probe output (passkey or retrieval) whose cases table was written last (the default pick)."""
    return max(names, key=lambda n: stat_key(Path(root) / n / "cases.parquet")[0])


def read_probe_tables(path: str, tables: tuple, what: str, hint: str) -> list[pd.DataFrame]:
    """The parquet tables ``[(name, required columns), ...]`` of a probe output folder, in order.
    RunError (naming the file, the problem and the command ``hint`` that remakes it) when one is
    unreadable or lacks a column the page needs."""
    out = []
    for name, cols in tables:
        p = Path(path) / f"{name}.parquet"
        try:
            df = pd.read_parquet(p)
        except Exception as e:  # pyarrow raises several types for corrupted files
            raise RunError(f"{p} cannot be read ({type(e).__name__}: {e}); run the probe again: `{hint}`") from e
        missing = [c for c in cols if c not in df.columns]
        if missing:
            raise RunError(f"{p} lacks the columns {missing}: not a {what} table of this focus-lab; run the "
                           f"probe again: `{hint}`")
        out.append(df)
    return out


@st.cache_resource(show_spinner=False, max_entries=16)
def _read_passkey(path: str, key: tuple) -> tuple[pd.DataFrame, pd.DataFrame, dict]:
    """(cases, needle_layers, passkey.json as a dict or {}) of a passkey output, read-only.
    RunError when a table is unreadable or lacks a column the page needs."""
    import json
    out = read_probe_tables(path, (("cases", PASSKEY_CASE_COLUMNS), ("needle_layers", PASSKEY_LAYER_COLUMNS)),
                            "passkey", PASSKEY_HINT)
    info = {}
    try:
        info = json.loads((Path(path) / "passkey.json").read_text())
    except (OSError, ValueError):
        pass
    return out[0], out[1], info if isinstance(info, dict) else {}


def open_passkey(name: str, root: Path | None = None) -> tuple[pd.DataFrame, pd.DataFrame, dict]:
    """The passkey output ``name`` below the runs root (checked like a run name):
    (cases, needle_layers, settings). RunError when it lies outside the root or is no passkey
    output."""
    root = runs_root() if root is None else root
    p = safe_run_path(root, name)
    if not is_passkey_dir(p):
        raise RunError(f"{name!r} is not a passkey output below the runs root {root} (it needs "
                       f"{' and '.join(PASSKEY_FILES)}): `{PASSKEY_HINT}`")
    return _read_passkey(str(p), tuple(stat_key(p / f) for f in (*PASSKEY_FILES, "passkey.json")))


# ---------------------------------------------------------------------------------------------
# retrieval suite outputs (``focus-lab probe retrieval``): not runs either

RETRIEVAL_FILES = ("cases.parquet", "trace.parquet")
RETRIEVAL_HINT = "focus-lab probe retrieval --out runs/retrieval"
#: Columns the Retrieval page reads (a subset of ``focus_lab.eval.retrieval.CASES_COLUMNS`` /
#: ``TRACE_COLUMNS``; listed here so the dashboard does not import torch through retrieval.py).
RETRIEVAL_CASE_COLUMNS = ("task", "length", "seed", "pattern", "score", "answer_logprob", "distant_pairs_kept",
                          "needle_pairs_kept", "continuation", "expected")
RETRIEVAL_TRACE_COLUMNS = ("task", "length", "seed", "pattern", "layer_idx", "head", "dense_mass", "mass_kept",
                           "copy_mass", "copy_mass_kept", "retrieval_score")


def is_retrieval_dir(path: Path) -> bool:
    """A retrieval suite output: ``cases.parquet`` and ``trace.parquet``, no run manifest."""
    return all((path / f).is_file() for f in RETRIEVAL_FILES) and not (path / MANIFEST).is_file()


def retrieval_dirs(root: Path) -> list[str]:
    """The retrieval suite outputs below ``root`` (``probe_dirs``)."""
    return probe_dirs(root, is_retrieval_dir)


@st.cache_resource(show_spinner=False, max_entries=8)
def _read_retrieval(path: str, key: tuple) -> tuple[pd.DataFrame, pd.DataFrame]:
    """(cases, trace) of a retrieval output, read-only; RunError when a table is unreadable or
    lacks a column the page needs."""
    out = read_probe_tables(path, (("cases", RETRIEVAL_CASE_COLUMNS), ("trace", RETRIEVAL_TRACE_COLUMNS)),
                            "retrieval", RETRIEVAL_HINT)
    return out[0], out[1]


def open_retrieval(name: str, root: Path | None = None) -> tuple[pd.DataFrame, pd.DataFrame]:
    """The retrieval output ``name`` below the runs root: (cases, trace). RunError when it lies
    outside the root or is no retrieval output."""
    root = runs_root() if root is None else root
    p = safe_run_path(root, name)
    if not is_retrieval_dir(p):
        raise RunError(f"{name!r} is not a retrieval suite output below the runs root {root} (it needs "
                       f"{' and '.join(RETRIEVAL_FILES)}): `{RETRIEVAL_HINT}`")
    return _read_retrieval(str(p), tuple(stat_key(p / f) for f in RETRIEVAL_FILES))


# ---------------------------------------------------------------------------------------------
# committed results (figures/results/ of the checkout): what the probe pages show without output

def _committed_key(kind: str) -> tuple:
    """The mtimes and sizes of the files a committed result is read from (cache key)."""
    from focus_lab.eval import committed
    from focus_lab.hf.shipped import MANIFEST as ROUTER_MANIFEST
    files = (["retrieval_cases.parquet"] if kind == "retrieval" else ["passkey_cases.parquet", "passkey_tables.json"])
    extra = sorted(committed.RESULTS.glob("retrieval_cases_*.parquet")) if kind == "retrieval" else []
    return tuple(stat_key(p) for p in [*(committed.RESULTS / f for f in files), *extra, ROUTER_MANIFEST])


@st.cache_resource(show_spinner=False, max_entries=4)
def _read_committed(kind: str, key: tuple):
    """``committed_retrieval()`` / ``committed_passkey()`` of the shipped file, shared read-only;
    (result, None), or (None, the reason) when there is none."""
    from focus_lab.eval import committed
    try:
        return (committed.committed_retrieval() if kind == "retrieval" else committed.committed_passkey()), None
    except committed.NoCommittedResults as e:
        return None, str(e)


def committed_result(kind: str):
    """The committed ``kind`` ("retrieval" or "passkey") results of the shipped router file
    (``focus_lab.eval.committed``), re-read when a table or the router manifest changes:
    (CommittedResult, None), or (None, why there is none)."""
    return _read_committed(kind, _committed_key(kind))


def committed_intro(what: str, root: Path, source, hint: str, doc: str, inline_command: bool = True) -> None:
    """The info line of a probe page showing committed results because the runs root holds no
    output: the runs root, the router file (name, sha256 prefix), the command that made the rows
    (inline, or in a code block below when ``inline_command`` is False), and how to make one's own."""
    made = f"made by `{source.command}`" if inline_command else "made by the commands below"
    st.info(f"No {what} output under `{root}`. Showing the committed results of {source.label()}, {made} "
            f"(`{source.table}`, {source.docs}). Make your own with `{hint}` ({doc}), then reload this page.")
    if not inline_command:
        st.code("\n".join(source.commands), language="bash", wrap_lines=True)
