"""JAX's persistent compilation cache for every command but `bench`.

Compiled programs kept on disk: a run's actors, learner and evaluator compile the same searches
and learner step, and runs of one config repeat them (tiny `train`, 30 steps: 66 s, then 31 s).
Unbounded (a size limit needs the `filelock` package): a few MB per config; delete it freely.
"""

from __future__ import annotations

import os
import sys

from malloczero.common.files import user_cache_dir

COMPILATION_CACHE_ENV = "JAX_COMPILATION_CACHE_DIR"


def default_compilation_cache_dir() -> str:
  """$XDG_CACHE_HOME/malloczero/jax (default ~/.cache/malloczero/jax)."""
  return user_cache_dir("jax")


def use_compilation_cache() -> None:
  """Turns on JAX's persistent compilation cache for this process and the nodes it launches
  (they inherit the environment), at `default_compilation_cache_dir()` unless the user set
  JAX_COMPILATION_CACHE_DIR (empty turns it off). The cache key covers the program, the jax and
  XLA versions and the machine, so a hit is the same executable a compile would give."""
  path = os.environ.setdefault(COMPILATION_CACHE_ENV, default_compilation_cache_dir())
  if "jax" in sys.modules:  # JAX read its environment when imported: tell it directly.
    import jax

    if jax.config.jax_compilation_cache_dir is None and path:
      jax.config.update("jax_compilation_cache_dir", path)
