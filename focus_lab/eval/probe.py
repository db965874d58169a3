"""The core both probes share (passkey, ``focus_lab.eval.passkey``; the retrieval suite,
``focus_lab.eval.retrieval``): prompt encoding, one forward with the logits of the last positions
only, which patterns decode through the KV cache, the fingerprint of a resumable cell, and the
``torchrun`` shard of a process. Source: docs/probe.md."""

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
