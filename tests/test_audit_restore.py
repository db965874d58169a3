"""The audit page's restored drops and group ablation (app_pages/audit.py), on a tiny recorded run
whose restored_drops / group_ablation tables come from focus_lab.recording.restore; the numbers
shown are checked against the tables."""

from __future__ import annotations

import json
import re
import shutil
from pathlib import Path

import numpy as np
import pytest

import focus_lab
import focus_lab.app
from focus_lab.recording.restore import group_ablation_table, restored_drops_table, write_intervention_table
from focus_lab.runs import Run
from run_fixtures import make_tiny_run

st_testing = pytest.importorskip("streamlit.testing.v1")
MAIN = Path(focus_lab.app.__file__).parent / "main.py"


@pytest.fixture(scope="module")
def runs_root(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("runs")
    path = make_tiny_run(root / "tiny", with_eval=False, with_train_log=False)
    shutil.copytree(path, root / "plain")
    from focus_lab.hf.models import load_model
    run = Run.open(path)
    model, _ = load_model(str(path.parent / ".tiny-assets" / "model"), verbose=False)
    focus_lab.load_routers(model, run.manifest["routers"]["path"])
    write_intervention_table(path, "restored_drops", restored_drops_table(model, run, top_n=4, progress=False), {})
    write_intervention_table(path, "group_ablation", group_ablation_table(model, run, [1], progress=False), {})
    return root


def _audit(runs_root, monkeypatch, run: str):
    monkeypatch.setenv("FOCUS_LAB_RUNS", str(runs_root))
    at = st_testing.AppTest.from_file(str(MAIN), default_timeout=120)
    at.query_params["run"] = run
    at.run()
    at.switch_page("app_pages/audit.py")
    at.run()
    assert not at.exception, [e.value for e in at.exception]
    return at


def test_restored_drops_beside_the_costly_drops_and_the_group_ablation_chart(runs_root, monkeypatch):
    at = _audit(runs_root, monkeypatch, "tiny")
    rd = Run.open(runs_root / "tiny").table("restored_drops")
    line = next(m.value for m in at.markdown if m.value.startswith("**Restored drops**"))
    q1, med, q3 = np.quantile(rd["recovered"], [0.25, 0.5, 0.75])
    assert f"median **{med:+.1%}** (quartiles {q1:+.1%} to {q3:+.1%})" in line
    block = next(m.value for m in at.html if 'class="fl-costly"' in m.value)
    rows = block.split("<tr>")[2:]
    cells = [re.search(r'<span title="layer (\d+), key position (\d+)"><b>([+-]\d+)%</b>', r) for r in rows]
    shown = [c for c in cells if c]
    assert len(shown) == len(rd) == 4  # the four restored queries (ranks 1-4), '-' on the others
    for c, r in zip(shown, rd.sort_values("query_rank").itertuples()):
        assert (int(c.group(1)), int(c.group(2))) == (r.layer_idx, r.key_position)
        assert int(c.group(3)) == int(f"{r.recovered:+.0%}".rstrip("%"))
    # the group ablation: bars are the table's mean loss changes, per part of speech and group
    at.number_input(key="ablation_min_tokens").set_value(1).run()
    fig = next(json.loads(c.proto.spec) for c in at.get("plotly_chart")
               if "loss change when one group is cut" in json.dumps(json.loads(c.proto.spec)["layout"].get("title")))
    ab = Run.open(runs_root / "tiny").table("group_ablation")
    for trace in fig["data"]:
        g = int(trace["name"])
        want = ab[ab.group == g].set_index("pos")["delta"]
        ys = trace["y"]
        ys = np.frombuffer(__import__("base64").b64decode(ys["bdata"]), dtype=ys["dtype"]) if isinstance(ys, dict) \
            else np.asarray(ys)
        assert np.allclose(ys, want.loc[trace["x"]].to_numpy())


def test_a_run_without_them_says_how_to_make_them(runs_root, monkeypatch):
    at = _audit(runs_root, monkeypatch, "plain")
    infos = [i.value for i in at.info]
    assert any("group_ablation" in i and "analyses.studies.restored_drops" in i for i in infos)
    assert any("Restore the costly drops" in i for i in infos)
    assert not any(m.value.startswith("**Restored drops**") for m in at.markdown)
