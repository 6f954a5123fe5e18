"""Modules imported on first use, for heavy dependencies (numba's jitted kernels) that importing
`malloczero` must not pay for."""

from __future__ import annotations

import functools
import importlib
from types import ModuleType
from typing import Callable


def lazy_module(name: str) -> Callable[[], ModuleType]:
  """A function that imports module `name` on its first call and returns it on every call."""
  return functools.cache(lambda: importlib.import_module(name))
