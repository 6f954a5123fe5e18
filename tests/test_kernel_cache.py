"""The kernels' cache (env/kernel_cache.py): every kernel is cached under a stamp that covers the
modules it calls into and the layouts it reads, so a cached kernel is never older than a file it
depends on."""

import ast
import glob
import os
import shutil

from malloczero.env import kernel_cache
from malloczero.env.kernel_cache import DependencyStampLocator, dependency_stamp

ENV = kernel_cache.ENV_DIR
KERNEL_FILES = glob.glob(os.path.join(ENV, "msa", "kernels", "*.py")) + [
  os.path.join(ENV, "game", "observation_kernels.py"),
  os.path.join(ENV, "placement_kernels.py"),
  os.path.join(ENV, "simulator_kernels.py"),
  os.path.join(ENV, "validator_kernels.py"),
]


def _covered() -> set[str]:
  return {
    os.path.relpath(p, ENV)
    for p in glob.glob(os.path.join(ENV, "**", "*.py"), recursive=True)
    if any(p in glob.glob(os.path.join(ENV, d)) for d in kernel_cache.DEPENDENCIES)
  }


def test_every_module_a_kernel_imports_is_in_the_stamp():
  covered = _covered()
  missing = []
  for path in KERNEL_FILES:
    assert os.path.relpath(path, ENV) in covered, path
    with open(path, encoding="utf-8") as f:
      tree = ast.parse(f.read())
    for node in ast.walk(tree):
      if isinstance(node, ast.ImportFrom) and (node.module or "").startswith("malloczero.env."):
        module = os.path.join(*node.module.split(".")[2:]) + ".py"
        if os.path.exists(os.path.join(ENV, module)) and module not in covered:
          missing.append(f"{os.path.relpath(path, ENV)} imports {node.module}")
  assert not missing, "add these to kernel_cache.DEPENDENCIES:\n" + "\n".join(missing)


def test_the_kernels_are_cached_under_the_dependency_stamp():
  from malloczero.env import placement_kernels, validator_kernels
  from malloczero.env.game import observation_kernels
  from malloczero.env.msa.kernels import (
    chunk_index,
    copy_trees,
    live_lists,
    prefetch,
    shared,
    solver_loop,
  )

  modules = (
    chunk_index,
    copy_trees,
    live_lists,
    prefetch,
    shared,
    solver_loop,
    observation_kernels,
    placement_kernels,
    validator_kernels,
  )
  kernels = [value for m in modules for value in vars(m).values() if hasattr(value, "_cache")]
  assert len(kernels) >= 50
  for kernel in kernels:
    locator = kernel._cache._impl._locator
    assert isinstance(locator, DependencyStampLocator), kernel
    own, dependencies = locator.get_source_stamp()
    assert dependencies == dependency_stamp()
    assert locator.get_cache_path().startswith(os.path.dirname(kernel.py_func.__code__.co_filename))


def test_the_stamp_changes_with_any_dependency_and_nothing_else(tmp_path):
  root = tmp_path / "env"
  shutil.copytree(ENV, root, ignore=shutil.ignore_patterns("__pycache__", "programs"))
  before = dependency_stamp(str(root))
  assert {name for name, _, _ in before} == _covered()
  os.utime(root / "solvers" / "registry.py", (1, 1))  # Not a kernel's dependency.
  assert dependency_stamp(str(root)) == before
  for dependency in ("msa/chunks.py", "msa/kernels/chunk_index.py", "game/game.py"):
    stat = os.stat(root / dependency)
    os.utime(root / dependency, (stat.st_atime, stat.st_mtime + 1))
    after = dependency_stamp(str(root))
    assert after != before, dependency
    before = after


def test_other_functions_keep_numbas_own_stamp():
  import numba

  @numba.njit(cache=True)
  def plain(x):
    return x + 1

  assert not isinstance(plain._cache._impl._locator, DependencyStampLocator)
