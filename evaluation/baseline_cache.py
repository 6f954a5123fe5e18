"""Baseline results kept between evaluations, so that a program nobody changed is not solved again.

An evaluation of the default suite spends most of its time in evo and CP-SAT at their time limits
on programs that did not change. A result is stored under a key made of everything it depends on:
the program's content, the hardware with its capacities, the solver, the solver's version
(`Solver.version`, raised whenever its results change), its options (time limit and seed
included) and this file's format. A changed program, capacity, option or solver version is a new
key; stale entries are never read.

A cached mapping is checked by the independent validator again when read, as every solve's is:
an entry that fails (a damaged file, a validator that grew stricter) is solved again and
rewritten. Its solve time is the one measured when it was solved: for a solver without a time
limit, on a second solve of the same program, after any compilation. Entries are files under
`default_cache_dir()`: delete the directory freely.
"""

from __future__ import annotations

import dataclasses
import gzip
import hashlib
import json
import os
from typing import Any, Optional

import numpy as np

from malloczero.common.errors import MalloczeroError
from malloczero.common.files import user_cache_dir, write_bytes
from malloczero.env.hardware import Hardware
from malloczero.env.mapping import Mapping
from malloczero.env.solvers import SolveResult, get_solver, solve
from malloczero.env.validator import validate_mapping
from malloczero.env.workload import Workload
from malloczero.env.workload_json import workload_to_dict

CACHE_FORMAT = 1
CACHE_DIR_ENV = "MALLOCZERO_BASELINE_CACHE_DIR"


def default_cache_dir() -> str:
  """$MALLOCZERO_BASELINE_CACHE_DIR, else $XDG_CACHE_HOME/malloczero/baselines (default
  ~/.cache/malloczero/baselines)."""
  if os.environ.get(CACHE_DIR_ENV):
    return os.environ[CACHE_DIR_ENV]
  return user_cache_dir("baselines")


def _plain(value: Any) -> Any:
  """numpy scalars and arrays in a solver's info, as JSON has them."""
  if isinstance(value, np.generic):
    return value.item()
  if isinstance(value, np.ndarray):
    return value.tolist()
  raise TypeError(f"{type(value).__name__} is not JSON")


@dataclasses.dataclass
class BaselineCache:
  """`solve` with results kept in `directory` (None: nothing kept, every call solves).

  `reused` and `solved` count this object's calls, for the one line an evaluation prints."""

  directory: Optional[str] = None
  reused: int = 0
  solved: int = 0
  # The last program hashed, held (so that no other object can take its id) with its digest:
  # one program is solved by several solvers in a row.
  _last: Optional[tuple[Workload, str]] = dataclasses.field(default=None, repr=False)

  def _program_digest(self, workload: Workload) -> str:
    if self._last is None or self._last[0] is not workload:
      text = json.dumps(workload_to_dict(workload), sort_keys=True, default=_plain)
      self._last = (workload, hashlib.sha256(text.encode()).hexdigest())
    return self._last[1]

  def key(
    self, workload: Workload, hardware: Hardware, solver: str, options: dict[str, Any]
  ) -> dict[str, Any]:
    """Everything a result depends on."""
    key = {
      "format": CACHE_FORMAT,
      "program": self._program_digest(workload),
      "hardware": hardware.to_dict(),
      "solver": solver,
      "version": get_solver(solver).version,
      "options": options,
    }
    if _untimed(options):  # Timed warm (`_solve_warm`): entries timed cold are not read.
      key["timing"] = "warm"
    return key

  def path(self, key: dict[str, Any]) -> str:
    digest = hashlib.sha256(json.dumps(key, sort_keys=True, default=_plain).encode()).hexdigest()
    return os.path.join(self.directory or "", key["solver"], f"{digest}.json.gz")

  def solve(
    self, workload: Workload, hardware: Hardware, solver: str, **options: Any
  ) -> SolveResult:
    """`env.solvers.solve`, or its result from an earlier call with the same key."""
    if self.directory is None:
      self.solved += 1
      return _solve_warm(workload, hardware, solver, options)
    key = self.key(workload, hardware, solver, options)
    path = self.path(key)
    result = self._read(path, key, workload, hardware)
    if result is not None:
      self.reused += 1
      return result
    result = _solve_warm(workload, hardware, solver, options)
    self.solved += 1
    self._write(path, key, result)
    return result

  def _read(
    self, path: str, key: dict[str, Any], workload: Workload, hardware: Hardware
  ) -> Optional[SolveResult]:
    try:
      with gzip.open(path, "rt", encoding="utf-8") as f:
        entry = json.load(f)
      if entry["key"] != json.loads(json.dumps(key, default=_plain)):
        return None  # A digest collision, or an entry written by hand.
      mapping = Mapping.from_dict(entry["mapping"], where=path)
      validate_mapping(workload, hardware, mapping)
      return SolveResult(mapping, float(entry["solve_time_s"]), dict(entry["info"]))
    except FileNotFoundError:
      return None
    except (OSError, ValueError, KeyError, TypeError, MalloczeroError, EOFError):
      return None  # Damaged or stale: solved again and rewritten.

  def _write(self, path: str, key: dict[str, Any], result: SolveResult) -> None:
    entry = {
      "key": key,
      "solve_time_s": result.solve_time_s,
      "info": result.info,
      "mapping": result.mapping.to_dict(),
    }
    try:
      data = json.dumps(entry, default=_plain).encode()
    except TypeError:
      return  # An info the cache cannot keep: the result is used, not kept.
    try:
      os.makedirs(os.path.dirname(path), exist_ok=True)
      write_bytes(path, gzip.compress(data, mtime=0))
    except OSError:
      pass  # A cache that cannot be written costs time, never the evaluation.


def _untimed(options: dict[str, Any]) -> bool:
  return options.get("time_limit_s") is None


def _solve_warm(
  workload: Workload, hardware: Hardware, solver: str, options: dict[str, Any]
) -> SolveResult:
  """`solve`; a solve without a time limit (msa, which takes none; any other solver called
  without one) is timed on a second, identical solve, so that its solve time is its work and not
  its kernels' one-off compilation in this process (18 s for msa's first loop program after a
  kernel change, against 3 ms on the same program warm), which the agent's time limit, counting
  msa's time, would otherwise pay."""
  result = solve(workload, hardware, solver, **dict(options))
  if not _untimed(options):
    return result
  again = solve(workload, hardware, solver, **dict(options))
  return dataclasses.replace(result, solve_time_s=again.solve_time_s)


def open_cache(enabled: bool = True) -> BaselineCache:
  """The user's cache (`default_cache_dir()`), or one that keeps nothing."""
  return BaselineCache(default_cache_dir() if enabled else None)
