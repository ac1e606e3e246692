"""Built-in adapters, one module per family; importing this package registers them all.

Adapters whose source library is an optional extra import it lazily, so every module here
imports cleanly without transformers or open_clip installed.
"""

import importlib
import pkgutil

for _info in sorted(pkgutil.iter_modules(__path__), key=lambda m: m.name):
    if _info.name != "base":
        importlib.import_module(f"{__name__}.{_info.name}")
