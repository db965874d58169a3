"""The dashboard's Retrieval page under streamlit's AppTest, on the committed retrieval suite output
(figures/results/retrieval_*.parquet, measured on the embedded model): the grid, the case view and
the layer x head map checked against values computed here from the parquet files."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

import focus_lab.app
from run_fixtures import decode
from focus_lab.app import lib

MAIN = Path(focus_lab.app.__file__).parent / "main.py"
REPO = Path(__file__).resolve().parents[1]
st_testing = pytest.importorskip("streamlit.testing.v1")


@pytest.fixture(scope="module")
def root(tmp_path_factory):
    r = tmp_path_factory.mktemp("runs")
    out = r / "suites" / "retrieval"
    out.mkdir(parents=True)
    shutil.copy(REPO / "figures/results/retrieval_cases.parquet", out / "cases.parquet")
    shutil.copy(REPO / "figures/results/retrieval_trace.parquet", out / "trace.parquet")
    (r / "empty").mkdir()
    return r


def open_page(root, monkeypatch):
    monkeypatch.setenv("FOCUS_LAB_RUNS", str(root))
    at = st_testing.AppTest.from_file(str(MAIN), default_timeout=120)
    at.run()
    at.switch_page("app_pages/retrieval.py")
    at.run()
    assert not at.exception, [e.value for e in at.exception]
    return at


def test_retrieval_outputs_are_found_and_are_not_runs(root):
    assert lib.retrieval_dirs(root) == ["suites/retrieval"]
    assert lib.passkey_dirs(root) == []


def test_grid_case_and_dropped_map_follow_the_parquet(root, monkeypatch):
    cases = pd.read_parquet(root / "suites/retrieval/cases.parquet")
    trace = pd.read_parquet(root / "suites/retrieval/trace.parquet")
    at = open_page(root, monkeypatch)
    assert not at.error, [e.value for e in at.error]
    figs = [json.loads(c.proto.spec) for c in at.get("plotly_chart")]
    grid = figs[0]["data"][0]
    L = int(at.selectbox(key="retrieval_length").value)
    assert L == 4096
    c = cases[cases.length == L]
    # an independent ratio: mean score of the pattern over mean dense score, on the same seeds
    task, pat = "niah_single_1", "hard_top2"
    d = c[(c.task == task) & (c.pattern == "dense")].set_index("seed").score
    p = c[(c.task == task) & (c.pattern == pat)].set_index("seed").score
    want = p.mean() / d.loc[p.index].mean()
    z = decode(grid["z"])
    i = [y.split(" (")[0] for y in grid["y"]].index(task)
    j = list(grid["x"]).index(pat)
    assert z[i, j] == pytest.approx(want)
    # a task where dense scores below 50% is marked, and not coloured
    k = [y.split(" (")[0] for y in grid["y"]].index("cwe")
    assert "dense < 50%" in grid["y"][k] and np.isnan(z[k]).all()
    # the case view: the chosen pattern's dropped needle mass per layer and head
    at.selectbox(key="retrieval_task").set_value("niah_multikey_1").run()
    at.selectbox(key="retrieval_seed").set_value(0).run()
    # (hard top-2 without the capacity: the committed suite's pattern on every task)
    at.selectbox(key="retrieval_pattern").set_value("hard_top2_nocap").run()
    assert not at.exception
    figs = [json.loads(c.proto.spec) for c in at.get("plotly_chart")]
    heat = figs[1]["data"][0]
    t = trace[(trace.task == "niah_multikey_1") & (trace.length == L) & (trace.seed == 0)
              & (trace.pattern == "hard_top2_nocap")]
    piv = (t.dense_mass - t.mass_kept).to_numpy().reshape(t.layer_idx.nunique(), t["head"].nunique())
    assert decode(heat["z"]) == pytest.approx(piv.astype(float), abs=1e-6)
    assert figs[1]["data"][1]["name"].startswith("retrieval head")  # marked
    shown = [m.value for m in at.markdown]
    row = cases[(cases.task == "niah_multikey_1") & (cases.length == L) & (cases.seed == 0)].iloc[0]
    assert any(row.expected in s for s in shown)
    assert any("[[" in c.value for c in at.code)  # the needle in its haystack


def test_no_output_says_how_to_make_one(tmp_path, monkeypatch):
    (tmp_path / "x").mkdir()
    at = open_page(tmp_path, monkeypatch)
    assert any(lib.RETRIEVAL_HINT in i.value for i in at.info)
