"""The main job's pieces on the tiny model: ``focus-lab eval --run`` evaluates exactly the windows a
run recorded and writes its table into the run; ``focus-lab quickstart`` records, evaluates into
the run and prints its stage times; ``scripts/quickstart.sh`` hands its own stage times over.

The reference for the eval table is the recorder's own ``loss_delta`` table (per-token NLL under
dense and hard top-k attention, computed by ``record_run``, not by ``evaluate``)."""

from __future__ import annotations

import json
import math
import os
import shutil
import subprocess
from pathlib import Path

import pytest

from focus_lab.hf import shipped
from typer.testing import CliRunner

from focus_lab import cli
from focus_lab.runs import Run
from run_fixtures import make_tiny_run

REPO = Path(__file__).resolve().parent.parent
PATTERNS = cli.QUICKSTART_PATTERNS.split(",")


@pytest.fixture(scope="module")
def recorded(tmp_path_factory) -> Path:
    """A tiny run as ``focus-lab record`` leaves it (no eval or train_log table)."""
    root = tmp_path_factory.mktemp("runs")
    return make_tiny_run(root / "tiny", with_eval=False, with_train_log=False, with_pos=False)


def fresh_copy(recorded: Path, tmp_path: Path) -> Path:
    run = tmp_path / "run"
    shutil.copytree(recorded, run)
    return run


def invoke(*args: str):
    return CliRunner().invoke(cli.app, list(args))


def one_error_line(res, *fragments: str) -> None:
    assert res.exit_code == 2, res.output
    lines = res.output.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: ") and "Traceback" not in res.output, res.output
    for f in fragments:
        assert f in lines[0], (f, lines[0])


def test_eval_run_writes_the_table_of_every_recorded_window_into_the_run(recorded, tmp_path):
    run_dir = fresh_copy(recorded, tmp_path)
    res = invoke("eval", "--run", str(run_dir), "--patterns", cli.QUICKSTART_PATTERNS)
    assert res.exit_code == 0, res.output
    run = Run.open(run_dir)
    ev = run.eval
    ld = run.loss_delta
    windows = run.manifest["windows"]
    T = run.manifest["seq_len"]
    assert windows >= 2 and ev["label"].tolist() == PATTERNS
    assert (ev["tokens"] == windows * (T - 1)).all() and len(ld) == windows * (T - 1)
    by = ev.set_index("label")
    # the recorder's per-token losses over the same windows: dense, and hard at the run's top-k (2)
    assert run.config["top_k"] == 2
    assert by.loc["dense", "nll"] == pytest.approx(ld["nll_dense"].mean(), abs=1e-5)
    # 'default' is the router file's hard top-2, the rules the recorder ran
    assert by.loc["default", "nll"] == pytest.approx(ld["nll_hard"].mean(), abs=1e-5)
    assert by.loc["dense", "perplexity"] == pytest.approx(math.exp(ld["nll_dense"].mean()), rel=1e-5)
    assert by.loc["default_top1", "distant_pairs_kept"] < by.loc["default", "distant_pairs_kept"] < 1.0
    # each row names the rules that ran, the router file and the code
    assert by.loc["random_default", "canonical_pattern"].startswith("random_top2")
    assert (ev["router_sha256"] == run.manifest["routers"]["sha256"]).all() and ev["commit"].str.len().min() > 0
    entry = run.manifest["eval"]
    assert entry["windows"] == list(range(windows)) and entry["patterns"] == PATTERNS and entry["seq_len"] == T
    assert entry["routers_sha256"] == run.manifest["routers"]["sha256"]
    assert entry["command"] == f"focus-lab eval --run {run_dir} --patterns {cli.QUICKSTART_PATTERNS}"
    assert "eval" in run.manifest["tables"]
    assert not [p.name for p in run_dir.iterdir() if p.name.startswith(".")]  # no temporary left


def test_eval_run_max_windows_takes_the_first_recorded_windows(recorded, tmp_path):
    run_dir = fresh_copy(recorded, tmp_path)
    res = invoke("eval", "--run", str(run_dir), "--patterns", "dense,hard_top2", "--max-windows", "1")
    assert res.exit_code == 0, res.output
    run = Run.open(run_dir)
    first = run.loss_delta.query("window == 0")
    by = run.eval.set_index("label")
    assert by.loc["dense", "tokens"] == len(first)
    assert by.loc["dense", "nll"] == pytest.approx(first["nll_dense"].mean(), abs=1e-5)
    assert by.loc["hard_top2", "nll"] == pytest.approx(first["nll_hard"].mean(), abs=1e-5)
    assert run.manifest["eval"]["windows"] == [0]


def test_eval_run_refuses_bad_input_in_one_line(recorded, tmp_path):
    run_dir = fresh_copy(recorded, tmp_path)
    one_error_line(invoke("eval", "--run", str(run_dir), "--seq-len", "64", "--routers", "x.safetensors"),
                   "--run takes the model, router file and windows from the run", "drop --routers, --seq-len")
    one_error_line(invoke("eval", "--run", str(tmp_path / "nothing")), "is not a directory")
    one_error_line(invoke("eval", "--run", str(run_dir), "--max-windows", "0"), "--max-windows 0: at least one")
    one_error_line(invoke("eval", "--run", str(run_dir), "--patterns", "dense,hard_top9"), "hard_top9")
    mf = json.loads((run_dir / "manifest.json").read_text())
    router_file = Path(mf["routers"]["path"])
    changed = tmp_path / "changed.safetensors"
    changed.write_bytes(router_file.read_bytes() + b" ")
    for path, fragment in ((tmp_path / "gone.safetensors", "which is missing here"),
                           (changed, "changed since run")):
        mf["routers"]["path"] = str(path)
        (run_dir / "manifest.json").write_text(json.dumps(mf))
        one_error_line(invoke("eval", "--run", str(run_dir)), fragment)
    assert not (run_dir / "eval.parquet").exists()


def test_record_keeps_the_shipped_routers_provenance():
    """``routers.shipped`` of a run recorded with the shipped file: its MANIFEST.json entry
    (read here directly) with the model name; nothing for any other file."""
    from focus_lab.io import file_sha256
    from focus_lab.hf.shipped import MANIFEST, shipped_router_file
    name = next(iter(json.loads(MANIFEST.read_text())["shipped"]))
    entry = shipped.manifest()[name]
    assert entry["name"] == json.loads(MANIFEST.read_text())["shipped"][name]
    assert file_sha256(shipped_router_file(name)) == entry["sha256"]
    assert cli._shipped_provenance(entry["sha256"]) == {"model": name, **entry}
    assert cli._shipped_provenance("0" * 64) is None


def test_quickstart_records_then_evaluates_into_the_run_and_prints_stage_times(monkeypatch, tmp_path):
    """The steps run in order on the same run folder; the stage times are the ones handed over
    (setup, prepare) and each step's own, on a clock that the steps advance by known amounts."""
    clock = [1000.0]
    calls = []

    def fake_step(*args: str) -> int:
        calls.append(args)
        clock[0] += {"record": 70.0, "eval": 30.0, "routers": 900.0}[args[0]]
        return {"record": 3 * 2**30, "eval": 1.5 * 2**30, "routers": 2 * 2**30}[args[0]]

    monkeypatch.setattr(cli, "_invoke", fake_step)
    monkeypatch.setattr(cli, "_report_recorded_perplexity", lambda run_dir: None)
    monkeypatch.setattr(cli.time, "perf_counter", lambda: clock[0])
    monkeypatch.chdir(tmp_path)
    res = invoke("quickstart", "--no-serve", "--stage-time", "setup=12/0.5", "--stage-time", "prepare=3")
    assert res.exit_code == 0, res.output
    run_dir = str(Path("runs") / cli.DEFAULT_NAME)
    assert calls == [("record", "--seq-len", "4096", "--max-windows", "4", "--out", run_dir),
                     ("eval", "--run", run_dir, "--patterns", cli.QUICKSTART_PATTERNS, "--max-windows", "1")]
    table = res.output[res.output.index("on this machine:"):].splitlines()[1:]
    assert [line.split()[0] for line in table] == ["setup", "prepare", "record", "eval", "total"]
    assert [line.split()[1] for line in table] == ["12", "3", "70", "30", "115"]
    # each stage's peak: the one handed over for setup, none for prepare, the children's for record
    # and eval; the total names the largest
    assert table[0].endswith("peak  0.50 GiB") and "peak" not in table[1]
    assert table[2].endswith("peak  3.00 GiB") and table[3].endswith("peak  1.50 GiB")
    assert "(1 min 55 s)" in table[-1] and table[-1].endswith("peak  3.00 GiB (record)")
    # --model gemma3-270m: the same steps on Gemma-3-270M into its own run; --train runs its chain
    calls.clear()
    res = invoke("quickstart", "--no-serve", "--model", "gemma3-270m")
    assert res.exit_code == 0, res.output
    assert calls == [("record", "--model", "gemma3-270m", "--seq-len", "4096", "--max-windows", "4", "--out",
                      str(Path("runs") / "gemma3-austen")),
                     ("eval", "--run", str(Path("runs") / "gemma3-austen"), "--patterns", cli.QUICKSTART_PATTERNS,
                      "--max-windows", "1")]
    calls.clear()
    assert invoke("quickstart", "--no-serve", "--model", "gemma3-270m", "--train").exit_code == 0
    chain = str(Path("checkpoints") / "gemma3_chain")
    assert calls[0] == ("routers", "build", "--model", "gemma3-270m", "--out", chain)
    assert calls[1][:5] == ("record", "--model", "gemma3-270m", "--routers", str(Path(chain) / "routers.safetensors"))
    one_error_line(invoke("quickstart", "--no-serve", "--model", "gpt2"), "--model 'gpt2'")
    one_error_line(invoke("quickstart", "--no-serve", "--stage-time", "setup"), "--stage-time 'setup'")
    one_error_line(invoke("quickstart", "--no-serve", "--stage-time", "setup=3/x"), "--stage-time 'setup=3/x'")


def test_invoke_reports_the_child_peak_memory():
    """cli._invoke returns the step's own peak RSS: a child that holds a 300 MB buffer reports at
    least that, and a failing step exits with its code."""
    import sys as _sys
    import typer
    code = "import sys; b = bytearray(300 * 2**20); b[::4096] = b'x' * len(b[::4096]); sys.exit(0)"
    real = cli.subprocess.Popen
    try:
        cli.subprocess.Popen = lambda argv: real([_sys.executable, "-c", code])
        assert cli._invoke("anything") >= 300 * 2**20
        cli.subprocess.Popen = lambda argv: real([_sys.executable, "-c", "import sys; sys.exit(3)"])
        with pytest.raises(typer.Exit) as e:
            cli._invoke("anything")
        assert e.value.exit_code == 3
    finally:
        cli.subprocess.Popen = real


def test_quickstart_script_hands_its_setup_and_prepare_times_over(tmp_path):
    """scripts/quickstart.sh, run in a copy whose setup and focus-lab are stand-ins: it prepares
    austen, then runs focus-lab quickstart with --stage-time setup=S prepare=P (S at least the
    stand-in setup's 0.3 s sleep) and the script's own arguments."""
    (tmp_path / "scripts").mkdir()
    shutil.copy(REPO / "scripts" / "quickstart.sh", tmp_path / "scripts" / "quickstart.sh")
    (tmp_path / "scripts" / "setup.sh").write_text("sleep 0.3\n")
    bin_dir = tmp_path / ".venv" / "bin"
    bin_dir.mkdir(parents=True)
    (bin_dir / "focus-lab").write_text('#!/usr/bin/env bash\necho "focus-lab $*" >> calls.txt\n')
    (bin_dir / "focus-lab").chmod(0o755)
    res = subprocess.run(["bash", "scripts/quickstart.sh", "--no-serve", "--port", "9"], cwd=tmp_path,
                         capture_output=True, text=True, env={**os.environ})
    assert res.returncode == 0, res.stderr
    prepare, quick = (tmp_path / "calls.txt").read_text().splitlines()
    assert prepare == "focus-lab prepare austen"
    words = quick.split()
    assert words[:2] == ["focus-lab", "quickstart"] and words[-3:] == ["--no-serve", "--port", "9"]
    times = dict(w.split("=") for w in words[3:-3:2])
    assert words[2:-3:2] == ["--stage-time", "--stage-time"] and list(times) == ["setup", "prepare"]
    (setup, setup_peak), (prep, prep_peak) = (times[k].split("/") for k in ("setup", "prepare"))
    assert 0.3 <= float(setup) < 30 and 0 <= float(prep) < 30
    # the peaks are of the stand-ins (a sleep, a bash script): a few MiB, not zero, not GiB
    assert 0 < float(setup_peak) < 0.5 and 0 < float(prep_peak) < 0.5
