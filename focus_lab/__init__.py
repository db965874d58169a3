"""focus-lab: a workbench for Focus sparse attention (arXiv 2604.03260).

``import focus_lab`` is light: the names below are imported on first use (PEP 562), so a
reader of recorded runs (``focus_lab.runs``, the dashboard) never pays for torch and
transformers.
"""

from __future__ import annotations

import importlib

__version__ = "0.1.0"

# public name -> submodule that defines it
_EXPORTS = {
    "ConfigError": "config", "FocusConfig": "config", "TrainConfig": "config",
    "RouterMismatchError": "retrofit", "UnsupportedModelError": "retrofit", "attach": "retrofit",
    "detach": "retrofit", "focus_config": "retrofit", "load_routers": "retrofit",
    "model_identity": "retrofit", "routers": "retrofit", "save_routers": "retrofit",
    "set_config": "retrofit", "FocusForward": "retrofit", "FocusCache": "retrofit",
    "forward_state": "retrofit",
}

__all__ = [*_EXPORTS, "record", "__version__"]


def __getattr__(name: str):
    """Import the submodule that defines ``name`` on first access (``record`` is the callable
    module ``focus_lab.record``: ``with focus_lab.record(model, ...) as rec``)."""
    if name in _EXPORTS:
        value = getattr(importlib.import_module(f".{_EXPORTS[name]}", __name__), name)
    elif name == "record":
        value = importlib.import_module(".record", __name__)
    else:
        try:  # any submodule, e.g. focus_lab.runs
            value = importlib.import_module(f".{name}", __name__)
        except ModuleNotFoundError as e:
            if e.name != f"{__name__}.{name}":
                raise
            raise AttributeError(f"module {__name__!r} has no attribute {name!r}") from None
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(__all__))
