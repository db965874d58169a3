"""Give the committed result tables (``figures/results/``) the columns every table now records:
``canonical_pattern`` (the rules each row ran, ``focus_lab.patterns``) and ``router_name`` (the
router file by its manifest name), beside the labels they were written with.

A label of these tables meant the router file's rules changed by its suffixes
(``focus_lab.patterns.legacy``). What a row ran is resolved from what the row itself records
(its per-layer k, token-match shifts, capacity and random layers in force: the length cells), or
from its router file's rules, known for the files the manifest names (their ``default_pattern``).
A row made with a file the manifest does not name, whose rules the row does not record, keeps
``canonical_pattern`` empty (None) rather than a guess. Idempotent; each file is rewritten
atomically.

    python -m analyses.migrate_tables            # rewrite the committed tables
    python -m analyses.migrate_tables --check    # exit 1 when a table lacks the columns
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import pandas as pd

from focus_lab.eval.retrieval import MOBA
from focus_lab.hf.router_files import rules_config
from focus_lab.hf.shipped import named_file, registry
from focus_lab.io import write_parquet
from focus_lab.method.config import FocusConfig, parse_int_list, parse_layer_top_k
from focus_lab.patterns import Pattern, legacy_label_pattern
from focus_lab.patterns.legacy import legacy_changes, split_legacy
from focus_lab.patterns.rules.capacity import Capacity
from focus_lab.patterns.rules.key_shift import KeyShift
from focus_lab.patterns.rules.layer_top_k import LayerTopK
from focus_lab.patterns.rules.match import Match
from focus_lab.patterns.rules.random_layers import RandomLayers

RESULTS = Path(__file__).resolve().parents[1] / "figures" / "results"
COLUMNS = ("canonical_pattern", "router_name")
# the tables whose rows ran with one router file each, by how the table names it
SHIPPED = "smollm2-135m/needle-mix-capacity"
ONE_FILE = {"retrieval_cases.parquet": SHIPPED, "retrieval_cases_5710775e.parquet": "smollm2-135m/soup-budget",
            "retrieval_trace.parquet": SHIPPED, "retrieval_trace_5710775e.parquet": "smollm2-135m/soup-budget"}
PER_ROW = ("length_cells.parquet", "copy_loss.parquet", "copy_pairs.parquet", "copy_pairs_cap.parquet",
           "copy_pairs_layers.parquet")
# needle_mix_cases: its column ``routers`` names the run; "plain" (the same steps without needles) is
# a file the manifest does not name
NEEDLE_MIX = {"needle_mix": "smollm2-135m/needle-mix", "plain": None}
# tables whose rows hold no one pattern get the router file's name only: passkey_needle_layers (each
# row holds the uniform top-1 and top-2 masks' kept edges) and layer_budget (a sweep row changes one
# layer of its study's base budget; its study page spells the variants)
ROUTER_ONLY = ("passkey_needle_layers.parquet", "layer_budget.parquet")


TABLES = set(ONE_FILE) | set(PER_ROW) | set(ROUTER_ONLY) | {"passkey_cases.parquet", "needle_mix_cases.parquet"}


def columns_of(name: str) -> tuple[str, ...]:
    """The columns the migration gives table ``name``."""
    return ("router_name",) if name in ROUTER_ONLY else COLUMNS


def file_config(name: str) -> FocusConfig:
    """The FocusConfig a named router file carries, from the manifest: its window, sinks and
    default pattern as the file's rules (``rules_config``)."""
    f = registry()["files"][name]
    base = FocusConfig(num_groups=4, window=f["window"], sink_tokens=f["sink_tokens"])
    return rules_config(base, Pattern.parse(f["default_pattern"]))


def label_pattern(label: str, config: FocusConfig | None) -> str | None:
    """The canonical pattern of a legacy ``label`` under a file's ``config`` (None: unknown file:
    only dense and window, which no rule touches, resolve)."""
    if label in ("dense", "window", MOBA):  # no rule touches them (MoBA: not a pattern of groups)
        return label
    if config is None:
        return None
    return str(legacy_label_pattern(label, config))


def cell_pattern(row, config: FocusConfig | None) -> str | None:
    """A length cell's canonical pattern from what the cell records (``layer_top_k``,
    ``match_shifts``, ``capacity``, ``random_layers`` in force) and its label's head and key
    shift; the file's random layers and key shift where the row leaves them to the file (None
    when that file is not named)."""
    label = row.label
    if label in ("dense", "window"):
        return label
    head, suffix = split_legacy(label)
    ch = legacy_changes(label, 64)  # any k: the cell's own columns say what ran
    mode = ch["mode"]
    assignment = ch.get("assignment", "router")
    rules = []
    if mode == "hard":
        k = ch["top_k"]
        if getattr(row, "layer_top_k", ""):
            r = LayerTopK.from_mapping(parse_layer_top_k(row.layer_top_k), k)
            rules += [r] if r else []
        cap = getattr(row, "capacity", "") or ""
        if cap and assignment == "router":
            share, _, rest = cap.partition("@")
            layers, _, overflow = rest.partition(":")
            rules.append(Capacity(float(share), None if layers == "all" else tuple(parse_int_list(layers)), overflow))
        elif suffix.get("group_capacity") and assignment == "router":  # a cell made before its capacity column
            layers = suffix.get("capacity_layers")
            rules.append(Capacity(float(suffix["group_capacity"]), None if layers is None else tuple(layers),
                                  suffix.get("capacity_overflow", "second")))
    else:
        k = None
    shifts = getattr(row, "match_shifts", "") or ""
    if shifts and mode == "hard":
        s, _, latest = shifts.partition("@")
        rules.append(Match(tuple(parse_int_list(s)), int(latest or 0)))
    rl = getattr(row, "random_layers", "") or ""
    if rl == "":
        if config is None:
            return None
        layers = tuple(config.random_layers or ())
    else:
        layers = () if rl == "none" else tuple(parse_int_list(rl))
    if layers and assignment != "random":
        rules.append(RandomLayers(layers))
    if "key_shift" in suffix:
        shift = suffix["key_shift"]
    elif config is None:
        return None
    else:
        shift = config.key_shift
    if shift:
        rules.append(KeyShift())
    return str(Pattern(mode, assignment, k, tuple(rules)))


def migrate(df: pd.DataFrame, name: str, passkey_tables: dict) -> pd.DataFrame:
    """``df`` (the committed table ``name``) with ``canonical_pattern`` and ``router_name``."""
    configs: dict[str, FocusConfig | None] = {}

    def config_of(router: str | None) -> FocusConfig | None:
        if router not in configs:
            configs[router] = file_config(router) if isinstance(router, str) and router else None
        return configs[router]

    label_col = "label" if "label" in df else "pattern"
    out = df.drop(columns=[c for c in COLUMNS if c in df])
    if name == "needle_mix_cases.parquet":
        out["router_name"] = out["routers"].map(NEEDLE_MIX)
        out["canonical_pattern"] = [label_pattern(lab, config_of(r)) for lab, r in zip(out[label_col], out["router_name"])]
    elif name == "passkey_needle_layers.parquet":
        by = {t: named_file(((passkey_tables.get(t, {}).get("settings", {}).get("routers")) or {}).get("sha256", ""))
              for t in out["table"].unique()}
        out["router_name"] = out["table"].map(by)
    elif name == "layer_budget.parquet":
        shas = out["routers_sha256"].fillna("")
        out["router_name"] = shas.map({s: named_file(s) if s else None for s in shas.unique()})
    elif name in ONE_FILE:
        router = ONE_FILE[name]
        out["router_name"] = router
        cache = {lab: label_pattern(lab, config_of(router)) for lab in out[label_col].unique()}
        out["canonical_pattern"] = out[label_col].map(cache)
    elif name == "passkey_cases.parquet":
        names, pats = [], []
        for table, g in out.groupby("table", sort=False):
            st = passkey_tables.get(table, {}).get("settings", {})
            router = named_file((st.get("routers") or {}).get("sha256", ""))
            cfg = config_of(router)
            if cfg is not None and st.get("config_overrides"):
                over = dict(st["config_overrides"])
                if "layer_top_k" in over:
                    over["layer_top_k"] = {int(a): b for a, b in over["layer_top_k"].items()}
                cfg = cfg.replace(**over)
            cache = {lab: label_pattern(lab, cfg) for lab in g[label_col].unique()}
            names.append(pd.Series(router, index=g.index))
            pats.append(g[label_col].map(cache))
        out["router_name"] = pd.concat(names).reindex(out.index)
        out["canonical_pattern"] = pd.concat(pats).reindex(out.index)
    else:
        shas = out["routers_sha256"].fillna("")
        routers = {s: named_file(s) if s else None for s in shas.unique()}
        out["router_name"] = shas.map(routers)
        if name == "length_cells.parquet":
            out["canonical_pattern"] = [cell_pattern(r, config_of(routers[s]))
                                        for r, s in zip(out.itertuples(), shas)]
        else:
            out["canonical_pattern"] = [label_pattern(lab, config_of(routers[s]))
                                        for lab, s in zip(out[label_col], shas)]
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--results", type=Path, default=RESULTS)
    ap.add_argument("--check", action="store_true", help="only say which tables lack the columns")
    a = ap.parse_args(argv)
    passkey_tables = json.loads((a.results / "passkey_tables.json").read_text())
    missing = 0
    for name in sorted(TABLES):
        path = a.results / name
        df = pd.read_parquet(path)
        want = columns_of(name)
        if a.check:
            if not set(want) <= set(df.columns):
                print(f"{path}: no {', '.join(c for c in want if c not in df)}; "
                      "rewrite it with `python -m analyses.migrate_tables`", file=sys.stderr)
                missing += 1
            continue
        out = migrate(df, name, passkey_tables)
        write_parquet(path, out)
        n = len(out)
        resolved = int(out["canonical_pattern"].notna().sum()) if "canonical_pattern" in want else 0
        print(f"{name}: {resolved if 'canonical_pattern' in want else '-'} of {n} rows resolved "
              f"({out['router_name'].notna().sum()} with a named router file)")
    return 1 if missing else 0


if __name__ == "__main__":
    raise SystemExit(main())
