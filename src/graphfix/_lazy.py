"""Module attributes imported on first use (PEP 562), for fast start-up of the CLI."""

from __future__ import annotations

import sys
from collections.abc import Callable, Mapping
from importlib import import_module


def lazy_attributes(package: str, where: Mapping[str, str]) -> Callable[[str], object]:
    """A module `__getattr__` that imports `name` from `where[name]` when first read
    and keeps it on the module, so later reads cost nothing. `where[name]` is a module,
    or `module:attribute` for a name the module defines under another one."""

    def __getattr__(name: str) -> object:
        if name not in where:
            raise AttributeError(f"module {package!r} has no attribute {name!r}")
        module, _, there = where[name].partition(":")
        value = getattr(import_module(module), there or name)
        setattr(sys.modules[package], name, value)
        return value

    return __getattr__
