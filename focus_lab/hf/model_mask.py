"""The model's own attention mask (causality, padding, a sliding window) as a rule, evaluated a
block of query rows at a time.

transformers builds each layer type's mask once per forward: ``sdpa_mask`` returns a
(B, 1, Tq, Tk) bool tensor, 1 GiB at 32,768 tokens, and Gemma-3 has two (full and sliding
layers), plus about 3 GiB of comparisons while they are built. The "focus" mask function
(``focus_lab.hf.attention``) returns a ``ModelMask`` instead: the same arguments, kept, and
``sdpa_mask`` called again for the rows a path asks for. The paths that scale (the decomposition,
dense causal SDPA, the key-sliced masked attention of the sliding layers, the recorder) ask for
rows or for nothing; the masked reference path and the hook points ask for ``dense()``.

Source: docs/method.md §4 (the mask a layer attends with is its groups' mask within the model's
own mask); the issue "A second model at long context" (a 32K forward in bounded memory).
"""

from __future__ import annotations

import functools
from typing import Callable

import torch
from transformers.masking_utils import sdpa_mask

#: (B x Tq x Tk) up to which ``dense()`` is kept for the rest of the forward (64 Mi bools, 8192^2
#: tokens): every layer of a forward reads the same mask, and building it again per layer costs
#: what transformers' one build did. Above it each call builds it anew and frees it.
DENSE_CACHE_ELEMENTS = 1 << 26
#: query rows per block when a whole-mask quantity (plain causality, the diagonal) is computed
ROW_BLOCK = 512


class ModelMask:
    """The (B, Tq, Tk) bool mask of the model's own attention (True = visible), given by
    ``rows(start, stop)`` -> (B, stop - start, Tk) bool rather than held.

    Build with ``ModelMask.rule(**sdpa_kwargs)`` (what the "focus" mask function receives from
    transformers: the rule is ``sdpa_mask`` on those arguments) or ``ModelMask.tensor(mask, B, Tq,
    Tk)`` (a 4-D mask given as a tensor, or None for plain causality).

    Attributes: ``shape`` (B, Tq, Tk); ``device``; ``dtype`` (torch.bool); ``plain_causal``: True
    when query i (at position Tk - Tq + i) sees exactly its i + 1 first keys (no padding, no
    sliding window), computed once, ``ROW_BLOCK`` rows at a time.
    """

    dtype = torch.bool

    def __init__(self, shape: tuple[int, int, int], rows: Callable[[int, int], torch.Tensor],
                 device: torch.device | str) -> None:
        self.shape = torch.Size(shape)
        self.device = torch.device(device)
        self._rows = rows
        self._dense: torch.Tensor | None = None

    @classmethod
    def rule(cls, *, batch_size: int, q_length: int, kv_length: int, q_offset: int = 0,
             **kwargs) -> "ModelMask":
        """The mask ``sdpa_mask(batch_size, q_length, kv_length, q_offset, **kwargs)`` would build
        (``allow_is_causal_skip`` is forced off, so it never stands for "no mask")."""
        kwargs = {**kwargs, "allow_is_causal_skip": False, "allow_is_bidirectional_skip": False}

        def rows(start: int, stop: int) -> torch.Tensor:
            m = sdpa_mask(batch_size=batch_size, q_length=stop - start, kv_length=kv_length,
                          q_offset=q_offset + start, **kwargs)  # (B or 1, 1, c, Tk)
            return m[:, 0].expand(batch_size, stop - start, kv_length)

        return cls((batch_size, q_length, kv_length), rows, kwargs.get("device", "cpu"))

    @classmethod
    def tensor(cls, mask: torch.Tensor | None, B: int, Tq: int, Tk: int,
               device: torch.device | str) -> "ModelMask":
        """``mask``: transformers' 4-D mask (B or 1, 1, Tq, >= Tk), bool or float (a bias whose
        hidden entries are the dtype's minimum), or None (plain causality for queries at
        positions Tk - Tq .. Tk - 1)."""
        if mask is None:
            def rows(start: int, stop: int) -> torch.Tensor:
                q = torch.arange(Tk - Tq + start, Tk - Tq + stop, device=device)  # (c,)
                k = torch.arange(Tk, device=device)  # (Tk,)
                return (k[None, :] <= q[:, None]).expand(B, stop - start, Tk)
        else:
            def rows(start: int, stop: int) -> torch.Tensor:
                m = mask[:, 0, start:stop, :Tk]  # (B or 1, c, Tk)
                if m.dtype != torch.bool:
                    m = m > torch.finfo(m.dtype).min / 2
                return m.expand(B, stop - start, Tk)
        return cls((B, Tq, Tk), rows, device)

    @classmethod
    def of(cls, keep: torch.Tensor) -> "ModelMask":
        """A (B, Tq, Tk) bool tensor as a ModelMask (its rows are slices of it)."""
        m = cls(tuple(keep.shape), lambda s, e: keep[:, s:e], keep.device)
        m._dense = keep
        return m

    def rows(self, start: int, stop: int) -> torch.Tensor:
        """(B, stop - start, Tk) bool: the mask's rows ``start`` .. ``stop`` - 1."""
        if self._dense is not None:
            return self._dense[:, start:stop]
        return self._rows(start, min(stop, self.shape[1]))

    def dense(self) -> torch.Tensor:
        """(B, Tq, Tk) bool, the whole mask (O(Tq Tk) memory; kept for the forward when at most
        ``DENSE_CACHE_ELEMENTS``)."""
        if self._dense is not None:
            return self._dense
        m = self._rows(0, self.shape[1])
        if m.numel() <= DENSE_CACHE_ELEMENTS:
            self._dense = m
        return m

    def sized(self, B: int, Tq: int, Tk: int) -> "ModelMask":
        """This mask for an attention call of (B, Tq, Tk): itself when the shape matches, else
        its first Tk keys, expanded to B (transformers may size keys for a static cache).
        Raises ValueError when the queries differ (the mask belongs to another call)."""
        if tuple(self.shape) == (B, Tq, Tk):
            return self
        if self.shape[1] != Tq or self.shape[2] < Tk or self.shape[0] not in (1, B):
            raise ValueError(f"the model's mask has shape {tuple(self.shape)}, the attention call "
                             f"(batch, queries, keys) = ({B}, {Tq}, {Tk})")
        return ModelMask((B, Tq, Tk), lambda s, e: self.rows(s, e)[..., :Tk].expand(B, e - s, Tk), self.device)

    def diagonal(self) -> torch.Tensor:
        """(B, Tq) bool: whether each query sees its own key (position Tk - Tq + i): False on a
        padded token."""
        B, Tq, Tk = self.shape
        out = []
        for s in range(0, Tq, ROW_BLOCK):
            e = min(Tq, s + ROW_BLOCK)
            cols = torch.arange(Tk - Tq + s, Tk - Tq + e, device=self.device)  # (c,)
            out.append(self.rows(s, e).gather(2, cols.expand(B, -1)[..., None])[..., 0])  # (B, c)
        return torch.cat(out, dim=1)

    @functools.cached_property
    def plain_causal(self) -> bool:
        B, Tq, Tk = self.shape
        ok = torch.ones((), dtype=torch.bool, device=self.device)
        for s in range(0, Tq, ROW_BLOCK):
            e = min(Tq, s + ROW_BLOCK)
            counts = torch.count_nonzero(self.rows(s, e), dim=-1)  # (B, c)
            want = torch.arange(Tk - Tq + s + 1, Tk - Tq + e + 1, device=self.device)  # (c,)
            ok &= (counts == want).all()
        return bool(ok)  # one host sync per mask

    def __repr__(self) -> str:
        held = "held" if self._dense is not None else "by rows"
        return f"ModelMask(shape={tuple(self.shape)}, {held})"
