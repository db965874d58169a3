"""GrowingCache (focus_lab.hf.kv_cache) against transformers' DynamicCache: the same tensors at
every step, in place when there is room, and the same generations (dense and hard mode)."""

import pytest
import torch
from transformers.cache_utils import DynamicCache, DynamicLayer

from focus_lab.hf.kv_cache import GrowingCache, GrowingLayer, PlainDynamicCache


@pytest.fixture
def small_spare(monkeypatch):
    monkeypatch.setattr(GrowingLayer, "SPARE", 3)  # buffers grow every few steps


def _kv(gen, B, n):
    return torch.randn(B, 2, n, 4, generator=gen), torch.randn(B, 2, n, 4, generator=gen)


def test_growing_layer_equals_dynamic_layer_through_every_method(small_spare):
    """Updates of 1-7 tokens, a crop, a batch reorder and repeat, a reset: after each, the
    growing layer holds exactly the DynamicLayer's keys and values."""
    gen = torch.Generator().manual_seed(0)
    grow, dyn = GrowingLayer(), DynamicLayer()
    B = 2
    script = [5, 1, 1, 7, 1, "crop", 1, 2, "select", 1, 1, "repeat", 3, 1, "reset", 4, 1]
    for step in script:
        if step == "crop":
            grow.crop(-3), dyn.crop(-3)
        elif step == "select":
            idx = torch.tensor([1, 0])
            grow.batch_select_indices(idx), dyn.batch_select_indices(idx)
        elif step == "repeat":
            grow.batch_repeat_interleave(2), dyn.batch_repeat_interleave(2)
            B = 4
        elif step == "reset":
            grow.reset(), dyn.reset()
        else:
            k, v = _kv(gen, B, step)
            gk, gv = grow.update(k, v)
            dk, dv = dyn.update(k, v)
            assert torch.equal(gk, dk) and torch.equal(gv, dv), f"after update({step})"
        if dyn.is_initialized and dyn.keys.numel():
            assert torch.equal(grow.keys, dyn.keys) and torch.equal(grow.values, dyn.values), step
            assert grow.get_seq_length() == dyn.get_seq_length()


def test_growing_layer_appends_in_place_while_there_is_room(small_spare):
    """No copy of the cached tokens per step: the returned keys stay views of one buffer until
    it is full, then move once (the DynamicLayer's keys move every step)."""
    gen = torch.Generator().manual_seed(1)
    grow = GrowingLayer()
    k, v = _kv(gen, 1, 10)
    grow.update(k, v)  # 10 tokens, room for 13
    ptr = grow.keys.data_ptr()
    for n in range(11, 14):
        grow.update(*_kv(gen, 1, 1))
        assert grow.keys.data_ptr() == ptr and grow.keys.shape[-2] == n
    grow.update(*_kv(gen, 1, 1))  # the 14th token does not fit: a new buffer
    assert grow.keys.data_ptr() != ptr and grow.keys.shape[-2] == 14


@pytest.mark.parametrize("family", ["llama", "gpt2"])
@pytest.mark.parametrize("mode", ["dense", "hard"])
def test_growing_cache_decodes_like_dynamic_cache(family, mode, small_spare):
    """Prefill + one-token steps through GrowingCache give the same logits as through
    DynamicCache and as the full forward; generate() gives the same tokens. (PlainDynamicCache:
    attach's pre-hook would make an exact DynamicCache grow too.)"""
    import focus_lab
    from conftest import FAMILIES
    m = FAMILIES[family]()
    focus_lab.attach(m, focus_lab.FocusConfig(num_groups=4, top_k=2, window=8, mode=mode))
    ids = torch.randint(3, 97, (1, 40), generator=torch.Generator().manual_seed(2))
    with torch.no_grad():
        full = m(ids).logits
        runs = {}
        for name, cls in [("growing", GrowingCache), ("dynamic", PlainDynamicCache)]:
            cache = cls(config=m.config)
            parts = [m(ids[:, :25], past_key_values=cache, use_cache=True).logits]
            parts += [m(ids[:, t:t + 1], past_key_values=cache, use_cache=True).logits for t in range(25, 40)]
            runs[name] = torch.cat(parts, 1)
            assert all(isinstance(layer, GrowingLayer) == (name == "growing") for layer in cache.layers)
        gen_g = m.generate(ids[:, :20], max_new_tokens=8, do_sample=False, past_key_values=GrowingCache(config=m.config))
        gen_d = m.generate(ids[:, :20], max_new_tokens=8, do_sample=False, past_key_values=PlainDynamicCache(config=m.config))
    assert torch.equal(runs["growing"], runs["dynamic"])
    assert (runs["growing"] - full).abs().max().item() <= 1e-5
    assert torch.equal(gen_g, gen_d)


@pytest.mark.parametrize("family", ["llama", "gpt2"])
def test_attached_model_makes_generates_default_cache_grow(family):
    """On an attached model the empty layers of a forward's DynamicCache (generate's default)
    become GrowingLayers, the logits stay those of the same steps on the plain model's cache,
    and a cache that already holds tokens, or of another class, is left alone."""
    import focus_lab
    from conftest import FAMILIES
    from transformers.cache_utils import StaticCache
    m = FAMILIES[family]()
    ids = torch.randint(3, 97, (1, 30), generator=torch.Generator().manual_seed(3))
    with torch.no_grad():
        plain_cache = DynamicCache(config=m.config)
        plain = [m(ids[:, :20], past_key_values=plain_cache, use_cache=True).logits,
                 m(ids[:, 20:21], past_key_values=plain_cache, use_cache=True).logits]
        assert not any(isinstance(layer, GrowingLayer) for layer in plain_cache.layers)  # before attach: untouched
        focus_lab.attach(m, focus_lab.FocusConfig(num_groups=4, top_k=2, window=8, mode="dense"))
        cache = DynamicCache(config=m.config)
        out = [m(ids[:, :20], past_key_values=cache, use_cache=True).logits,
               m(ids[:, 20:21], past_key_values=cache, use_cache=True).logits]
        assert cache.layers and all(isinstance(layer, GrowingLayer) for layer in cache.layers)
        assert all(torch.equal(a, b) for a, b in zip(plain, out))
        held = DynamicCache(config=m.config)
        focus_lab.detach(m)
        m(ids[:, :5], past_key_values=held, use_cache=True)  # holds tokens before the model is attached
        focus_lab.attach(m, focus_lab.FocusConfig(num_groups=4, top_k=2, window=8, mode="dense"))
        m(ids[:, 5:6], past_key_values=held, use_cache=True)
        assert not any(isinstance(layer, GrowingLayer) for layer in held.layers)
        class Sub(DynamicCache):  # a subclass is the caller's choice: left as it is
            pass
        sub = Sub(config=m.config)
        m(ids[:, :5], past_key_values=sub, use_cache=True)
        assert not any(isinstance(layer, GrowingLayer) for layer in sub.layers)
        static = StaticCache(config=m.config, max_cache_len=64)
        from focus_lab.hf.kv_cache import grow_in_place
        grow_in_place(static)
        assert not any(isinstance(layer, GrowingLayer) for layer in static.layers)


@pytest.mark.parametrize("family,key_shift", [("llama", 0), ("gpt2", 0), ("llama", 1)])
def test_beam_search_scores_equal_full_forward_in_hard_mode(family, key_shift):
    """Beam search reorders the KV cache's rows between steps; the key groups of the Focus cache
    must follow (``attach`` installs the model's ``_reorder_cache``). Each returned beam's score
    (length_penalty 0: the sum of its tokens' log-probs) equals the log-probs of a full hard-mode
    forward over the finished sequence, which routes every token afresh; and the beams did get
    reordered, so the test can fail. Detach puts the model's own ``_reorder_cache`` state back."""
    import focus_lab
    from conftest import FAMILIES
    m = FAMILIES[family]()
    focus_lab.attach(m, focus_lab.FocusConfig(num_groups=4, top_k=1, window=4, mode="hard",
                                              key_shift=key_shift))
    ids = torch.randint(3, 97, (1, 40), generator=torch.Generator().manual_seed(5))
    n_new = 12
    with torch.no_grad():
        out = m.generate(ids, max_new_tokens=n_new, min_new_tokens=n_new, num_beams=4, num_return_sequences=4,
                         do_sample=False, length_penalty=0.0, early_stopping=False, output_scores=True,
                         return_dict_in_generate=True)
        logp = torch.log_softmax(m(out.sequences).logits.float(), -1)[:, ids.shape[1] - 1:-1]  # (4, n_new, V)
    full = logp.gather(-1, out.sequences[:, ids.shape[1]:, None])[..., 0].sum(-1)  # (4,)
    assert torch.allclose(out.sequences_scores, full, atol=1e-4), (out.sequences_scores, full)
    assert (out.beam_indices[:, :n_new] != torch.arange(4)[:, None]).any(), "no reorder happened"
    focus_lab.detach(m)
    assert "_reorder_cache" not in m.__dict__
