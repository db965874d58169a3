"""The per-token NLL of ``evaluate`` without the full logits (``evaluate.next_token_nll``: the
output head over slices of positions) against the full-logits cross-entropy, on tiny random
Llama, GPT-2, Gemma-2 and Gemma-3 models (issue 73: Gemma-3's 262K vocabulary at 16K-32K tokens)."""

import math
from types import SimpleNamespace

import numpy as np
import pandas as pd
import pytest
import torch
import torch.nn.functional as F

import focus_lab
from focus_lab import FocusConfig
from focus_lab.eval.evaluate import evaluate, next_token_nll, output_head, parse_patterns
from conftest import tiny_gemma2, tiny_gemma3, tiny_gpt2, tiny_llama

T = 40


def _gemma3_capped():
    """Gemma-3 with a final logit softcap small enough to change the tiny model's logits."""
    model = tiny_gemma3()
    model.config.final_logit_softcapping = 0.5
    return model


MODELS = {"llama": tiny_llama, "gpt2": tiny_gpt2, "gemma2": tiny_gemma2, "gemma3": tiny_gemma3,
          "gemma3_capped": _gemma3_capped}


def _ids(seed=0, batch=2):
    return torch.randint(3, 97, (batch, T), generator=torch.Generator().manual_seed(seed))


def _full_nll(model, ids, **kwargs) -> torch.Tensor:
    """(batch, T - 1) nats from the full (batch, T, vocab) logits of the model's own forward."""
    logits = model(input_ids=ids, **kwargs).logits
    return F.cross_entropy(logits[:, :-1].flatten(0, 1).float(), ids[:, 1:].flatten(),
                           reduction="none").view(ids.shape[0], -1)


@torch.no_grad()
@pytest.mark.parametrize("name", sorted(MODELS))
@pytest.mark.parametrize("attached", [False, True])
def test_chunked_nll_equals_the_full_logits_nll(name, attached):
    """Slices of 1, 7 (which divides no batch x (T - 1) = 78) and more positions than there are:
    the same per-token NLL as the full logits, plain or with Focus attached (hard top-1)."""
    model = MODELS[name]()
    kwargs = {"use_cache": False}
    if attached:
        focus_lab.attach(model, FocusConfig(mode="hard", window=4, num_groups=4, top_k=1))
        kwargs["focus"] = focus_lab.forward_state(model)
    ids = _ids()
    ref = _full_nll(model, ids, **kwargs)
    for chunk in (1, 7, 10_000):
        out = next_token_nll(model, ids, chunk=chunk, **kwargs)
        assert out.shape == ref.shape == (2, T - 1) and out.dtype == torch.float32
        assert torch.allclose(out, ref, atol=1e-5, rtol=0), (chunk, (out - ref).abs().max())


@torch.no_grad()
def test_the_head_applies_gemmas_final_softcap():
    """The cap changes the NLL (so the test above checks it), as transformers' forward applies it."""
    model = _gemma3_capped()
    hidden = model.base_model(input_ids=_ids()).last_hidden_state
    capped = output_head(model)(hidden)
    plain = model.get_output_embeddings()(hidden)
    assert capped.abs().max() <= 0.5 and not torch.allclose(capped, plain, atol=1e-3)
    assert torch.allclose(capped, model(input_ids=_ids()).logits, atol=1e-6)


def test_evaluate_nll_equals_the_full_logits_nll():
    """``evaluate``'s nll per pattern (dense, window, hard top-1, random top-2) is the token-weighted
    mean of the full-logits cross-entropy over the windows, within float tolerance."""
    model = tiny_gemma3()
    focus_lab.attach(model, FocusConfig(window=4, num_groups=4, seed=3))
    windows = [SimpleNamespace(input_ids=_ids(s, batch=1)[0]) for s in (1, 2, 3)]
    pats = parse_patterns("dense,window,hard_top1,random_top2", 4)
    df = evaluate(model, windows, pats, batch_size=2, progress=False).set_index("label")
    for label, changes in pats:
        with torch.no_grad():
            state = focus_lab.forward_state(model, **changes)
            ref = torch.cat([_full_nll(model, w.input_ids[None], use_cache=False, focus=state)
                             for w in windows]).double().mean().item()
        assert df.nll[label] == pytest.approx(ref, abs=1e-5)
        assert df.tokens[label] == 3 * (T - 1)


def test_bad_chunk_or_a_body_without_head_is_refused():
    model = tiny_llama()
    with pytest.raises(ValueError, match="chunk 0"):
        next_token_nll(model, _ids(), chunk=0)
    with pytest.raises(ValueError, match="no output head"):
        output_head(model.base_model)


def test_block_losses_are_the_full_logits_nll_in_runs(monkeypatch):
    """Each row's block_nll holds, window after window, the summed full-logits NLL of each run of
    BLOCK_TOKENS predicted tokens (16 here: runs of 16, 16 and 7 of a window's 39), and block_tokens
    their lengths; per_window rows hold their own window's runs."""
    import focus_lab.eval.evaluate as E
    monkeypatch.setattr(E, "BLOCK_TOKENS", 16)
    model = tiny_gemma3()
    focus_lab.attach(model, FocusConfig(window=4, num_groups=4, seed=3))
    windows = [SimpleNamespace(input_ids=_ids(s, batch=1)[0], index=10 + s) for s in (1, 2)]
    pats = parse_patterns("dense,hard_top1", 4)
    pooled = evaluate(model, windows, pats, batch_size=2, progress=False).set_index("label")
    rows = evaluate(model, windows, pats, progress=False, per_window=True)
    for label, changes in pats:
        with torch.no_grad():
            state = focus_lab.forward_state(model, **changes)
            ref = [_full_nll(model, w.input_ids[None], use_cache=False, focus=state)[0].double() for w in windows]
        expect = [float(r[a:b].sum()) for r in ref for a, b in ((0, 16), (16, 32), (32, 39))]
        assert list(pooled.block_tokens[label]) == [16, 16, 7, 16, 16, 7]
        assert pooled.block_nll[label] == pytest.approx(expect, abs=1e-4)
        mine = rows[rows.label == label].set_index("window")
        assert mine.block_nll[11] == pytest.approx(expect[:3], abs=1e-4)
        assert mine.block_nll[12] == pytest.approx(expect[3:], abs=1e-4)
        assert sum(mine.block_nll[11]) == pytest.approx(mine.nll[11] * mine.tokens[11], abs=1e-4)


def _block_rows(per_token: list[list[float]], block: int = 2) -> pd.DataFrame:
    """Per-window rows from per-token NLLs: blocks of ``block`` tokens."""
    rows = []
    for w, nll in enumerate(per_token):
        runs = [nll[s:s + block] for s in range(0, len(nll), block)]
        rows.append({"window": w, "nll": sum(nll) / len(nll), "tokens": len(nll),
                     "block_nll": [sum(r) for r in runs], "block_tokens": [len(r) for r in runs]})
    return pd.DataFrame(rows)


def test_block_interval_by_hand(monkeypatch):
    """paired_change with ``block``: the same change as over windows; a unit covering a whole
    window gives the window bootstrap's interval; a difference equal in every unit gives an interval
    of width 0; units of 2 tokens resampled stay within the units' own changes."""
    import focus_lab.eval.evaluate as E
    monkeypatch.setattr(E, "BLOCK_TOKENS", 2)
    gen = np.random.default_rng(1)
    base = [list(gen.uniform(1, 3, 8)) for _ in range(3)]  # 3 windows of 8 tokens
    b = _block_rows(base)
    shift = [[x + 0.01 for x in w] for w in base]
    assert E.paired_change(_block_rows(shift), b, block=4) == pytest.approx((100 * (math.exp(0.01) - 1),) * 3)
    other = [list(np.array(w) + gen.normal(0, 0.1, 8)) for w in base]
    a = _block_rows(other)
    win = E.paired_change(a, b)
    assert E.paired_change(a, b, block=8) == pytest.approx(win)  # 8 tokens: a unit is a window
    ch, lo, hi = E.paired_change(a, b, block=2)
    assert ch == pytest.approx(win[0])
    per = [100 * (math.exp((sum(o[s:s + 2]) - sum(q[s:s + 2])) / 2) - 1)
           for o, q in zip(other, base) for s in range(0, 8, 2)]
    assert min(per) <= lo < ch < hi <= max(per)
    with pytest.raises(ValueError, match="multiple of 2"):
        E.paired_change(a, b, block=3)
    with pytest.raises(ValueError, match="evaluate the windows again"):
        E.paired_change(a.drop(columns=["block_nll", "block_tokens"]), b, block=2)
