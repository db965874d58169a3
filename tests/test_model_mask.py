"""The model's mask given by rows (focus_lab.hf.model_mask.ModelMask) against transformers' own
materialized mask (``sdpa_mask``), and a long forward that never builds a (B, T, T) mask."""

import pytest
import torch
from transformers.masking_utils import (causal_mask_function,
                                        sdpa_mask, sliding_window_causal_mask_function)

import focus_lab
from focus_lab.hf import attention as focus_attention_module
from focus_lab.hf.model_mask import ModelMask
from focus_lab.hf.state import is_plain_causal
from focus_lab.hf.tiny import tiny_gemma3
from focus_lab.method.config import FocusConfig


def _brute_plain(m: torch.Tensor) -> bool:  # (B, Tq, Tk): query i sees exactly keys 0 .. Tk - Tq + i
    B, Tq, Tk = m.shape
    q = torch.arange(Tk - Tq, Tk)[:, None]
    return bool((m == (torch.arange(Tk)[None, :] <= q)).all())


CASES = {
    "causal": dict(batch_size=2, q_length=37, kv_length=37, mask_function=causal_mask_function),
    "sliding": dict(batch_size=1, q_length=40, kv_length=40, mask_function=sliding_window_causal_mask_function(6)),
    "cache step": dict(batch_size=1, q_length=3, kv_length=30, q_offset=27, mask_function=causal_mask_function),
    "padding": dict(batch_size=2, q_length=20, kv_length=20, mask_function=causal_mask_function,
                    attention_mask=torch.tensor([[0] * 5 + [1] * 15, [1] * 20])),
}


@pytest.mark.parametrize("name", list(CASES))
def test_rows_dense_diagonal_and_plain_causality_equal_the_built_mask(name, monkeypatch):
    kw = CASES[name]
    want = sdpa_mask(**kw, allow_is_causal_skip=False)[:, 0]  # (B, Tq, Tk), transformers' own build
    monkeypatch.setattr("focus_lab.hf.model_mask.ROW_BLOCK", 7)  # several blocks, a ragged last one
    m = ModelMask.rule(**kw)
    assert tuple(m.shape) == tuple(want.shape)
    assert torch.equal(torch.cat([m.rows(s, min(s + 5, m.shape[1])) for s in range(0, m.shape[1], 5)], 1), want)
    assert torch.equal(m.diagonal(), want.diagonal(offset=want.shape[2] - want.shape[1], dim1=1, dim2=2))
    assert m.plain_causal == _brute_plain(want) == (name in ("causal", "cache step"))
    assert is_plain_causal(want) == m.plain_causal  # the tensor form goes through the same rule
    assert torch.equal(m.dense(), want)


def test_a_float_bias_mask_and_none_read_as_the_same_rows():
    B, T = 2, 9
    causal = torch.ones(T, T, dtype=torch.bool).tril()
    bias = torch.zeros(B, 1, T, T).masked_fill(~causal, torch.finfo(torch.float32).min)
    assert torch.equal(ModelMask.tensor(bias, B, T, T, "cpu").dense(), causal.expand(B, T, T))
    assert torch.equal(ModelMask.tensor(None, B, T, T, "cpu").rows(2, 5), causal[2:5].expand(B, 3, T))
    with pytest.raises(ValueError, match="attention call"):
        ModelMask.tensor(None, B, T, T, "cpu").sized(B, T - 1, T)


@pytest.mark.parametrize("mode", ["dense", "hard"])
def test_a_long_gemma_forward_reads_rows_only_and_equals_the_built_mask(mode, monkeypatch):
    """Gemma-shaped model (sliding layers in a 16-key window, every third layer global and
    routed), 1,100 tokens (three blocks of 512 queries): with the model's mask given by rows no
    path asks for the whole mask, and the logits equal those under transformers' own built
    (1, 1, T, T) masks, the mask function before ModelMask."""
    model = tiny_gemma3(max_positions=2048)
    focus_lab.attach(model, FocusConfig(mode=mode, window=8, num_groups=4, top_k=1))
    ids = torch.randint(3, 97, (1, 1100))

    def no_dense(self):
        raise AssertionError(f"the whole mask was built: {self!r}")

    with torch.no_grad(), monkeypatch.context() as mp:
        mp.setattr(ModelMask, "dense", no_dense)
        rows = model(ids).logits
    built = {}

    def built_mask(**kw):  # the pre-ModelMask mask function: transformers' tensor, always built
        m = sdpa_mask(**{**kw, "allow_is_causal_skip": False})
        built[tuple(m.shape)] = True
        return m

    with torch.no_grad(), monkeypatch.context() as mp:
        mp.setitem(focus_attention_module.AttentionMaskInterface._global_mapping, "focus", built_mask)
        want = model(ids).logits
    assert built == {(1, 1, 1100, 1100): True}
    torch.testing.assert_close(rows, want, atol=1e-5, rtol=1e-5)


def test_padding_reaches_a_routed_layer_through_the_rows():
    """Left padding: the routed layers see the padded tokens as masked (their token mask, the
    mask's diagonal), and the padded batch row's logits on its real tokens equal those of the
    unpadded sequence alone (dense mode)."""
    model = tiny_gemma3()
    focus_lab.attach(model, FocusConfig(mode="dense", window=8, num_groups=4, top_k=1))
    ids = torch.randint(3, 97, (1, 30))
    padded = torch.cat([torch.zeros(1, 4, dtype=torch.long), ids], 1)
    att = torch.cat([torch.zeros(1, 4, dtype=torch.long), torch.ones(1, 30, dtype=torch.long)], 1)
    with torch.no_grad():
        alone = model(ids).logits
        pos = (att.cumsum(-1) - 1).clamp(min=0)
        pad = model(padded, attention_mask=att, position_ids=pos).logits[:, 4:]
    torch.testing.assert_close(pad, alone, atol=1e-4, rtol=1e-4)
