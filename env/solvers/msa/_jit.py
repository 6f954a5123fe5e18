"""`kernels()`: msa's jitted kernels (`_jit_kernels.py`), imported on first use.

Why a loader: importing numba costs about 0.3 s, and importing the solvers (so `malloczero`)
must not pay it (env/solvers/__init__.py loads the pack solver lazily for the same reason); msa's
parts call `kernels()` in their checks instead of importing the kernels at module level.
"""

from __future__ import annotations

import importlib
from types import ModuleType

_KERNELS: ModuleType | None = None


def kernels() -> ModuleType:
  """The `_jit_kernels` module (numba loaded, and the kernels compiled or read from numba's
  cache as each is first called)."""
  global _KERNELS
  if _KERNELS is None:
    _KERNELS = importlib.import_module("malloczero.env.solvers.msa._jit_kernels")
  return _KERNELS
