"""Focus on every supported architecture family, on tiny random configs.

GPT-2 (MHA, learned positions), Llama (GQA, RoPE), Mistral (GQA, RoPE, its own sliding window),
Qwen2 (GQA, q/k/v bias), OLMo-2 (QK-norm, post-norm), Gemma-2 (interleaved sliding/global
layers, attention-logit soft-capping) and Gemma-3 (interleaved layers, QK-norm). One code path
(``focus_lab.hf.retrofit.focus_attention``) with a small adapter per family
(``focus_lab.hf.retrofit.ADAPTERS``). Each test runs in well under a second per family.
"""

import types

import pytest
import torch

import focus_lab
from focus_lab import FocusConfig, TrainConfig, UnsupportedModelError
from focus_lab.method.core import masked_attention
from focus_lab.train.loop import train
from focus_lab.hf.retrofit import ADAPTERS, attention_modules, focus_layers, sliding_layers
from conftest import cached_logits, ALL_FAMILIES, tiny_gemma2, tiny_gemma3, tiny_mistral

T = 48
GLOBAL_ONLY = {"gemma2", "gemma3_text"}


def _ids(seed=0, batch=2, T=T):
    return torch.randint(3, 97, (batch, T), generator=torch.Generator().manual_seed(seed))


@pytest.fixture(params=sorted(ALL_FAMILIES))
def family(request):
    return request.param


def test_every_adapter_has_a_tiny_model():
    assert set(ALL_FAMILIES) == set(ADAPTERS)


@torch.no_grad()
def test_routed_layers(family):
    model = ALL_FAMILIES[family]()
    layers = [i for i, _ in attention_modules(model)]
    assert layers == [0, 1]
    focus_lab.attach(model, FocusConfig(window=4))
    routed = sorted(focus_lab.routers(model))
    if family in GLOBAL_ONLY:  # Gemma: layer 0 slides, layer 1 is global
        assert sliding_layers(model) == [0] and routed == [1] == focus_layers(model)
    else:
        assert routed == layers


def test_gemma_refuses_routers_on_sliding_layers():
    for build in (tiny_gemma2, tiny_gemma3):
        with pytest.raises(ValueError, match=r"sliding-window layers \[0\].*global layers \[1\]"):
            focus_lab.attach(build(), FocusConfig(layers=[0, 1]))


@torch.no_grad()
def test_detach_restores_exact_outputs(family):
    model = ALL_FAMILIES[family]()
    ids = _ids()
    impl = model.config._attn_implementation
    grads = {n: p.requires_grad for n, p in model.named_parameters()}
    ref = model(ids).logits
    focus_lab.attach(model, FocusConfig(mode="hard", window=4, num_groups=4, top_k=1))
    assert not torch.allclose(model(ids, use_cache=False).logits, ref, atol=1e-3)
    focus_lab.detach(model)
    assert torch.equal(model(ids).logits, ref)
    assert model.config._attn_implementation == impl
    assert {n: p.requires_grad for n, p in model.named_parameters()} == grads
    assert not any(hasattr(m, "focus_router") for _, m in attention_modules(model))


@torch.no_grad()
@pytest.mark.parametrize("changes", [{"mode": "soft"}, {"mode": "hard"}, {"mode": "hard", "backend": "dense"},
                                     {"mode": "window"}, {"mode": "dense", "window": 4}])
def test_window_covering_the_sequence_equals_dense(family, changes):
    model = ALL_FAMILIES[family]()
    ids = _ids()
    ref = model(ids).logits  # the model's own attention (eager for Gemma-2, sdpa otherwise)
    focus_lab.attach(model, FocusConfig(**{"window": T, "num_groups": 4, "top_k": 1, **changes}))
    out = model(ids, use_cache=False).logits
    assert torch.allclose(out, ref, atol=1e-5), (out - ref).abs().max()


@torch.no_grad()
def test_hard_mask_is_causal_and_local_prefix_is_exact(family):
    model = ALL_FAMILIES[family]()
    ref = model(_ids()).logits
    focus_lab.attach(model, FocusConfig(mode="hard", window=4, num_groups=4, top_k=1))
    a = _ids()
    out = model(a, use_cache=False).logits
    assert torch.allclose(out[:, :4], ref[:, :4], atol=1e-5)  # the first w tokens see everything
    b = a.clone()
    b[:, 31:] = _ids(9)[:, 31:]
    assert torch.allclose(model(b, use_cache=False).logits[:, :31], out[:, :31], atol=1e-5)


@torch.no_grad()
def test_fast_hard_path_equals_dense_reference(family):
    model = ALL_FAMILIES[family]()
    ids = _ids()
    focus_lab.attach(model, FocusConfig(mode="hard", window=6, num_groups=4, top_k=2))
    fast = model(ids, use_cache=False).logits
    focus_lab.set_config(model, backend="dense")
    ref = model(ids, use_cache=False).logits
    assert torch.allclose(fast, ref, atol=1e-5), (fast - ref).abs().max()


@torch.no_grad()
def test_hard_mode_kv_cache_equals_full_forward(family):
    """Prefill + chunk + single-token steps through the model's own cache give the full
    forward's logits (Gemma: sliding-window cache layers for the local layers; Mistral: a
    sliding cache on the routed layers, so key positions are absolute, sinks included)."""
    model = ALL_FAMILIES[family]()
    focus_lab.attach(model, FocusConfig(mode="hard", window=6, num_groups=4, top_k=2, sink_tokens=2))
    ids = _ids(1, batch=1)
    full = model(ids, use_cache=False).logits
    assert (cached_logits(model, ids, [30, 45]) - full).abs().max().item() <= 1e-5


def test_training_step_changes_only_routers(family, tmp_path):
    model = ALL_FAMILIES[family]()
    windows = [types.SimpleNamespace(input_ids=w) for w in _ids(5, batch=4, T=32)]
    before = {n: p.detach().clone() for n, p in model.named_parameters()}
    focus_lab.attach(model, FocusConfig(window=4))
    trainable = {n for n, p in model.named_parameters() if p.requires_grad}
    assert trainable and all(".focus_router." in n for n in trainable)
    r0 = {n: p.detach().clone() for n, p in model.named_parameters() if n in trainable}
    train(model, windows, FocusConfig(window=4),
          TrainConfig(steps=1, batch_size=2, seq_len=32, warmup=1), tmp_path, progress=False)
    for n, p in model.named_parameters():
        if n in trainable:
            assert not torch.equal(p, r0[n]), f"router parameter {n} did not change"
        else:
            assert torch.equal(p, before[n]), f"frozen parameter {n} changed"
    assert (tmp_path / "routers.safetensors").is_file()


@torch.no_grad()
def test_recording_covers_the_routed_layers(family):
    from focus_lab.recording.recorder import assignments_for_window
    model = ALL_FAMILIES[family]()
    focus_lab.attach(model, FocusConfig(mode="hard", window=4, num_groups=4, top_k=2))
    routed = sorted(focus_lab.routers(model))
    ids = _ids(batch=1)
    ref = model(ids, use_cache=False).logits
    with focus_lab.record(model, metrics=["assignments", "balance"]) as rec:
        inside = model(ids, use_cache=False).logits
    assert torch.equal(inside, ref)
    tables = rec.tables()
    asg = tables["assignments"]
    assert sorted(asg["layer_idx"].unique()) == routed
    assert len(asg) == T * len(routed)
    assert set(tables["balance"]["layer_idx"].unique()) == set(routed)
    a = assignments_for_window(model, ids[0])
    assert sorted(a["layer_idx"].unique()) == routed and len(a) == T * len(routed)


@torch.no_grad()
def test_evaluate_runs_every_pattern(family):
    """focus_lab.eval.evaluate's observers see the routed layers only (Gemma: not the sliding ones)."""
    from focus_lab.eval.evaluate import evaluate
    model = ALL_FAMILIES[family]()
    focus_lab.attach(model, FocusConfig(window=T, num_groups=2, top_k=1))
    df = evaluate(model, [types.SimpleNamespace(input_ids=w) for w in _ids(6, batch=1)], progress=False)
    assert list(df["label"]) == ["dense", "window", "soft", "hard_top1", "hard_top2"]
    assert df["perplexity"].max() - df["perplexity"].min() < 1e-3  # nothing is masked at w = T


@torch.no_grad()
def test_router_file_round_trip(family, tmp_path):
    model = ALL_FAMILIES[family]()
    focus_lab.attach(model, FocusConfig(mode="hard", window=4, num_groups=3, top_k=1, seed=3))
    ids = _ids(4)
    ref = model(ids, use_cache=False).logits
    path = focus_lab.save_routers(model, tmp_path / "r.safetensors")
    other = ALL_FAMILIES[family]()
    focus_lab.load_routers(other, path)
    assert sorted(focus_lab.routers(other)) == sorted(focus_lab.routers(model))
    assert torch.equal(other(ids, use_cache=False).logits, ref)


# ------------------------------------------------------------------------------------------
# the features that make the test above discriminative, and Gemma-2's soft-capping

@torch.no_grad()
def test_sliding_window_and_softcap_matter_in_the_tiny_models():
    ids = _ids()
    assert not torch.allclose(tiny_gemma2()(ids).logits, tiny_gemma2(softcap=None)(ids).logits, atol=1e-3)
    assert not torch.allclose(tiny_gemma2()(ids).logits, tiny_gemma2(sliding_window=512)(ids).logits, atol=1e-3)
    assert not torch.allclose(tiny_gemma3()(ids).logits, tiny_gemma3(sliding_window=512)(ids).logits, atol=1e-3)
    assert not torch.allclose(tiny_mistral()(ids).logits, tiny_mistral(sliding_window=None)(ids).logits, atol=1e-3)


@torch.no_grad()
def test_softcap_forces_the_dense_reference(monkeypatch):
    import focus_lab.hf.attention as rf  # where the attention function calls it

    def boom(*a, **k):
        raise AssertionError("the decomposition does not soft-cap; softcap must use the dense reference")
    model = tiny_gemma2()
    focus_lab.attach(model, FocusConfig(mode="hard", window=4, num_groups=4, top_k=1))
    monkeypatch.setattr(rf, "hard_focus_attention", boom)
    model(_ids(), use_cache=False)


def _eager_softcap(q, k, v, bias, scale, softcap):
    rep = q.shape[1] // k.shape[1]
    k, v = k.repeat_interleave(rep, 1), v.repeat_interleave(rep, 1)
    logits = q @ k.transpose(-1, -2) * scale
    logits = softcap * torch.tanh(logits / softcap)
    if bias.dtype == torch.bool:
        logits = logits.masked_fill(~bias[:, None], float("-inf"))
    else:
        logits = logits + bias[:, None]
    return torch.softmax(logits, -1) @ v


def test_masked_attention_softcap_matches_eager_formula():
    from focus_lab.method.core import _softcapped_attention
    g = torch.Generator().manual_seed(0)
    B, H, Hkv, Tq, Tk, D = 2, 4, 2, 9, 13, 8
    q = 3 * torch.randn(B, H, Tq, D, generator=g)
    k, v = torch.randn(B, Hkv, Tk, D, generator=g), torch.randn(B, Hkv, Tk, D, generator=g)
    keep = torch.rand(B, Tq, Tk, generator=g) > 0.3
    keep[..., Tk - Tq:].diagonal(dim1=1, dim2=2).fill_(True)
    fbias = torch.where(keep, torch.randn(B, Tq, Tk, generator=g), torch.tensor(float("-inf")))
    for bias in (keep, fbias):
        ref = _eager_softcap(q, k, v, bias, 0.3, 2.0)
        out = masked_attention(q, k, v, bias, 0.3, softcap=2.0)
        assert torch.allclose(out, ref, atol=1e-6)
        small = _softcapped_attention(q, k, v, bias, 0.3, 2.0, chunk_elements=50)  # 1 query a chunk
        assert torch.allclose(small, ref, atol=1e-6)
    nocap = masked_attention(q, k, v, keep, 0.3)
    assert not torch.allclose(nocap, masked_attention(q, k, v, keep, 0.3, softcap=2.0), atol=1e-3)
    assert torch.allclose(nocap, masked_attention(q, k, v, keep, 0.3, softcap=1e6), atol=1e-5)


def test_softcap_soft_gate_has_router_gradients():
    model = tiny_gemma2()
    focus_lab.attach(model, FocusConfig(mode="soft", window=4))
    ids = _ids()
    model(input_ids=ids, labels=ids, use_cache=False).loss.backward()
    r = focus_lab.routers(model)[1]
    assert r.proj.grad is not None and r.proj.grad.abs().sum() > 0


def test_unsupported_architecture_lists_every_family():
    from transformers import BertConfig, BertForMaskedLM
    model = BertForMaskedLM(BertConfig(vocab_size=50, hidden_size=32, num_hidden_layers=1,
                                       num_attention_heads=2, intermediate_size=64))
    with pytest.raises(UnsupportedModelError, match="'bert'.*supported families: " + ", ".join(sorted(ADAPTERS))):
        focus_lab.attach(model, FocusConfig())
