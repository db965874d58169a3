"""attach / detach / save / load on tiny random Llama and GPT-2 models."""

import pytest
import torch

import focus_lab
from focus_lab import FocusConfig, RouterMismatchError, UnsupportedModelError
from focus_lab.train.loop import train
from conftest import tiny_gpt2, tiny_llama

T = 48


def _ids(seed=0, batch=2, T=T):
    return torch.randint(3, 97, (batch, T), generator=torch.Generator().manual_seed(seed))


@torch.no_grad()
@pytest.mark.parametrize("changes", [{"mode": "soft", "window": T}, {"mode": "hard", "window": T},
                                     {"mode": "soft", "num_groups": 1, "top_k": 1, "window": 4},
                                     {"mode": "hard", "num_groups": 1, "top_k": 1, "window": 4},
                                     {"mode": "hard", "num_groups": 4, "top_k": 4, "window": 4},
                                     {"mode": "dense", "window": 4}])
def test_focus_equals_dense_when_nothing_is_masked(tiny_model, changes):
    ids = _ids()
    ref = tiny_model(ids).logits
    focus_lab.attach(tiny_model, FocusConfig(**changes))
    out = tiny_model(ids, use_cache=False).logits
    assert torch.allclose(out, ref, atol=1e-5), (out - ref).abs().max()


@torch.no_grad()
def test_focus_changes_outputs_when_it_masks(tiny_model):
    ids = _ids()
    ref = tiny_model(ids).logits
    focus_lab.attach(tiny_model, FocusConfig(mode="hard", window=4, num_groups=4, top_k=1))
    out = tiny_model(ids, use_cache=False).logits
    assert not torch.allclose(out[:, 4:], ref[:, 4:], atol=1e-3)
    assert torch.allclose(out[:, :4], ref[:, :4], atol=1e-5)  # first w tokens see everything


@torch.no_grad()
def test_detach_restores_exact_logits(tiny_model):
    ids = _ids()
    before = {n: p.requires_grad for n, p in tiny_model.named_parameters()}
    ref = tiny_model(ids).logits
    focus_lab.attach(tiny_model, FocusConfig(window=4))
    assert not all(p.requires_grad == before[n] for n, p in tiny_model.named_parameters() if n in before)
    focus_lab.detach(tiny_model)
    assert torch.equal(tiny_model(ids).logits, ref)
    assert {n: p.requires_grad for n, p in tiny_model.named_parameters()} == before
    assert tiny_model.config._attn_implementation == "sdpa"


@torch.no_grad()
@pytest.mark.parametrize("mode", ["hard", "window", "dense"])
def test_causal_modes_never_see_the_future(tiny_model, mode):
    focus_lab.attach(tiny_model, FocusConfig(mode=mode, window=4, num_groups=4, top_k=2))
    a = _ids(1)
    b = a.clone()
    i = 30
    b[:, i + 1:] = _ids(2)[:, i + 1:]
    la = tiny_model(a, use_cache=False).logits
    lb = tiny_model(b, use_cache=False).logits
    assert torch.allclose(la[:, :i + 1], lb[:, :i + 1], atol=1e-6)
    assert not torch.allclose(la[:, i + 1:], lb[:, i + 1:], atol=1e-3)


@pytest.mark.parametrize("mode", ["soft", "hard", "window", "dense"])
def test_inference_mode_equals_no_grad(tiny_model, mode):
    """Under ``torch.inference_mode()`` (whose tensors keep no version counter, which the
    plain-causality check reads otherwise) a Focus forward, padded, and a KV-cache decode step
    (every mode but soft, which refuses decode steps) give exactly the no_grad outputs."""
    focus_lab.attach(tiny_model, FocusConfig(mode=mode, window=4, num_groups=4, top_k=2))
    ids = _ids(4)
    mask = torch.ones_like(ids)
    mask[1, :3] = 0  # left padding in one row: transformers builds a mask that is not plain causal

    def run():
        full = tiny_model(ids, attention_mask=mask, use_cache=False).logits
        if mode == "soft":
            return (full,)
        state = focus_lab.forward_state(tiny_model, cache=True)
        pre = tiny_model(ids[:, :-1], focus=state, use_cache=True)
        step = tiny_model(ids[:, -1:], focus=state, past_key_values=pre.past_key_values, use_cache=True).logits
        return full, step

    with torch.no_grad():
        ref = run()
    with torch.inference_mode():
        out = run()
    for a, b in zip(out, ref):
        assert torch.equal(a, b), (a - b).abs().max()


def test_attention_function_applies_causality_when_mask_is_none():
    from focus_lab.hf.retrofit import focus_attention
    torch.manual_seed(0)
    q, k, v = torch.randn(1, 2, 6, 4), torch.randn(1, 2, 6, 4), torch.randn(1, 2, 6, 4)
    module = torch.nn.Module()
    out, _ = focus_attention(module, q, k, v, None)
    ref = torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=True)
    assert torch.allclose(out, ref.transpose(1, 2), atol=1e-6)


def test_padding_reaches_focus_attention():
    model = tiny_llama()
    focus_lab.attach(model, FocusConfig(mode="hard", window=64))
    ids = _ids(3, batch=1, T=20)
    with torch.no_grad():
        alone = model(ids, use_cache=False).logits
        padded = torch.cat([torch.zeros(1, 5, dtype=torch.long), ids], 1)
        mask = torch.cat([torch.zeros(1, 5, dtype=torch.long), torch.ones(1, 20, dtype=torch.long)], 1)
        pos = torch.cat([torch.zeros(1, 5, dtype=torch.long), torch.arange(20)[None]], 1)
        out = model(padded, attention_mask=mask, position_ids=pos, use_cache=False).logits
    assert torch.allclose(out[:, 5:], alone, atol=1e-4)


def test_training_step_changes_only_routers(tiny_model, tmp_path):
    import types
    from focus_lab import TrainConfig
    windows = [types.SimpleNamespace(input_ids=w) for w in _ids(5, batch=6, T=32)]
    before = {n: p.detach().clone() for n, p in tiny_model.named_parameters()}
    buffers = {n: b.clone() for n, b in tiny_model.named_buffers()}
    focus_lab.attach(tiny_model, FocusConfig(window=4))
    trainable = {n for n, p in tiny_model.named_parameters() if p.requires_grad}
    assert trainable and all(".focus_router." in n for n in trainable)
    r0 = {n: p.detach().clone() for n, p in tiny_model.named_parameters() if n in trainable}
    train(tiny_model, windows, FocusConfig(window=4), TrainConfig(steps=1, batch_size=2, seq_len=32, warmup=1),
          tmp_path, progress=False)
    for n, p in tiny_model.named_parameters():
        if n in trainable:
            assert not torch.equal(p, r0[n]), f"router parameter {n} did not change"
        else:
            assert torch.equal(p, before[n]), f"frozen parameter {n} changed"
    for n, b in tiny_model.named_buffers():
        if n in buffers:
            assert torch.equal(b, buffers[n])


def test_router_save_load_round_trip_and_foreign_refusal(tmp_path):
    model = tiny_llama()
    cfg = FocusConfig(mode="hard", window=4, num_groups=3, top_k=2, seed=7)
    focus_lab.attach(model, cfg)
    with torch.no_grad():
        for r in focus_lab.routers(model).values():
            r.group_bias.copy_(torch.randn(3))
    ids = _ids(4)
    with torch.no_grad():
        ref = model(ids, use_cache=False).logits
    path = focus_lab.save_routers(model, tmp_path / "r.safetensors")
    other = tiny_llama()  # same seed: same base model
    loaded = focus_lab.load_routers(other, path)
    assert loaded == cfg
    with torch.no_grad():
        assert torch.equal(other(ids, use_cache=False).logits, ref)
    foreign = tiny_llama(seed=1)
    with pytest.raises(RouterMismatchError, match="trained on base model"):
        focus_lab.load_routers(foreign, path)
    with pytest.raises(RouterMismatchError, match="trained on base model"):
        focus_lab.load_routers(tiny_gpt2(), path)
    (tmp_path / "junk.safetensors").write_bytes(b"not a safetensors file")
    with pytest.raises(RouterMismatchError, match="not a safetensors"):
        focus_lab.load_routers(tiny_llama(), tmp_path / "junk.safetensors")


def test_unsupported_architecture_lists_families():
    from transformers import BertConfig, BertForMaskedLM
    model = BertForMaskedLM(BertConfig(vocab_size=50, hidden_size=32, num_hidden_layers=1,
                                       num_attention_heads=2, intermediate_size=64))
    with pytest.raises(UnsupportedModelError, match="supported families: .*gpt2.*llama"):
        focus_lab.attach(model, FocusConfig())


@torch.no_grad()
def test_phase_timings_add_up_inside_the_attention_function():
    """Phase timings of a FocusForward (hard mode, the two-call path) add up inside the
    attention function."""
    from focus_lab.hf.retrofit import forward_state
    model = tiny_llama()
    focus_lab.attach(model, FocusConfig(mode="hard", window=4, num_groups=4, top_k=2, sink_tokens=2))
    state = forward_state(model)
    state.timings = {}
    model(_ids(), use_cache=False, focus=state)
    t = state.timings
    inside = sum(v for k, v in t.items() if k != "attention_fn")
    assert {"route", "plan", "attn_A", "attn_B", "merge", "attention_fn"} <= set(t)
    assert 0 < inside <= t["attention_fn"]
