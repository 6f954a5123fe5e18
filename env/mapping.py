"""Mappings: the result of a solver or an agent, as written to MAP.json or MAP.json.gz (format
version 2).

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
import gzip
import json
import operator
import os
from typing import Any, Callable, NoReturn

import numpy as np

from malloczero.common import strict_json
from malloczero.common.errors import MappingError
from malloczero.common.files import write_bytes, write_text
from malloczero.common.strict_json import show_value, unknown_key
from malloczero.common.units import show_int
from malloczero.env.cost_model import NO_COPY, Allocations
from malloczero.env.hardware import Hardware, HardwareError
from malloczero.env.workload import (
  MAX_FILE_INT,
  Workload,
  collection_paused,
  finite_number,
  int_out_of_range,
)

ALLOCATION_KEYS = ("request", "buffer", "level", "offset", "start", "end")
COPY_KINDS = ("prefetch", "eviction")
COPY_KEYS = ("start", "done")
MAPPING_KEYS = (
  "format_version",
  "workload",
  "hardware",
  "solver",
  "allocations",
  "estimated_time_s",
  "slow_only_time_s",
)
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
  def from_arrays(
    cls,
    workload: Workload,
    hardware: Hardware,
    solver: str,
    request: np.ndarray,
    allocations: Allocations,
    estimated_time_s: float,
    slow_only_time_s: float,
  ) -> "Mapping":
    """`allocations` must say how each is filled (`prefetch_done` set, see `CostModel.resolve`)."""
    if allocations.prefetch_done is None:
      raise MappingError("internal: allocations without their prefetches cannot be written")
    ids = np.array([b.id for b in workload.buffers], np.int64)
    axis = workload.time_axis
    on_axis = lambda ops: axis[ops].tolist()
    prefetched = (allocations.prefetch_done != NO_COPY).tolist()
    evicted = (allocations.evict_start != NO_COPY).tolist()
    # Columns as Python ints first: indexing arrays per row was most of a large mapping's time.
    columns = zip(
      np.asarray(request).tolist(),
      ids[allocations.buffer].tolist(),
      allocations.level.tolist(),
      allocations.offset.tolist(),
      on_axis(allocations.start),
      on_axis(allocations.end),
      on_axis(allocations.prefetch_done),
      on_axis(allocations.evict_start),
      on_axis(allocations.evict_done),
      prefetched,
      evicted,
    )
    rows = []
    for r, buffer, level, offset, start, end, done, evict_start, evict_done, p, e in columns:
      row: dict[str, Any] = {
        "request": r,
        "buffer": buffer,
        "level": level,
        "offset": offset,
        "start": start,
        "end": end,
      }
      if p:
        row["prefetch"] = {"start": start, "done": done}
      if e:
        row["eviction"] = {"start": evict_start, "done": evict_done}
      rows.append(row)
    return cls(
      workload.name, hardware, solver, tuple(rows), float(estimated_time_s), float(slow_only_time_s)
    )

  def to_arrays(self, workload: Workload) -> Allocations:
    """Allocation arrays with buffer ids resolved to positions; unknown ids raise MappingError.
    A prefetch's written start is not among them (it is the allocation's start; the validator
    checks that with `prefetch_starts`). Read a column set at a time (a mapping of 10^5
    allocations is 10^5 dicts: one pass each, not one per key)."""
    rows = self.allocations
    table = np.array(list(map(_PLAIN_KEYS, rows)), np.int64).reshape(len(rows), len(PLAIN_KEYS))
    ids, level, offset, start, end = table.T
    buffer = _positions(workload, ids)
    copy = lambda kind, key, copies: _op_index(
      workload,
      np.array([NO_COPY if c is None else c[key] for c in copies], np.int64),
      f"{kind}.{key}",
    )
    prefetches = [a.get("prefetch") for a in rows]
    evictions = [a.get("eviction") for a in rows]
    return Allocations(
      buffer=buffer,
      level=np.ascontiguousarray(level),
      offset=np.ascontiguousarray(offset),
      start=_op_index(workload, np.ascontiguousarray(start), "start"),
      end=_op_index(workload, np.ascontiguousarray(end), "end"),
      prefetch_done=copy("prefetch", "done", prefetches),
      evict_start=copy("eviction", "start", evictions),
      evict_done=copy("eviction", "done", evictions),
    )

  def prefetch_starts(self, workload: Workload) -> np.ndarray:
    """[n] each allocation's prefetch start as written, in op indices (`NO_COPY` where it has
    none)."""
    return _op_index(
      workload,
      np.array(
        [
          NO_COPY if p is None else p["start"]
          for p in (a.get("prefetch") for a in self.allocations)
        ],
        np.int64,
      ),
      "prefetch.start",
    )

  def to_dict(self) -> dict[str, Any]:
    return {
      "format_version": FORMAT_VERSION,
      "workload": self.workload,
      "hardware": self.hardware.to_dict() if self.hardware else None,
      "solver": self.solver,
      "allocations": [
        {k: dict(v) if isinstance(v, dict) else v for k, v in a.items()} for a in self.allocations
      ],
      "estimated_time_s": self.estimated_time_s,
      "slow_only_time_s": self.slow_only_time_s,
    }

  @classmethod
  def from_dict(cls, data: Any, where: str = "mapping") -> "Mapping":
    """The mapping `data` describes, checked key by key: no key the format lacks, integers where
    it means integers (not 2.0, not true), copy windows in order; `where` starts every message."""

    def fail(message: str) -> NoReturn:
      raise MappingError(f"{where}: {message}")

    if not isinstance(data, dict):
      fail(f"expected a JSON object, got {type(data).__name__}")
    version = data.get("format_version", 1)
    if not _is_int(version):
      fail(f"'format_version' must be the integer {FORMAT_VERSION}, got {show_value(version)}")
    if version != FORMAT_VERSION:
      fail(
        f"mapping format version {show_int(version)}"
        + (" (no 'format_version')" if "format_version" not in data else "")
        + f"; this malloczero reads version {FORMAT_VERSION} (segments with their prefetch and "
        "eviction copies, times with copy contention): solve again to write one"
      )
    if problem := unknown_key(data, MAPPING_KEYS):
      fail(problem)
    for key in ("workload", "allocations", "estimated_time_s", "slow_only_time_s"):
      if key not in data:
        fail(f"missing required key '{key}'")
    for key in ("workload", "solver"):
      if key in data and (not isinstance(data[key], str) or not data[key].isprintable()):
        fail(f"'{key}' must be a string of printable text, got {show_value(data[key])}")
    if not isinstance(data["allocations"], list):
      fail("'allocations' must be a list")
    rows = [_allocation(a, f"allocation {i}", fail) for i, a in enumerate(data["allocations"])]
    for key in ("estimated_time_s", "slow_only_time_s"):
      if (seconds := finite_number(data[key])) is None or seconds < 0:
        fail(f"'{key}' must be a finite number of seconds >= 0, got {show_value(data[key])}")
    hardware = None
    if data.get("hardware") is not None:
      try:
        hardware = Hardware.from_dict(data["hardware"], where=f"{where}: hardware")
      except HardwareError as e:
        raise MappingError(str(e)) from None
    return cls(
      str(data["workload"]),
      hardware,
      str(data.get("solver", "unknown")),
      tuple(rows),
      float(data["estimated_time_s"]),
      float(data["slow_only_time_s"]),
    )

  def save(self, path: str | os.PathLike) -> None:
    """Writes MAP.json, or MAP.json.gz compressed (as workloads are), atomically (see
    common/files.py)."""
    text = json.dumps(self.to_dict(), indent=1)
    if os.fspath(path).endswith(".gz"):
      write_bytes(path, gzip.compress(text.encode("utf-8")))
    else:
      write_text(path, text)


def _is_int(value: Any) -> bool:
  return isinstance(value, int) and not isinstance(value, bool)


def _plain(value: Any) -> bool:
  return type(value) is int and -MAX_FILE_INT <= value <= MAX_FILE_INT


def _plain_allocation(a: Any) -> dict[str, Any] | None:
  """The common allocation, plain integers and well-formed copies, as `_allocation`'s checks
  would return it, without them (10^5 allocations are read in a second); None for any other,
  which `_allocation` then checks key by key."""
  if type(a) is not dict or not all(_plain(a.get(k)) for k in ALLOCATION_KEYS):
    return None
  row = {k: a[k] for k in ALLOCATION_KEYS}
  for kind in COPY_KINDS:
    copy = a.get(kind)
    if copy is None:
      continue
    if (
      type(copy) is not dict
      or len(copy) != len(COPY_KEYS)
      or not all(_plain(copy.get(k)) for k in COPY_KEYS)
      or not 0 <= copy["start"] <= copy["done"]
    ):
      return None
    row[kind] = {k: copy[k] for k in COPY_KEYS}
  return row if len(a) == len(ALLOCATION_KEYS) + sum(kind in a for kind in COPY_KINDS) else None


def _allocation(a: Any, what: str, fail: Callable[[str], NoReturn]) -> dict[str, Any]:
  """One allocation of a mapping file as a row of plain integers; `fail` reports a problem with
  `what` (the allocation) in one line."""
  if (row := _plain_allocation(a)) is not None:
    return row
  if not isinstance(a, dict):
    fail(f"{what} is not an object")
  if problem := unknown_key(a, ALLOCATION_KEYS + COPY_KINDS):
    fail(f"{what}: {problem}")
  for key in ALLOCATION_KEYS:
    v = a.get(key)
    if not _is_int(v):
      fail(f"{what}: '{key}' must be an integer, got {show_value(v)}")
    if problem := int_out_of_range(v, key):
      fail(f"{what}: {problem}")
  row = {k: int(a[k]) for k in ALLOCATION_KEYS}
  for kind in COPY_KINDS:
    if a.get(kind) is None:
      continue
    copy = a[kind]
    if not isinstance(copy, dict):
      fail(f"{what}: '{kind}' must be an object with 'start' and 'done', got {show_value(copy)}")
    if problem := unknown_key(copy, COPY_KEYS):
      fail(f"{what}: '{kind}': {problem}")
    for key in COPY_KEYS:
      v = copy.get(key)
      if not _is_int(v):
        fail(f"{what}: '{kind}.{key}' must be an integer, got {show_value(v)}")
      if problem := int_out_of_range(v, f"{kind}.{key}"):
        fail(f"{what}: {problem}")
      if v < 0:
        fail(f"{what}: '{kind}.{key}' must be >= 0, got {v}")
    if copy["done"] < copy["start"]:
      fail(
        f"{what}: its {kind} window [start {copy['start']}, done {copy['done']}] is due before "
        "it is issued: 'done' must be >= 'start'"
      )
    row[kind] = {key: int(copy[key]) for key in COPY_KEYS}
  return row


PLAIN_KEYS = ("buffer", "level", "offset", "start", "end")
_PLAIN_KEYS = operator.itemgetter(*PLAIN_KEYS)


def _positions(workload: Workload, ids: np.ndarray) -> np.ndarray:
  """The positions in `workload.buffers` of buffer ids `[n]`; MappingError naming the first id
  that is not the workload's."""
  known = np.array([b.id for b in workload.buffers], np.int64)
  order = np.argsort(known, kind="stable")
  found = np.minimum(np.searchsorted(known[order], ids), len(known) - 1)
  missing = np.flatnonzero(known[order][found] != ids)
  if missing.size:
    raise MappingError(
      f"allocation refers to unknown buffer id {int(ids[missing[0]])} of workload '{workload.name}'"
    )
  return np.ascontiguousarray(order[found])


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
    raise MappingError(
      f"allocation {i}: '{key}' = {int(times[i])} is not an op boundary of "
      f"'{workload.name}' (its ops start at times {_sample(axis)})"
    )
  return index


def _sample(axis: np.ndarray) -> str:
  shown = ", ".join(str(int(x)) for x in axis[:6])
  return shown + (f", ..., {int(axis[-1])}" if len(axis) > 6 else "")


def load_mapping(path: str | os.PathLike) -> Mapping:
  """Reads MAP.json or MAP.json.gz; every failure is a one-line MappingError."""
  path = os.fspath(path)
  if not os.path.exists(path):
    raise MappingError(f"{path}: no such mapping file")
  with collection_paused():  # 10^5 allocations are 10^5 dicts, all kept.
    return Mapping.from_dict(strict_json.load(path, MappingError), where=path)
