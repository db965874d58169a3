"""Perplexity by context length, Focus against dense, window and controls.

For each corpus (held-out text: Persuasion for ``austen``, Hamlet for ``shakespeare``) and each
length, the same windows are evaluated under every pattern (``focus_lab.eval.evaluate``: dense,
window + sinks, Focus hard top-1 / top-2, balanced random groups and the router's own groups
shuffled, both at the router's sparsity). Each window is its own row, so every difference
comes with a paired bootstrap interval over windows (a +-1% difference on 4 windows is not a
verdict). Resumable: one parquet per (corpus, length) cell under ``<out>/cells/``.

Every table measured for the docs is committed as one tidy file,
``figures/results/length_cells.parquet`` (``COMMITTED``: one row per table, corpus, length,
window and pattern; ``table`` names the table, ``routers_sha256`` / ``random_layers`` /
``layer_top_k`` (the per-layer k the row's pattern ran with, ``spec_in_force``; older tables: the
``--layer-top-k`` given) / ``seed`` say what made it). ``--reuse`` and ``--against`` take a folder of
this script's output or the name of a committed table; ``--commit NAME`` adds the cells already
under ``--out`` to the committed file (it computes nothing: run first); ``--table NAME --report`` writes a committed table's markdown.

Usage (background; ~25 min per corpus on 2 CPU cores at the default windows)::

    python -m analyses.length_table --out checkpoints/lt --reuse shipped          # run / resume
    python -m analyses.length_table --out checkpoints/lt --report                 # tables only
    python -m analyses.length_table --table shipped --out figures --report        # figures/length_table.md
    python -m analyses.length_table --model gemma3-270m --out checkpoints/lt_gemma --lengths 4096,8192 \
        --windows 4096:4,8192:2 --patterns dense,window,hard_top1,hard_top2,random_top2,shuffled_top2
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path

import numpy as np
import pandas as pd

from focus_lab.io import write_text

PATTERNS = "dense,window,hard_top1,hard_top2,random_top1,random_top2,shuffled_top1,shuffled_top2"
WINDOWS = "512:8,1024:8,2048:8,4096:8,8192:4"
SCHEMA_VERSION = 1
# every committed length-table cell, one tidy table (``table`` column)
COMMITTED = Path(__file__).resolve().parent.parent / "figures" / "results" / "length_cells.parquet"
#: tokens per unit of the block interval of a control over the router (``evaluate.paired_change``
#: with ``block``): fixed a priori, between the 512-token window and a 32K window's length
INTERVAL_BLOCK = 2048
# patterns that use no groups at all: the same rows whatever the router file, seed or per-layer k
GROUP_FREE = ("dense", "window")


def router_free(label: str) -> bool:
    """Patterns whose rows do not depend on the router file (random groups ignore its bias), so
    ``--reuse`` may take them from another table's cells on the same windows: dense, window and
    random_topK, the latter only under the same per-layer k (``_same_spec``)."""
    return label in GROUP_FREE or label.startswith("random_top")


def _changes(cfg, label: str) -> dict | None:
    """``patterns.legacy.legacy_changes`` of the committed label ``label`` under ``cfg``'s
    groups; None for a pattern this file cannot run (e.g. top-k above its groups)."""
    from focus_lab.patterns.legacy import legacy_changes
    try:
        return legacy_changes(label, cfg.num_groups)
    except ValueError:
        return None


def spec_in_force(cfg, label: str) -> str:
    """The per-layer k a pattern runs with under ``cfg`` (``FocusConfig.layer_top_k_in_force``
    with the pattern's top_k: an explicit ``--layer-top-k`` or the router file's
    ``top_k_budgets``), as a ``--layer-top-k`` spec; '' when uniform or for a pattern without
    groups. Recorded per row in the ``layer_top_k`` column."""
    from focus_lab.eval.evaluate import pattern_layer_spec
    changes = _changes(cfg, label)
    return pattern_layer_spec(cfg, changes) if changes is not None else ""


def match_in_force(cfg, label: str) -> str:
    """The token-match pairs a pattern runs with under ``cfg`` (``FocusConfig.match_shifts``, or
    the pattern's ``_match`` / ``_nomatch`` suffix, and ``match_latest``; docs/method.md §2.8) as
    text, e.g. '0-1', or '0-1@16' with the nearest 16 matches only; '' when off or for a pattern
    that is not hard (dense, window, soft). Recorded per row in the ``match_shifts`` column."""
    from focus_lab.method.config import format_int_list
    changes = _changes(cfg, label)
    if changes is None or changes.get("mode") != "hard":
        return ""
    shifts = changes.get("match_shifts", cfg.match_shifts)
    if not shifts:
        return ""
    return format_int_list(shifts) + (f"@{cfg.match_latest}" if cfg.match_latest else "")


def capacity_in_force(cfg, label: str) -> str:
    """The group capacity a pattern runs with under ``cfg`` (``FocusConfig.capacity_at``: the
    router file's ``group_capacity``, ``capacity_layers``, ``capacity_overflow`` and
    ``capacity_top_k``, or the pattern's ``_cap`` / ``_evict`` / ``_nocap`` suffix; docs/method.md
    §2.9) as text, e.g. '0.5@13,15-16:evict' ('all' for every routed layer); '' when off or for a
    pattern the cap never touches (dense, window, soft, random and shuffled groups). Recorded per
    row in the ``capacity`` column."""
    from focus_lab.method.config import format_int_list
    changes = _changes(cfg, label)
    if changes is None or changes.get("mode") != "hard" or changes.get("assignment", "router") != "router":
        return ""
    c = cfg.replace(**changes)
    if not c.capacity_for_top_k():
        return ""
    layers = "all" if c.capacity_layers is None else format_int_list(c.capacity_layers)
    return f"{c.group_capacity:g}@{layers}:{c.capacity_overflow}"


def pattern_in_force(cfg, label: str) -> str:
    """The canonical pattern (``focus_lab.patterns``) a row labelled ``label`` runs under ``cfg``:
    the label means the router file's rules changed by its suffixes (``legacy_label_pattern``), so
    ``hard_top2`` is ``hard_top2+key_shift`` under a file whose rules hold the key shift. '' for a
    label this file cannot run. Recorded per row in the ``canonical_pattern`` column."""
    from analyses.migrate_tables import label_pattern
    from focus_lab.patterns import PatternError
    try:
        return label_pattern(label, cfg) or ""
    except (PatternError, ValueError):
        return ""


def _key_shift_of(label: str) -> int:
    """The key shift a row made before cells recorded their pattern ran: its label's ``_keyshift``
    suffix (every such committed row spells it; no router file saved the shift before
    ``gemma3-270m/distill64-8k-keyshift``, whose rows record their pattern)."""
    from focus_lab.patterns.legacy import split_legacy
    try:
        return int(split_legacy(label)[1].get("key_shift", 0))
    except ValueError:
        return 0


def _same_pattern(old: pd.DataFrame, cfg) -> pd.Series:
    """Rows of ``old`` that ran the pattern this run gives their label (``pattern_in_force``),
    compared by the row's ``canonical_pattern`` where it has one; a row without one (a cell made
    before that column) by its key shift (``_key_shift_of``), the one rule no other column records."""
    from focus_lab.patterns import Pattern
    pats = _column(old, "canonical_pattern", "")
    want = {lab: pattern_in_force(cfg, lab) for lab in old.label.unique()}
    shift = {lab: int(bool(w) and Pattern.parse(w).rule("key_shift") is not None) for lab, w in want.items()}
    return pd.Series([p == want[lab] if p else _key_shift_of(lab) == shift[lab] for p, lab in zip(pats, old.label)],
                     index=old.index, dtype=bool)


def _same_spec(old: pd.DataFrame, cfg) -> pd.Series:
    """Rows of ``old`` made with the per-layer k this run gives their pattern (``spec_in_force``,
    specs compared as mappings: an older cell holds the ``--layer-top-k`` text as typed), with
    the same token-match shifts (``match_in_force``; a cell made before that column: none), the
    same group capacity (``capacity_in_force``; a cell made before that column: none) and the same
    pattern (``_same_pattern``: the key shift, which no other column records)."""
    from focus_lab.method.config import parse_layer_top_k
    read = lambda spec: parse_layer_top_k(spec) if spec else {}  # noqa: E731
    return pd.Series([read(spec) == read(spec_in_force(cfg, lab)) and match == match_in_force(cfg, lab)
                      and cap == capacity_in_force(cfg, lab)
                      for spec, match, cap, lab in zip(_column(old, "layer_top_k", ""), _column(old, "match_shifts", ""),
                                                       _column(old, "capacity", ""), old.label)],
                     index=old.index, dtype=bool) & _same_pattern(old, cfg)


def by_pattern(old: pd.DataFrame, labels: list[str], cfg) -> pd.DataFrame:
    """``old`` with each row that records its pattern (``canonical_pattern``) and whose label this
    run does not ask for relabelled to the label of ``labels`` that runs that pattern here
    (``pattern_in_force``, the first such): a row is reused for what it ran, not for how it was
    spelled (``hard_top2_keyshift`` under the file before the key shift is ``hard_top2`` under
    ``gemma3-270m/distill64-8k-keyshift``)."""
    if "canonical_pattern" not in old or old.empty:
        return old
    want: dict[str, str] = {}
    for lab in labels:
        want.setdefault(pattern_in_force(cfg, lab), lab)
    want.pop("", None)
    pats = old["canonical_pattern"].fillna("").astype(str)
    moved = ~old.label.isin(labels) & pats.isin(want)
    if not moved.any():
        return old
    out = old.copy()
    out.loc[moved, "label"] = pats[moved].map(want)
    return out  # a (label, window) twice: the filters keep the row that ran this run's pattern


def _column(old: pd.DataFrame, column: str, default) -> pd.Series:
    """A cell's column, ``default`` for a cell made before it existed (seed: 0; the spec columns
    ``random_layers`` and ``layer_top_k``: '', as text)."""
    col = old[column] if column in old else pd.Series(default, index=old.index)
    return col.fillna("").astype(str) if default == "" else col


def complete_labels(rows: pd.DataFrame, windows: list[int]) -> set[str]:
    """The patterns ``rows`` hold on every one of ``windows`` (only those are reused)."""
    return {lab for lab, g in rows.groupby("label") if set(g["window"]) >= set(windows)}


def reusable_rows(old: pd.DataFrame, labels: list[str], windows: list[int], cfg) -> pd.DataFrame:
    """The rows of another table's cell that this run may take: router-free patterns it asks for
    (dense, window, random_topK), on its windows; random rows only when drawn with the same seed
    (``cfg.seed`` fixes the random control's groups; a cell without a seed column was made with
    seed 0) and under the same per-layer k (``spec_in_force``: a per-layer k changes which pairs
    random groups keep)."""
    plain = old.label.isin(GROUP_FREE)
    return old[old.label.map(router_free) & old.label.isin(labels) & old.window.isin(windows)
               & (plain | ((_column(old, "seed", 0) == cfg.seed) & _same_spec(old, cfg)))]


def same_router_rows(old: pd.DataFrame, labels: list[str], windows: list[int], cfg, shas: set[str],
                     own_sha: str, budget_only: set[str] = frozenset(),
                     file_random_layers: list[int] | None = None) -> pd.DataFrame:
    """The rows of another table's cell made with this run's router, so that they may be taken
    for the router patterns (hard, shuffled, soft) too: the cell's router file is this one
    (``own_sha``) or differs from it only in ``top_k_budgets`` or the group capacity
    (``budget_only``: ``shipped.same_router_shas`` and ``shipped.capacity_only_shas``), its random layers as the file says or as given, or it holds the
    same tensors (``shas``, e.g. ``shipped.same_tensor_shas``) under the same ``--random-layers``; same seed,
    the same per-layer k, token-match pairs and capacity for the row's pattern (``_same_spec``),
    on this run's windows.
    ``cfg``: this run's FocusConfig. ``file_random_layers``: the router file's own random
    layers, what a row made without ``--random-layers`` ('') ran with; such a row is taken only
    when they are this run's (None: this run keeps the file's own)."""
    from focus_lab.method.config import parse_random_layers
    if "routers_sha256" not in old:
        return old.iloc[:0]
    spec = _column(old, "random_layers", "")
    want = sorted(cfg.random_layers or [])
    same_layers = spec.map(lambda x: x != "" and sorted(parse_random_layers(x)) == want)
    as_file = (spec == "") & (file_random_layers is None or sorted(file_random_layers) == want)
    recorded = _column(old, "canonical_pattern", "") != ""  # its pattern, random layers included, checked
    sha = old["routers_sha256"]
    return old[old.label.isin(labels) & old.window.isin(windows) & (_column(old, "seed", 0) == cfg.seed)
               & _same_spec(old, cfg)
               & (((sha.isin({own_sha} | set(budget_only))) & (as_file | same_layers))
                  | (sha.isin(shas) & (same_layers | recorded)))]


# the columns of a cell that describe the run that made it; a reused row keeps the others
_RUN_COLUMNS = ("corpus", "seq_len", "heldout", "routers", "routers_sha256", "table_schema_version",
                "reused_from", "random_layers", "layer_top_k", "match_shifts", "capacity", "seed",
                "canonical_pattern", "router_name")


def window_columns(rows: pd.DataFrame) -> list[str]:
    """The columns of a cell's rows that a reused row keeps: ``evaluate(..., per_window=True)``'s
    and ``window``, not those describing the run that made the cell (``_RUN_COLUMNS``)."""
    return [c for c in rows.columns if c not in _RUN_COLUMNS]


def split_cell(cell: str) -> tuple[str, int]:
    """``"austen_4096"`` or ``"austen_4096.parquet"`` -> ``("austen", 4096)``."""
    corpus, _, tokens = cell.removesuffix(".parquet").rpartition("_")
    return corpus, int(tokens)


def committed_cells(path: Path | None = None) -> pd.DataFrame:
    """The committed cells (``COMMITTED``, or ``path``); an empty frame when the file is absent."""
    path = Path(path) if path is not None else COMMITTED
    return pd.read_parquet(path) if path.is_file() else pd.DataFrame(columns=["table", "corpus", "seq_len"])


def table_cell(source: Path | str, cell: str, committed: pd.DataFrame | None = None) -> pd.DataFrame | None:
    """The rows of one cell (``"<corpus>_<tokens>.parquet"``) of a table: ``<source>/cells/<cell>``
    when ``source`` is a folder of this script's output, else the rows of the committed table named
    ``source`` (without the ``table`` column). None when neither has the cell."""
    path = Path(source) / "cells" / cell
    if path.is_file():
        return pd.read_parquet(path)
    committed = committed_cells() if committed is None else committed
    corpus, tokens = split_cell(cell)
    rows = committed[(committed["table"] == str(source)) & (committed["corpus"] == corpus)
                     & (committed["seq_len"] == tokens)]
    return rows.drop(columns="table").reset_index(drop=True) if len(rows) else None


def commit_table(out: Path, name: str, path: Path | None = None) -> int:
    """Add the cells of a run (``<out>/cells/*.parquet``) to the committed file as table ``name``
    (rows of an earlier table of that name are replaced). Returns the number of rows written."""
    from focus_lab.io import write_parquet
    path = Path(path) if path is not None else COMMITTED
    cells = sorted((Path(out) / "cells").glob("*.parquet"))
    if not cells:
        raise SystemExit(f"no cells under {Path(out) / 'cells'}: nothing to commit")
    from focus_lab.io import with_table
    new = pd.concat([pd.read_parquet(c) for c in cells], ignore_index=True)
    both = with_table(path, new, name)
    for col in ("routers_sha256", "random_layers", "layer_top_k", "match_shifts", "capacity", "reused_from"):
        if col in both:
            both[col] = both[col].fillna("").astype(str)
    if "seed" in both:
        both["seed"] = both["seed"].fillna(0).astype("int64")
    if "model" in both:  # tables made before cells named their model are SmolLM2's
        both["model"] = both["model"].fillna("smollm2-135m-instruct").astype(str)
    from analyses.migrate_tables import migrate  # each row's canonical pattern and router name
    write_parquet(path, migrate(both, "length_cells.parquet", {}))
    return len(new)


def reused_rows(folders: list[Path], cell: str, labels: list[str], windows: list[int], cfg,
                sha: str, file_random_layers: list[int] | None = None) -> pd.DataFrame:
    """The rows ``--reuse`` takes for one cell (``table_cell``: a folder's ``cells/<cell>`` or a
    committed table's rows), window by window: the
    router-free rows (``reusable_rows``) and the rows made with this router (``same_router_rows``:
    this file, sha256 ``sha``, or one holding the same tensors under the same random layers); for
    each (pattern, window), the first folder that has it. The run evaluates only the pairs
    missing, so a table with more windows than an earlier one computes only the new windows.
    ``file_random_layers``: the router file's own random layers (``same_router_rows``).
    Columns: the cell's per-window columns and ``reused_from``: the folder, or, for a row the folder
    had itself reused, the run that row names (the run that measured it, however often reused)."""
    from focus_lab.hf.shipped import capacity_only_shas, same_router_shas, same_tensor_shas
    taken, committed = [], None
    for folder in folders or []:
        if not (Path(folder) / "cells" / cell).is_file() and committed is None:
            committed = committed_cells()
        old = table_cell(folder, cell, committed)
        if old is None:
            continue
        old = by_pattern(old, labels, cfg)
        rows = pd.concat([reusable_rows(old, labels, windows, cfg),
                          same_router_rows(old, labels, windows, cfg, same_tensor_shas(sha), sha,
                                           same_router_shas(sha) | capacity_only_shas(sha), file_random_layers)])
        origin = rows["reused_from"].fillna("").astype(str) if "reused_from" in rows else pd.Series("", rows.index)
        # a row the folder itself reused names the run that measured it, not the folder
        taken.append(rows[window_columns(rows)].assign(reused_from=origin.where(origin != "", str(folder))))
    if not taken:
        return pd.DataFrame()
    return pd.concat(taken, ignore_index=True).drop_duplicates(["label", "window"]).reset_index(drop=True)


def run_cells(args) -> None:
    import torch
    from focus_lab.data import load_corpus, make_windows
    from focus_lab.eval.evaluate import evaluate
    from focus_lab.patterns.legacy import parse_legacy_patterns as parse_patterns
    from focus_lab.io import file_sha256, write_parquet
    from focus_lab.hf.models import load_model
    from focus_lab.hf.retrofit import load_routers, read_router_file
    from focus_lab.hf.shipped import resolve_routers

    torch.set_num_threads(args.threads)
    routers = resolve_routers(args.routers, args.model)
    model, tok = load_model(args.model)
    from focus_lab.method.config import parse_layer_top_k, parse_match_shifts, parse_random_layers
    overrides = {}
    if args.random_layers is not None:
        overrides["random_layers"] = parse_random_layers(args.random_layers)
    if args.layer_top_k is not None:
        overrides["layer_top_k"] = parse_layer_top_k(args.layer_top_k)
    if args.match_shifts is not None:
        overrides["match_shifts"] = parse_match_shifts(args.match_shifts)
    if args.seed is not None:
        overrides["seed"] = args.seed
    cfg = load_routers(model, routers, config_overrides=overrides or None)
    file_layers = read_router_file(routers)[0].random_layers or []  # what rows made without --random-layers ran with
    pats = parse_patterns(args.patterns, cfg.num_groups)
    windows_at = dict((int(a), int(b)) for a, b in (x.split(":") for x in args.windows.split(",")))
    for corpus in args.corpora.split(","):
        corp = load_corpus(corpus)
        for L in (int(x) for x in args.lengths.split(",")):
            cell = args.out / "cells" / f"{corp.name}_{L}.parquet"  # a local file: its stem, inside --out
            if cell.is_file():
                continue
            ws = make_windows(corp.heldout, tok, L, max_windows=windows_at[L])
            rows = []
            old = reused_rows(args.reuse, cell.name, [p for p, _ in pats], [w.index for w in ws], cfg,
                              file_sha256(routers), file_layers)
            if len(old):
                rows.append(old)
                for src, g in old.groupby("reused_from"):
                    print(f"{corpus} {L}: reusing " + ", ".join(
                        f"{lab} ({len(h)} windows)" for lab, h in g.groupby("label")) + f" from {src}", flush=True)
            partial = cell.with_name(cell.stem + ".partial.parquet")  # the windows a stopped run finished
            computed = []  # the rows this run (or the stopped one before it) evaluated
            if partial.is_file():  # the same windows (a window's index is its place in the text)
                done = pd.read_parquet(partial)
                computed.append(done[done.window.isin([w.index for w in ws])])
                print(f"{corpus} {L}: {computed[0].window.nunique()} windows finished before, from {partial}",
                      flush=True)
            have = set()
            for r in rows + computed:
                have |= set(zip(r.get("label", []), r.get("window", [])))
            t0 = time.perf_counter()
            routers_sha = file_sha256(routers)

            def finished(rows: list) -> pd.DataFrame:
                out = pd.concat(rows, ignore_index=True)
                out["reused_from"] = out["reused_from"].fillna("") if "reused_from" in out else ""
                out["corpus"], out["seq_len"] = corpus, L
                out["heldout"] = ",".join(d.name for d in corp.heldout)
                out["model"] = args.model or "smollm2-135m-instruct"
                out["routers"] = str(routers)
                out["routers_sha256"] = routers_sha
                out["random_layers"] = args.random_layers or ""
                out["layer_top_k"] = out.label.map(lambda lab: spec_in_force(cfg, lab))
                out["match_shifts"] = out.label.map(lambda lab: match_in_force(cfg, lab))
                out["capacity"] = out.label.map(lambda lab: capacity_in_force(cfg, lab))
                out["canonical_pattern"] = out.label.map(lambda lab: pattern_in_force(cfg, lab))
                out["seed"] = cfg.seed
                out["table_schema_version"] = SCHEMA_VERSION
                return out
            for w in ws:
                todo = [p for p in pats if (p[0], w.index) not in have]
                if not todo:
                    continue
                df = evaluate(model, [w], todo, progress=False, per_window=True)
                computed.append(df)
                write_parquet(partial, finished(computed))  # atomic; a stop keeps the finished windows
                print(f"{corpus} {L} window {w.index}: " + ", ".join(
                    f"{r.label} {r.perplexity:.2f}" for r in df.itertuples()), flush=True)
            write_parquet(cell, finished(rows + computed))
            partial.unlink(missing_ok=True)
            print(f"== {corpus} {L}: {len(ws)} windows in {time.perf_counter() - t0:.0f} s", flush=True)


def paired_delta(df: pd.DataFrame, a: str, b: str, reps: int = 2000, seed: int = 0):
    """Perplexity change of pattern ``a`` over ``b`` in % with its 95% paired bootstrap interval
    (``evaluate.paired_change`` on the per-window rows). Returns (delta, lo, hi)."""
    from focus_lab.eval.evaluate import paired_change
    return paired_change(df[df.label == a], df[df.label == b], reps=reps, seed=seed)


def against_rows(df: pd.DataFrame, against: Path, pairs: dict[str, str] | None = None) -> list[dict]:
    """Paired change of every router pattern (hard_topK, shuffled_topK) and of random_topK of this
    table over the same pattern in another table's cells (``table_cell``: a folder or a committed
    table's name), on the windows both
    have: e.g. a ``--random-layers`` or ``--layer-top-k`` setting against the plain routers.
    ``pairs`` ({this table's label: the other's}, ``parse_pairs``) compares patterns of different
    names instead, e.g. top-4 of 8 groups against top-2 of 4 at the same share of distant pairs;
    its rows are labelled ``"a vs b"``.
    Returns rows corpus, seq_len, label, windows, vs_against_pct, ci_lo, ci_hi (< 0: this table's
    pattern is better)."""
    from focus_lab.eval.evaluate import paired_change
    rows = []
    for (corpus, L), g in df.groupby(["corpus", "seq_len"], sort=True):
        other = table_cell(against, f"{corpus}_{L}.parquet")
        if other is None:
            continue
        if pairs:
            todo = [(a, b, f"{a} vs {b}") for a, b in pairs.items() if a in set(g.label) and b in set(other.label)]
        else:
            todo = [(x, x, x) for x in sorted(set(g.label) & set(other.label))
                    if x not in GROUP_FREE and not (g[g.label == x].reused_from != "").all()]
        for la, lb, name in todo:
            a, b = g[g.label == la], other[other.label == lb]
            m, lo, hi = paired_change(a, b)
            rows.append({"corpus": corpus, "seq_len": L, "label": name,
                         "windows": len(set(a.window) & set(b.window)), "vs_against_pct": m, "ci_lo": lo, "ci_hi": hi})
    return rows


def parse_pairs(spec: str | None) -> dict[str, str] | None:
    """``--against-pairs`` "a=b,c=d" -> {"a": "b", "c": "d"} (None for None or empty); raises
    SystemExit naming the bad item."""
    if not spec:
        return None
    out = {}
    for item in spec.split(","):
        a, eq, b = item.strip().partition("=")
        if not (eq and a.strip() and b.strip()):
            raise SystemExit(f"--against-pairs: {item!r} is not THIS=OTHER (e.g. hard_top4=hard_top2)")
        out[a.strip()] = b.strip()
    return out


def router_of(label: str) -> str | None:
    """The router pattern a control is measured against: ``random_top2`` -> ``hard_top2``,
    ``shuffled_top1_keyshift`` -> ``hard_top1_keyshift`` (same k, same suffixes); None for a
    pattern that is not a control."""
    kind, sep, rest = label.partition("_top")
    return f"hard_top{rest}" if sep and kind in ("random", "shuffled") else None


def base_of(label: str) -> str | None:
    """A pattern name without its suffixes (``hard_top2_keyshift`` -> ``hard_top2``,
    ``patterns.legacy.split_legacy``); None when it has none."""
    from focus_lab.patterns.legacy import split_legacy
    base = split_legacy(label)[0]
    return base if base != label else None


def has_blocks(rows: pd.DataFrame) -> bool:
    """Whether every row holds its block losses (evaluation schema 3, ``evaluate.BLOCK_TOKENS``)."""
    return len(rows) > 0 and "block_nll" in rows and not rows["block_nll"].isna().any()


def block_delta(df: pd.DataFrame, a: str, b: str, block: int = INTERVAL_BLOCK, reps: int = 2000, seed: int = 0):
    """``paired_delta`` with runs of ``block`` tokens inside the windows as the resampled units
    (``evaluate.paired_change``); NaNs when a row of either pattern lacks block losses."""
    from focus_lab.eval.evaluate import paired_change
    x, y = df[df.label == a], df[df.label == b]
    if not (has_blocks(x) and has_blocks(y)):
        return float("nan"), float("nan"), float("nan")
    return paired_change(x, y, reps=reps, seed=seed, block=block)


def summarize(df: pd.DataFrame) -> pd.DataFrame:
    """Per (corpus, length, pattern) of a table's per-window rows: pooled perplexity, windows,
    tokens, distant pairs kept, tokens/s, the change vs dense in % with its 95% paired interval
    (``delta_vs_dense_pct``, ``ci_lo``, ``ci_hi``) and, for random / shuffled groups, the control's
    change over the router at the same k (``control_vs_router_pct``, > 0: the router is better)
    with its interval over windows (``control_ci_lo``, ``control_ci_hi``) and over runs of
    ``INTERVAL_BLOCK`` tokens (``control_block_ci_lo``, ``control_block_ci_hi``; NaN where the rows
    hold no block losses).
    Only the windows that every pattern of the cell ran on count (a stopped run's ``.partial``
    cell may hold a window some patterns have not reached): each pattern pools the same windows."""
    from focus_lab.eval.evaluate import pool_windows
    summary = []
    for (corpus, L), g in df.groupby(["corpus", "seq_len"], sort=True):
        per_window = g.groupby("window").label.nunique()  # patterns run on each window
        g = g[g.window.isin(per_window.index[per_window == g.label.nunique()])]
        nwin = g.window.nunique()
        pooled = pool_windows(g[["label", "window", "nll", "tokens", "seconds", "distant_pairs_kept",
                                 "max_group_share"]]).set_index("label")
        for label, r in pooled.iterrows():
            row = {"corpus": corpus, "seq_len": L, "windows": nwin, "tokens": int(r.tokens),
                   "label": label, "perplexity": r.perplexity, "distant_pairs_kept": r.distant_pairs_kept,
                   "tokens_per_second": r.tokens_per_second}
            if label != "dense":
                row["delta_vs_dense_pct"], row["ci_lo"], row["ci_hi"] = paired_delta(g, label, "dense")
            if (router := router_of(label)) in pooled.index:
                m, lo, hi = paired_delta(g, label, router)
                row["control_vs_router_pct"], row["control_ci_lo"], row["control_ci_hi"] = m, lo, hi
                _, row["control_block_ci_lo"], row["control_block_ci_hi"] = block_delta(g, label, router)
            summary.append(row)
    s = pd.DataFrame(summary)
    s["schema_version"] = SCHEMA_VERSION
    return s


def report(out: Path, against: Path | str | None = None, table: str | None = None,
           pairs: dict[str, str] | None = None) -> str:
    """``<out>/length_table.md`` (and ``<out>/length_table.parquet``, the ``summarize`` rows) from
    the cells under ``<out>/cells``, or, with ``table``, from that committed table (markdown only).
    The text is ``report_text``'s; returns it."""
    text = report_text(out, against, table, pairs)
    Path(out).mkdir(parents=True, exist_ok=True)
    write_text(Path(out) / "length_table.md", text)
    return text


def report_text(out: Path | None, against: Path | str | None = None, table: str | None = None,
                pairs: dict[str, str] | None = None) -> str:
    """The markdown of ``report``, written nowhere (the docs' generated blocks embed it): the cells
    under ``<out>/cells`` (their ``summarize`` rows go to ``<out>/length_table.parquet``), or, with
    ``table``, the committed table of that name. Raises SystemExit naming the choices when the table
    or the cells are missing."""
    if table is not None:
        df = committed_cells()
        df = df[df["table"] == table].drop(columns="table")
        if not len(df):
            raise SystemExit(f"no committed table {table!r} in {COMMITTED}: choose from "
                             + ", ".join(sorted(committed_cells()["table"].unique())))
    else:
        cells = sorted((out / "cells").glob("*.parquet"))
        if not cells:
            raise SystemExit(f"no cells under {out / 'cells'}: run without --report first")
        df = pd.concat([pd.read_parquet(c) for c in cells], ignore_index=True)
    if "reused_from" not in df:
        df["reused_from"] = ""
    df["reused_from"] = df["reused_from"].fillna("")
    reused = {(r.corpus, r.seq_len, r.label): r.reused_from
              for r in df[df.reused_from != ""].drop_duplicates(["corpus", "seq_len", "label"]).itertuples()}
    lines = []
    if table is not None:
        made = df.drop_duplicates(["routers_sha256", "random_layers"])
        specs = df[df.layer_top_k != ""].groupby("layer_top_k").label.unique()
        lines.append(f"# Length table `{table}`\n\nCommitted cells: `figures/results/{COMMITTED.name}`, "
                     f"rows with table == '{table}'. Router file sha256 "
                     + "; ".join(f"`{r.routers_sha256[:12]}...`" + (f", random groups in layers {r.random_layers}"
                                 if r.random_layers else "") for r in made.itertuples())
                     + "".join(f"; per-layer k `{spec}` ({', '.join(sorted(labels))})" for spec, labels in specs.items())
                     + ".")
    s = summarize(df)
    if table is None:
        from focus_lab.io import write_parquet
        write_parquet(out / "length_table.parquet", s)
    order = [p for p in PATTERNS.split(",") if p in set(s.label)]
    order += sorted(set(s.label) - set(order))  # suffixed patterns (_keyshift, _match, ...) last
    for corpus, g in s.groupby("corpus"):
        held = df[df.corpus == corpus].heldout.iloc[0]
        lines.append(f"\n**{corpus}** (held out: {held}); perplexity, change vs dense with its 95% paired "
                     "bootstrap interval over windows, distant pairs kept in brackets\n")
        lines.append("| tokens | windows | " + " | ".join(order) + " |")
        lines.append("|---:|---:|" + "---|" * len(order))
        for L, h in g.groupby("seq_len"):
            h = h.set_index("label")
            cells_ = []
            for p in order:
                if p not in h.index:
                    cells_.append("")
                    continue
                r = h.loc[p]
                c = f"{r.perplexity:.2f}"
                if p != "dense":
                    c += f" ({r.delta_vs_dense_pct:+.1f}% [{r.ci_lo:+.1f}, {r.ci_hi:+.1f}])"
                if p.startswith(("hard", "random", "shuffled")) or p == "window":
                    c += f" [{r.distant_pairs_kept:.2f}]"
                cells_.append(c)
            lines.append(f"| {L} | {int(h.windows.iloc[0])} | " + " | ".join(cells_) + " |")
        lines.append("\nRouter against the controls at equal sparsity (control's perplexity over the "
                     "router's, %, 95% interval over windows; > 0 means the router is better; where the rows "
                     f"hold block losses, \"blocks\" gives the interval over runs of {INTERVAL_BLOCK} tokens "
                     "inside these windows):\n")
        controls = ["random_top1", "shuffled_top1", "random_top2", "shuffled_top2"]
        controls += [p for p in order if p not in controls and router_of(p) in set(g.label)]
        lines.append("| tokens | " + " | ".join(p.replace("_top", " top-").replace("_", " ") for p in controls)
                     + " | tokens/s dense / hard top-1 / hard top-2 |")
        lines.append("|---:|" + "---|" * len(controls) + "---|")
        for L, h in g.groupby("seq_len"):
            h = h.set_index("label")
            c = [f"{h.loc[p].control_vs_router_pct:+.1f}% [{h.loc[p].control_ci_lo:+.1f}, {h.loc[p].control_ci_hi:+.1f}]"
                 + (f" (blocks [{h.loc[p].control_block_ci_lo:+.2f}, {h.loc[p].control_block_ci_hi:+.2f}])"
                    if not pd.isna(h.loc[p].get("control_block_ci_lo")) else "")
                 if p in h.index and not pd.isna(h.loc[p].get("control_vs_router_pct")) else ""
                 for p in controls]
            t = " / ".join((f"{h.loc[p].tokens_per_second:.0f}" + ("*" if (corpus, L, p) in reused else ""))
                           if p in h.index else "-" for p in ("dense", "hard_top1", "hard_top2"))
            lines.append(f"| {L} | " + " | ".join(c) + f" | {t} |")
        variants = [p for p in order if base_of(p) in set(g.label)]
        if variants:
            lines.append("\nSuffixed patterns against the same pattern without the suffix (paired on the "
                         "same windows, % change, 95% interval; < 0: the suffix helps):\n")
            lines.append("| tokens | " + " | ".join(f"{p} vs {base_of(p)}" for p in variants) + " |")
            lines.append("|---:|" + "---|" * len(variants))
            for L, h in df[df.corpus == corpus].groupby("seq_len"):
                cs = []
                for p in variants:
                    have = set(h.label)
                    if p in have and base_of(p) in have:
                        m, lo, hi = paired_delta(h, p, base_of(p))
                        cs.append(f"{m:+.2f}% [{lo:+.2f}, {hi:+.2f}]")
                    else:
                        cs.append("")
                lines.append(f"| {L} | " + " | ".join(cs) + " |")
        if any(k[0] == corpus for k in reused):
            lines.append("\n\\* reused from " + ", ".join(sorted({v for k, v in reused.items() if k[0] == corpus}))
                         + " (`--reuse`): measured in another run, at another time; its tokens/s do not compare "
                         "with this run's.")
    if against is not None:
        vs = pd.DataFrame(against_rows(df, against, pairs))
        lines.append(f"\nAgainst `{against}` ({'the paired pattern' if pairs else 'same pattern'} there, paired on the windows both tables have; "
                     "% change of this table's perplexity, 95% interval; < 0: this table's is better):\n")
        if len(vs):
            labels = [p for p in PATTERNS.split(",") if p in set(vs.label)]
            labels += sorted(set(vs.label) - set(labels))
            lines.append("| corpus | tokens | windows | " + " | ".join(labels) + " |")
            lines.append("|---|---:|---:|" + "---|" * len(labels))
            for (corpus, L), h in vs.groupby(["corpus", "seq_len"]):
                h = h.set_index("label")
                lines.append(f"| {corpus} | {L} | {int(h.windows.max())} | " + " | ".join(
                    f"{h.loc[p].vs_against_pct:+.2f}% [{h.loc[p].ci_lo:+.2f}, {h.loc[p].ci_hi:+.2f}]"
                    if p in h.index else "" for p in labels) + " |")
        else:
            lines.append("(no cell of the same corpus and length there)")
    return "\n".join(lines) + "\n"


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", default=None, help="gemma3-270m, an HF id or a local path; default: the embedded "
                    "SmolLM2-135M (a cell records its model)")
    ap.add_argument("--routers", type=Path, default=None, help="default: the routers shipped for the model")
    ap.add_argument("--out", type=Path, default=Path("checkpoints/length_table"))
    ap.add_argument("--corpora", default="austen,shakespeare")
    ap.add_argument("--lengths", default="512,1024,2048,4096,8192")
    ap.add_argument("--windows", default=WINDOWS, help="LENGTH:WINDOWS pairs")
    ap.add_argument("--patterns", default=PATTERNS)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--reuse", type=lambda v: [Path(x) for x in v.split(",") if x], default=None,
                    help="other tables (folders of this script's output or committed table names), "
                    "comma-separated: take from their cells, window by "
                    "window, the router-free patterns (dense, window, random_topK) and the rows made "
                    "with this router file's tensors, each row for the pattern it ran (a row that records "
                    "it: hard_top2_keyshift of one file is hard_top2 of a file whose rules hold the "
                    "shift); the first folder that has a pattern on a window wins")
    ap.add_argument("--layer-top-k", default=None, help="hard patterns: per-layer k overriding the pattern's "
                    "top_k, e.g. '1-9:0;10-14:2', or 'none' (uniform); default: the router file's (FocusConfig.layer_top_k, "
                    "else its top_k_budgets for the pattern's top_k)")
    ap.add_argument("--match-shifts", default=None, help="hard patterns: token-match pairs, e.g. '0,1' (keys "
                    "j with ids[j-s] == ids[i], docs/method.md §2.8), or 'none'; default: the router file's "
                    "(FocusConfig.match_shifts)")
    ap.add_argument("--random-layers", default=None, help="layers routed by balanced random groups "
                    "instead of the router, e.g. 1-9, or 'none'; default: the router file's (FocusConfig.random_layers)")
    ap.add_argument("--seed", type=int, default=None, help="seed of the random and shuffled groups "
                    "(FocusConfig.seed; another draw of the controls, the router unchanged); default: the "
                    "router file's")
    ap.add_argument("--against", type=Path, default=None, help="another table (a folder or a committed "
                    "table's name): report the paired change of each router pattern over the same pattern "
                    "there (same windows)")
    ap.add_argument("--against-pairs", default=None, help="with --against: compare differently named "
                    "patterns, THIS=OTHER comma-separated, e.g. 'hard_top4=hard_top2' (top-4 of 8 groups "
                    "against top-2 of 4 at the same share of distant pairs)")
    ap.add_argument("--report", action="store_true", help="only write the tables from the cells")
    ap.add_argument("--table", default=None, help="with --report: a committed table's name (e.g. shipped): "
                    "write its markdown into --out")
    ap.add_argument("--commit", default=None, metavar="NAME", help="add the cells already under --out to the "
                    f"committed file ({COMMITTED.parent.name}/{COMMITTED.name}) as table NAME; computes nothing "
                    "(run first without it), so it implies --report")
    args = ap.parse_args(argv)
    if args.table is not None and not args.report:
        ap.error("--table reports a committed table: add --report")
    if args.commit and not args.report:
        # a commit never computes: with the run's options left out, run_cells would compute the
        # default corpora's cells into --out and commit them with the run's
        print(f"--commit: committing the cells already under {args.out / 'cells'} (computing nothing)")
    elif not args.report:
        run_cells(args)
    pairs = parse_pairs(args.against_pairs)
    if pairs and args.against is None:
        ap.error("--against-pairs needs --against")
    print(report(args.out, args.against, table=args.table, pairs=pairs))
    if args.commit:
        print(f"committed {commit_table(args.out, args.commit)} rows as table {args.commit!r} in {COMMITTED}")


if __name__ == "__main__":
    main()
