"""Tiny random models and tokenizers: offline stand-ins for quick runs, examples and tests.

One place for them: the figures' ``--quick`` mode, ``analyses/studies/bad_inputs_table.py``
and the test suite (``tests/conftest.py``, ``tests/run_fixtures.py``) all build them here.
Nothing is downloaded; weights are random (``torch.manual_seed(seed)``), so the numbers they
produce mean nothing beyond exercising the code.
"""

from __future__ import annotations

from typing import Iterable

import torch

SAMPLE_TEXT = (
    "It was a bright morning in the village, and Anne walked to the house on the hill. "
    "Her sister had written a long letter, which she carried in her hand. "
    "The captain was waiting by the gate; he smiled when he saw her. "
    "They spoke of the sea, of ships, and of the friends they had lost. "
    "Mr. Elliot arrived later, and nobody was pleased to see him. "
    "Anne thought of the letter again, and of the words her sister had chosen. "
    "In the evening the whole family sat by the fire and read aloud. "
    "The captain told a story about a storm that had nearly sunk his ship. "
    "Everyone listened, and even Mr. Elliot was quiet for a while. "
    "When the story ended, Anne went to the window and looked at the dark sea. "
    "She knew that tomorrow would bring another letter, and perhaps an answer. "
    "The house was silent, but her heart was not."
)


def tiny_llama(seed: int = 0, layers: int = 2, vocab_size: int = 97, max_positions: int = 512,
               bos_token_id: int = 1, eos_token_id: int = 2, pad_token_id: int = 0):
    """Llama family (GQA 4/2 heads, head_dim 16, RoPE), random weights, eval mode."""
    from transformers import LlamaConfig, LlamaForCausalLM
    torch.manual_seed(seed)
    cfg = LlamaConfig(vocab_size=vocab_size, hidden_size=64, intermediate_size=128,
                      num_hidden_layers=layers, num_attention_heads=4, num_key_value_heads=2,
                      max_position_embeddings=max_positions, bos_token_id=bos_token_id,
                      eos_token_id=eos_token_id, pad_token_id=pad_token_id)
    return LlamaForCausalLM(cfg).eval()


def tiny_gemma3(seed: int = 0, layers: int = 6, vocab_size: int = 97, global_every: int = 3,
                sliding_window: int = 16, max_positions: int = 512):
    """Gemma-3 text laid out like Gemma-3-270M at a tiny size: every ``global_every``-th layer
    attends globally (``full_attention``: layers 2 and 5 of 6 by default, the only ones Focus
    routes), the others in a sliding window of ``sliding_window`` keys; 4 query heads sharing 1
    KV head, head_dim 16, QK-norm, local and global RoPE; random weights, eval mode."""
    from transformers import Gemma3ForCausalLM, Gemma3TextConfig
    torch.manual_seed(seed)
    types = ["full_attention" if (i + 1) % global_every == 0 else "sliding_attention" for i in range(layers)]
    cfg = Gemma3TextConfig(vocab_size=vocab_size, hidden_size=64, intermediate_size=128, num_hidden_layers=layers,
                           num_attention_heads=4, num_key_value_heads=1, head_dim=16, query_pre_attn_scalar=16,
                           max_position_embeddings=max_positions, sliding_window=sliding_window, layer_types=types,
                           bos_token_id=1, eos_token_id=2, pad_token_id=0)
    return Gemma3ForCausalLM(cfg).eval()


def tiny_gpt2(seed: int = 0, layers: int = 2, vocab_size: int = 97, max_positions: int = 512):
    """GPT-2 (MHA 4 heads, learned positions), random weights, eval mode."""
    from transformers import GPT2Config, GPT2LMHeadModel
    torch.manual_seed(seed)
    cfg = GPT2Config(vocab_size=vocab_size, n_embd=64, n_layer=layers, n_head=4,
                     n_positions=max_positions, bos_token_id=1, eos_token_id=2)
    return GPT2LMHeadModel(cfg).eval()


def bpe_tokenizer(texts: Iterable[str], vocab: int = 97,
                  special_tokens: tuple[str, ...] = ("<pad>", "<s>", "</s>", "<unk>"),
                  split_punctuation: bool = False):
    """A fast BPE tokenizer of at most ``vocab`` entries trained on ``texts`` (character
    offsets work, so spaCy labels align). Pre-tokenizer: ``Whitespace`` (``\\w+|[^\\w\\s]+``),
    or whitespace then every punctuation mark alone with ``split_punctuation``. Special
    tokens: pad, bos, eos, unk in that order when four are given; with one, it serves as unk,
    pad and eos."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast
    tk = Tokenizer(models.BPE(unk_token=special_tokens[-1]))
    tk.pre_tokenizer = (pre_tokenizers.Sequence([pre_tokenizers.WhitespaceSplit(), pre_tokenizers.Punctuation()])
                        if split_punctuation else pre_tokenizers.Whitespace())
    tk.decoder = decoders.BPEDecoder()
    trainer = trainers.BpeTrainer(vocab_size=vocab, special_tokens=list(special_tokens), show_progress=False)
    tk.train_from_iterator(list(texts), trainer)
    if len(special_tokens) == 4:
        pad, bos, eos, unk = special_tokens
        return PreTrainedTokenizerFast(tokenizer_object=tk, unk_token=unk, pad_token=pad,
                                       bos_token=bos, eos_token=eos)
    unk = special_tokens[0]
    return PreTrainedTokenizerFast(tokenizer_object=tk, unk_token=unk, pad_token=unk, eos_token=unk)
