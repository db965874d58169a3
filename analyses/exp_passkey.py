"""Experiment ``passkey``: ``make_data(ctx)`` makes ``<out>/data/passkey.parquet`` (run and cached by
``analyses/figures.py``, ``focus-lab-figures``). Read by ``analyses/fig_passkey.py``,
``analyses/table_reproduction.py``.

``python -m analyses.exp_passkey --run runs/passkey --commit NAME`` adds a ``focus-lab probe
passkey`` run to the committed probe tables (``figures/results/passkey_*``) as table NAME.
"""

from __future__ import annotations

import json
from pathlib import Path

import pandas as pd

from analyses.common import PASSKEY_TABLES, Context


CASE = ["format", "length", "depth", "seed", "key"]
REPO = PASSKEY_TABLES.parent.parent
SAME_PROMPT = ("prompt_version", "haystack", "max_new_tokens", "needle", "question", "answer_prefix")


def _tables() -> list[tuple[str, dict, pd.DataFrame]]:
    """Every committed probe table: (its name, its settings from ``passkey_tables.json``, cases
    from ``passkey_cases.parquet`` without the ``table`` column), in name order."""
    meta_path, cases_path = PASSKEY_TABLES / "passkey_tables.json", PASSKEY_TABLES / "passkey_cases.parquet"
    if not meta_path.is_file() or not cases_path.is_file():
        return []
    meta = json.loads(meta_path.read_text())
    cases = pd.read_parquet(cases_path)
    return [(name, meta[name].get("settings", {}),
             cases[cases["table"] == name].drop(columns="table").reset_index(drop=True)) for name in sorted(meta)]


def _run_spec(settings: dict, pattern: str, cfg, own_sha: str) -> str | None:
    """The per-layer k a committed probe run gave ``pattern`` (``length_table.spec_in_force``):
    the run's ``--layer-top-k`` if it set one, else its router file's budget, which is ``cfg``'s
    for the file ``own_sha`` and none for any other (``shipped.same_router_shas``: the file before
    its budget was saved). None for a run with ``--random-layers``: another pattern
    under the same label."""
    from analyses.length_table import spec_in_force
    over = settings.get("config_overrides") or {}
    if "random_layers" in over:
        return None
    from focus_lab.hf.shipped import capacity_only_shas
    run_sha = settings.get("routers", {}).get("sha256")
    own = run_sha == own_sha or run_sha in capacity_only_shas(own_sha)  # the same budget
    base = cfg if own else cfg.replace(top_k_budgets=None)
    if "layer_top_k" in over:
        base = base.replace(layer_top_k=over["layer_top_k"])
    return spec_in_force(base, pattern)


def _committed(ctx: Context, cfg=None) -> list[pd.DataFrame]:
    """The committed probe tables (``figures/results/passkey_cases.parquet``, one ``table`` per run
    of ``focus-lab probe passkey``) that measured the routers in use as they run now: made with
    this router file, or with one differing only in its budget (``shipped.same_router_shas``) or
    its group capacity (``shipped.capacity_only_shas``: only the patterns the capacity does not
    touch), and only the patterns that ran with the per-layer k they have now (``_run_spec`` against
    ``length_table.spec_in_force``; a run with ``--random-layers`` is left out).

    Rows that do not depend on the router file (dense and window, and random groups under the same
    per-layer k) are added from the other committed tables for the cases those tables share (same
    prompt settings, format, length, depth, case seed and key) when the router's own tables lack
    that pattern there, so the figure compares patterns on the same cases; ``source`` names the
    table each row comes from. ``cfg``: the router file's FocusConfig (default: read from it)."""
    from analyses.length_table import capacity_in_force, router_free, spec_in_force
    from focus_lab.hf.retrofit import read_router_file
    from focus_lab.hf.shipped import capacity_only_shas, same_router_shas
    tables = _tables()
    sha = ctx.router_id()
    cfg = read_router_file(ctx.routers())[0] if cfg is None else cfg
    capacity_only = capacity_only_shas(sha)
    shas = {sha} | same_router_shas(sha) | capacity_only

    def same(df: pd.DataFrame, settings: dict) -> pd.Series:
        # a file differing only in the capacity ran every pattern without it (the probe's runs
        # predate the capacity): its rows count where this file's capacity does not apply
        no_cap = settings.get("routers", {}).get("sha256") in capacity_only
        return df["pattern"].map(lambda p: _run_spec(settings, p, cfg, sha) == spec_in_force(cfg, p)
                                 and not (no_cap and capacity_in_force(cfg, p)))

    mine = [df[same(df, s)].assign(source=name) for name, s, df in tables
            if s.get("routers", {}).get("sha256") in shas]
    mine = [df for df in mine if len(df)]
    if not mine:
        return []
    first = next(s for name, s, _ in tables if name == mine[0]["source"].iloc[0])
    prompt = {k: first.get(k) for k in SAME_PROMPT}
    cases = pd.concat(mine)[CASE].drop_duplicates()
    own = {df["source"].iloc[0] for df in mine}
    extra = [df[df["pattern"].map(router_free) & same(df, s)].merge(cases, on=CASE).assign(source=name)
             for name, s, df in tables if name not in own and {k: s.get(k) for k in SAME_PROMPT} == prompt]
    # the router's own rows first: a pattern of a case is taken once, from the first table that has it
    rows = pd.concat(mine + extra, ignore_index=True).drop_duplicates(CASE + ["pattern"], keep="first")
    for name, g in rows.groupby("source", sort=False):
        ctx.log(f"  [passkey] committed table {name!r}: {sorted(g['pattern'].unique())}, {len(g)} rows"
                + ("" if name in own else " (router-free, on the router's cases)"))
    return [rows]


def make_data(ctx: Context) -> pd.DataFrame:
    """Passkey retrieval (``passkey.run_passkey``) on held-out Austen haystacks: one row per case
    (length, depth, pattern, seed: exact match, key log-prob in nats, distant pairs kept,
    needle edges kept). Full settings: the committed tables of ``focus-lab probe passkey`` runs
    with the same routers (``figures/results/passkey_*``), else the probe at ``settings.passkey_*``
    (``chat`` prompt format; quick: ``bare``, the tiny tokenizer has no chat template)."""
    if not ctx.quick:
        frames = _committed(ctx)
        if frames:
            return pd.concat(frames, ignore_index=True)
    from focus_lab.patterns.legacy import parse_legacy_patterns as parse_patterns
    from focus_lab.eval.passkey import load_haystack, run_passkey
    from focus_lab.hf.retrofit import load_routers
    s = ctx.settings
    model = ctx.model()
    cfg = load_routers(model, ctx.routers())
    corp = ctx.corpus("austen")
    hay = load_haystack(corp.heldout, ctx.tokenizer, name="austen held-out")
    res = run_passkey(model, ctx.tokenizer, hay, ctx.data / "passkey_run", lengths=list(s.passkey_lengths),
                      depths=list(s.passkey_depths), patterns=parse_patterns(s.passkey_patterns, cfg.num_groups),
                      keys=s.passkey_keys, formats=("bare",) if ctx.quick else ("chat",),
                      settings={"routers": {"path": str(ctx.routers()), "sha256": ctx.router_id()}},
                      log=ctx.log)
    return res["cases"].assign(source="passkey_run")


def commit_run(run: Path, name: str, results: Path = PASSKEY_TABLES) -> int:
    """Add a ``focus-lab probe passkey`` run to the committed probe tables as table ``name``:
    its ``cases.parquet`` and ``needle_layers.parquet`` rows (with a ``table`` column) to
    ``passkey_cases.parquet`` / ``passkey_needle_layers.parquet`` and its ``passkey.json``
    (less the file list; a router path inside the repository made relative) to
    ``passkey_tables.json``. Rows of an earlier table of that name are replaced; each file is
    written atomically.

    Args: run: the probe's ``--out`` folder; name: the table's name; results: the folder of the
        committed files. Returns: the number of case rows written.
    Raises: SystemExit naming a missing file of the run, or an empty name.
    """
    from focus_lab.io import with_table
    from focus_lab.io import write_json, write_parquet
    run, results = Path(run), Path(results)
    if not name.strip():
        raise SystemExit("--commit needs a table name, e.g. shipped_4k")
    need = [run / f for f in ("passkey.json", "cases.parquet", "needle_layers.parquet")]
    missing = [str(p) for p in need if not p.is_file()]
    if missing:
        raise SystemExit(f"{run} is not a finished 'focus-lab probe passkey' run: missing {', '.join(missing)}")
    meta = json.loads(need[0].read_text())
    meta.pop("files", None)
    routers = meta.get("settings", {}).get("routers", {})
    path = Path(routers.get("path", ""))
    if path.is_absolute() and path.is_relative_to(REPO):
        routers["path"] = str(path.relative_to(REPO))
    n = 0
    for src, dst in ((need[1], "passkey_cases.parquet"), (need[2], "passkey_needle_layers.parquet")):
        new = pd.read_parquet(src)
        write_parquet(results / dst, with_table(results / dst, new, name))
        n = n or len(new)
    tables_path = results / "passkey_tables.json"
    tables = json.loads(tables_path.read_text()) if tables_path.is_file() else {}
    tables[name] = meta
    write_json(tables_path, dict(sorted(tables.items())))
    return n


def main(argv=None) -> None:
    import argparse
    ap = argparse.ArgumentParser(description="Add a 'focus-lab probe passkey' run to the committed probe "
                                 "tables (figures/results/passkey_*).")
    ap.add_argument("--run", type=Path, required=True, help="the probe's --out folder")
    ap.add_argument("--commit", required=True, metavar="NAME", help="the table's name")
    args = ap.parse_args(argv)
    n = commit_run(args.run, args.commit)
    print(f"committed {n} cases as table {args.commit!r} in {PASSKEY_TABLES}")


if __name__ == "__main__":
    main()
