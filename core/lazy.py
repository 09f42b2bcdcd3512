"""A package's public names imported on first use (PEP 562's module ``__getattr__``), one implementation for every
package that needs it.

Why: :mod:`core.models` and :mod:`core.training` re-export names from modules that import torch and transformers
(seconds), and ``python -m core --help`` or a bad option should not wait for them (tests/cli/test_cli_startup.py).
Each package lists its names by the module that owns them and hands the list here; both packages once carried
their own copy of these twenty lines.
"""

from __future__ import annotations

import importlib
import sys
from collections.abc import Callable, Iterable, Mapping
from typing import Any


def lazy_exports(
    package: str, owners: Mapping[str, str], submodules: Iterable[str]
) -> tuple[Callable[[str], Any], Callable[[], list[str]]]:
    """The ``__getattr__`` and ``__dir__`` of ``package``: a name of ``owners`` (name -> owning submodule) is read
    from its module on first use and stored in the package (later reads are plain attribute reads); a name of
    ``submodules`` is that submodule, imported; any other name is the usual AttributeError."""
    subs = frozenset(submodules)

    def __getattr__(name: str) -> Any:
        if name in subs:
            return importlib.import_module(f"{package}.{name}")  # the import sets the attribute itself
        owner = owners.get(name)
        if owner is None:
            raise AttributeError(f"module {package!r} has no attribute {name!r}")
        value = getattr(importlib.import_module(f"{package}.{owner}"), name)
        setattr(sys.modules[package], name, value)
        return value

    def __dir__() -> list[str]:
        return sorted({*vars(sys.modules[package]), *owners})

    return __getattr__, __dir__
