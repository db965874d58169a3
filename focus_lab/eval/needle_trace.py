"""The needle trace: the one hook that the passkey probe and the retrieval suite both attach.

Over the forwards of one pattern on one prompt it records, per routed layer, the pattern's mask on
the (answer query, needle key) pairs, the distant pairs kept by each forward from position 0, and,
for a dense forward, the dense attention of the answer queries to the needle's tokens and each
head's strongest key (``metrics.rows_attention``: no (T, T) attention map is held). The passkey
probe's per-layer audit and the retrieval suite's trace are both read from it.

Source: docs/retrieval.md (the trace), docs/passkey_reference.md (the audit), docs/method.md §2.
"""

from __future__ import annotations

import torch


class NeedleTrace:
    """The ``attn_out`` hook of a pattern's forwards over one prompt (``hooks``), a context
    manager that always removes it.

    Args:
        model: an attached model; rows: (r,) long, the absolute positions of the queries traced
            (those that predict an answer token); needle: (m,) long, the key positions traced
            (the needle's answer tokens); config: the pattern's FocusConfig; dense: record the
            dense attention of ``rows`` (a dense forward).
    Recorded:
        kept: {layer_idx: (r, m) float in [0, 1]}, the mask the layer attended with on those pairs
            (soft mode: the gate's factor on the pair's weight, exp(bias) clamped to 1, docs/method.md
            §2.3); probs: {layer_idx: (H, r, m)} dense attention to the needle, argmax: {layer_idx:
            (H, r)} each head's strongest key, both with ``dense``; pairs_kept: the distant pairs
            kept (``core.distant_pairs_kept``) of each hard forward from position 0, one per layer.
    """

    def __init__(self, model, rows: torch.Tensor, needle: torch.Tensor, config, dense: bool):
        self.model, self.rows, self.needle, self.config, self.dense = model, rows, needle, config, dense
        self.kept: dict[int, torch.Tensor] = {}  # layer -> (r, m) float in [0, 1]
        self.probs: dict[int, torch.Tensor] = {}  # layer -> (H, r, m) dense attention to the needle
        self.argmax: dict[int, torch.Tensor] = {}  # layer -> (H, r) each head's strongest key
        self.pairs_kept: list[float] = []

    def __enter__(self) -> "NeedleTrace":
        from focus_lab.hf.hooks import hooks
        self._hooks = hooks(self.model, {"attn_out": self})
        self._hooks.__enter__()
        return self

    def __exit__(self, *exc) -> None:
        self._hooks.__exit__(*exc)

    def _kept_rows(self, call, rows_in: torch.Tensor) -> torch.Tensor:
        """(r, m) float: the mask this layer attended with on the traced pairs."""
        Tq, Tk = call.query.shape[2], call.key.shape[2]
        cfg = self.config
        routing = call.routing
        needle = self.needle.to(call.key.device)
        if Tq > 256 and cfg.mode == "hard" and routing is not None and not cfg.match_shifts:
            from focus_lab.method.core import hard_mask  # the mask rule on the rows only: no (T, T) mask
            qg = routing.query_groups[:, rows_in]  # (B, r, k)
            m = hard_mask(qg, routing.key_group[:, :Tk], cfg.window, self.rows.to(call.key.device),
                          torch.arange(Tk, device=call.key.device), cfg.sink_tokens)  # (B, r, Tk)
            return m[0][:, needle].float()
        edge = call.kept[0, rows_in][:, needle]  # (r, m)
        return edge.float() if edge.dtype == torch.bool else edge.float().exp().clamp(max=1.0)

    @torch.no_grad()
    def __call__(self, out: torch.Tensor, hook) -> None:
        call = hook.call
        query, key = call.query, call.key
        Tq, Tk = query.shape[2], key.shape[2]
        cfg = self.config
        if Tq == Tk and cfg.mode == "hard" and call.routing is not None:  # a forward from position 0
            from focus_lab.method.core import distant_pairs_kept
            r = call.routing
            self.pairs_kept.append(distant_pairs_kept(r.query_groups, r.key_group, cfg.window, cfg.sink_tokens,
                                                      call.rule_pairs))
        rows = self.rows
        if int(rows[-1]) >= Tk or int(rows[0]) < Tk - Tq:  # the answer's queries are not in this call
            return
        layer = hook.layer_idx
        rows_in = (rows - (Tk - Tq)).to(query.device)
        self.kept[layer] = self._kept_rows(call, rows_in).cpu()
        if self.dense:
            from focus_lab.method.metrics import attention_scale, rows_attention
            p = rows_attention(query, key, attention_scale(call.module, query.shape[-1]), rows.to(query.device),
                               getattr(call.module, "attn_logit_softcapping", None))[0]  # (H, r, Tk)
            self.probs[layer] = p[:, :, self.needle.to(p.device)].cpu()
            self.argmax[layer] = p.argmax(-1).cpu()
        self.recorded(call, layer)

    def recorded(self, call, layer: int) -> None:
        """Called after a layer's traced rows are recorded: a subclass's extra measures."""
