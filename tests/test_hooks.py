"""focus_lab.hooks / focus_lab.cache: the named hook points, against independent references
(output_hidden_states, dense attention, brute-force masks), in forwards and in generate."""

import pytest
import torch

import focus_lab
from focus_lab import FocusConfig
from focus_lab.hf.hooks import POINTS, HookError, HookWarning
from focus_lab.hf.retrofit import attention_modules, forward_state
from conftest import tiny_gemma2, tiny_gpt2, tiny_llama

T = 24


def _ids(seed=0, batch=2, T=T):
    return torch.randint(3, 97, (batch, T), generator=torch.Generator().manual_seed(seed))


def _registered(model):
    return sum(len(m.__dict__.get("_focus_hooks", [])) for _, m in attention_modules(model))


@torch.no_grad()
def test_cached_points_match_independent_references():
    """router_in is the input norm of the layer's hidden state (output_hidden_states); attn_out is
    softmax(q k^T * scale + causal) v from the cached q, k, v; scores are the router's own
    output on router_in; query_groups/key_group are the hard assignment of the routing."""
    model = tiny_llama(layers=2)
    focus_lab.attach(model, FocusConfig(window=4, mode="hard", num_groups=3, top_k=1))
    ids = _ids()
    with focus_lab.cache(model, list(POINTS)) as c:
        out = model(input_ids=ids, use_cache=False, output_hidden_states=True)
    assert sorted({k.split(".")[1] for k in c}) == ["0", "1"]
    for i, layer in enumerate(model.model.layers):
        h = c[f"layers.{i}.router_in"]
        assert torch.allclose(h, layer.input_layernorm(out.hidden_states[i]), atol=1e-6)
        r = focus_lab.routers(model)[i]
        assert torch.allclose(c[f"layers.{i}.router_logits"], r(h, forward_state(model).config), atol=1e-5)
        q, k, v = c[f"layers.{i}.query"], c[f"layers.{i}.key"], c[f"layers.{i}.value"]
        assert q.shape[:3] == (2, 4, T) and k.shape[2] == T and c[f"layers.{i}.key_group"].shape == (2, T)
        kept = c[f"layers.{i}.kept"]
        kk, vv = (x.repeat_interleave(q.shape[1] // k.shape[1], dim=1) for x in (k, v))
        logits = (q @ kk.transpose(-1, -2)) * model.model.layers[i].self_attn.scaling
        ref = torch.softmax(logits.masked_fill(~kept[:, None], float("-inf")), -1) @ vv
        assert torch.allclose(c[f"layers.{i}.attn_out"], ref, atol=1e-5)
        # the kept mask is the hard rule, brute force: same group, or within the window
        qg, kg = c[f"layers.{i}.query_groups"], c[f"layers.{i}.key_group"]
        for b in range(2):
            for a in range(T):
                for j in range(T):
                    want = j <= a and (a - j < 4 or bool((kg[b, j] == qg[b, a]).any()))
                    assert bool(kept[b, a, j]) == want
    assert _registered(model) == 0


@torch.no_grad()
def test_names_patterns_and_a_point_alone_select_the_same_hooks_and_bad_names_list_the_valid_ones():
    model = tiny_llama(layers=3)
    focus_lab.attach(model, FocusConfig(window=4, mode="dense"))
    for key in ("attn_out", "layers.*.attn_out"):
        seen = []
        with focus_lab.hooks(model, {key: lambda x, hook: seen.append(hook.name)}):
            model(input_ids=_ids(), use_cache=False)
        assert seen == ["layers.0.attn_out", "layers.1.attn_out", "layers.2.attn_out"]
    seen = []
    with focus_lab.hooks(model, {"layers.1.attn_out": lambda x, hook: seen.append(hook.layer_idx)}):
        model(input_ids=_ids(), use_cache=False)
    assert seen == [1]
    # dense mode: no routing, so the routing points do not fire; router_in does
    with pytest.warns(HookWarning, match="router_logits"), \
            focus_lab.cache(model, ["router_logits", "key_group", "router_in"]) as c:
        model(input_ids=_ids(), use_cache=False)
    assert sorted(c) == ["layers.0.router_in", "layers.1.router_in", "layers.2.router_in"]
    for bad in ("layers.9.attn_out", "attn", "layers.0.logits"):
        with pytest.raises(ValueError) as e:
            with focus_lab.hooks(model, {bad: lambda x, hook: None}):
                pass
        msg = str(e.value)
        assert "\n" not in msg and repr(bad) in msg and "router_in" in msg and "0..2" in msg
    assert _registered(model) == 0
    assert len(focus_lab.hook_names(model)) == 3 * len(POINTS)


@torch.no_grad()
def test_a_raising_hook_names_point_and_layer_and_every_hook_is_removed():
    model = tiny_llama(layers=2)
    focus_lab.attach(model, FocusConfig(window=4, mode="hard", num_groups=2))
    before = [dict(m._forward_pre_hooks) for _, m in attention_modules(model)]

    def boom(x, hook):
        if hook.layer_idx == 1:
            raise KeyError("nope")
    with pytest.raises(HookError, match=r"layers\.1\.router_logits \(layer 1, point router_logits\) raised KeyError") as e:
        with focus_lab.hooks(model, {"router_logits": boom, "attn_out": lambda x, hook: None}):
            model(input_ids=_ids(), use_cache=False)
    assert isinstance(e.value.__cause__, KeyError)
    assert _registered(model) == 0
    assert [dict(m._forward_pre_hooks) for _, m in attention_modules(model)] == before
    # a read-only point may not return a tensor
    with pytest.raises(HookError, match="query is read-only"):
        with focus_lab.hooks(model, {"layers.0.query": lambda x, hook: x * 2}):
            model(input_ids=_ids(), use_cache=False)
    assert _registered(model) == 0


@torch.no_grad()
def test_an_attn_out_patch_changes_the_logits_and_zero_patch_equals_ablating_the_layer():
    """Returning a tensor at attn_out replaces the layer's output: zeros there equal a model
    whose o_proj input is zero (checked with an o_proj pre-hook, independent of the points)."""
    model = tiny_llama(layers=2)
    focus_lab.attach(model, FocusConfig(window=4, mode="dense"))
    ids = _ids()
    base = model(input_ids=ids, use_cache=False).logits
    with focus_lab.hooks(model, {"layers.1.attn_out": lambda x, hook: torch.zeros_like(x)}):
        patched = model(input_ids=ids, use_cache=False).logits
    h = model.model.layers[1].self_attn.o_proj.register_forward_pre_hook(lambda m, a: (torch.zeros_like(a[0]),))
    ablated = model(input_ids=ids, use_cache=False).logits
    h.remove()
    assert not torch.allclose(base, patched) and torch.allclose(patched, ablated, atol=1e-6)
    with pytest.raises(HookError, match="shape"):
        with focus_lab.hooks(model, {"layers.0.attn_out": lambda x, hook: x[:, :1]}):
            model(input_ids=ids, use_cache=False)


@torch.no_grad()
def test_hooks_fire_in_generate_decode_steps_with_the_cached_key_groups():
    """In hard-mode generate, every decode step fires the points with Tq = 1; key_group then
    covers every cached key and equals the prefill's groups followed by the new tokens'."""
    model = tiny_llama(layers=2)
    focus_lab.attach(model, FocusConfig(window=4, mode="hard", num_groups=3, top_k=1))
    ids = _ids(batch=1, T=12)
    with focus_lab.cache(model, ["layers.0.key_group", "layers.0.query"], every_call=True) as c:
        out = model.generate(ids, max_new_tokens=4, do_sample=False)
    kg, q = c["layers.0.key_group"], c["layers.0.query"]
    assert out.shape[1] == 16 and len(kg) == 4 and [x.shape[2] for x in q] == [12, 1, 1, 1]
    assert [x.shape[1] for x in kg] == [12, 13, 14, 15]
    for a, b in zip(kg, kg[1:]):
        assert torch.equal(b[:, :a.shape[1]], a)
    # the groups of a full forward over the same tokens are the same
    with focus_lab.cache(model, ["layers.0.key_group"]) as full:
        model(input_ids=out[:, :15], use_cache=False)
    assert torch.equal(full["layers.0.key_group"], kg[-1])


@torch.no_grad()
def test_gpt2_and_an_unrouted_gemma_layer_fire_what_they_have():
    model = tiny_gpt2()
    focus_lab.attach(model, FocusConfig(window=4, mode="hard", num_groups=2))
    with focus_lab.cache(model, ["attn_out", "key_group"]) as c:
        model(input_ids=_ids(), use_cache=False)
    assert len(c) == 2 * len(focus_lab.routers(model))
    g = tiny_gemma2()
    focus_lab.attach(g, FocusConfig(window=4, mode="hard", num_groups=2))
    routed = set(focus_lab.routers(g))
    with focus_lab.cache(g, ["attn_out", "router_in"]) as c:
        g(input_ids=_ids(), use_cache=False)
    layers = {i for i, _ in attention_modules(g)}
    assert {int(k.split(".")[1]) for k in c if k.endswith("attn_out")} == layers
    assert {int(k.split(".")[1]) for k in c if k.endswith("router_in")} == routed != layers


@torch.no_grad()
@pytest.mark.parametrize("mode", ["hard", "soft"])
def test_the_probe_how_to_computes_the_entropy_of_kept_attention(mode):
    """docs/probe.md's example, run as written, against a brute-force entropy: softmax of
    q.k * scale over the keys the hard rule keeps (same group, or within the window), or in
    soft mode plus the gate's bias (the log agreement of the Sinkhorn probabilities)."""
    import re
    from pathlib import Path
    from focus_lab.method.core import soft_gate_bias
    text = (Path(__file__).resolve().parent.parent / "docs" / "probe.md").read_text()
    code = re.findall(r"```python\n(.*?)```", text, re.S)[0]
    assert len(code.strip().splitlines()) <= 25 and '"pattern"' in code
    ns: dict = {}
    exec(code, ns)
    model = tiny_llama(layers=2)
    focus_lab.attach(model, FocusConfig(window=4, mode=mode, num_groups=3, top_k=1))
    ids = _ids(batch=1)
    got = ns["kept_attention_entropy"](model, ids, forward_state(model))
    with focus_lab.cache(model, ["router_in", "query", "key", "query_groups", "key_group"]) as c:
        model(input_ids=ids, use_cache=False)
    cfg = forward_state(model).config
    for i in (0, 1):
        q, k = c[f"layers.{i}.query"][0], c[f"layers.{i}.key"][0]
        qg, kg = c[f"layers.{i}.query_groups"][0], c[f"layers.{i}.key_group"][0]
        bias = None
        if mode == "soft":  # the gate, from the router's own Sinkhorn probabilities
            from focus_lab.method.core import route
            r = route(focus_lab.routers(model)[i], c[f"layers.{i}.router_in"], config=cfg)
            pos = torch.arange(T)
            bias = soft_gate_bias(r.log_p, r.log_p_keys, 4, pos, pos, cfg.eps)[0]  # (T, T)
        H = q.shape[0]
        scale = model.model.layers[i].self_attn.scaling
        ent = torch.zeros(H)
        for h in range(H):
            kh = k[h // (H // k.shape[0])]
            for a in range(T):
                if mode == "hard":
                    keys = [j for j in range(a + 1) if a - j < 4 or bool((qg[a] == kg[j]).any())]
                    logits = torch.stack([q[h, a] @ kh[j] * scale for j in keys])
                else:
                    logits = torch.stack([q[h, a] @ kh[j] * scale + bias[a, j] for j in range(a + 1)])
                p = torch.softmax(logits, 0)
                ent[h] += -(p * p.clamp_min(1e-30).log()).sum() / T
        assert torch.allclose(got[i], ent, atol=1e-4)
