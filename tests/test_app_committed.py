"""The dashboard's Retrieval and Passkey pages under streamlit's AppTest on a runs root without
probe output (what the main job leaves): they show the committed results of the shipped router
file (figures/results/, focus_lab.eval.committed), labelled with the file's manifest name, its
sha256 and the command that made them; checked against cells computed here from the parquet.
Without a committed results folder they say so, and show no figure."""

from __future__ import annotations

import json
from pathlib import Path

import pandas as pd
import pytest

import focus_lab.app
from run_fixtures import decode
from focus_lab.app import lib
from focus_lab.eval import committed

MAIN = Path(focus_lab.app.__file__).parent / "main.py"
REPO = Path(__file__).resolve().parents[1]
RESULTS = REPO / "figures" / "results"
MANIFEST = json.loads((REPO / "focus_lab" / "routers" / "MANIFEST.json").read_text())
SHIPPED = MANIFEST["shipped"]["smollm2-135m-instruct"]
SHIPPED_SHA = MANIFEST["files"][SHIPPED]["sha256"]
st_testing = pytest.importorskip("streamlit.testing.v1")


def open_page(root: Path, page: str, monkeypatch):
    monkeypatch.setenv("FOCUS_LAB_RUNS", str(root))
    at = st_testing.AppTest.from_file(str(MAIN), default_timeout=120)
    at.run()
    at.switch_page(f"app_pages/{page}.py")
    at.run()
    assert not at.exception, [e.value for e in at.exception]
    assert not at.error, [e.value for e in at.error]
    return at


@pytest.fixture()
def empty_root(tmp_path):
    (tmp_path / "main-job").mkdir()  # a folder that is neither a run nor a probe output
    return tmp_path


def test_retrieval_page_shows_the_committed_suite_of_the_shipped_file(empty_root, monkeypatch):
    at = open_page(empty_root, "retrieval", monkeypatch)
    info = " ".join(i.value for i in at.info)
    assert f"No retrieval output under `{empty_root.resolve()}`" in info
    assert f"router file `{SHIPPED}` (sha256 {SHIPPED_SHA[:12]})" in info
    assert committed.RETRIEVAL_COMMAND in info and "figures/results/retrieval_cases.parquet" in info
    assert lib.RETRIEVAL_HINT in info  # how to make one's own
    # the grid at 4096 tokens: one cell computed here from the parquet (paired on the same seeds)
    assert int(at.selectbox(key="retrieval_length").value) == 4096
    grid = json.loads(at.get("plotly_chart")[0].proto.spec)["data"][0]
    raw = pd.read_parquet(RESULTS / "retrieval_cases.parquet")
    c = raw[(raw.task == "niah_single_1") & (raw.length == 4096)]
    p = c[c.pattern == "hard_top2"].set_index("seed").score
    d = c[c.pattern == "dense"].set_index("seed").score
    i = [y.split(" (")[0] for y in grid["y"]].index("niah_single_1")
    j = list(grid["x"]).index("hard_top2")
    assert decode(grid["z"])[i, j] == pytest.approx(p.mean() / d.loc[p.index].mean())
    tab = at.dataframe[0].value
    row = tab[(tab.task == "passkey") & (tab.pattern == "hard_top2")].iloc[0]
    want = raw[(raw.task == "passkey") & (raw.length == 4096) & (raw.pattern == "hard_top2")]
    assert row["cases"] == len(want) and row["score"] == pytest.approx(want.score.mean())
    assert row["canonical_pattern"] == want["canonical_pattern"].iloc[0]
    # the other length
    at.selectbox(key="retrieval_length").set_value(8192).run()
    assert not at.exception
    assert set(at.dataframe[0].value["task"]) == set(raw[raw.length == 8192].task)


def test_passkey_page_shows_the_committed_tables_of_the_shipped_file(empty_root, monkeypatch):
    at = open_page(empty_root, "passkey", monkeypatch)
    info = " ".join(i.value for i in at.info)
    assert f"No passkey output under `{empty_root.resolve()}`" in info
    assert f"router file `{SHIPPED}` (sha256 {SHIPPED_SHA[:12]})" in info and lib.PASSKEY_HINT in info
    code = "\n".join(c.value for c in at.code)
    assert "focus-lab probe passkey --lengths 4096" in code and "--commit capacity_8k" in code
    assert any("capacity_4k" in c.value for c in at.caption)
    # the heatmaps: one panel per pattern, dense first; the table's counts computed here
    fig = json.loads(at.get("plotly_chart")[0].proto.spec)
    assert [a["text"] for a in fig["layout"]["annotations"][:2]] == ["dense", "hard_top2"]
    raw = pd.read_parquet(RESULTS / "passkey_cases.parquet")
    mine = raw[raw.table.str.startswith("capacity_4k") & (raw.pattern == "hard_top2")]
    tab = at.dataframe[0].value
    row = tab[(tab.pattern == "hard_top2") & (tab.length == 4096)].iloc[0]
    assert (row["cases"], row["hits"]) == (len(mine), int(mine.exact_match.sum())) == (60, 59)
    assert row["key_logprob"] == pytest.approx(mine.key_logprob.mean())


def test_without_committed_results_the_pages_say_so(empty_root, monkeypatch):
    monkeypatch.setattr(committed, "RESULTS", empty_root / "figures" / "results")  # installed elsewhere
    for page, hint in (("retrieval", lib.RETRIEVAL_HINT), ("passkey", lib.PASSKEY_HINT)):
        at = open_page(empty_root, page, monkeypatch)
        info = " ".join(i.value for i in at.info)
        assert hint in info and "No committed result to show" in info and "not a folder" in info
        assert not at.get("plotly_chart")
