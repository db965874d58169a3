"""The core both probes share (passkey, ``focus_lab.eval.passkey``; the retrieval suite,
``focus_lab.eval.retrieval``): prompt encoding, one forward with the logits of the last positions
only, which patterns decode through the KV cache, the fingerprint of a resumable cell, and the
``torchrun`` shard of a process, greedy decoding. Source: docs/passkey_reference.md, docs/retrieval.md."""

from __future__ import annotations

import hashlib
import json
import os

import torch


def encode(tokenizer, text: str) -> list[int]:
    """Token ids of ``text`` without special tokens ([] for '')."""
    return list(tokenizer(text, add_special_tokens=False)["input_ids"]) if text else []


def forward(model, ids: torch.Tensor, keep: int | None = None, **kw):
    """``model(input_ids=ids[None])`` for ids (T,), computing the logits of the last ``keep``
    positions only (``logits_to_keep``: (1, keep, V) instead of (1, T, V)) when the model
    supports it."""
    if keep is not None:
        try:
            return model(input_ids=ids[None], logits_to_keep=keep, **kw)
        except TypeError:
            pass
    return model(input_ids=ids[None], **kw)


def cache_ok(config) -> bool:
    """Patterns that decode through the KV cache: every hard pattern (random groups are a function
    of the position; shuffled groups permute the prefill and draw later positions' groups from it,
    ``core.Router._shuffle``), dense and window; not soft mode."""
    return config.mode in ("dense", "window", "hard")


def fingerprint(settings: dict) -> str:
    """12 hex digits of the sha256 of the settings that change a cell's or case's content."""
    return hashlib.sha256(json.dumps(settings, sort_keys=True, default=str).encode()).hexdigest()[:12]


def shard() -> tuple[int, int]:
    """(rank, world size) under ``torchrun`` (``RANK`` / ``WORLD_SIZE``), else (0, 1)."""
    return int(os.environ.get("RANK", 0)), int(os.environ.get("WORLD_SIZE", 1))


def barrier() -> None:
    """Wait for every process of a ``torchrun`` launch (gloo, initialized on first use)."""
    import torch.distributed as dist
    if not dist.is_initialized():
        dist.init_process_group("gloo")
    dist.barrier()


def eos_ids(model) -> set[int]:
    """The token ids that end generation (``generation_config.eos_token_id``, one or a list)."""
    eos = getattr(getattr(model, "generation_config", None), "eos_token_id", None)
    return set(eos if isinstance(eos, (list, tuple)) else [eos]) - {None}


def greedy(model, seq: torch.Tensor, steps: int, stop, eos: set[int], use_cache: bool, focus=None,
           past=None, cached: int = 0, out: list[int] | None = None) -> list[int]:
    """Greedy decoding after ``seq`` ((T,) token ids, ending with ``out``: the tokens already chosen,
    e.g. the teacher-forced answer tokens greedy agrees with), up to ``steps`` tokens in all
    (``out`` included).

    ``use_cache``: through the KV cache, ``past`` holding ``seq[:cached]`` (None and 0: nothing
    yet, so the first forward is the prefill of ``seq``); the rest of ``seq`` goes in as one
    chunk, then one token a step (docs/method.md §4 KV cache). Otherwise one full forward per
    token. ``focus``: the ``FocusForward`` of every forward (given a ``FocusCache`` when decoding
    through the cache without one); None: the model's default. Stops after a token of ``eos``,
    when ``stop(tokens)`` is true, or after ``steps`` tokens. Returns ``out`` and the new tokens.
    """
    out = list(out or [])
    if (out and (stop(out) or out[-1] in eos)) or len(out) >= steps:
        return out
    if focus is not None and use_cache and focus.cache is None:
        from focus_lab.hf.state import FocusCache, FocusForward
        focus = FocusForward(focus.config, FocusCache())
    fkw = {} if focus is None else {"focus": focus}
    while True:
        if use_cache:  # the tokens the cache lacks (attach's pre-hook makes it append in place)
            res = forward(model, seq[cached:], keep=1, use_cache=True, past_key_values=past, **fkw)
            past, cached = res.past_key_values, len(seq)
        else:
            res = forward(model, seq, keep=1, use_cache=False, **fkw)
        nxt = int(res.logits[0, -1].argmax())
        out.append(nxt)
        seq = torch.cat([seq, torch.tensor([nxt], dtype=seq.dtype, device=seq.device)])
        if nxt in eos or stop(out) or len(out) >= steps:
            return out
