"""Reliability: kill -9 then --resume, determinism, two-process DDP, bad inputs with clear errors."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file
from typer.testing import CliRunner

import focus_lab
from focus_lab.cli import app
from conftest import tiny_gpt2, tiny_llama
from run_fixtures import TEXT, make_tokenizer

REPO = Path(__file__).resolve().parent.parent
ENV = {**os.environ, "HF_HUB_OFFLINE": "1", "OMP_NUM_THREADS": "1", "PYTHONPATH": str(REPO)}


@pytest.fixture(scope="module")
def tiny_dir(tmp_path_factory):
    """A tiny random Llama + fast tokenizer saved as a local model directory, and a corpus file."""
    d = tmp_path_factory.mktemp("tiny")
    model_dir = d / "model"
    tiny_llama().save_pretrained(model_dir)
    make_tokenizer().save_pretrained(model_dir)
    corpus = d / "corpus.txt"
    corpus.write_text("\n\n".join([TEXT] * 30))
    return model_dir, corpus


def _train_args(model_dir, corpus, out, steps, extra=()):
    return ["train", "--model", str(model_dir), "--corpus", str(corpus), "--out", str(out),
            "--steps", str(steps), "--seq-len", "32", "--batch-size", "2", "--window", "4",
            "--checkpoint-every", "10", "--lr", "0.01", *extra]


def _cli(args, **kw):
    return subprocess.run([sys.executable, "-m", "focus_lab", *args], env=ENV, capture_output=True,
                          text=True, timeout=600, **kw)


def _tensors(path):
    return load_file(str(path))


def test_kill_9_then_resume_equals_uninterrupted_run(tiny_dir, tmp_path):
    model_dir, corpus = tiny_dir
    steps = 300
    ref = _cli(_train_args(model_dir, corpus, tmp_path / "ref", steps))
    assert ref.returncode == 0, ref.stderr[-2000:]

    out = tmp_path / "killed"
    proc = subprocess.Popen([sys.executable, "-m", "focus_lab", *_train_args(model_dir, corpus, out, steps)],
                            env=ENV, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    step_file = out / "checkpoint" / "step.json"
    deadline = time.time() + 300
    killed_at = None
    while time.time() < deadline and proc.poll() is None:
        if step_file.is_file():
            try:
                killed_at = json.loads(step_file.read_text())["step"]
            except (json.JSONDecodeError, KeyError):
                killed_at = None
            if killed_at and killed_at >= 20:
                proc.send_signal(signal.SIGKILL)
                break
        time.sleep(0.05)
    proc.wait(timeout=30)
    assert proc.returncode == -signal.SIGKILL, "the training finished before it could be killed"
    assert not (out / "routers.safetensors").exists()
    assert killed_at < steps
    res = _cli(_train_args(model_dir, corpus, out, steps, ["--resume"]))
    assert res.returncode == 0, res.stderr[-2000:]
    a, b = _tensors(tmp_path / "ref" / "routers.safetensors"), _tensors(out / "routers.safetensors")
    assert a.keys() == b.keys()
    for k in a:
        assert torch.equal(a[k], b[k]), k


def test_same_seed_same_routers_and_assignments(tmp_path):
    import types
    from focus_lab import FocusConfig, TrainConfig
    from focus_lab.train.loop import train
    ids = torch.randint(3, 97, (8, 32), generator=torch.Generator().manual_seed(0))
    windows = [types.SimpleNamespace(input_ids=w) for w in ids]
    outs = []
    for run in range(2):
        model = tiny_gpt2()
        cfg = FocusConfig(window=4, mode="soft")
        train(model, windows, cfg, TrainConfig(steps=4, batch_size=2, seq_len=32, hard_phase=0.5),
              tmp_path / str(run), progress=False)
        focus_lab.set_config(model, mode="hard")
        groups = []
        with torch.no_grad(), focus_lab.hooks(model, {"key_group": lambda kg, hook: groups.append(kg)}):
            model(ids[:2], use_cache=False)
        outs.append((_tensors(tmp_path / str(run) / "routers.safetensors"), groups))
    (ta, ga), (tb, gb) = outs
    assert all(torch.equal(ta[k], tb[k]) for k in ta)
    assert all(torch.equal(x, y) for x, y in zip(ga, gb))
    # what the bytes depend on beyond the command is recorded: the CPU and torch's threads
    import json
    rec = json.loads((tmp_path / "0" / "train_config.json").read_text())["machine"]
    assert rec["threads"] == torch.get_num_threads() and rec["torch"] == torch.__version__ and rec["nproc"] >= 1


@pytest.mark.skipif(shutil.which("torchrun") is None and not (Path(sys.executable).parent / "torchrun").exists(),
                    reason="torchrun not installed")
def test_two_process_ddp_matches_single_process(tiny_dir, tmp_path):
    import pandas as pd
    model_dir, corpus = tiny_dir
    single = _cli(_train_args(model_dir, corpus, tmp_path / "single", 4))
    assert single.returncode == 0, single.stderr[-2000:]
    torchrun = str(Path(sys.executable).parent / "torchrun")
    import socket
    with socket.socket() as s:  # a free port: a fixed one collides with another run of the suite
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    ddp = subprocess.run([torchrun, "--nproc_per_node=2", f"--master_port={port}", "-m", "focus_lab",
                          *_train_args(model_dir, corpus, tmp_path / "ddp", 4)],
                         env=ENV, capture_output=True, text=True, timeout=600)
    assert ddp.returncode == 0, ddp.stderr[-3000:]
    info = json.loads((tmp_path / "ddp" / "ddp.json").read_text())
    assert info["world_size"] == 2 and info["identical"], info
    l1 = pd.read_parquet(tmp_path / "single" / "train_log.parquet").groupby("step").loss.first()
    l2 = pd.read_parquet(tmp_path / "ddp" / "train_log.parquet").groupby("step").loss.first()
    assert len(l1) == len(l2) == 4
    assert (l1 - l2).abs().max() < 1e-5, (l1, l2)
    a, b = _tensors(tmp_path / "single" / "routers.safetensors"), _tensors(tmp_path / "ddp" / "routers.safetensors")
    for k in a:
        assert torch.allclose(a[k], b[k], atol=1e-5), k


# ------------------------------------------------------------------------------------------
# bad inputs: each a clear one-line error naming the problem and the fix (exit code 2)

@pytest.mark.parametrize("flags,match", [
    (["--num-groups", "0"], "num_groups"),
    (["--top-k", "5"], "top_k"),
    (["--window", "0"], "window"),
    (["--tau", "0"], "tau"),
    (["--router-dim", "0"], "router_dim"),
    (["--recipe", "magic"], "unknown recipe"),
])
def test_invalid_config_is_a_clear_cli_error(flags, match, tiny_dir, tmp_path):
    model_dir, corpus = tiny_dir
    r = CliRunner().invoke(app, _train_args(model_dir, corpus, tmp_path / "x", 1)[:-2] + flags)
    assert r.exit_code == 2, r.output
    assert match in r.output and "Traceback" not in r.output


@pytest.mark.parametrize("device,match", [("tpu", "use cpu, cuda or cuda:N"), ("cuda:x", "use cpu, cuda or cuda:N"),
                                          ("cuda", "sees no CUDA device"), ("cuda:0", "sees no CUDA device")])
@pytest.mark.skipif(torch.cuda.is_available(), reason="the 'no CUDA device' errors need a machine without one")
def test_bad_device_is_a_clear_cli_error(device, match, tiny_dir, tmp_path):
    """``--device`` of train and eval: one line naming the problem, exit 2, before the model loads."""
    model_dir, corpus = tiny_dir
    for args in (_train_args(model_dir, corpus, tmp_path / "x", 1),
                 ["eval", "--model", str(model_dir), "--corpus", str(corpus), "--seq-len", "32",
                  "--routers", str(tmp_path / "missing.safetensors")]):
        if args[0] == "eval":  # a router file to get past the routers check
            focus_lab.save_routers(focus_lab.attach(tiny_llama(), focus_lab.FocusConfig()), args[-1])
        r = CliRunner().invoke(app, args + ["--device", device])
        assert r.exit_code == 2, r.output
        assert match in r.output and "Traceback" not in r.output and len(r.output.strip().splitlines()) == 1


@pytest.mark.parametrize("content,match", [
    (b"", "empty"), (b"   \n\t\n", "whitespace"), (b"abc\x00def" * 10, "binary"),
    ("caf\u00e9 au lait".encode("latin-1") * 10, "UTF-8"),
])
def test_bad_corpus_files_are_clear_errors(content, match, tiny_dir, tmp_path):
    model_dir, _ = tiny_dir
    f = tmp_path / "bad.txt"
    f.write_bytes(content)
    r = CliRunner().invoke(app, _train_args(model_dir, f, tmp_path / "x", 1))
    assert r.exit_code == 2 and match in r.output, r.output


def test_unknown_corpus_name_lists_known_ones(tiny_dir, tmp_path):
    model_dir, _ = tiny_dir
    r = CliRunner().invoke(app, _train_args(model_dir, "no-such-corpus", tmp_path / "x", 1))
    assert r.exit_code == 2 and "austen" in r.output, r.output


def test_router_file_for_another_model_is_refused_in_cli(tiny_dir, tmp_path):
    model_dir, corpus = tiny_dir
    other = tiny_llama(seed=5)
    focus_lab.attach(other, focus_lab.FocusConfig(window=4))
    focus_lab.save_routers(other, tmp_path / "foreign.safetensors")
    r = CliRunner().invoke(app, ["eval", "--model", str(model_dir), "--corpus", str(corpus),
                                 "--routers", str(tmp_path / "foreign.safetensors"), "--seq-len", "32"])
    assert r.exit_code == 2 and "trained on base model" in r.output, r.output


def test_text_longer_than_positions_is_split_and_said_once(tiny_dir, tmp_path):
    model_dir, corpus = tiny_dir
    r = CliRunner().invoke(app, _train_args(model_dir, corpus, tmp_path / "x", 1)[:-0 or None]
                           + ["--seq-len", "100000"])
    assert r.exit_code == 0, r.output
    assert r.output.count("exceeds the model's 512 positions") == 1


def test_nan_scores_are_a_clear_error():
    model = tiny_llama()
    focus_lab.attach(model, focus_lab.FocusConfig(window=4))
    with torch.no_grad():
        focus_lab.routers(model)[0].proj.fill_(float("nan"))
    with pytest.raises(FloatingPointError, match="layer 0 contain NaN"):
        model(torch.randint(3, 97, (1, 16)), use_cache=False)


def test_run_with_other_schema_or_missing_table(tmp_path):
    from focus_lab.runs import Run, RunError
    run = tmp_path / "r"
    run.mkdir()
    (run / "manifest.json").write_text(json.dumps({"schema_version": 99}))
    with pytest.raises(RunError, match="schema version 99"):
        Run.open(run)
    (run / "manifest.json").write_text(json.dumps({"schema_version": 1}))
    with pytest.raises(RunError, match="no table 'coverage'"):
        Run.open(run).table("coverage")
    (run / "manifest.json").write_text("{not json")
    with pytest.raises(RunError, match="corrupted"):
        Run.open(run)


def test_calibrate_cli_writes_a_new_file_equal_to_the_library_and_refuses_overwriting(tiny_dir, tmp_path):
    """`focus-lab calibrate`: the written routers carry the bias ``calibrate_bias`` computes on
    the same training windows (everything else unchanged); --out equal to --routers is refused."""
    from focus_lab.train.calibrate import calibrate_bias
    from focus_lab.data import load_corpus, make_windows
    from focus_lab.hf.models import load_model
    model_dir, corpus = tiny_dir
    m = tiny_llama()
    focus_lab.attach(m, focus_lab.FocusConfig(window=4, sink_tokens=2))
    for r in focus_lab.routers(m).values():
        r.group_bias.copy_(torch.tensor([1.0, -1.0, 0.5, -0.5]))
    src = focus_lab.save_routers(m, tmp_path / "in.safetensors")
    r = CliRunner().invoke(app, ["calibrate", "--model", str(model_dir), "--corpus", str(corpus),
                                 "--routers", str(src), "--seq-len", "32", "--max-windows", "3",
                                 "--out", str(tmp_path / "out.safetensors")])
    assert r.exit_code == 0, r.output
    got = _tensors(tmp_path / "out.safetensors")
    ref_model, tok = load_model(str(model_dir), verbose=False)
    focus_lab.load_routers(ref_model, src)
    windows = make_windows(load_corpus(str(corpus)).train, tok, 32, max_windows=3)
    want = calibrate_bias(ref_model, windows, progress=False)
    before = _tensors(src)
    for i, b in want.items():
        assert torch.allclose(got[f"layers.{i}.group_bias"], b, atol=1e-6)
        assert not torch.allclose(got[f"layers.{i}.group_bias"], before[f"layers.{i}.group_bias"])
        assert torch.equal(got[f"layers.{i}.proj"], before[f"layers.{i}.proj"])
    r = CliRunner().invoke(app, ["calibrate", "--model", str(model_dir), "--corpus", str(corpus),
                                 "--routers", str(src), "--out", str(src), "--seq-len", "32"])
    assert r.exit_code == 2 and "is the input router file" in r.output, r.output


def test_eval_dtype_runs_the_model_in_half_precision(tiny_dir, tmp_path):
    """``focus-lab eval --dtype bf16``: the model runs in bf16 (said in the header line; its routers
    too, scoring in fp32), the
    perplexities stay within bf16's rounding of the fp32 run's on the same windows; a dtype it
    does not know is one line, exit 2, before the model loads."""
    import pandas as pd
    model_dir, corpus = tiny_dir
    routers = tmp_path / "r.safetensors"
    focus_lab.save_routers(focus_lab.attach(tiny_llama(), focus_lab.FocusConfig(window=8, sink_tokens=2)), routers)
    args = ["eval", "--model", str(model_dir), "--corpus", str(corpus), "--seq-len", "64", "--max-windows", "2",
            "--routers", str(routers), "--patterns", "dense,hard_top1,hard_top2"]
    tables = {}
    for dt in ("fp32", "bf16"):
        r = CliRunner().invoke(app, args + ["--dtype", dt, "--out", str(tmp_path / f"{dt}.parquet")])
        assert r.exit_code == 0, r.output
        assert ("model in bf16" in r.output) == (dt == "bf16")
        tables[dt] = pd.read_parquet(tmp_path / f"{dt}.parquet").set_index("label")
    rel = (tables["bf16"].perplexity / tables["fp32"].perplexity - 1).abs()
    assert rel.max() <= 0.02, rel
    assert rel.max() > 0  # bf16 rounding shows: the weights were cast
    r = CliRunner().invoke(app, args + ["--dtype", "int8"])
    assert r.exit_code == 2 and "--dtype int8: choose one of fp32, bf16, fp16" in r.output
    assert len(r.output.strip().splitlines()) == 1 and "Traceback" not in r.output
