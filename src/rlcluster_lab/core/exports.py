"""Public names that IDEs and type checkers see, imported only when first used.

A package's ``__init__`` writes its public API as imports under ``if TYPE_CHECKING:`` and lists
them in ``__all__``; ``lazy_exports`` reads those same import lines and resolves each name on
first use, so ``import rlcluster_lab`` imports no JAX and the CLI refuses a bad flag before the
JAX backend starts. JAX-free (the standard library only).
"""

from __future__ import annotations

import ast
import importlib
import importlib.util
import pathlib
import sys
from collections.abc import Callable, Iterable, Mapping
from typing import Any


def typed_imports(source: str, package: str) -> dict[str, tuple[str, str]]:
    """The names the ``if TYPE_CHECKING:`` blocks of a module's ``source`` import (relative imports
    resolved against ``package``): name -> (module, attribute). A plain ``import x`` there (it names
    no single object) or a name imported twice is a ``ValueError``."""
    found: dict[str, tuple[str, str]] = {}
    for node in ast.parse(source).body:
        if not (isinstance(node, ast.If) and isinstance(node.test, ast.Name) and node.test.id == "TYPE_CHECKING"):
            continue
        for stmt in node.body:
            if isinstance(stmt, ast.ImportFrom):
                module = importlib.util.resolve_name("." * stmt.level + (stmt.module or ""), package)
                for alias in stmt.names:
                    name = alias.asname or alias.name
                    if name in found:
                        raise ValueError(f"{package}: {name!r} is imported twice under TYPE_CHECKING")
                    found[name] = (module, alias.name)
            elif isinstance(stmt, ast.Import):
                raise ValueError(
                    f"{package}: 'import {stmt.names[0].name}' under TYPE_CHECKING names no single object; "
                    "write 'from module import name' for each public name"
                )
    return found


def lazy_exports(
    module_name: str, source_file: str, public: Iterable[str], *, moved: Mapping[str, str] | None = None
) -> tuple[Callable[[str], Any], Callable[[], list[str]]]:
    """The ``__getattr__`` and ``__dir__`` of the package ``module_name`` (its ``__init__.py``:
    ``source_file``) whose public names, ``public`` (its ``__all__``), are exactly its
    ``TYPE_CHECKING`` imports, else a ``ValueError``. ``moved``: names that left this namespace, name
    -> the module holding it now, still served but not listed."""
    table = typed_imports(pathlib.Path(source_file).read_text(encoding="utf-8"), module_name)
    listed = list(public)
    if sorted(listed) != sorted(table):
        missing, extra = sorted(set(table) - set(listed)), sorted(set(listed) - set(table))
        raise ValueError(
            f"{module_name}: __all__ and the TYPE_CHECKING imports differ (imported but not in __all__: {missing}; "
            f"in __all__ but not imported: {extra}); list each public name in both"
        )
    old = dict(moved or {})

    def __getattr__(name: str) -> Any:
        if name in table:
            module, attribute = table[name]
            value = getattr(importlib.import_module(module), attribute)
            setattr(sys.modules[module_name], name, value)  # resolved once
            return value
        if name in old:
            return getattr(importlib.import_module(old[name]), name)
        raise AttributeError(f"module {module_name!r} has no attribute {name!r}")

    def __dir__() -> list[str]:
        return sorted(set(vars(sys.modules[module_name])) | set(listed))

    return __getattr__, __dir__
