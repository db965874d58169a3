"""``focus_lab.runs.Run``, the one reader of run directories: column subsets,
K, the token frame, its errors, and the dashboard's ``RunView`` reading through it. The runs here
are written by hand (a manifest and two parquet tables): no torch, no recorder."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pandas as pd
import pytest

from focus_lab.runs import MANIFEST, SCHEMA, SCHEMA_VERSION, Run, RunError, write_table


def write_run(path: Path, focus_config: dict | None = None, with_pos: bool = True) -> Path:
    path.mkdir(parents=True)
    mf = {"schema_version": SCHEMA_VERSION, "model": {"num_layers": 2}}
    if focus_config is not None:
        mf["focus_config"] = focus_config
    (path / MANIFEST).write_text(json.dumps(mf))
    tokens = pd.DataFrame({"window": [0, 0, 0], "position": [0, 1, 2], "doc": "d", "token_id": [5, 6, 7],
                           "token": ["A", " cat", "\n"], "char_start": [0, 1, 5], "char_end": [1, 5, 6]})
    tokens[list(SCHEMA["tokens"])].to_parquet(path / "tokens.parquet")
    asg = pd.DataFrame({"window": 0, "position": [0, 1, 2] * 2, "layer_idx": [0] * 3 + [1] * 3,
                        "group": [0, 2, 1, 2, 2, 0], "prob": 0.5, "margin": 1.0})
    asg.to_parquet(path / "assignments.parquet")
    if with_pos:
        pd.DataFrame({"window": 0, "position": [0, 1], "pos": ["DET", "NOUN"], "dep": ["det", "ROOT"],
                      "word": ["A", "cat"]}).to_parquet(path / "pos.parquet")
    return path


def test_columns_reads_a_subset_and_names_what_is_missing(tmp_path):
    run = Run.open(write_run(tmp_path / "r"))
    sub = run.columns("assignments", ["layer_idx", "group"])
    assert list(sub.columns) == ["layer_idx", "group"] and len(sub) == 6
    with pytest.raises(RunError, match=r"cannot be read with the columns \['group', 'nope'\]"):
        run.columns("assignments", ["group", "nope"])
    with pytest.raises(RunError, match="no table 'coverage'"):
        run.columns("coverage", ["coverage"])
    whole = run.table("assignments")  # kept: columns now slice it
    assert run.columns("assignments", ["group"])["group"].tolist() == whole["group"].tolist()
    with pytest.raises(RunError, match=r"has no columns \['nope'\]"):
        run.columns("assignments", ["nope"])
    (run.path / "tokens.parquet").write_bytes(b"PAR1 not parquet")
    with pytest.raises(RunError, match="corrupted"):
        run.table("tokens")


def test_num_groups_name_and_config(tmp_path):
    counted = Run.open(write_run(tmp_path / "a"))
    assert counted.config == {} and counted.num_groups == 3 and counted.num_layers == 2
    assert counted.name == "a"
    configured = Run.open(write_run(tmp_path / "b", focus_config={"num_groups": 8}))
    assert configured.num_groups == 8
    assert Run(configured.path, configured.manifest, name="sub/b").name == "sub/b"


def test_token_frame_joins_pos(tmp_path):
    run = Run.open(write_run(tmp_path / "r"))
    full = run.token_frame()
    assert list(full.columns) == list(SCHEMA["tokens"]) + ["pos", "dep", "word"]
    some = run.token_frame(pos_columns=("pos", "lemma"))  # lemma: not in this pos table
    assert list(some.columns) == list(SCHEMA["tokens"]) + ["pos"]
    assert some["pos"].tolist()[:2] == ["DET", "NOUN"] and pd.isna(some["pos"].iloc[2])
    bare = Run.open(write_run(tmp_path / "bare", with_pos=False))
    assert list(bare.token_frame(pos_columns=("pos",)).columns) == list(SCHEMA["tokens"])


def test_the_dashboard_reads_runs_through_run(tmp_path, monkeypatch):
    """``app.lib.RunView`` is a ``Run``: the same tables, columns, K and errors, read through the
    Streamlit caches; a re-written table is read again."""
    pytest.importorskip("streamlit")
    from focus_lab.app import lib
    path = write_run(tmp_path / "root" / "sub" / "r", focus_config={"num_groups": 4})
    view = lib.open_run("sub/r", root=tmp_path / "root")
    run = Run.open(path)
    assert isinstance(view, Run) and view.name == "sub/r" and view.path == path.resolve()
    assert view.manifest == run.manifest and view.num_groups == 4 and view.tables == run.tables
    pd.testing.assert_frame_equal(view.table("assignments"), run.table("assignments"))
    pd.testing.assert_frame_equal(view.columns("assignments", ["group"]), run.columns("assignments", ["group"]))
    pd.testing.assert_frame_equal(view.token_frame(), run.token_frame())
    with pytest.raises(RunError, match="no table 'coverage'"):
        view.table("coverage")
    with pytest.raises(RunError, match="cannot be read with the columns"):
        view.columns("assignments", ["nope"])
    tf = lib.token_frame(view)
    assert tf["pos"].tolist() == ["DET", "NOUN", "(none)"] and tf["display"].tolist() == ["A", "cat", "⏎"]
    pd.DataFrame({"window": [0], "position": [0], "layer_idx": [0], "group": [1]}).to_parquet(
        path / "assignments.parquet")
    assert len(lib.open_run("sub/r", root=tmp_path / "root").table("assignments")) == 1


def test_window_token_ids_are_the_recorded_inputs(tmp_path):
    """Each window's token ids in position order, whatever the row order on disk; a window with a
    gap in its positions is refused."""
    import numpy as np
    path = write_run(tmp_path / "r")
    tok = pd.DataFrame({"window": [1, 0, 1, 0, 0, 1], "position": [2, 1, 0, 0, 2, 1], "doc": "d",
                        "token_id": [17, 6, 15, 5, 7, 16], "token": "x", "char_start": 0, "char_end": 1})
    tok[list(SCHEMA["tokens"])].to_parquet(path / "tokens.parquet")
    ids = Run.open(path).window_token_ids()
    assert list(ids) == [0, 1]
    assert ids[0].tolist() == [5, 6, 7] and ids[1].tolist() == [15, 16, 17] and ids[0].dtype == np.int64
    tok[tok.position != 1][list(SCHEMA["tokens"])].to_parquet(path / "tokens.parquet")
    with pytest.raises(RunError, match="window 0 of the tokens table does not hold positions 0..1"):
        Run.open(path).window_token_ids()


def test_write_table_adds_a_table_and_its_manifest_entry(tmp_path):
    """write_table puts the parquet file and the manifest's entry in place (nothing else left in
    the run folder), keeps the other manifest fields, and refuses a table outside the schema or a
    folder that is not a run."""
    path = write_run(tmp_path / "r", focus_config={"num_groups": 4})
    before = json.loads((path / MANIFEST).read_text())
    df = pd.DataFrame({"label": ["dense", "hard_top2"], "perplexity": [10.0, 11.0]})
    target = write_table(path, "eval", df, {"windows": [0], "patterns": ["dense", "hard_top2"]})
    assert target == path / "eval.parquet"
    run = Run.open(path)
    pd.testing.assert_frame_equal(run.eval, df)
    assert run.manifest["eval"] == {"windows": [0], "patterns": ["dense", "hard_top2"]}
    assert run.manifest["tables"] == ["eval"]
    assert {k: v for k, v in run.manifest.items() if k not in ("eval", "tables")} == before
    assert sorted(p.name for p in path.iterdir()) == ["assignments.parquet", "eval.parquet", MANIFEST,
                                                      "pos.parquet", "tokens.parquet"]
    with pytest.raises(ValueError, match="'evaluation' is not a table of the run schema"):
        write_table(path, "evaluation", df)
    with pytest.raises(RunError, match="is not a directory"):
        write_table(tmp_path / "nope", "eval", df)


# ------------------------------------------------------------------------------------------
# docs/run_tables.md states the same tables and columns as runs.SCHEMA (one column list)

SCHEMA_DOC = Path(__file__).resolve().parent.parent / "docs" / "run_tables.md"


def doc_tables(text: str) -> dict[str, list[str]]:
    """{table: its columns in order}: each ``### `name` `` section of the document's "Tables"
    part with the first cells of its table rows ``| `column` | meaning |`` (a section without a
    table, like eval's, has no columns)."""
    part = text.split("\n## Tables\n", 1)[1].split("\n## ", 1)[0]
    out: dict[str, list[str]] = {}
    for sec in part.split("\n### ")[1:]:
        heading = sec.split("\n", 1)[0].strip()
        name = heading.strip("`") if re.fullmatch(r"`\w+`", heading) else heading  # else: no table
        assert name not in out, f"docs/run_tables.md: two sections ### {heading}"
        out[name] = re.findall(r"^\|\s*`([^`]+)`\s*\|", sec, flags=re.M)
    return out


def schema_mismatches(doc: dict[str, list[str]], schema: dict[str, tuple[str, ...]]) -> list[str]:
    """What differs between the documented tables and ``schema``, one line each, naming the
    tables and columns missing from the document, those it has in excess, and order changes."""
    out = [f"table {n}: no section ### `{n}`" for n in schema if n not in doc]
    out += [f"section ### {n}: not a table of runs.SCHEMA" for n in doc if n not in schema]
    for name in (n for n in schema if n in doc):
        want, got = list(schema[name]), doc[name]
        missing = [c for c in want if c not in got]
        extra = [c for c in got if c not in want]
        if missing or extra:
            out.append(f"table {name}: columns missing from the document {missing}, documented but not in "
                       f"runs.SCHEMA {extra}")
        elif got != want:
            out.append(f"table {name}: documented in the order {got}, runs.SCHEMA has {want}")
    return out


def test_docs_tables_are_the_schema():
    doc = doc_tables(SCHEMA_DOC.read_text())
    assert len(doc) == len(SCHEMA) >= 19
    problems = schema_mismatches(doc, SCHEMA)
    assert not problems, "docs/run_tables.md disagrees with runs.SCHEMA:\n" + "\n".join(problems)


def test_docs_check_fails_on_each_kind_of_difference():
    """The comparison above can fail: a dropped, an added, a reordered column, a missing and an
    unknown section are each reported by name."""
    text = SCHEMA_DOC.read_text()
    assert "| `soft_share` |" in text and "### `patterns`" in text

    def problems(t: str) -> str:
        return "\n".join(schema_mismatches(doc_tables(t), SCHEMA))

    dropped = re.sub(r"^\| `soft_share` \|.*\n", "", text, flags=re.M)
    assert "table balance" in problems(dropped) and "missing from the document ['soft_share']" in problems(dropped)
    added = text.replace("| `hard_share` |", "| `bogus_share` | an undocumented column |\n| `hard_share` |", 1)
    assert "runs.SCHEMA ['bogus_share']" in problems(added)
    rows = re.findall(r"^\| `(?:layer_idx|group)` \|.*\n", text.split("### `balance`")[1], flags=re.M)[:2]
    swapped = text.replace(rows[0] + rows[1], rows[1] + rows[0], 1)
    assert swapped != text and "table balance: documented in the order" in problems(swapped)
    untitled = problems(text.replace("### `patterns`", "### Patterns maps"))
    assert "table patterns: no section" in untitled and "### Patterns maps: not a table" in untitled
    assert "### pattern_maps: not a table of runs.SCHEMA" in problems(text.replace("### `patterns`",
                                                                                    "### `pattern_maps`"))
    assert problems(text) == ""


def test_dropped_mass_by_distance_hand_checked():
    """Two heads, buckets [0,128) [128,512) [512,1024): dropped = mass - kept_mass per bucket,
    averaged over heads; far = buckets starting at >= 512."""
    import pandas as pd
    from focus_lab.runs import RunError, dropped_mass_by_distance
    rows = []
    # layer 0: head 0 drops 0.0 / 0.1 / 0.3, head 1 drops 0.0 / 0.2 / 0.0 -> dropped 0.3, far 0.15
    for head, drops in ((0, (0.0, 0.1, 0.3)), (1, (0.0, 0.2, 0.0))):
        for (lo, hi), d in zip(((0, 128), (128, 512), (512, 1024)), drops):
            rows.append(dict(layer_idx=0, head=head, pattern="focus", distance_lo=lo, distance_hi=hi,
                             mass=0.5, kept_mass=0.5 - d))
            rows.append(dict(layer_idx=0, head=head, pattern="window", distance_lo=lo, distance_hi=hi,
                             mass=0.5, kept_mass=0.0))
    # layer 1 drops nothing: share undefined
    rows.append(dict(layer_idx=1, head=0, pattern="focus", distance_lo=512, distance_hi=1024, mass=0.2,
                     kept_mass=0.2))
    df = dropped_mass_by_distance(pd.DataFrame(rows), 512)
    r0, r1 = df.set_index("layer_idx").loc[0], df.set_index("layer_idx").loc[1]
    assert r0.dropped_mass == pytest.approx(0.3) and r0.far_dropped_mass == pytest.approx(0.15)
    assert r0.far_share == pytest.approx(0.5)
    assert r1.dropped_mass == 0 and pd.isna(r1.far_share)
    assert dropped_mass_by_distance(pd.DataFrame(rows), 128).set_index("layer_idx").loc[0].far_share == pytest.approx(1.0)
    with pytest.raises(RunError, match="random"):
        dropped_mass_by_distance(pd.DataFrame(rows), 512, pattern="random")
