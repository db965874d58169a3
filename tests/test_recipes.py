"""Router recipes: sink tokens in the one mask rule, straight-through, schedules."""

import contextlib
import itertools

import pytest
import torch

import focus_lab
from focus_lab import FocusConfig, TrainConfig
from focus_lab.method.core import hard_assign, hard_mask, local_mask
from focus_lab.train.recipes import RECIPES, recipe
from focus_lab.train.loop import schedule_config
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


def test_coverage_loss_matches_pair_by_pair_definition():
    from focus_lab.method.core import coverage_loss
    torch.manual_seed(0)
    B, T, K, w, s = 2, 12, 3, 3, 1
    attn = torch.softmax(torch.randn(B, T, T).masked_fill(torch.ones(T, T).triu(1).bool(), float("-inf")), -1)
    log_p = torch.log_softmax(torch.randn(B, T, K), -1)
    p = log_p.exp()
    kept = total = 0.0
    for b, i, j in itertools.product(range(B), range(T), range(T)):
        if j <= i and i - j >= w and j >= s:  # distant, not a sink
            total += float(attn[b, i, j])
            kept += float(attn[b, i, j]) * float((p[b, i] * p[b, j]).sum())
    assert float(coverage_loss(attn, log_p, w, s)) == pytest.approx(1 - kept / total, abs=1e-6)
    # a shared one-hot group keeps everything; disjoint one-hot groups keep nothing
    same = torch.log(torch.eye(K)[torch.zeros(B, T, dtype=torch.long)].clamp(min=1e-30))
    assert float(coverage_loss(attn, same, w, s)) == pytest.approx(0.0, abs=1e-6)
    alt = torch.log(torch.eye(K)[torch.arange(T) % K].expand(B, T, K).clamp(min=1e-30))
    attn_mod = torch.zeros(B, T, T)
    for i in range(T):  # every query attends only to keys of another residue class mod K
        js = [j for j in range(i + 1) if j % K != i % K] or [i]
        attn_mod[:, i, js] = 1.0 / len(js)
    assert float(coverage_loss(attn_mod, alt, w, 0)) == pytest.approx(1.0, abs=1e-6)


def test_coverage_objective_trains_only_routers_and_raises_kept_mass(tmp_path):
    """Coverage training moves only the routers, lowers the coverage loss on its batch, and
    leaves the model's logits in dense mode untouched."""
    from focus_lab.train.loop import coverage_step, train
    from types import SimpleNamespace
    model = tiny_llama(layers=2)
    torch.manual_seed(0)
    ids = torch.randint(3, 97, (2, 48))
    cfg = FocusConfig(num_groups=3, window=4, top_k=1, sink_tokens=1)
    focus_lab.attach(model, cfg.replace(mode="dense"))
    with torch.no_grad():
        dense = model(ids, use_cache=False).logits
    before = {n: p.clone() for n, p in model.named_parameters()}
    first = float(coverage_step(model, ids, cfg))
    for p in model.parameters():
        p.grad = None
    wins = [SimpleNamespace(input_ids=ids[i]) for i in range(2)]
    train(model, wins, cfg, TrainConfig(steps=25, seq_len=48, batch_size=2, lr=3e-2, objective="coverage"),
          tmp_path / "cov", progress=False)
    last = float(coverage_step(model, ids, cfg))
    assert last < first - 0.02, (first, last)
    changed = {n for n, p in model.named_parameters() if not torch.equal(p, before[n])}
    assert changed and all("focus_router" in n for n in changed)
    focus_lab.set_config(model, mode="dense")
    with torch.no_grad():
        assert torch.equal(model(ids, use_cache=False).logits, dense)


def test_train_config_rejects_unknown_objective():
    with pytest.raises(focus_lab.ConfigError, match="objective"):
        TrainConfig(objective="kl")


def test_shuffled_control_keeps_group_sizes_and_moves_members():
    from focus_lab.method.core import Router, route
    torch.manual_seed(0)
    cfg = FocusConfig(num_groups=4, top_k=2, mode="hard")
    r = Router(32, cfg, layer_idx=3)
    r.eval()
    h = torch.randn(2, 50, 32)
    a = route(r, h, config=cfg)
    b = route(r, h, config=cfg.replace(assignment="shuffled"))
    for x, y in ((a.key_group, b.key_group), (a.query_groups[..., 1], b.query_groups[..., 1])):
        assert torch.equal(torch.sort(x, -1).values, torch.sort(y, -1).values)  # same multiset per row
    assert not torch.equal(a.key_group, b.key_group)
    assert torch.equal(b.query_groups[..., 0], b.key_group)  # a key still lives in its top-1 group


def test_shuffled_control_decodes_from_the_prefill_groups():
    """Through a KV cache the shuffled control permutes the first forward's groups (as a full
    forward of that length does) and gives each later position the groups of a prefill position:
    whatever the later tokens are, whether they come one at a time or as a chunk, and after a
    restart from an earlier position."""
    from focus_lab.method.core import Router, route
    torch.manual_seed(0)
    cfg = FocusConfig(num_groups=4, top_k=2, mode="hard", assignment="shuffled")
    r = Router(32, cfg, layer_idx=5)
    r.eval()
    h = torch.randn(2, 90, 32)
    P = 60
    own = route(r, h, config=cfg.replace(assignment="router"))  # the router's groups, not moved
    first = route(r, h[:, :P], config=cfg)
    perm = torch.randperm(P, generator=torch.Generator().manual_seed(5))  # layer_seed(0, 5)
    assert torch.equal(first.query_groups, own.query_groups[:, :P][:, perm])
    assert torch.equal(first.key_group, own.key_group[:, :P][:, perm])
    chunk = route(r, h[:, P:], config=cfg, start=P)
    steps = [route(r, h[:, t:t + 1], config=cfg, start=t) for t in range(P, 90)]
    assert torch.equal(chunk.query_groups, torch.cat([s.query_groups for s in steps], 1))
    assert torch.equal(chunk.key_group, torch.cat([s.key_group for s in steps], 1))
    other = route(r, torch.randn(2, 30, 32) * 5, config=cfg, start=P)  # other tokens, same groups
    assert torch.equal(other.query_groups, chunk.query_groups)
    restart = route(r, h[:, P + 10:], config=cfg, start=P + 10)
    assert torch.equal(restart.query_groups, chunk.query_groups[:, 10:])
    # every later position takes one prefill position's groups, query and key alike
    pool = first.query_groups  # (B, P, k)
    for t in range(30):
        hits = [j for j in range(P) if torch.equal(pool[:, j], chunk.query_groups[:, t])]
        assert hits and any(torch.equal(first.key_group[:, j], chunk.key_group[:, t]) for j in hits)
    # the draws over many positions cover the prefill about uniformly (hand bound: 4000 draws of 60)
    from focus_lab.method.core import shuffle_sources
    src = shuffle_sources(7, P, P, 4000)
    counts = torch.bincount(src, minlength=P)
    assert src.min() >= 0 and src.max() < P and counts.min() > 30 and counts.max() < 110
    with pytest.raises(RuntimeError, match="start with a forward from position 0"):
        route(Router(32, cfg, layer_idx=5), h[:, P:], config=cfg, start=P)


def test_random_control_ignores_the_router_bias():
    """Random groups stay the same (balanced) whatever bias a trained router carries."""
    from focus_lab.method.core import Router, route
    cfg = FocusConfig(num_groups=4, top_k=1, mode="hard", assignment="random")
    r = Router(16, cfg, layer_idx=0)
    r.eval()
    h = torch.randn(1, 400, 16)
    before = route(r, h, config=cfg).key_group
    r.group_bias.copy_(torch.tensor([5.0, 0.0, 0.0, -5.0]))
    after = route(r, h, config=cfg).key_group
    assert torch.equal(before, after)
    share = torch.bincount(after.reshape(-1), minlength=4).float() / after.numel()
    assert share.max() < 0.35


def test_readme_lists_exactly_the_accepted_recipes():
    """Every recipe the CLI reference's 'Router recipes' section names is accepted by --recipe,
    and every accepted recipe is named there."""
    import re
    from pathlib import Path
    text = (Path(__file__).resolve().parents[1] / "docs" / "cli.md").read_text()
    section = text.split("## Router recipes", 1)[1].split("\n## ", 1)[0]
    named = set(re.findall(r"`([a-z0-9_]+)`", section))
    assert named == set(RECIPES), (sorted(named - set(RECIPES)), sorted(set(RECIPES) - named))


def test_continued_training_keeps_the_init_files_random_groups(tmp_path):
    """train(init_routers=F) with another seed: the saved file keeps F's seed and random_layers
    (the random groups it was measured with), starts from F's tensors, and still trains; so does
    a resumed run; without init_routers the given seed is saved."""
    from types import SimpleNamespace
    from focus_lab.hf.retrofit import read_router_file, save_routers
    from focus_lab.train.loop import train
    torch.manual_seed(0)
    ids = torch.randint(3, 97, (2, 48))
    wins = [SimpleNamespace(input_ids=ids[i]) for i in range(2)]
    first = tiny_llama(layers=3)
    focus_lab.attach(first, FocusConfig(num_groups=3, window=4, top_k=1, sink_tokens=1, seed=5, random_layers=[1]))
    init = save_routers(first, tmp_path / "init.safetensors")
    model = tiny_llama(layers=3)
    tcfg = TrainConfig(steps=2, seq_len=48, batch_size=2, lr=3e-2, seed=1, init_routers=str(init), checkpoint_every=1)
    train(model, wins, FocusConfig(num_groups=3, window=4, top_k=1, sink_tokens=1, seed=1), tcfg,
          tmp_path / "cont", progress=False)
    cfg, _, tensors, _ = read_router_file(tmp_path / "cont" / "routers.safetensors")
    assert (cfg.seed, cfg.random_layers) == (5, [1])
    _, _, start, _ = read_router_file(init)
    assert any(not torch.equal(tensors[k], start[k]) for k in start)  # it trained from F
    # resuming that run (no init file, the CLI's seed again) keeps them too
    train(tiny_llama(layers=3), wins, FocusConfig(num_groups=3, window=4, top_k=1, sink_tokens=1, seed=1),
          TrainConfig(steps=3, seq_len=48, batch_size=2, lr=3e-2, seed=1, checkpoint_every=1),
          tmp_path / "cont", resume=True, progress=False)
    cfg = read_router_file(tmp_path / "cont" / "routers.safetensors")[0]
    assert (cfg.seed, cfg.random_layers) == (5, [1])
    fresh = tiny_llama(layers=3)
    train(fresh, wins, FocusConfig(num_groups=3, window=4, top_k=1, sink_tokens=1, seed=1),
          TrainConfig(steps=1, seq_len=48, batch_size=2, lr=3e-2, seed=1), tmp_path / "new", progress=False)
    assert read_router_file(tmp_path / "new" / "routers.safetensors")[0].seed == 1


@pytest.mark.parametrize("objective", ["lm", "distill", "coverage"])
def test_training_leaves_the_random_layers_routers_untouched(tmp_path, objective):
    """Continued training of a file with random_layers (the shipped file's case) runs under every
    objective and changes only the routers that route: a random layer's proj, centroids and group
    bias stay the init file's (the distill and coverage objectives raised 'element 0 of tensors
    does not require grad' there, and the LM objective moved its group bias)."""
    from types import SimpleNamespace
    from focus_lab.hf.retrofit import read_router_file, save_routers
    from focus_lab.train.loop import train
    torch.manual_seed(0)
    ids = torch.randint(3, 97, (2, 48))
    wins = [SimpleNamespace(input_ids=ids[i]) for i in range(2)]
    base = dict(num_groups=3, window=4, top_k=1, sink_tokens=1)
    first = tiny_llama(layers=3)
    focus_lab.attach(first, FocusConfig(**base, random_layers=[1]))
    init = save_routers(first, tmp_path / "init.safetensors")
    extra = {} if objective == "lm" else {"objective": objective}
    train(tiny_llama(layers=3), wins, FocusConfig(**base),
          TrainConfig(steps=2, seq_len=48, batch_size=2, lr=3e-2, init_routers=str(init), **extra),
          tmp_path / "out", progress=False)
    _, _, start, _ = read_router_file(init)
    _, _, end, _ = read_router_file(tmp_path / "out" / "routers.safetensors")
    for name in ("proj", "centroids", "group_bias"):
        assert torch.equal(end[f"layers.1.{name}"], start[f"layers.1.{name}"]), name
    assert not torch.equal(end["layers.0.proj"], start["layers.0.proj"])
    assert not torch.equal(end["layers.2.proj"], start["layers.2.proj"])


def test_explicit_random_layers_override_the_init_files(tmp_path):
    """TrainConfig.random_layers given with an init file whose layers all route: the saved file
    has those random layers, their routers keep the init tensors, and the other layers' routers
    end exactly as in a run that trains every layer (the distill objective is per layer)."""
    from types import SimpleNamespace
    from focus_lab.hf.retrofit import read_router_file, save_routers
    from focus_lab.train.loop import train
    torch.manual_seed(0)
    ids = torch.randint(3, 97, (2, 48))
    wins = [SimpleNamespace(input_ids=ids[i]) for i in range(2)]
    base = dict(num_groups=3, window=4, top_k=1, sink_tokens=1)
    first = tiny_llama(layers=3)
    focus_lab.attach(first, FocusConfig(**base))
    init = save_routers(first, tmp_path / "init.safetensors")
    common = dict(steps=2, seq_len=48, batch_size=2, lr=3e-2, init_routers=str(init), objective="distill",
                  distill_queries=8)
    train(tiny_llama(layers=3), wins, FocusConfig(**base), TrainConfig(**common, random_layers=[1]),
          tmp_path / "skip", progress=False)
    train(tiny_llama(layers=3), wins, FocusConfig(**base), TrainConfig(**common), tmp_path / "all", progress=False)
    cfg, _, skip, _ = read_router_file(tmp_path / "skip" / "routers.safetensors")
    assert cfg.random_layers == [1]
    assert read_router_file(tmp_path / "all" / "routers.safetensors")[0].random_layers in (None, [])
    _, _, start, _ = read_router_file(init)
    _, _, every, _ = read_router_file(tmp_path / "all" / "routers.safetensors")
    for name in ("proj", "centroids", "group_bias"):
        assert torch.equal(skip[f"layers.1.{name}"], start[f"layers.1.{name}"]), name
        assert not torch.equal(every["layers.1.proj"], start["layers.1.proj"])
        for layer in (0, 2):
            assert torch.equal(skip[f"layers.{layer}.{name}"], every[f"layers.{layer}.{name}"]), (layer, name)


def test_stop_after_then_resume_equals_the_uninterrupted_run(tmp_path):
    """stop_after=3 of a 6-step schedule stops with the 4-step learning rates (not a 3-step
    schedule's), and resuming it to the end gives the tensors of a 6-step run in one go."""
    from types import SimpleNamespace
    from focus_lab.hf.retrofit import read_router_file
    from focus_lab.train.loop import lr_at, train
    import pandas as pd
    torch.manual_seed(0)
    ids = torch.randint(3, 97, (2, 48))
    wins = [SimpleNamespace(input_ids=ids[i]) for i in range(2)]
    fcfg = FocusConfig(num_groups=3, window=4, top_k=1, sink_tokens=1)
    sched = dict(steps=6, seq_len=48, batch_size=2, lr=3e-2, warmup=1, checkpoint_every=1)
    torch.manual_seed(1)
    res = train(tiny_llama(layers=2), wins, fcfg, TrainConfig(**sched, stop_after=3), tmp_path / "cut", progress=False)
    assert res.steps == 3
    log = pd.read_parquet(tmp_path / "cut" / "train_log.parquet")
    assert sorted(log["step"].unique()) == [0, 1, 2]
    assert log.groupby("step")["lr"].first().tolist() == pytest.approx(
        [lr_at(s, TrainConfig(**sched)) for s in range(3)])
    assert lr_at(2, TrainConfig(**sched)) != pytest.approx(lr_at(2, TrainConfig(**{**sched, "steps": 3})))
    torch.manual_seed(1)
    train(tiny_llama(layers=2), wins, fcfg, TrainConfig(**sched), tmp_path / "cut", resume=True, progress=False)
    torch.manual_seed(1)
    train(tiny_llama(layers=2), wins, fcfg, TrainConfig(**sched), tmp_path / "whole", progress=False)
    _, _, a, _ = read_router_file(tmp_path / "cut" / "routers.safetensors")
    _, _, b, _ = read_router_file(tmp_path / "whole" / "routers.safetensors")
    for k in b:
        assert torch.allclose(a[k], b[k], atol=1e-6), k
    with pytest.raises(focus_lab.method.config.ConfigError, match="stop_after"):
        TrainConfig(**sched, stop_after=7)


@pytest.mark.parametrize("family", ["llama", "gpt2"])
def test_checkpointed_layers_give_the_plain_gradients_and_one_bias_update(family):
    """LM objective through the soft gate: with every decoder layer recomputed in the backward
    (hf.retrofit.checkpointed_layers) the routers' gradients equal those of the plain forward,
    the group bias moves once (not again in the recompute), the model stays in eval mode (GPT-2's
    dropout off) and the layers' forward is restored on exit, also after an error."""
    from focus_lab.hf.retrofit import checkpointed_layers
    from focus_lab.hf.tiny import tiny_gpt2
    from focus_lab.method.config import ConfigError

    ids = torch.randint(3, 97, (2, 48))

    def step(checkpointed: bool):
        model = tiny_llama() if family == "llama" else tiny_gpt2()
        model.eval()
        focus_lab.attach(model, FocusConfig(mode="soft", window=4, sink_tokens=2, bias_momentum=0.5))
        rs = focus_lab.routers(model)
        for r in rs.values():
            r.train()
        layers = {id(m): m.forward for m in model.modules()}
        ctx = checkpointed_layers(model) if checkpointed else contextlib.nullcontext()
        with ctx:
            loss = model(input_ids=ids, labels=ids, use_cache=False).loss
            loss.backward()
        assert {id(m): m.forward for m in model.modules()} == layers  # restored
        return loss.detach(), {i: (r.centroids.grad.clone(), r.group_bias.clone()) for i, r in rs.items()}

    loss0, plain = step(False)
    loss1, ckpt = step(True)
    assert torch.allclose(loss0, loss1, atol=1e-6)
    for i, (g, b) in plain.items():
        assert g.abs().sum() > 0
        assert torch.allclose(ckpt[i][0], g, atol=1e-6, rtol=1e-4), f"layer {i}: gradients differ"
        assert torch.allclose(ckpt[i][1], b, atol=1e-6), f"layer {i}: group bias updated twice"
        assert b.abs().sum() > 0  # it did move once

    model = tiny_llama()
    forwards = {id(m): m.forward for m in model.modules()}
    with pytest.raises(RuntimeError, match="boom"):
        with checkpointed_layers(model):
            raise RuntimeError("boom")
    assert {id(m): m.forward for m in model.modules()} == forwards
    with pytest.raises(ConfigError, match="only the 'lm' objective"):
        TrainConfig(objective="distill", gradient_checkpointing=True)
