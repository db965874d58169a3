"""End to end on the real embedded model (SmolLM2-135M from its PyPI GGUF) and real Austen text:
train 2 steps, eval, record, evaluate the recorded window into the run, open the run — through the
CLI a researcher uses."""

import pandas as pd
import pytest
from typer.testing import CliRunner

from focus_lab.cli import app
from focus_lab.runs import Run

pytestmark = pytest.mark.slow


def test_train_eval_record_open_on_embedded_model(tmp_path):
    runner = CliRunner()
    ck = tmp_path / "ck"
    common = ["--seq-len", "192"]
    r = runner.invoke(app, ["train", "--out", str(ck), "--steps", "2", "--batch-size", "1",
                            "--window", "64", "--checkpoint-every", "1", *common])
    assert r.exit_code == 0, r.output
    assert "trained 278400 router parameters for 2 steps" in r.output  # 30 x (576*16 + 4*16)
    log = pd.read_parquet(ck / "train_log.parquet")
    assert sorted(log.step.unique()) == [0, 1] and log.layer_idx.nunique() == 30
    assert (ck / "checkpoint" / "routers.safetensors").is_file()

    r = runner.invoke(app, ["eval", "--routers", str(ck / "routers.safetensors"), "--max-windows", "1", *common])
    assert r.exit_code == 0, r.output
    ev = pd.read_parquet(ck / "eval.parquet").set_index("label")
    assert list(ev.index) == ["dense", "window", "soft", "hard_top1", "hard_top2", "hard_top3", "hard_top4"]
    assert 2 < ev.loc["dense", "perplexity"] < 200  # a real pretrained model on real English
    # top-K keeps every pair: exactly dense; the window alone loses context
    assert ev.loc["hard_top4", "perplexity"] == pytest.approx(ev.loc["dense", "perplexity"], rel=1e-4)
    assert ev.loc["hard_top4", "distant_pairs_kept"] == 1.0
    assert ev.loc["hard_top1", "distant_pairs_kept"] < ev.loc["hard_top2", "distant_pairs_kept"] < 1.0

    out = tmp_path / "runs" / "r"
    r = runner.invoke(app, ["record", "--routers", str(ck / "routers.safetensors"), "--out", str(out),
                            "--max-windows", "1", *common])
    assert r.exit_code == 0, r.output
    run = Run.open(out)
    assert {"tokens", "assignments", "pos", "eval", "train_log"} <= set(run.tables)
    tok = run.tokens
    assert len(tok) == 192 and tok.doc.unique().tolist() == ["persuasion"]
    asg = run.assignments
    assert len(asg) == 192 * 30 and asg.group.between(0, 3).all()
    assert run.manifest["focus_config"]["mode"] == "dense"  # record audits the dense model by default
    assert run.manifest["model"]["num_layers"] == 30
    pos = run.token_frame()
    assert (pos.pos != "").mean() > 0.5  # most tokens belong to a spaCy word

    # the copied tables name their source; eval --run replaces the copied eval by the recorded window's
    assert run.manifest["copied_tables"] == {"eval": str(ck / "eval.parquet"), "train_log": str(ck / "train_log.parquet")}
    assert "shipped" not in run.manifest["routers"]  # a file trained here, not the shipped one
    r = runner.invoke(app, ["eval", "--run", str(out), "--patterns", "dense,hard_top2"])
    assert r.exit_code == 0, r.output
    run = Run.open(out)
    ev = run.eval.set_index("label")
    assert list(ev.index) == ["dense", "hard_top2"] and run.manifest["eval"]["windows"] == [0]
    ld = run.loss_delta  # the recorder's own per-token losses of the same window
    assert ev.loc["dense", "nll"] == pytest.approx(ld.nll_dense.mean(), abs=1e-4)
    assert ev.loc["hard_top2", "nll"] == pytest.approx(ld.nll_hard.mean(), abs=1e-4)
