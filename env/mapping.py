"""Mappings: the result of a solver or an agent, as written to MAP.json (format version 2).

  {"format_version": 2, "workload": str, "hardware": {...hardware JSON...}, "solver": str,
   "allocations": [{"request": int, "buffer": int, "level": int, "offset": int,
                    "start": int, "end": int,
                    "prefetch": {"start": int, "done": int},     # only if filled by a copy
                    "eviction": {"start": int, "done": int}},    # only if evicted
                   ...],
   "estimated_time_s": float, "slow_only_time_s": float}

Each allocation is a segment: `buffer` (its id in the workload) in `level` (an index into the
hardware's levels, 0 = fastest) at `offset` bytes over `[start, end)`. Without `prefetch` it is
produced in place (an activation's producer writes it there); with it, a copy from default
memory issued at `prefetch.start` (the allocation's start: the chunk is reserved from the copy's
issue) and due before `prefetch.done`, the first use it serves. `eviction` is a copy back to
default memory issued at `eviction.start` and due at `eviction.done`. `request` is the game's
request index (-1 when a solver made the segment outside the game).

Every time (`start`, `end` and the copies' `start` and `done`) is on the workload's time axis
(env/workload.py): the op indices of the program's schedule, step by step, even where the
workload stores several steps as one weighted op. For a MiniMalloc CSV these are the CSV's own
times, so an activation's window is its row's `[lower, upper)`; the arrays the cost model works
on use op indices, and `from_arrays` / `to_arrays` translate.

Version 1 files (no `format_version`: whole-range allocations with an implied prefetch) are
refused with a one-line error: their times were computed without copy contention.
"""

from __future__ import annotations

import dataclasses
import json
import os
from typing import Any

import numpy as np

from malloczero.env.cost_model import NO_COPY, Allocations
from malloczero.common.errors import MappingError
from malloczero.common.files import write_text
from malloczero.env.hardware import Hardware, HardwareError
from malloczero.env.workload import Workload, int_out_of_range

ALLOCATION_KEYS = ("request", "buffer", "level", "offset", "start", "end")
COPY_KINDS = ("prefetch", "eviction")
COPY_KEYS = ("start", "done")
FORMAT_VERSION = 2


@dataclasses.dataclass(frozen=True)
class Mapping:
  workload: str
  hardware: Hardware | None
  solver: str
  allocations: tuple[dict[str, Any], ...]
  estimated_time_s: float
  slow_only_time_s: float

  @property
  def speedup(self) -> float:
    return self.slow_only_time_s / self.estimated_time_s

  @classmethod
  def from_arrays(cls, workload: Workload, hardware: Hardware, solver: str, request: np.ndarray,
                  allocations: Allocations, estimated_time_s: float,
                  slow_only_time_s: float) -> "Mapping":
    """`allocations` must say how each is filled (`prefetch_done` set, see `CostModel.resolve`)."""
    if allocations.prefetch_done is None:
      raise MappingError("internal: allocations without their prefetches cannot be written")
    ids = np.array([b.id for b in workload.buffers], np.int64)
    axis = workload.time_axis
    rows = []
    for i in range(len(allocations)):
      row: dict[str, Any] = {
          "request": int(request[i]), "buffer": int(ids[allocations.buffer[i]]),
          "level": int(allocations.level[i]), "offset": int(allocations.offset[i]),
          "start": int(axis[allocations.start[i]]), "end": int(axis[allocations.end[i]])}
      if allocations.prefetch_done[i] != NO_COPY:
        row["prefetch"] = {"start": int(axis[allocations.start[i]]),
                           "done": int(axis[allocations.prefetch_done[i]])}
      if allocations.evict_start[i] != NO_COPY:
        row["eviction"] = {"start": int(axis[allocations.evict_start[i]]),
                           "done": int(axis[allocations.evict_done[i]])}
      rows.append(row)
    return cls(workload.name, hardware, solver, tuple(rows), float(estimated_time_s),
               float(slow_only_time_s))

  def to_arrays(self, workload: Workload) -> Allocations:
    """Allocation arrays with buffer ids resolved to positions; unknown ids raise MappingError.
    A prefetch's written start is not among them (it is the allocation's start; the validator
    checks that with `prefetch_starts`)."""
    index = workload.buffer_index
    try:
      buffer = np.array([index[a["buffer"]] for a in self.allocations], np.int64)
    except KeyError as e:
      raise MappingError(f"allocation refers to unknown buffer id {e.args[0]} of workload "
                         f"'{workload.name}'") from None
    col = lambda k: np.array([a[k] for a in self.allocations], np.int64)
    copy = lambda kind, key: _op_index(
        workload, np.array([a[kind][key] if kind in a else NO_COPY for a in self.allocations],
                           np.int64), f"{kind}.{key}")
    return Allocations(buffer=buffer, level=col("level"), offset=col("offset"),
                       start=_op_index(workload, col("start"), "start"),
                       end=_op_index(workload, col("end"), "end"),
                       prefetch_done=copy("prefetch", "done"),
                       evict_start=copy("eviction", "start"), evict_done=copy("eviction", "done"))

  def prefetch_starts(self, workload: Workload) -> np.ndarray:
    """[n] each allocation's prefetch start as written, in op indices (`NO_COPY` where it has
    none)."""
    return _op_index(workload, np.array([a["prefetch"]["start"] if "prefetch" in a else NO_COPY
                                         for a in self.allocations], np.int64), "prefetch.start")

  def to_dict(self) -> dict[str, Any]:
    return {"format_version": FORMAT_VERSION, "workload": self.workload,
            "hardware": self.hardware.to_dict() if self.hardware else None,
            "solver": self.solver, "allocations": [dict(a) for a in self.allocations],
            "estimated_time_s": self.estimated_time_s, "slow_only_time_s": self.slow_only_time_s}

  @classmethod
  def from_dict(cls, data: Any, where: str = "mapping") -> "Mapping":
    if not isinstance(data, dict):
      raise MappingError(f"{where}: expected a JSON object, got {type(data).__name__}")
    version = data.get("format_version", 1)
    if version != FORMAT_VERSION:
      raise MappingError(
          f"{where}: mapping format version {version!r}"
          + (" (no 'format_version')" if "format_version" not in data else "")
          + f"; this malloczero reads version {FORMAT_VERSION} (segments with their prefetch and "
          "eviction copies, times with copy contention): solve again to write one")
    for key in ("workload", "allocations", "estimated_time_s", "slow_only_time_s"):
      if key not in data:
        raise MappingError(f"{where}: missing required key '{key}'")
    if not isinstance(data["allocations"], list):
      raise MappingError(f"{where}: 'allocations' must be a list")
    rows = []
    for i, a in enumerate(data["allocations"]):
      if not isinstance(a, dict):
        raise MappingError(f"{where}: allocation {i} is not an object")
      for key in ALLOCATION_KEYS:
        v = a.get(key)
        if isinstance(v, bool) or not isinstance(v, int):
          raise MappingError(f"{where}: allocation {i}: '{key}' must be an integer, got {v!r}")
        if (problem := int_out_of_range(v, key)):
          raise MappingError(f"{where}: allocation {i}: {problem}")
      row = {k: int(a[k]) for k in ALLOCATION_KEYS}
      for kind in COPY_KINDS:
        if a.get(kind) is None:
          continue
        copy = a[kind]
        if not isinstance(copy, dict):
          raise MappingError(f"{where}: allocation {i}: '{kind}' must be an object with "
                             f"'start' and 'done', got {copy!r}")
        for key in COPY_KEYS:
          v = copy.get(key)
          if isinstance(v, bool) or not isinstance(v, int):
            raise MappingError(f"{where}: allocation {i}: '{kind}.{key}' must be an integer, "
                               f"got {v!r}")
          if (problem := int_out_of_range(v, f"{kind}.{key}")):
            raise MappingError(f"{where}: allocation {i}: {problem}")
          if v < 0:
            raise MappingError(f"{where}: allocation {i}: '{kind}.{key}' must be >= 0, got {v}")
        row[kind] = {key: int(copy[key]) for key in COPY_KEYS}
      rows.append(row)
    for key in ("estimated_time_s", "slow_only_time_s"):
      v = data[key]
      if isinstance(v, bool) or not isinstance(v, (int, float)):
        raise MappingError(f"{where}: '{key}' must be a number, got {v!r}")
    hardware = None
    if data.get("hardware") is not None:
      try:
        hardware = Hardware.from_dict(data["hardware"], where=f"{where}: hardware")
      except HardwareError as e:
        raise MappingError(str(e)) from None
    return cls(str(data["workload"]), hardware, str(data.get("solver", "unknown")), tuple(rows),
               float(data["estimated_time_s"]), float(data["slow_only_time_s"]))

  def save(self, path: str | os.PathLike) -> None:
    """Writes MAP.json atomically (see common/files.py)."""
    write_text(path, json.dumps(self.to_dict(), indent=1))


def _op_index(workload: Workload, times: np.ndarray, key: str) -> np.ndarray:
  """Op indices of times on the workload's axis. With every op one step they are the same
  numbers (the validator judges them); a time inside a weighted op, or off the axis, names no
  op boundary, which is a one-line MappingError."""
  axis = workload.time_axis
  if axis[-1] == workload.num_ops:
    return times
  index = np.minimum(np.searchsorted(axis, times), len(axis) - 1)
  absent = times == NO_COPY  # No such copy: stays NO_COPY.
  index[absent] = NO_COPY
  bad = np.flatnonzero((axis[np.maximum(index, 0)] != times) & ~absent)
  if bad.size:
    i = int(bad[0])
    raise MappingError(f"allocation {i}: '{key}' = {int(times[i])} is not an op boundary of "
                       f"'{workload.name}' (its ops start at times {_sample(axis)})")
  return index


def _sample(axis: np.ndarray) -> str:
  shown = ", ".join(str(int(x)) for x in axis[:6])
  return shown + (f", ..., {int(axis[-1])}" if len(axis) > 6 else "")


def load_mapping(path: str | os.PathLike) -> Mapping:
  path = os.fspath(path)
  if not os.path.exists(path):
    raise MappingError(f"{path}: no such mapping file")
  try:
    with open(path, encoding="utf-8") as f:
      data = json.load(f)
  except json.JSONDecodeError as e:
    raise MappingError(f"{path}: not valid JSON (truncated or corrupt?): {e.msg} at line "
                       f"{e.lineno}") from None
  except (OSError, UnicodeDecodeError) as e:
    raise MappingError(f"{path}: cannot read: {e}") from None
  except ValueError as e:  # An integer of more digits than Python converts.
    raise MappingError(f"{path}: not a readable mapping: {e}") from None
  return Mapping.from_dict(data, where=path)
