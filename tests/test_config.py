"""FocusConfig and TrainConfig by concern (docs/api.md "Configuration", "Training")."""

import dataclasses
import json
import subprocess
import sys

import pytest

from focus_lab.method.config import (CONCERNS, FLAT_ORDER, TRAIN_CONCERNS, TRAIN_FLAT_ORDER, ConfigError,
                                     FocusConfig, LeverConfig, PatternConfig, RoutingConfig, ShapeConfig,
                                     TrainConfig)


def test_no_config_class_holds_more_than_twelve_fields():
    for cls in (FocusConfig, TrainConfig, *CONCERNS.values(), *TRAIN_CONCERNS.values()):
        assert len(dataclasses.fields(cls)) <= 12, cls.__name__
    # every flat field lives in exactly one concern
    assert sorted(f.name for c in CONCERNS.values() for f in dataclasses.fields(c)) == sorted(set(FLAT_ORDER) - {"backend"})
    assert sorted(f.name for c in TRAIN_CONCERNS.values() for f in dataclasses.fields(c)) == sorted(TRAIN_FLAT_ORDER)


def test_the_concerns_and_the_flat_keywords_build_the_same_config():
    by_concern = FocusConfig(shape=ShapeConfig(num_groups=8, router_dim=8), routing=RoutingConfig(tau=0.2),
                             pattern=PatternConfig(mode="hard", top_k=3, window=64, sink_tokens=4),
                             levers=LeverConfig(match_shifts=[1, 0]), backend="dense")
    flat = FocusConfig(num_groups=8, router_dim=8, tau=0.2, mode="hard", top_k=3, window=64, sink_tokens=4,
                       match_shifts=[0, 1], backend="dense")
    assert by_concern == flat and by_concern.shape.num_groups == flat.num_groups == 8
    assert flat.match_shifts == [0, 1] and flat.levers.match_shifts == [0, 1]  # normalized in its concern
    # the saved form is flat, in the fields' order, and reads back (nested too)
    d = flat.to_dict()
    assert tuple(d) == tuple(n for n in FLAT_ORDER if n != "rules")
    assert FocusConfig.from_dict(d) == flat == FocusConfig.from_json(flat.to_json())
    nested = {"shape": {"num_groups": 8, "router_dim": 8}, "routing": {"tau": 0.2}, "backend": "dense",
              "pattern": {"mode": "hard", "top_k": 3, "window": 64, "sink_tokens": 4}, "match_shifts": [0, 1]}
    assert FocusConfig.from_dict(nested) == flat
    # replace changes one field, validated, the rest kept
    assert flat.replace(top_k=1).top_k == 1 and flat.replace(top_k=1).tau == 0.2
    assert dataclasses.replace(flat, tau=0.5).pattern == flat.pattern
    with pytest.raises(ConfigError, match="top_k"):
        flat.replace(top_k=9)
    with pytest.raises(dataclasses.FrozenInstanceError):
        flat.tau = 1.0
    with pytest.raises(TypeError, match="unknown fields.*'topk'"):
        FocusConfig(topk=2)
    with pytest.raises(TypeError, match="takes a ShapeConfig"):
        FocusConfig(shape=RoutingConfig())
    with pytest.raises(ConfigError, match="unknown FocusConfig fields"):
        FocusConfig.from_dict({"num_groups": 4, "colour": "red"})


def test_a_lever_keyword_warns_once_from_outside_focus_lab():
    """A lever field given flat by a user warns once per field, naming its rule; focus_lab's own
    calls (a pattern's changes through replace) do not warn."""
    code = ("import warnings; warnings.simplefilter('always')\n"
            "from focus_lab.method.config import FocusConfig\n"
            "from focus_lab.patterns import Pattern\n"
            "with warnings.catch_warnings(record=True) as w:\n"
            "    warnings.simplefilter('always')\n"
            "    FocusConfig(num_groups=4, key_shift=1); FocusConfig(num_groups=4, key_shift=1)\n"
            "    FocusConfig(num_groups=4, match_shifts=[1])\n"
            "    FocusConfig(num_groups=4, mode='hard').replace(**Pattern.parse('hard_top2+key_shift').changes())\n"
            "    FocusConfig(num_groups=4, tau=0.2)\n"
            "print(len(w)); print(w[0].category.__name__); print(w[0].message); print(w[1].message)\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout.splitlines()
    assert out[0] == "2" and out[1] == "FutureWarning"
    assert "FocusConfig(key_shift=...) is deprecated" in out[2] and "key_shift" in out[2]
    assert "match(shifts=[...])" in out[3]


def test_train_config_by_concern():
    t = TrainConfig(steps=40, objective="distill", distill_top_k=[1, 2], seq_len=4096)
    assert (t.optim.steps, t.loss.objective, t.loss.distill_top_k, t.data.seq_len) == (40, "distill", (1, 2), 4096)
    t.steps = 41  # flat writes reach the concern
    assert t.optim.steps == 41
    d = t.to_dict()
    assert tuple(d) == TRAIN_FLAT_ORDER and json.loads(json.dumps(d))["steps"] == 41
    assert TrainConfig(**json.loads(json.dumps(d))).to_dict() == json.loads(json.dumps(d)) | {"distill_top_k": (1, 2)}
    with pytest.raises(ConfigError, match="objective"):
        TrainConfig(objective="mse")
    with pytest.raises(TypeError, match="unknown fields"):
        TrainConfig(epochs=3)
