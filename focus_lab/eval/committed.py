"""The committed results of a router file, read from the tables a checkout ships in
``figures/results/``: the retrieval suite (``retrieval_cases*.parquet``) and the passkey probe
(``passkey_cases.parquet`` with its sidecar ``passkey_tables.json``), each summarized per
(task or format, length, pattern) and labelled with where it came from (the router file's
manifest name and sha256, the command that made the rows, the page that documents them).

Used by the dashboard's Retrieval and Passkey pages when the runs root holds no output of their
own, and meant for generated result blocks in the docs: pandas and the standard library only (no
torch, no streamlit). The summaries reuse the probes' own readers
(``retrieval_tables.summary``: the paired 95% bootstrap over cases); the passkey probe has no
interval of its own, so its summary gives counts (hits, and of dense's hits on the same cases how
many the pattern keeps), not an interval.

Raises ``NoCommittedResults`` (a ``FileNotFoundError``) when the folder, a table or the router
file's rows are absent: e.g. focus-lab installed from a wheel, without ``figures/``.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path

import pandas as pd

import focus_lab
from focus_lab.eval.retrieval_tables import summary as retrieval_table_summary
from focus_lab.hf.shipped import registry
from focus_lab.model_names import EMBEDDED

#: the checkout holding the installed package (``pip install -e .``); its committed results folder
REPO = Path(focus_lab.__file__).resolve().parent.parent
RESULTS = REPO / "figures" / "results"

#: How the committed retrieval tables were made: suite runs of ``focus-lab probe retrieval``
#: merged into the table (a (task, length, seed, pattern) it already holds keeps its row;
#: ``analyses/studies/retrieval_table.py``). Every run's own command: ``RETRIEVAL_DOCS``.
RETRIEVAL_COMMAND = ("focus-lab probe retrieval --out <run>, merged with "
                     "python -m analyses.studies.retrieval_table --add <run> --device <machine>")
RETRIEVAL_DOCS = "docs/results.md#retrieval-beyond-passkey"
PASSKEY_DOCS = "docs/passkey_reference.md#measured-with-the-shipped-routers"
#: a committed probe table becomes one with this command (``analyses/exp_passkey.py``)
PASSKEY_COMMIT = "python -m analyses.exp_passkey --run <out> --commit {table}"

#: what identifies one passkey case across tables (the case seed fixes key and haystack start)
PASSKEY_CASE = ["format", "length", "depth", "seed", "key"]
#: prompt settings two probe tables must share for their cases to be the same cases
PASSKEY_SAME_PROMPT = ("prompt_version", "haystack", "max_new_tokens", "needle", "question", "answer_prefix")


class NoCommittedResults(FileNotFoundError):
    """No committed result to read: the results folder, a table, or the router file's rows in
    it are absent. The message names what is missing."""


@dataclass(frozen=True)
class CommittedSource:
    """Where a committed result comes from.

    kind: ``"retrieval"`` or ``"passkey"``.
    table: the table's path relative to the repository root (posix), e.g.
        ``figures/results/retrieval_cases.parquet``.
    router_name: the router file's name in ``focus_lab/routers/MANIFEST.json``
        (``focus-lab routers list``).
    router_sha256: that file's sha256 (64 hex digits; from the manifest, or the probe table's
        sidecar for passkey).
    commands: the command(s) that made the rows, one per committed run (passkey: one per probe
        table, rebuilt from its settings in ``passkey_tables.json``; retrieval: one line for the
        merged suite runs, ``RETRIEVAL_COMMAND``).
    docs: the page (repository-relative, with anchor) that documents the rows and every command.
    commit: the commit of the code that made the rows when the table records one (a ``commit``
        column with one value), else None: the committed tables predate that column.
    tables: passkey only: the committed probe tables (``table`` column) of this router file.
    reference_tables: passkey only: the tables the dense rows come from (dense does not depend on
        the router file; same prompt settings and cases).
    """

    kind: str
    table: str
    router_name: str
    router_sha256: str
    commands: tuple[str, ...]
    docs: str
    commit: str | None = None
    tables: tuple[str, ...] = field(default=())
    reference_tables: tuple[str, ...] = field(default=())

    @property
    def command(self) -> str:
        """The commands as one line, ``"; "``-separated."""
        return "; ".join(self.commands)

    def label(self) -> str:
        """One line: ``router file `NAME` (sha256 <first 12>)``, with the commit when known."""
        out = f"router file `{self.router_name}` (sha256 {self.router_sha256[:12]})"
        return out + (f", code at commit {self.commit}" if self.commit else "")


@dataclass(frozen=True)
class CommittedResult:
    """A committed result: its ``source``, the ``cases`` it is made of (the table's rows, one per
    case and pattern, columns as the probe writes them) and their ``summary`` (see
    ``committed_retrieval`` / ``committed_passkey`` for the columns). Treat the frames as
    read-only."""

    source: CommittedSource
    cases: pd.DataFrame
    summary: pd.DataFrame


# ---------------------------------------------------------------------------------------------
# the folder and the router file

def results_dir(results: str | Path | None = None) -> Path:
    """The committed results folder: ``results`` if given, else ``figures/results`` of the
    checkout holding the installed package. Raises NoCommittedResults when it is not a folder."""
    p = Path(results) if results is not None else RESULTS
    if not p.is_dir():
        raise NoCommittedResults(f"no committed results: {p} is not a folder (focus-lab installed without "
                                 "its figures/ folder; a git checkout has them)")
    return p




def router_file(router: str | None = None, model: str | None = None) -> tuple[str, str]:
    """(manifest name, sha256) of a router file: ``router`` by its manifest name, or by default the
    file shipped for ``model`` (None: the embedded SmolLM2-135M, ``EMBEDDED``).

    Raises NoCommittedResults: no manifest, an unknown name, or a model no file ships for."""
    reg = registry()
    files = reg.get("files", {})
    if router is None:
        shipped = reg.get("shipped", {})
        model = model if model is not None else EMBEDDED
        if model not in shipped:
            raise NoCommittedResults(f"no router file ships for model {model!r} (shipped: {sorted(shipped)})")
        router = shipped[model]
    if router not in files:
        raise NoCommittedResults(f"no router file {router!r} in the manifest ({', '.join(sorted(files))}; "
                                 "'focus-lab routers list')")
    return router, files[router]["sha256"]


def _relative(path: Path) -> str:
    """``path`` relative to the repository root when inside it, else as given (posix)."""
    try:
        return path.resolve().relative_to(REPO).as_posix()
    except ValueError:
        return path.as_posix()


def _read(path: Path, columns: list[str] | None = None) -> pd.DataFrame:
    if not path.is_file():
        raise NoCommittedResults(f"no committed table {path}")
    return pd.read_parquet(path, columns=columns)


def _commit(df: pd.DataFrame) -> str | None:
    """The ``commit`` column's one value, else None (absent, empty or several)."""
    if "commit" not in df.columns:
        return None
    vals = df["commit"].dropna().unique()
    return str(vals[0]) if len(vals) == 1 else None


# ---------------------------------------------------------------------------------------------
# retrieval

def retrieval_tables(results: str | Path | None = None) -> list[Path]:
    """The committed retrieval case tables: ``retrieval_cases.parquet`` (the shipped file's) first,
    then ``retrieval_cases_<sha256 prefix>.parquet`` (earlier files'), by name."""
    d = results_dir(results)
    main = d / "retrieval_cases.parquet"
    return ([main] if main.is_file() else []) + sorted(d.glob("retrieval_cases_*.parquet"))


def retrieval_summary(cases: pd.DataFrame) -> pd.DataFrame:
    """``retrieval_tables.summary`` of retrieval suite rows (per task, length and pattern, in the
    rows' order; score relative to dense with a paired 95% bootstrap interval over the cases both
    ran), with ``canonical_pattern`` after ``pattern`` when the rows carry it (the pattern as it
    ran under the router file's config; one per label)."""
    s = retrieval_table_summary(cases)
    if "canonical_pattern" in cases.columns and len(s):
        canon = cases.drop_duplicates("pattern").set_index("pattern")["canonical_pattern"]
        s.insert(s.columns.get_loc("pattern") + 1, "canonical_pattern", s["pattern"].map(canon))
    return s


def committed_retrieval(router: str | None = None, results: str | Path | None = None,
                        model: str | None = None) -> CommittedResult:
    """The committed retrieval suite of a router file (default: the shipped file), from the first
    of ``retrieval_tables(results)`` holding rows with its ``router_name``.

    Returns a CommittedResult:
      - ``cases``: the table's rows of that router file (one per task, length, seed and pattern:
        ``score`` = RULER's share of the expected answers in the greedy output, 0..1;
        ``answer_logprob`` in nats, teacher forced; ``distant_pairs_kept`` 0..1; ``device``;
        ``canonical_pattern``), in the table's order;
      - ``summary``: ``retrieval_summary(cases)``, one row per (task, length, pattern): task,
        length (tokens), pattern, canonical_pattern, cases (count), score (mean), relative,
        relative_lo, relative_hi (mean score over dense's on the cases both ran, paired 95%
        bootstrap interval), logprob (nats), logprob_change / _lo / _hi (against dense, nats),
        distant_pairs_kept, needle_pairs_kept, needle_mass_kept (0..1), seconds (per case),
        cost_ratio, dense_score, dense_below_half (dense under 50%: the ratio says little);
      - ``source``: table, router name and sha256 (from the manifest: the table records the name),
        ``RETRIEVAL_COMMAND``, ``RETRIEVAL_DOCS``.

    Raises NoCommittedResults: no results folder or table, an unknown router, or no table with
    rows of that router file (the message lists the router files the tables hold)."""
    name, sha = router_file(router, model)
    held = {}
    for path in retrieval_tables(results):
        names = _read(path, ["router_name"])["router_name"]
        held[path.name] = sorted(names.dropna().unique())
        if (names == name).any():
            df = _read(path)
            cases = df[df["router_name"] == name].reset_index(drop=True)
            source = CommittedSource(kind="retrieval", table=_relative(path), router_name=name, router_sha256=sha,
                                     commands=(RETRIEVAL_COMMAND,), docs=RETRIEVAL_DOCS, commit=_commit(cases))
            return CommittedResult(source=source, cases=cases, summary=retrieval_summary(cases))
    raise NoCommittedResults(f"no committed retrieval rows of router file {name!r} in {results_dir(results)} "
                             f"(tables and their router files: {held or 'no retrieval_cases*.parquet'})")


# ---------------------------------------------------------------------------------------------
# passkey

def passkey_command(entry: dict, table: str, shipped: bool = True, router: str | None = None) -> str:
    """The ``focus-lab probe passkey`` command that made a committed probe table, rebuilt from its
    entry in ``passkey_tables.json`` (lengths, depths, keys, first seed, formats, pattern labels,
    config overrides), then the command that committed it as ``table``, e.g.
    ``focus-lab probe passkey --lengths 4096 --depths 0,25,50,75,100 --keys 6 --seed 6 --patterns
    hard_top2 --out <out>; python -m analyses.exp_passkey --run <out> --commit NAME``.
    ``shipped``: the table ran the shipped file (no ``--routers``); else ``--routers router``."""
    s = entry.get("settings", {}) if isinstance(entry.get("settings"), dict) else {}
    parts = ["focus-lab probe passkey"]
    if not shipped and router:
        parts.append(f"--routers {router}")
    if entry.get("lengths"):
        parts.append("--lengths " + ",".join(str(int(x)) for x in entry["lengths"]))
    if entry.get("depths"):
        parts.append("--depths " + ",".join(f"{float(x):g}" for x in entry["depths"]))
    if s.get("keys") is not None:
        parts.append(f"--keys {s['keys']}")
    if s.get("seed"):
        parts.append(f"--seed {s['seed']}")
    formats = entry.get("formats") or []
    if formats and list(formats) != ["chat"]:
        parts.append("--formats " + ",".join(formats))
    pats = [p[0] if isinstance(p, (list, tuple)) else str(p) for p in s.get("patterns", [])]
    if pats:
        parts.append("--patterns " + ",".join(pats))
    over = s.get("config_overrides") if isinstance(s.get("config_overrides"), dict) else {}
    if over.get("layer_top_k"):
        spec = ";".join(f"{layer}:{k}" for layer, k in sorted(over["layer_top_k"].items(), key=lambda kv: int(kv[0])))
        parts.append(f"--layer-top-k '{spec}'")
    if "random_layers" in over:
        parts.append("--random-layers " + (",".join(map(str, over["random_layers"])) or "none"))
    return " ".join(parts + ["--out <out>"]) + "; " + PASSKEY_COMMIT.format(table=table)


def passkey_summary(cases: pd.DataFrame, by: tuple[str, ...] = ()) -> pd.DataFrame:
    """Passkey rows summarized per (format, length, *by, pattern), in the rows' first-seen order
    of format and pattern, lengths and ``by`` sorted (``by``: e.g. ``("depth",)``).

    Columns: the keys, cases (count), hits (exact matches), exact_match (hits / cases, 0..1),
    key_logprob (mean, nats; teacher forced, summed over the key's tokens, 0 = certain),
    distant_pairs_kept and needle_edges_kept (means, 0..1), and, paired on the same cases
    (``PASSKEY_CASE``), dense_hits (cases of the group dense retrieves; NA without dense rows)
    and dense_hits_kept (of those, the ones the pattern retrieves too)."""
    keys = ["format", "length", *by, "pattern"]
    c = cases.assign(exact_match=cases["exact_match"].astype(bool))
    dense = c[c["pattern"] == "dense"][PASSKEY_CASE + ["exact_match"]].rename(columns={"exact_match": "dense_hit"})
    if len(dense):
        c = c.merge(dense.drop_duplicates(PASSKEY_CASE), on=PASSKEY_CASE, how="left")
    else:
        c = c.assign(dense_hit=pd.NA)
    c = c.assign(both=c["exact_match"] & c["dense_hit"].fillna(False).astype(bool))
    g = c.groupby(keys, sort=False)
    tab = g.agg(cases=("exact_match", "size"), hits=("exact_match", "sum"), exact_match=("exact_match", "mean"),
                key_logprob=("key_logprob", "mean"), distant_pairs_kept=("distant_pairs_kept", "mean"),
                needle_edges_kept=("needle_edges_kept", "mean")).reset_index()
    paired = g.agg(dense_hits=("dense_hit", lambda s: int(s.fillna(False).astype(bool).sum()) if s.notna().any()
                               else pd.NA),
                   dense_hits_kept=("both", "sum")).reset_index()
    tab = tab.merge(paired, on=keys)
    tab["hits"] = tab["hits"].astype(int)
    tab["dense_hits"] = tab["dense_hits"].astype("Int64")
    tab["dense_hits_kept"] = tab["dense_hits_kept"].astype("Int64").where(tab["dense_hits"].notna())
    order = {col: {v: i for i, v in enumerate(dict.fromkeys(cases[col]))} for col in ("format", "pattern")}
    tab = tab.sort_values(keys, key=lambda s: s.map(order[s.name]) if s.name in order else s, kind="stable")
    return tab.reset_index(drop=True)


def committed_passkey(router: str | None = None, results: str | Path | None = None,
                      model: str | None = None) -> CommittedResult:
    """The committed passkey probe tables of a router file (default: the shipped file): every table
    in ``passkey_tables.json`` whose settings name that file's sha256 (``settings.routers.sha256``),
    plus dense rows of the same cases (``PASSKEY_CASE``) from the other tables with the same prompt
    settings (dense does not depend on the router file; the first table by name gives a case's
    row), as docs/passkey_reference.md does.

    Returns a CommittedResult:
      - ``cases``: ``passkey_cases.parquet``'s rows (one per format, length, depth, seed and
        pattern; ``exact_match`` bool, ``key_logprob`` nats, ``distant_pairs_kept`` and
        ``needle_edges_kept`` 0..1; ``table`` names the committed table of the row), the dense
        rows taken from other tables first, then the router file's tables in name order;
      - ``summary``: ``passkey_summary(cases)`` per (format, length, pattern);
      - ``source``: ``figures/results/passkey_cases.parquet``, router name and sha256, one
        ``passkey_command`` per table of the router file, ``PASSKEY_DOCS``, ``tables`` and
        ``reference_tables`` (those of the dense rows).

    Raises NoCommittedResults: no results folder, table or sidecar, an unknown router, or no
    committed table of that router file (the message lists the sha256 prefixes they hold)."""
    name, sha = router_file(router, model)
    d = results_dir(results)
    meta_path, cases_path = d / "passkey_tables.json", d / "passkey_cases.parquet"
    if not meta_path.is_file():
        raise NoCommittedResults(f"no committed passkey tables: {meta_path} is missing")
    meta = json.loads(meta_path.read_text())

    def settings(t: str) -> dict:
        s = meta.get(t, {}).get("settings", {})
        return s if isinstance(s, dict) else {}

    own = sorted(t for t in meta if (settings(t).get("routers") or {}).get("sha256") == sha)
    if not own:
        held = sorted({(settings(t).get("routers") or {}).get("sha256", "")[:12] for t in meta})
        raise NoCommittedResults(f"no committed passkey table of router file {name!r} (sha256 {sha[:12]}) in "
                                 f"{meta_path} (its tables ran sha256 {', '.join(held)})")
    df = _read(cases_path)
    # a table that ran dense alone (e.g. the prompt-format comparison) measures no router file
    routed = set(df.loc[df["pattern"] != "dense", "table"])
    own = [t for t in own if t in routed] or own
    mine = df[df["table"].isin(own)]
    if mine.empty:
        raise NoCommittedResults(f"{cases_path} holds no rows of the tables {own} listed in {meta_path}")
    prompt = {k: settings(own[0]).get(k) for k in PASSKEY_SAME_PROMPT}
    others = [t for t in sorted(meta) if t not in own and {k: settings(t).get(k) for k in PASSKEY_SAME_PROMPT} == prompt]
    case_keys = mine[PASSKEY_CASE].drop_duplicates()
    have = mine[mine["pattern"] == "dense"][PASSKEY_CASE]
    dense = df[df["table"].isin(others) & (df["pattern"] == "dense")]
    dense = dense.assign(_order=dense["table"].map({t: i for i, t in enumerate(others)}))
    dense = (dense.sort_values("_order", kind="stable").drop(columns="_order").merge(case_keys, on=PASSKEY_CASE)
             .drop_duplicates(PASSKEY_CASE))
    if len(have):
        dense = dense.merge(have.assign(_have=True), on=PASSKEY_CASE, how="left")
        dense = dense[dense["_have"].isna()].drop(columns="_have")
    dense = dense[df.columns]
    # the dense rows of the other tables first (dense leads every comparison), then the router's
    # own tables in name order, each as written
    mine = mine.assign(_order=mine["table"].map({t: i for i, t in enumerate(own)}))
    mine = mine.sort_values("_order", kind="stable").drop(columns="_order")
    cases = pd.concat([dense, mine], ignore_index=True)
    shipped = name in registry().get("shipped", {}).values()
    source = CommittedSource(kind="passkey", table=_relative(cases_path), router_name=name, router_sha256=sha,
                             commands=tuple(passkey_command(meta[t], t, shipped, name) for t in own),
                             docs=PASSKEY_DOCS, commit=_commit(mine), tables=tuple(own),
                             reference_tables=tuple(dict.fromkeys(dense["table"])))
    return CommittedResult(source=source, cases=cases, summary=passkey_summary(cases))
