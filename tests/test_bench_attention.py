"""The benchmark's input checks (analyses/bench_attention.py): bad options are one line and exit 2."""

import argparse

import pytest

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
