"""Bias re-calibration at a target length (focus_lab.train.calibrate) against Sinkhorn run by hand."""

from types import SimpleNamespace

import pytest
import torch

from conftest import tiny_llama
from focus_lab.train.calibrate import calibrate_bias
from focus_lab.method.config import FocusConfig
from focus_lab.method.core import sinkhorn
from focus_lab.hf.retrofit import attach, focus_config, routers, set_config


def test_bias_is_the_mean_column_potential_of_hard_mode_inputs():
    model = tiny_llama()
    attach(model, FocusConfig(window=4, sink_tokens=2, mode="soft"))
    for i, r in routers(model).items():
        r.group_bias.copy_(torch.tensor([0.5, -0.5, 0.2, -0.2]) * (i + 1))
    g = torch.Generator().manual_seed(0)
    windows = [SimpleNamespace(input_ids=torch.randint(0, model.config.vocab_size, (40,), generator=g))
               for _ in range(3)]
    # reference: router inputs of hard-mode forwards (old bias), Sinkhorn by hand
    hs = {i: [] for i in routers(model)}
    mods = {m.focus_router.layer_idx: m for m in model.modules() if hasattr(m, "focus_router")}
    hooks = [m.register_forward_pre_hook(
        lambda m, a, kw, i=i: hs[i].append(kw["hidden_states"]), with_kwargs=True) for i, m in mods.items()]
    set_config(model, mode="hard")
    with torch.no_grad():
        for w in windows:
            model(input_ids=w.input_ids[None], use_cache=False)
    for h in hooks:
        h.remove()
    cfg = focus_config(model)
    expected = {}
    for i, r in routers(model).items():
        cols = torch.cat([sinkhorn(r(h), cfg.tau, cfg.sinkhorn_iters)[1] for h in hs[i]])  # (3, K)
        b = cols.mean(0)
        expected[i] = b - b.mean()
    set_config(model, mode="soft")
    new = calibrate_bias(model, windows, progress=False)
    for i, r in routers(model).items():
        assert torch.allclose(new[i], expected[i], atol=1e-5)
        assert torch.allclose(r.group_bias, expected[i], atol=1e-5)
        assert not r.training
    assert focus_config(model).mode == "soft" and focus_config(model).bias_momentum == cfg.bias_momentum


def test_no_windows_is_an_error():
    model = tiny_llama()
    attach(model, FocusConfig())
    with pytest.raises(ValueError, match="no windows"):
        calibrate_bias(model, [])
