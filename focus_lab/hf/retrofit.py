"""Retrofit Focus onto a pretrained transformers model: the names of ``focus_lab.hf`` in one place.

The work is split by job, each module importing only those before it (no import circles):

- ``family``: architecture adapters, a model's attention modules, which layers get routers;
- ``state``: the state of a forward (``FocusForward``) and of hard-mode decoding (``FocusCache``);
- ``hooks``: the named hook points (watch and patch a forward);
- ``attention``: the "focus" attention function registered with transformers;
- ``attach``: attach / detach, the default forward state, checkpointed layers;
- ``router_files``: the router file format, save / load, soups.

This module re-exports their public names (and imports ``attention``, which registers the
attention function), so ``from focus_lab.hf.retrofit import attach`` keeps working.
Source: docs/method.md §1-§4; docs/api.md.
"""

from __future__ import annotations

from focus_lab.hf.family import (ADAPTERS, FamilyAdapter, UnsupportedModelError, attention_modules,  # noqa: F401
                                 family_adapter, focus_layers, is_attached, sliding_layers)
from focus_lab.hf.state import FocusCache, FocusForward, PlainCausalCheck, is_plain_causal, state_of  # noqa: F401
from focus_lab.hf.attention import (ATTN_NAME, focus_attention, hard_focus_attention,  # noqa: F401
                                    _model_mask)
from focus_lab.hf.attach import (_Attachment, _default, attach, checkpointed_layers, detach,  # noqa: F401
                                 focus_config, forward_state, routers, set_config)
from focus_lab.hf.router_files import (ROUTER_FORMAT, ROUTER_FORMAT_VERSION, RouterMismatchError,  # noqa: F401
                                       base_model_mismatch, load_routers, model_identity, read_router_file,
                                       router_tensors, save_routers, soup_router_files, write_router_file)

_state_of = state_of  # the name before the split

__all__ = sorted(n for n in dir() if not n.startswith("_") and n != "annotations")
