"""focus-lab: a workbench for Focus sparse attention (arXiv 2604.03260).

``import focus_lab`` is light: the names below are imported on first use (PEP 562), so a
reader of recorded runs (``focus_lab.runs``, the dashboard) never pays for torch and
transformers.
"""

from __future__ import annotations

import importlib

__version__ = "0.1.0"

# public name -> submodule that defines it (docs/layout.md: the folders and what each may import)
_EXPORTS = {
    "ConfigError": "method.config", "FocusConfig": "method.config", "TrainConfig": "method.config",
    "RouterMismatchError": "hf.retrofit", "UnsupportedModelError": "hf.retrofit", "attach": "hf.retrofit",
    "detach": "hf.retrofit", "focus_config": "hf.retrofit", "load_routers": "hf.retrofit",
    "model_identity": "hf.retrofit", "routers": "hf.retrofit", "save_routers": "hf.retrofit",
    "set_config": "hf.retrofit", "FocusForward": "hf.retrofit", "FocusCache": "hf.retrofit",
    "forward_state": "hf.retrofit",
    "hooks": "hf.hooks", "cache": "hf.hooks", "hook_names": "hf.hooks", "HookError": "hf.hooks",
    "POINTS": "hf.hooks",
    "record": "recording.recorder", "record_run": "recording.recorder", "evaluate": "eval.evaluate",
    "load_model": "hf.models", "keep_freed_memory": "method.cpu",
}

__all__ = [*_EXPORTS, "__version__"]


def __getattr__(name: str):
    """Import the submodule that defines ``name`` on first access (or the subpackage /
    module ``name`` itself, e.g. ``focus_lab.runs``)."""
    if name in _EXPORTS:
        value = getattr(importlib.import_module(f".{_EXPORTS[name]}", __name__), name)
    else:
        try:
            value = importlib.import_module(f".{name}", __name__)
        except ModuleNotFoundError as e:
            if e.name != f"{__name__}.{name}":
                raise
            raise AttributeError(f"module {__name__!r} has no attribute {name!r}") from None
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(__all__))
