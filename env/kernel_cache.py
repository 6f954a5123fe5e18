"""numba's `njit` for the game's kernels, cached on disk with a stamp of every file they depend on.

numba keeps a compiled kernel beside its source and trusts it while that one file's modification
time and size are unchanged (numba/core/caching.py, `_SourceFileBackedLocatorMixin`). msa's
kernels call each other across the modules of env/msa/kernels/, and they and the game's kernels
read the layouts (named tuples) their owners in env/msa/ and env/game/ define; with numba's own
stamp, editing one of those files would leave the others' cached machine code in place, still
calling the old code. A kernel compiled with `njit` here is found where numba would put it, but
its stamp also covers every file of `DEPENDENCIES`: editing any of them compiles each kernel again
on its next first use (a minute on 2 cores), and nothing stale is ever loaded.
"""

from __future__ import annotations

import glob
import os
from typing import Any, Callable

import numba
from numba.core import caching

ENV_DIR = os.path.dirname(os.path.abspath(__file__))
# The kernels' modules and every module of the project they import (the owners that define their
# arguments' layouts), relative to env/; tests/test_kernel_cache.py checks that it is complete.
DEPENDENCIES = (
  "kernel_cache.py",
  "msa/kernels/*.py",
  "msa/allocate_segment.py",
  "msa/chunks.py",
  "msa/copy_resource.py",
  "msa/interval_picker.py",
  "msa/solver_loop.py",
  "game/game.py",
  "game/msa_observation.py",
  "game/observation_kernels.py",
  "placement_kernels.py",
  "simulator.py",
  "simulator_kernels.py",
  "validator_kernels.py",
)
# Set on the Python function of each kernel compiled here: the only ones the locator takes.
_KERNEL_MARK = "_malloczero_kernel"


def dependency_stamp(root: str = ENV_DIR) -> tuple[tuple[str, float, int], ...]:
  """(path relative to `root`, modification time, size) of every file of `DEPENDENCIES` there."""
  paths = sorted({p for pattern in DEPENDENCIES for p in glob.glob(os.path.join(root, pattern))})
  stamp = []
  for path in paths:
    st = os.stat(path)
    stamp.append((os.path.relpath(path, root), st.st_mtime, st.st_size))
  return tuple(stamp)


class DependencyStampLocator(caching._CacheLocator):
  """The cache location numba's own locators choose (in the source tree, NUMBA_CACHE_DIR, or the
  user's cache), with the kernel's own stamp joined to `dependency_stamp()`."""

  def __init__(self, inner: caching._CacheLocator):
    self._inner = inner
    self._py_file = getattr(inner, "_py_file", None)

  def ensure_cache_path(self) -> None:
    self._inner.ensure_cache_path()

  def get_cache_path(self) -> str:
    return self._inner.get_cache_path()

  def get_source_stamp(self) -> Any:
    return (self._inner.get_source_stamp(), dependency_stamp())

  def get_disambiguator(self) -> str:
    return self._inner.get_disambiguator()

  @classmethod
  def from_function(cls, py_func: Callable, py_file: str) -> DependencyStampLocator | None:
    if not getattr(py_func, _KERNEL_MARK, False):
      return None  # Any other function numba caches keeps numba's own stamp.
    for locator_class in caching.CacheImpl._locator_classes:
      if locator_class is not cls:
        inner = locator_class.from_function(py_func, py_file)
        if inner is not None:
          return cls(inner)
    return None


if DependencyStampLocator not in caching.CacheImpl._locator_classes:
  caching.CacheImpl._locator_classes.insert(0, DependencyStampLocator)


def njit(function: Callable) -> Callable:
  """`numba.njit(cache=True)`, cached under `DependencyStampLocator`."""
  setattr(function, _KERNEL_MARK, True)
  return numba.njit(cache=True)(function)
