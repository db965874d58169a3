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


def _committed(ctx: Context) -> list[pd.DataFrame]:
    """The committed probe tables (``figures/results/passkey_cases.parquet``, one ``table`` per run
    of ``focus-lab probe passkey``) made with the routers in use (sha256 in their settings) and
    their own configuration: a run with ``--layer-top-k`` / ``--random-layers`` (``config_overrides``
    in its settings) measures another pattern under the same label, so it is left out.

    Rows that do not depend on the router file (``length_table.router_free``: dense, and random
    groups unless a per-layer k changed them) are added from the other committed tables for the
    cases those tables share (same prompt settings, format, length, depth, case seed and key) when
    the router's own tables lack that pattern there, so the figure compares patterns on the same
    cases; ``source`` names the table each row comes from."""
    from analyses.length_table import router_free
    tables = _tables()
    own = [name for name, s, _ in tables
           if s.get("routers", {}).get("sha256") == ctx.router_id() and not s.get("config_overrides")]
    if not own:
        return []
    first = next(s for name, s, _ in tables if name == own[0])
    prompt = {k: first.get(k) for k in SAME_PROMPT}
    mine = [df.assign(source=name) for name, _, df in tables if name in own]
    cases = pd.concat(mine)[CASE].drop_duplicates()
    extra = [df[df["pattern"].map(lambda p, s=s: router_free(p, (s.get("config_overrides") or {}).get("layer_top_k")))]
             .merge(cases, on=CASE).assign(source=name)
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
    from focus_lab.eval.evaluate import parse_patterns
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
        new.insert(0, "table", name)
        old = pd.read_parquet(results / dst) if (results / dst).is_file() else new.iloc[:0]
        write_parquet(results / dst, pd.concat([old[old["table"] != name], new], ignore_index=True))
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
