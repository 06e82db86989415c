"""Operator families. Importing this package registers every module in it and in contrib/."""

import importlib
import pkgutil

from transmuter.lowering.ops import contrib


def _import_all(package) -> None:
    for info in pkgutil.iter_modules(package.__path__):
        if not info.ispkg and not info.name.startswith("_"):
            importlib.import_module(f"{package.__name__}.{info.name}")


_import_all(importlib.import_module(__name__))
_import_all(contrib)
