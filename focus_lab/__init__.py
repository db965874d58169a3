"""focus-lab: a workbench for Focus sparse attention (arXiv 2604.03260)."""

from .config import ConfigError, FocusConfig, TrainConfig
from . import record  # a callable module: ``with focus_lab.record(model, ...) as rec`` (record.record)
from .retrofit import (RouterMismatchError, UnsupportedModelError, attach, detach, focus_config,
                       load_routers, model_identity, routers, save_routers, set_config)

__version__ = "0.1.0"

__all__ = ["ConfigError", "FocusConfig", "TrainConfig", "RouterMismatchError", "UnsupportedModelError",
           "attach", "detach", "focus_config", "load_routers", "model_identity", "routers",
           "save_routers", "set_config", "record", "__version__"]
