"""Packages that are also their command's API function.

`graphfix.doctor` and `graphfix.check` name both a package (the findings engine, the
layer-wise comparison) and a command of the public API (`graphfix.doctor(model,
trt="10")`, `graphfix.check(ref, cand)`). Python binds a package to its parent's
attribute whenever it is imported, so a plain function of that name in
`graphfix/__init__.py` would be replaced by the package as soon as anything imports
`graphfix.doctor.engine`. Instead the package itself is callable: calling it calls
`graphfix.api.<command>`, and `from graphfix.doctor import diagnose` keeps working.
"""

from __future__ import annotations

import sys
import types
from typing import Any


class CommandModule(types.ModuleType):
    """A package module whose call is the command's API function (`__command__` names
    it in `graphfix.api`)."""

    __command__: str

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        from graphfix import api

        return getattr(api, self.__command__)(*args, **kwargs)


def make_callable(module_name: str, command: str) -> None:
    """Make the (already imported) package `module_name` call `graphfix.api.<command>`."""
    module = sys.modules[module_name]
    module.__class__ = CommandModule
    module.__command__ = command
