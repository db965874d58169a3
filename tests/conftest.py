"""Shared fixtures: tiny random models of each supported family (no hub access); the committed
length-table cells for the generated blocks' by-hand references (tests/by_hand.py)."""

from __future__ import annotations

import os

import pytest
import torch

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
torch.set_num_threads(min(2, torch.get_num_threads()))


def random_ids(seed: int = 0, batch: int = 2, T: int = 40) -> torch.Tensor:
    """(batch, T) token ids in 3..96 from ``seed`` (the tiny models' vocabulary)."""
    return torch.randint(3, 97, (batch, T), generator=torch.Generator().manual_seed(seed))


@torch.no_grad()
def cached_logits(model, ids: torch.Tensor, chunk_ends: list[int]) -> torch.Tensor:
    """Logits of ``ids`` (B, T) fed through one ``DynamicCache``: a prefill up to ``chunk_ends[0]``,
    chunks up to each further end, then one-token steps to T. Returns (B, T, vocab)."""
    from transformers import DynamicCache
    cache = DynamicCache(config=model.config)
    ends = list(chunk_ends) + list(range(chunk_ends[-1] + 1, ids.shape[1] + 1))
    parts, start = [], 0
    for end in ends:
        parts.append(model(ids[:, start:end], past_key_values=cache, use_cache=True).logits)
        start = end
    return torch.cat(parts, 1)


@torch.no_grad()
def soft_forward_layers(model, ids: torch.Tensor):
    """One soft-mode forward of a Focus-attached model on ``ids`` (B, T). Returns (the forward's
    FocusConfig, [(router, its RMS-normalized input (B, T, d), the gate it attended with (B, T, T))])."""
    import focus_lab
    from focus_lab.method.core import rms_normalize
    state = focus_lab.forward_state(model, mode="soft")
    with focus_lab.cache(model, ["router_in", "kept"]) as c:
        model(input_ids=ids, use_cache=False, focus=state)
    return state.config, [(r, rms_normalize(c[f"layers.{i}.router_in"]), c[f"layers.{i}.kept"])
                          for i, r in focus_lab.routers(model).items()]


def soft_gate_reference(p_q: torch.Tensor, p_k: torch.Tensor, window: int, eps: float, sinks: int = 0) -> torch.Tensor:
    """The soft gate by hand (docs/method.md §2.3): ``log(max(P_q . P_k, eps))`` on distant causal
    pairs, 0 on local and sink pairs, -inf above the diagonal. p_q, p_k: (B, T, K) -> (B, T, T)."""
    T = p_q.shape[1]
    pos = torch.arange(T)
    want = torch.log((p_q @ p_k.transpose(1, 2)).clamp(min=eps))  # (B, T, T)
    local = (pos[:, None] - pos[None, :] < window) | (pos[None, :] < sinks)
    return want.masked_fill(local, 0.0).masked_fill(pos[None, :] > pos[:, None], float("-inf"))


def tiny_llama(seed: int = 0, layers: int = 2):
    """Llama family (GQA 4/2 heads, RoPE), random weights, eval mode (``focus_lab.hf.tiny``)."""
    from focus_lab.hf.tiny import tiny_llama as make
    return make(seed=seed, layers=layers)


def tiny_gpt2(seed: int = 0, layers: int = 2):
    """GPT-2 (MHA, learned positions), random weights, eval mode (``focus_lab.hf.tiny``)."""
    from focus_lab.hf.tiny import tiny_gpt2 as make
    return make(seed=seed, layers=layers)


def _perturb(model, seed: int):
    """Random biases and norm weights (transformers initializes them to 0 / 1), so that q/k/v
    bias and QK-norm actually act in the tests. Deterministic in ``seed``; eval mode."""
    g = torch.Generator().manual_seed(seed + 12345)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith(".bias") or "norm" in name:
                p.add_(0.2 * torch.randn(p.shape, generator=g))
    return model.eval()


def tiny_mistral(seed: int = 0, layers: int = 2, sliding_window: int | None = 32):
    """Mistral (GQA 4/2 heads, RoPE) with its own sliding window (32 tokens by default), which
    reaches Focus through the mask."""
    from transformers import MistralConfig, MistralForCausalLM
    torch.manual_seed(seed)
    cfg = MistralConfig(vocab_size=97, hidden_size=64, intermediate_size=128, num_hidden_layers=layers,
                        num_attention_heads=4, num_key_value_heads=2, head_dim=16,
                        max_position_embeddings=512, sliding_window=sliding_window,
                        bos_token_id=1, eos_token_id=2, pad_token_id=0)
    return _perturb(MistralForCausalLM(cfg), seed)


def tiny_qwen2(seed: int = 0, layers: int = 2):
    """Qwen2 (GQA 4/2 heads, RoPE, q/k/v bias, randomized)."""
    from transformers import Qwen2Config, Qwen2ForCausalLM
    torch.manual_seed(seed)
    cfg = Qwen2Config(vocab_size=97, hidden_size=64, intermediate_size=128, num_hidden_layers=layers,
                      num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=512,
                      bos_token_id=1, eos_token_id=2, pad_token_id=0)
    return _perturb(Qwen2ForCausalLM(cfg), seed)


def tiny_olmo2(seed: int = 0, layers: int = 2):
    """OLMo-2 (GQA 4/2 heads, RoPE, QK-norm over the projections, post-norm layers)."""
    from transformers import Olmo2Config, Olmo2ForCausalLM
    torch.manual_seed(seed)
    cfg = Olmo2Config(vocab_size=97, hidden_size=64, intermediate_size=128, num_hidden_layers=layers,
                      num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=512,
                      bos_token_id=1, eos_token_id=2, pad_token_id=0)
    return _perturb(Olmo2ForCausalLM(cfg), seed)


def tiny_gemma2(seed: int = 0, layers: int = 2, sliding_window: int = 16, softcap: float | None = 1.0):
    """Gemma-2: interleaved sliding (even) / global (odd) layers, attention-logit soft-capping
    (1.0 by default; q/k projections scaled up so the attention logits reach a few units and the
    cap changes them),
    query_pre_attn_scalar != head_dim. Its default attention is eager (sdpa has no softcap)."""
    from transformers import Gemma2Config, Gemma2ForCausalLM
    torch.manual_seed(seed)
    cfg = Gemma2Config(vocab_size=97, hidden_size=64, intermediate_size=128, num_hidden_layers=layers,
                       num_attention_heads=4, num_key_value_heads=2, head_dim=16, query_pre_attn_scalar=24,
                       max_position_embeddings=512, sliding_window=sliding_window,
                       attn_logit_softcapping=softcap, final_logit_softcapping=30.0,
                       bos_token_id=1, eos_token_id=2, pad_token_id=0)
    model = _perturb(Gemma2ForCausalLM(cfg), seed)
    with torch.no_grad():  # attention logits of a few units, so that a cap of 1.0 bites
        for layer in model.model.layers:
            layer.self_attn.q_proj.weight.mul_(6.0)
            layer.self_attn.k_proj.weight.mul_(6.0)
    return model


def tiny_gemma3(seed: int = 0, layers: int = 2, sliding_window: int = 16):
    """Gemma-3 text: interleaved sliding / global layers ([sliding, global] for 2 layers),
    QK-norm, separate local/global RoPE, no attention softcap."""
    from transformers import Gemma3ForCausalLM, Gemma3TextConfig
    torch.manual_seed(seed)
    types = ["sliding_attention" if i % 2 == 0 else "full_attention" for i in range(layers)]
    cfg = Gemma3TextConfig(vocab_size=97, hidden_size=64, intermediate_size=128, num_hidden_layers=layers,
                           num_attention_heads=4, num_key_value_heads=1, head_dim=16, query_pre_attn_scalar=24,
                           max_position_embeddings=512, sliding_window=sliding_window, layer_types=types,
                           bos_token_id=1, eos_token_id=2, pad_token_id=0)
    return _perturb(Gemma3ForCausalLM(cfg), seed)


# families of the ``tiny_model`` fixture (every test that takes it runs on each), keyed by
# model_type. Gemma-2 is left out only because its default attention is eager, not sdpa (a test
# checks detach restores "sdpa"); tests/test_architectures.py covers it with ALL_FAMILIES.
FAMILIES = {"llama": tiny_llama, "gpt2": tiny_gpt2, "mistral": tiny_mistral, "qwen2": tiny_qwen2,
            "olmo2": tiny_olmo2, "gemma3_text": tiny_gemma3}
# every architecture family with an adapter (focus_lab.hf.retrofit.ADAPTERS), keyed by model_type
ALL_FAMILIES = {**FAMILIES, "gemma2": tiny_gemma2}


@pytest.fixture(params=sorted(FAMILIES))
def tiny_model(request):
    return FAMILIES[request.param]()


@pytest.fixture(scope="session")
def cells():
    """The committed length-table rows (figures/results/length_cells.parquet), read once for the
    tests that check generated blocks by hand (``by_hand.rows`` and the rest take them)."""
    from by_hand import length_cells
    return length_cells()
