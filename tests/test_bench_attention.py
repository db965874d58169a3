"""The benchmark's input checks (analyses/bench_attention.py): bad options are one line and exit 2."""

import argparse

import pytest
import torch

from analyses import bench_attention as bench


def _args(**kw):
    base = dict(patterns=bench.E2E_PATTERNS, decode_patterns=bench.DECODE_PATTERNS, e2e_sizes=[4096, 8192],
                decode_contexts=[2048, 8192], new_tokens=16)
    return argparse.Namespace(**{**base, **kw})


def test_default_options_fit_the_embedded_model():
    pats, dpats = bench.check_e2e_args(_args(), num_groups=4, positions=8192, window=128, sinks=64)
    assert [p for p, _ in pats] == bench.E2E_PATTERNS.split(",")
    assert dict(dpats)["hard_top2"] == {"mode": "hard", "top_k": 2, "assignment": "router"}


@pytest.mark.parametrize("kw,words", [
    ({"patterns": "dense,hard_top9"}, "unknown pattern 'hard_top9'"),
    ({"patterns": "window,hard_top1"}, "must include dense"),
    ({"e2e_sizes": [16384]}, "above the model's 8192 positions"),
    ({"e2e_sizes": [150]}, "window + sinks = 192"),
    ({"decode_contexts": [8200]}, "must fit the model's 8192 positions"),
    ({"decode_contexts": [10]}, "need more than --new-tokens 16"),
])
def test_bad_options_name_the_limit(kw, words):
    with pytest.raises(bench.BadInput) as err:
        bench.check_e2e_args(_args(**kw), num_groups=4, positions=8192, window=128, sinks=64)
    assert words in str(err.value) and "\n" not in str(err.value)


def test_main_exits_2_with_one_line(capsys):
    assert bench.main(["--no-kernel", "--no-e2e", "--e2e-repeats", "0"]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("bench_attention:") and "\n" not in err
    with pytest.raises(SystemExit) as e:
        bench.main(["--e2e-sizes", "4096,x"])
    assert e.value.code == 2


def test_pairs_bound_by_hand():
    """Dense: 10 s, 4 s of it attention; window: 6.5 s, 0.5 s of it attention, 0.1 of the pairs
    (its sinks). A pattern keeping 0.35 would take 6 + 0.5 + (0.35 - 0.1) * 4 = 7.5 s: 10 / 7.5."""
    import pandas as pd
    df = pd.DataFrame({"tokens": 4096, "pattern": ["dense", "window", "hard_top1"],
                       "bare_s": [10.0, 6.5, 9.0], "share_outside_attention": [0.6, 6.0 / 6.5, 0.7],
                       "distant_pairs_kept": [1.0, 0.1, 0.35]})
    b = bench.pairs_bound(df)
    assert b.iloc[0] != b.iloc[0]  # NaN on the dense row
    assert b.iloc[1] == pytest.approx(10 / 6.5)  # the window row: its own ratio
    assert b.iloc[2] == pytest.approx(10 / 7.5)


@pytest.mark.parametrize("device,words", [("tpu", "use cpu, cuda or cuda:N"), ("cuda:x", "use cpu, cuda or cuda:N")]
                         + ([] if torch.cuda.is_available() else [("cuda", "sees no CUDA device")]))
def test_bad_device_exits_2_with_one_line(capsys, device, words):
    """``--device`` goes through the CLI's check (``hf.models.resolve_device``): one line, exit 2."""
    assert bench.main(["--no-e2e", "--device", device]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("bench_attention:") and words in err and "\n" not in err


@pytest.mark.parametrize("backends,words", [("cuda", "is unknown"), ("torch,nope", "is unknown")]
                         + ([] if torch.cuda.is_available() else [("flash", "needs a CUDA device")]))
def test_bad_backend_exits_2_with_one_line(capsys, backends, words, tmp_path):
    """``--backends`` names a backend the kernel part cannot run: one line, exit 2, before any work."""
    assert bench.main(["--no-e2e", "--backends", backends, "--out", str(tmp_path)]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("bench_attention: --backends") and words in err and "\n" not in err
    assert not any(tmp_path.iterdir())


def test_kernel_rows_name_their_backend(tmp_path):
    """Each config runs once per ``--backends`` entry and its row names the concrete backend
    ("auto" resolved: "torch" on the CPU); flex's output equals the reference like torch's."""
    assert bench.main(["--no-e2e", "--sizes", "256", "--Ks", "4", "--ks", "2", "--repeats", "1",
                       "--backends", "auto,flex", "--check-max-n", "256", "--out", str(tmp_path)]) == 0
    import pandas as pd
    k = pd.read_csv(tmp_path / "kernel.csv")
    assert k.backend.tolist() == ["torch", "flex"]
    assert (k.max_abs_err < 1e-5).all()
