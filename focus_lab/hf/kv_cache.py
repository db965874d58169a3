"""A KV cache for generation that appends in place instead of copying the whole cache per step.

transformers' ``DynamicCache`` grows each layer by ``torch.cat([keys, new], dim=-2)``: every
decoding step copies the layer's whole cache, keys and values. At 8K tokens of context on the
embedded model (30 layers, 3 KV heads, head_dim 64, fp32) that is 2 x 30 x 6.3 MB copied per
generated token. Measured at 8K (docs/results.md, Speed), it costs hard Focus decoding 60-70 ms a
token and dense decoding nearly nothing, enough to turn hard top-1's 1.44x over dense into 0.89x.
``GrowingCache`` keeps each layer
in a buffer with spare room (grown geometrically, by a quarter and at least ``GrowingLayer.SPARE``
tokens) and writes each step's keys and values in place; ``keys`` / ``values`` are views of the
buffer's filled part. Every ``Cache`` method keeps working: one that replaces ``keys`` by a new
tensor (reordering a batch for beam search, ``batch_select_indices``) makes the next ``update``
copy it into a fresh buffer. Source: docs/method.md §4 (KV cache).

Usage: ``model.generate(ids, past_key_values=GrowingCache(config=model.config))``, or
``model(ids, past_key_values=GrowingCache(config=model.config), use_cache=True)``. On a model with
Focus attached this is automatic: ``attach``'s pre-hook turns the empty layers of a forward's
``DynamicCache`` (what ``generate`` makes by default) into growing ones (``grow_in_place``).
"""

from __future__ import annotations

import torch
from transformers.cache_utils import DynamicCache, DynamicLayer


class GrowingLayer(DynamicLayer):
    """A ``DynamicLayer`` whose keys and values live in buffers with spare room.

    ``keys`` / ``values``: (batch, kv_heads, seq, head_dim) views of buffers of shape
    (batch, kv_heads, capacity, head_dim), capacity >= seq. ``update`` writes the new tokens
    after the filled part; when they do not fit, or when ``keys`` no longer is a view of the
    buffer (a method replaced it), the filled part moves into a new buffer with room for
    ``SPARE`` or a quarter more tokens, whichever is more.
    """

    SPARE = 256  # the least spare room (tokens) a new buffer gets

    _kbuf: torch.Tensor | None = None
    _vbuf: torch.Tensor | None = None

    def _in_buffer(self) -> bool:
        """True when keys and values are the filled prefix of this layer's buffers."""
        k, v, kb, vb = self.keys, self.values, self._kbuf, self._vbuf
        return (kb is not None and k.dim() == 4 and k.data_ptr() == kb.data_ptr() and v.data_ptr() == vb.data_ptr()
                and k.shape[:2] == kb.shape[:2] and k.stride() == kb.stride() and v.stride() == vb.stride())

    def update(self, key_states: torch.Tensor, value_states: torch.Tensor, *args, **kwargs
               ) -> tuple[torch.Tensor, torch.Tensor]:
        """Append key_states / value_states (batch, kv_heads, new, head_dim); return the views
        of every cached token, (batch, kv_heads, seq, head_dim) each."""
        if not self.is_initialized:
            self.lazy_initialization(key_states, value_states)
        n = self.keys.shape[-2] if self.keys.numel() else 0
        m = key_states.shape[-2]
        if n == 0 or not self._in_buffer() or n + m > self._kbuf.shape[-2]:
            cap = n + m + max(self.SPARE, (n + m) // 4)
            B, H, _, D = key_states.shape
            kbuf = key_states.new_empty(B, H, cap, D)
            vbuf = value_states.new_empty(B, value_states.shape[1], cap, value_states.shape[-1])
            if n:
                kbuf[:, :, :n] = self.keys
                vbuf[:, :, :n] = self.values
            self._kbuf, self._vbuf = kbuf, vbuf
        self._kbuf[:, :, n:n + m] = key_states
        self._vbuf[:, :, n:n + m] = value_states
        self.keys = self._kbuf[:, :, :n + m]
        self.values = self._vbuf[:, :, :n + m]
        return self.keys, self.values

    def reset(self) -> None:
        """Drop the cached tokens and the buffers."""
        self._kbuf = self._vbuf = None
        super().reset()


def grow_in_place(cache) -> None:
    """Make the still-empty plain ``DynamicLayer`` s of ``cache``, when it is exactly transformers'
    ``DynamicCache``, ``GrowingLayer`` s, in place, and the layers it will add later too;
    anything else is left as it is (another cache class, a subclass of ``DynamicCache``, layers
    that already hold tokens, sliding-window layers). ``attach``'s pre-hook calls it on every
    forward's ``past_key_values``, so ``model.generate``'s default cache appends in place on an
    attached model. Outputs do not change."""
    if type(cache) is DynamicCache:
        _grow_layers(cache)


def _grow_layers(cache: DynamicCache) -> None:
    """``grow_in_place`` for any DynamicCache (its empty plain layers, and the ones it adds later)."""
    if cache.layer_class_to_replicate is DynamicLayer:
        cache.layer_class_to_replicate = GrowingLayer
    for i, layer in enumerate(cache.layers):
        if type(layer) is DynamicLayer and not layer.is_initialized:
            cache.layers[i] = GrowingLayer()


class GrowingCache(DynamicCache):
    """``DynamicCache`` whose full-attention layers are ``GrowingLayer`` s (appends in place).

    Same arguments as ``DynamicCache``; layers of other kinds (a model's sliding-window layers)
    stay as ``DynamicCache`` makes them. Outputs equal ``DynamicCache``'s exactly: only where the
    tensors live changes.
    """

    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        _grow_layers(self)


class PlainDynamicCache(DynamicCache):
    """transformers' ``DynamicCache`` exactly (a full copy of each layer per step), kept so by
    ``grow_in_place`` (which converts the exact ``DynamicCache`` class only): what a plain model's
    ``generate`` uses, for comparisons (``analyses/bench_attention.py --kv-cache dynamic``)."""
