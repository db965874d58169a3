"""Which models Focus fits and where: one adapter per architecture family, the attention
modules of a model, the layers that get a router. Imports nothing else of focus_lab.hf.
Source: docs/method.md §5 (model families), docs/api.md "Model families".
"""

from __future__ import annotations

import re
from dataclasses import dataclass

import torch.nn as nn


@dataclass(frozen=True)
class FamilyAdapter:
    """What Focus needs to know about one architecture family (``config.model_type``).

    Everything else is one code path: the model calls ``focus_attention`` through transformers'
    AttentionInterface with its own q/k/v (after its biases, QK-norm and RoPE or learned
    positions), its ``scaling``, its mask (causality, padding, its own sliding window) and, for
    Gemma-2, ``softcap``.

    Attributes:
        attn_attr: attribute name of the self-attention module in a decoder layer.
        global_layers_only: Focus routes only the layers whose ``config.layer_types`` entry is
            not "sliding_attention" (Gemma's interleaved local/global layers); sliding layers
            keep their own window (they go through the same function with no router).
        softcap: the model passes attention-logit soft-capping (``softcap=``) to the interface.
        touches: what Focus changes in this family, for the README's compatibility table.
    """

    attn_attr: str = "self_attn"
    global_layers_only: bool = False
    softcap: bool = False
    touches: str = "every layer's attention mask"


ADAPTERS: dict[str, FamilyAdapter] = {
    "gpt2": FamilyAdapter("attn", touches="every layer (MHA, learned positions)"),
    "llama": FamilyAdapter(touches="every layer (GQA, RoPE)"),
    "mistral": FamilyAdapter(touches="every layer (GQA, RoPE), intersected with the model's sliding window"),
    "qwen2": FamilyAdapter(touches="every layer (GQA, q/k/v bias), intersected with a sliding window if enabled"),
    "olmo2": FamilyAdapter(touches="every layer (QK-norm; post-norm, the router sees the residual stream)"),
    "gemma2": FamilyAdapter(global_layers_only=True, softcap=True,
                            touches="global layers only (logit softcap kept); sliding layers unchanged"),
    "gemma3_text": FamilyAdapter(global_layers_only=True,
                                 touches="global layers only (QK-norm); sliding layers unchanged"),
}



class UnsupportedModelError(ValueError):
    """The model's architecture has no Focus adapter."""




def attention_modules(model: nn.Module) -> list[tuple[int, nn.Module]]:
    """[(layer_idx, self-attention module)] of a supported model, in layer order.

    Raises UnsupportedModelError naming the supported families.
    """
    attr = family_adapter(model).attn_attr
    family = model.config.model_type
    pattern = re.compile(rf"(^|\.)(\d+)\.{attr}$")
    found = []
    for name, module in model.named_modules():
        m = pattern.search(name)
        if m:
            found.append((int(getattr(module, "layer_idx", None) or m.group(2)), module))
    if not found:
        raise UnsupportedModelError(f"no '{attr}' attention modules found in this {family} model")
    return sorted(found, key=lambda t: t[0])


def family_adapter(model: nn.Module) -> FamilyAdapter:
    """The FamilyAdapter of ``model``; UnsupportedModelError naming the supported families."""
    family = getattr(getattr(model, "config", None), "model_type", None)
    if family not in ADAPTERS:
        raise UnsupportedModelError(
            f"Focus has no adapter for model_type {family!r}; supported families: "
            f"{', '.join(sorted(ADAPTERS))}")
    return ADAPTERS[family]


def sliding_layers(model: nn.Module) -> list[int]:
    """Layer indices whose ``config.layer_types`` entry is "sliding_attention" (none when the
    config has no layer types)."""
    types = getattr(model.config, "layer_types", None) or []
    return [i for i, t in enumerate(types) if t == "sliding_attention"]


def focus_layers(model: nn.Module) -> list[int]:
    """Layers that get a router by default: all of them, or, for families with interleaved
    local/global attention (Gemma-2/3), the global (full-attention) layers only."""
    layers = [i for i, _ in attention_modules(model)]
    if family_adapter(model).global_layers_only:
        local = set(sliding_layers(model))
        layers = [i for i in layers if i not in local]
    return layers


def is_attached(model: nn.Module) -> bool:
    return hasattr(model, "_focus_state")
