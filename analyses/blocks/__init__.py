"""More generated result blocks (``analyses.doc_blocks``), one module per page or group of pages:
the study pages' tables, the recipe's stage table, the reference pages' measured tables. Importing
this package imports every module in it, and each registers its blocks with
``analyses.doc_blocks.block``."""

import importlib
import pkgutil

for _m in sorted(pkgutil.iter_modules(__path__), key=lambda m: m.name):
    importlib.import_module(f"{__name__}.{_m.name}")
