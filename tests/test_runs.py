"""``focus_lab.runs.Run``, the one reader of run directories (issue 17 item 3): column subsets,
K, the token frame, its errors, and the dashboard's ``RunView`` reading through it. The runs here
are written by hand (a manifest and two parquet tables): no torch, no recorder."""

from __future__ import annotations

import json
from pathlib import Path

import pandas as pd
import pytest

from focus_lab.runs import MANIFEST, SCHEMA, SCHEMA_VERSION, Run, RunError

APP = Path(__file__).resolve().parent.parent / "focus_lab" / "app"


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
    monkeypatch.syspath_prepend(str(APP))
    import lib
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
