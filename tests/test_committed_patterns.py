"""The committed result tables record, beside their legacy labels, the pattern each row ran
(``canonical_pattern``) and its router file by name (``router_name``); the patterns re-parse, and
the length cells' patterns are the rules each cell records in its own columns."""

from pathlib import Path

import pandas as pd
import pytest

from analyses.migrate_tables import TABLES, columns_of, file_config
from focus_lab.method.config import FocusConfig, format_int_list, parse_int_list, parse_layer_top_k
from focus_lab.patterns import Pattern, legacy_label_pattern

RESULTS = Path(__file__).resolve().parent.parent / "figures" / "results"


@pytest.fixture(scope="module")
def tables():
    return {name: pd.read_parquet(RESULTS / name, columns=None if "trace" not in name else
                                  ["pattern", "canonical_pattern", "router_name"]) for name in sorted(TABLES)}


def test_every_committed_table_records_its_patterns(tables):
    for name, df in tables.items():
        assert set(columns_of(name)) <= set(df.columns), f"{name}: run python -m analyses.migrate_tables"
        assert df["router_name"].notna().any(), name
        if "canonical_pattern" not in columns_of(name):
            continue  # rows that hold no one pattern (two masks a row; a study's sweep)
        pats = df["canonical_pattern"].dropna().unique()
        assert len(pats), name
        for p in pats:
            if p != "moba_matched":
                assert str(Pattern.parse(p)) == p, (name, p)  # one spelling, re-parsed
    # rows whose rules are known: all but those of router files the manifest does not name
    resolved = {n: df["canonical_pattern"].notna().mean() for n, df in tables.items() if "canonical_pattern" in df}
    assert resolved["retrieval_cases.parquet"] == resolved["retrieval_cases_5710775e.parquet"] == 1.0
    assert resolved["retrieval_trace.parquet"] == resolved["retrieval_trace_5710775e.parquet"] == 1.0
    # a trace row's pattern is its case's: the same label means the same pattern in both tables
    for a, b in (("retrieval_trace.parquet", "retrieval_cases.parquet"),
                 ("retrieval_trace_5710775e.parquet", "retrieval_cases_5710775e.parquet")):
        ta = tables[a].drop_duplicates("pattern").set_index("pattern")["canonical_pattern"]
        tb = tables[b].drop_duplicates("pattern").set_index("pattern")["canonical_pattern"]
        assert ta.to_dict() == tb.loc[ta.index].to_dict()
    assert resolved["length_cells.parquet"] > 0.75 and resolved["passkey_cases.parquet"] > 0.7


def test_length_cells_patterns_are_the_rules_each_cell_recorded(tables):
    """Independent of the migration's code path: each cell's per-layer k, token-match shifts and
    capacity (its own columns; a cell made before the capacity column: its label's ``_cap`` /
    ``_evict`` suffix) equal what its canonical pattern does in every layer."""
    from focus_lab.patterns.legacy import split_legacy
    df = tables["length_cells.parquet"]
    df = df[df.canonical_pattern.notna() & df.canonical_pattern.str.startswith(("hard_", "random_", "shuffled_"))]
    assert len(df) > 3000
    for (pat, spec, shifts, cap, label), g in df.groupby(["canonical_pattern", "layer_top_k", "match_shifts", "capacity",
                                                          "label"]):
        suffix = split_legacy(label)[1]
        if not cap and suffix.get("group_capacity"):  # e.g. hard_top2_cap70@14: 0.7 in layer 14, its other rules the file's
            layers = suffix["capacity_layers"]
            cap = (f"{suffix['group_capacity']:g}@{'all' if layers is None else format_int_list(layers)}:"
                   f"{suffix['capacity_overflow']}")
        p = Pattern.parse(pat)
        cfg = FocusConfig(num_groups=8).replace(**p.changes())
        want = parse_layer_top_k(spec) if spec else {}
        assert all(cfg.top_k_at(i) == want.get(i, p.top_k) for i in range(30)), (pat, spec)
        s, _, latest = shifts.partition("@")
        assert (cfg.match_shifts or []) == (parse_int_list(s) if s else []), (pat, shifts)
        assert cfg.match_latest == int(latest or 0)
        if cap and p.assignment == "router":
            share, _, rest = cap.partition("@")
            layers, _, overflow = rest.partition(":")
            assert (cfg.group_capacity, cfg.capacity_overflow) == (float(share), overflow), (pat, cap)
            assert cfg.capacity_layers == (None if layers == "all" else parse_int_list(layers))
        else:
            assert cfg.group_capacity == 0.0, (pat, cap)


def test_named_files_rows_are_their_labels_under_the_files_rules(tables):
    """A row of a named router file: its label under that file's rules (the manifest's default
    pattern), e.g. the shipped file's hard_top2 is its default with the capacity."""
    r = tables["retrieval_cases.parquet"]
    by = r.groupby("pattern")["canonical_pattern"].first()
    shipped = file_config("smollm2-135m/needle-mix-capacity")
    assert by["hard_top2"] == str(Pattern.parse("default", shipped))
    assert by["hard_top2_nocap"] == str(Pattern.parse("default", shipped)).replace(
        "capacity(0.5,layers=[13,15-16,21,25,28-29],evict)+", "")
    assert by["random_top2"] == str(Pattern.parse("random_default", shipped))
    for name in ("copy_loss.parquet", "passkey_cases.parquet"):
        t = tables[name].dropna(subset=["router_name"])
        for (router, label), g in t.groupby(["router_name", "pattern"]):
            if name == "passkey_cases.parquet":
                continue  # a table's overrides change the file's rules: checked by the migration
            assert set(g["canonical_pattern"]) == {str(legacy_label_pattern(label, file_config(router)))}
