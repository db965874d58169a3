"""Recipes of issue 9: sink tokens in the one mask rule, straight-through, schedules."""

import itertools

import pytest
import torch

import focus_lab
from focus_lab import FocusConfig, TrainConfig
from focus_lab.core import hard_assign, hard_mask, local_mask
from focus_lab.recipes import RECIPES, recipe
from focus_lab.train import schedule_config
from conftest import tiny_llama


def test_sink_tokens_in_hard_mask_match_definition():
    torch.manual_seed(0)
    T, w, s = 20, 3, 2
    qg, kg = hard_assign(torch.randn(1, T, 4), 0.1, 1)
    pos = torch.arange(T)
    m = hard_mask(qg, kg, w, pos, pos, sinks=s)
    for i, j in itertools.product(range(T), range(T)):
        want = j <= i and (int(kg[0, j]) == int(qg[0, i, 0]) or i - j < w or j < s)
        assert bool(m[0, i, j]) == want
    assert local_mask(pos, pos, w, s)[10, :s].all() and not local_mask(pos, pos, w, s)[0, 1]


@torch.no_grad()
def test_window_mode_with_sinks_differs_from_plain_window():
    model = tiny_llama()
    ids = torch.randint(3, 97, (1, 40))
    focus_lab.attach(model, FocusConfig(mode="window", window=4))
    plain = model(ids, use_cache=False).logits
    focus_lab.set_config(model, sink_tokens=2)
    sinks = model(ids, use_cache=False).logits
    assert torch.allclose(plain[:, :4], sinks[:, :4], atol=1e-6)  # within the window: sinks seen anyway
    assert not torch.allclose(plain[:, 4:], sinks[:, 4:], atol=1e-4)


def test_straight_through_forward_is_hard_and_gradient_is_soft():
    model = tiny_llama()
    ids = torch.randint(3, 97, (2, 40))
    focus_lab.attach(model, FocusConfig(mode="hard", window=4, top_k=1))
    with torch.no_grad():
        hard = model(ids, use_cache=False).logits
    focus_lab.set_config(model, mode="soft", straight_through=True)
    st = model(ids, use_cache=False).logits
    assert torch.allclose(st, hard, atol=1e-4)  # dropped pairs at log(eps) instead of -inf
    st.square().mean().backward()
    grads = [r.centroids.grad for r in focus_lab.routers(model).values()]
    assert all(g is not None and g.abs().sum() > 0 for g in grads)


def test_schedule_config_anneals_tau_and_starts_hard_phase():
    base = FocusConfig(tau=0.1)
    cfg = TrainConfig(steps=11, tau_final=0.01, hard_phase=0.3)
    assert schedule_config(base, cfg, 0).tau == pytest.approx(0.1)
    assert schedule_config(base, cfg, 10).tau == pytest.approx(0.01)
    assert schedule_config(base, cfg, 5).tau == pytest.approx(0.1 * 0.1 ** 0.5)
    assert not schedule_config(base, cfg, 7).straight_through  # 7 < 11 * 0.7
    assert schedule_config(base, cfg, 8).straight_through and schedule_config(base, cfg, 8).gumbel_noise == 1.0


@pytest.mark.parametrize("name", sorted(RECIPES))
def test_every_recipe_builds_valid_configs(name):
    f, t = recipe(name)
    FocusConfig(**f)
    TrainConfig(**t)


def test_unknown_recipe_lists_names():
    with pytest.raises(focus_lab.ConfigError, match="paper"):
        recipe("nope")
