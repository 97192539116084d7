"""The rules of ``distify check``, one module per rule (``dst101_unguarded_save.py`` ...).

Importing this package imports every rule module, which registers its class in
:data:`distify.lint.rule.REGISTRY`. Modules starting with ``_`` hold helpers shared by rules.
"""

from __future__ import annotations

import importlib
import pkgutil

for _module in sorted(pkgutil.iter_modules(__path__), key=lambda module: module.name):
    if not _module.name.startswith("_"):
        importlib.import_module(f"{__name__}.{_module.name}")
