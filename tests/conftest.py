"""Shared fixtures: tiny random models of each supported family (no hub access)."""

from __future__ import annotations

import os

import pytest
import torch

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
torch.set_num_threads(min(2, torch.get_num_threads()))


def tiny_llama(seed: int = 0, layers: int = 2):
    """Llama family (GQA 4/2 heads, RoPE), random weights, eval mode."""
    from transformers import LlamaConfig, LlamaForCausalLM
    torch.manual_seed(seed)
    cfg = LlamaConfig(vocab_size=97, hidden_size=64, intermediate_size=128, num_hidden_layers=layers,
                      num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=512,
                      bos_token_id=1, eos_token_id=2, pad_token_id=0)
    return LlamaForCausalLM(cfg).eval()


def tiny_gpt2(seed: int = 0, layers: int = 2):
    """GPT-2 (MHA, learned positions), random weights, eval mode."""
    from transformers import GPT2Config, GPT2LMHeadModel
    torch.manual_seed(seed)
    cfg = GPT2Config(vocab_size=97, n_embd=64, n_layer=layers, n_head=4, n_positions=512,
                     bos_token_id=1, eos_token_id=2)
    return GPT2LMHeadModel(cfg).eval()


FAMILIES = {"llama": tiny_llama, "gpt2": tiny_gpt2}


@pytest.fixture(params=sorted(FAMILIES))
def tiny_model(request):
    return FAMILIES[request.param]()
