"""Workloads: a compiled program as a schedule of ops and the buffers they read and write.

This module owns the model: ops in schedule order, each with its flops, and buffers, each with a
size in bytes, a defining op (`PROGRAM_START` for parameters and inputs), the ops that use it
(sorted, each op once) and a kind (`KINDS`); the checks every workload passes however it was
built, and the arrays the cost model and the game read. Its files are env/workload_json.py (the
JSON format, and `load_workload` / `save_workload` for every format) and env/minimalloc_csv.py
(MiniMalloc's CSV). What every reader of env's files shares is here too: the bound on the
integers they hold (`MAX_FILE_INT`) with its one-line complaint, finite numbers, and garbage
collection paused while their objects are built.

A buffer's `use_bytes[i]` is the number of bytes op `uses[i]` really reads of it, and `def_bytes`
the number its defining op writes; both default to `size` (None). They exist because XLA's cost
analysis charges some ops less than whole buffers: a gather or a slice reads only the rows it
fetches from a large table, an in-place dynamic-update-slice writes only its update. Each is an
integer `0 <= bytes <= size`; 0 is a use that keeps the buffer live without moving data (the
done of an asynchronous operation, the aliased operand of an in-place update). `def_bytes` needs
a defining op. The cost model and the game charge an incidence its bytes.

Live ranges are half-open op intervals: an activation lives on `[def, last_use + 1)`, a
parameter or input on `[0, last_use + 1)`, and a program output on `[def, T)` because it
must survive the program.

An op's `weight` (default 1) says how many identical consecutive steps of the program it stands
for: its flops and every byte it reads or writes count `weight` times, so its time in the cost
model is `weight` times the time of one step, exactly. The workload's *time axis* puts op `t`
on `[time_axis[t], time_axis[t + 1])`, the cumulative weights: with every weight 1 it is the op
index itself. Mapping files (env/mapping.py) give allocation windows on this axis, so a mapping
reads in the program's own time whichever way the schedule was stored.
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import gc
import itertools
from typing import Any, Iterable, Iterator, NamedTuple, NoReturn

import numpy as np

from malloczero.common.errors import WorkloadError
from malloczero.common.units import show_int, show_power_of_two
from malloczero.env.memory_guard import check_fits_in_memory

PROGRAM_START = -1
KINDS = ("activation", "parameter", "input", "output")
PREFETCHED_KINDS = ("parameter", "input")  # Exist before the program: copied in per use window.
# Integers read from files are bounded so that the int64 arrays built from them, and the sums and
# offsets computed in those arrays, cannot overflow: 2**60 bytes is 1 EiB.
MAX_FILE_INT = 1 << 60
MAX_TOTAL_BYTES = 1 << 62


MAX_LOOP_DEPTH = 64


@dataclasses.dataclass(frozen=True)
class Op:
  """One step of the schedule, or `weight` steps of it in one op: identical consecutive steps
  merged (a compressed MiniMalloc time interval), or an op of a loop's body that runs once per
  iteration (its weight the trip counts of the `loop_depth` loops around it, as the HLO importer
  flattens a `while`). `flops` and the bytes it moves are per step. `loop_depth` is XLA's while
  nest level, which its memory-space assignment reads instead of trip counts (env/msa)."""

  name: str
  flops: float
  weight: int = 1
  loop_depth: int = 0


@dataclasses.dataclass(frozen=True)
class Buffer:
  """A tensor. `def_op == PROGRAM_START` for parameters and inputs; `uses` sorted, unique.

  `use_bytes` (parallel to `uses`) and `def_bytes` are the bytes each use reads and the
  definition writes when that is less than `size`; None means `size` everywhere (the common
  case, kept as None so that equality and saved files do not depend on how it was built)."""

  id: int
  name: str
  size: int
  def_op: int
  uses: tuple[int, ...]
  kind: str
  use_bytes: tuple[int, ...] | None = None
  def_bytes: int | None = None


@dataclasses.dataclass(frozen=True)
class WorkloadArrays:
  """Numpy views of a workload used by the cost model and the game.

  Incidences are the (op, buffer) pairs an op touches (its results and operands), sorted by
  buffer then op; each pair appears once.
  """

  flops: np.ndarray  # [T] float64, all steps of the op (its flops x weight)
  sizes: np.ndarray  # [N] int64
  def_op: np.ndarray  # [N] int64, PROGRAM_START for parameters / inputs
  live_start: np.ndarray  # [N] int64
  live_end: np.ndarray  # [N] int64 (exclusive)
  is_prefetched: np.ndarray  # [N] bool: parameter or input
  is_output: np.ndarray  # [N] bool
  incidence_buffer: np.ndarray  # [E] int64
  incidence_op: np.ndarray  # [E] int64
  incidence_bytes: np.ndarray  # [E] float64: bytes the op moves (`def_bytes` / `use_bytes`),
  #   all steps of it (x the op's weight)
  buffer_incidence_start: np.ndarray  # [N + 1] CSR offsets into the incidence arrays


@dataclasses.dataclass(frozen=True)
class Workload:
  """A program's schedule and buffers, checked when built. Built from a JSON document or plain
  values by env/workload_json.py (`workload_from_dict`, `workload_from_ops`), read from a file of
  either format by its `load_workload`."""

  name: str
  source: str
  ops: tuple[Op, ...]
  buffers: tuple[Buffer, ...]

  def __post_init__(self):
    columns = _check_workload(self)
    # Kept for `arrays` (not a field: equality and copies do not see it).
    object.__setattr__(self, "_columns", columns)

  @property
  def num_ops(self) -> int:
    return len(self.ops)

  @property
  def num_buffers(self) -> int:
    return len(self.buffers)

  @functools.cached_property
  def buffer_index(self) -> dict[int, int]:
    """Maps a buffer id to its position in `buffers`."""
    return {b.id: i for i, b in enumerate(self.buffers)}

  @functools.cached_property
  def time_axis(self) -> np.ndarray:
    """[T + 1] int64: op `t` covers program time `[time_axis[t], time_axis[t + 1])`."""
    weights = np.fromiter((o.weight for o in self.ops), np.int64, count=self.num_ops)
    return np.concatenate([[0], np.cumsum(weights)])

  @functools.cached_property
  def arrays(self) -> WorkloadArrays:
    return _build_arrays(self)

  @functools.cached_property
  def peak_live_bytes(self) -> int:
    """Largest total size of buffers live at one op."""
    a = self.arrays
    delta = np.zeros(self.num_ops + 1, np.int64)
    np.add.at(delta, a.live_start, a.sizes)
    np.add.at(delta, a.live_end, -a.sizes)
    return int(np.cumsum(delta)[:-1].max(initial=0))

  def summary(self) -> dict[str, Any]:
    kinds = {k: sum(b.kind == k for b in self.buffers) for k in KINDS}
    return {
      "name": self.name,
      "ops": self.num_ops,
      "buffers": self.num_buffers,
      "total_flops": float(self.arrays.flops.sum()),
      "total_bytes": int(self.arrays.sizes.sum()),
      "peak_live_bytes": self.peak_live_bytes,
      **{f"{k}s": v for k, v in kinds.items()},
    }


def frozen_instances(cls: type, fields: Iterable[dict[str, Any]]) -> list:
  """Instances of a frozen dataclass (`Op`, `Buffer`), each from a dict of all its fields' values,
  made without its `__init__`: a frozen dataclass's `__init__` sets each field through
  `object.__setattr__`, which was a third of the time to read a workload of 100,000 buffers. The
  instances are those `__init__` makes (the same values in the same `__dict__`, so equal and
  alike); only for classes without a `__post_init__`. Each dict becomes an instance's own."""
  new, set_dict = object.__new__, object.__setattr__
  made = []
  for values in fields:
    instance = new(cls)
    set_dict(instance, "__dict__", values)
    made.append(instance)
  return made


# ----------------------------------------------------------------------------- checks, arrays


def fail(where: str, message: str) -> NoReturn:
  """Raises the one-line WorkloadError `where: message`."""
  error = WorkloadError(f"{where}: {message}")
  error.detail = message  # Lets a file loader name the file instead of the workload.
  raise error


def is_int(x: Any) -> bool:
  """Whether `x` is an integer (Python's or numpy's), not a bool."""
  return type(x) is int or (isinstance(x, (int, np.integer)) and not isinstance(x, bool))


class _Columns(NamedTuple):
  """A workload's buffers as columns, kept from its checks for its arrays (`_build_arrays`):
  sizes, definition ops, kind indices into `KINDS`, use counts `[N]`, and every use `[U]`."""

  sizes: np.ndarray
  def_op: np.ndarray
  kind: np.ndarray
  use_counts: np.ndarray
  uses: np.ndarray


def _plainly_valid(w: Workload) -> _Columns | None:
  """The buffers' columns when `_check_workload`'s checks all pass, made over the columns at
  once (one Python pass per buffer and check was a quarter of reading a program of 100,000
  buffers); None when one may fail, or a buffer reads or writes part of itself: the checks one
  buffer at a time then judge it, with their messages. Ints of Python's own type only."""
  ops, bufs = w.ops, w.buffers
  weights = [op.weight for op in ops]
  if not set(map(type, weights)) <= {int} or min(weights) < 1 or max(weights) > MAX_FILE_INT:
    return None
  if sum(weights) > MAX_FILE_INT:
    return None
  depths = [op.loop_depth for op in ops]
  if not set(map(type, depths)) <= {int} or min(depths) < 0 or max(depths) > MAX_LOOP_DEPTH:
    return None
  if any(b.use_bytes is not None or b.def_bytes is not None for b in bufs):
    return None
  ids = [b.id for b in bufs]
  sizes = [b.size for b in bufs]
  defs = [b.def_op for b in bufs]
  uses = [b.uses for b in bufs]
  kind_index = {kind: i for i, kind in enumerate(KINDS)}
  kinds = [kind_index.get(b.kind, -1) for b in bufs]
  if not (
    set(map(type, ids)) <= {int}
    and set(map(type, sizes)) <= {int}
    and set(map(type, defs)) <= {int}
    and set(map(type, uses)) <= {tuple}
    and min(ids) >= 0
    and len(set(ids)) == len(ids)
    and min(kinds) >= 0
    and min(sizes) > 0
    and sum(sizes) <= MAX_TOTAL_BYTES
    and max(sizes) <= MAX_FILE_INT
    and min(defs) >= -MAX_FILE_INT
    and max(defs) <= MAX_FILE_INT
  ):
    return None
  flat = list(itertools.chain.from_iterable(uses))
  if not set(map(type, flat)) <= {int} or (flat and not -MAX_FILE_INT <= min(flat)):
    return None
  if flat and max(flat) > MAX_FILE_INT:
    return None
  kind = np.array(kinds, np.int8)
  def_op = np.array(defs, np.int64)
  prefetched = np.isin(kind, [KINDS.index(k) for k in PREFETCHED_KINDS])
  num_ops = len(ops)
  if np.any(np.where(prefetched, def_op != PROGRAM_START, (def_op < 0) | (def_op >= num_ops))):
    return None
  counts = np.fromiter(map(len, uses), np.int64, count=len(uses))
  used = np.array(flat, np.int64)
  if np.any(used < 0) or np.any(used >= num_ops) or np.any(used <= np.repeat(def_op, counts)):
    return None
  steps = np.diff(used)
  across = np.cumsum(counts)[:-1] - 1  # The step from one buffer's uses into the next's.
  increasing = np.ones(len(steps), bool)
  increasing[across[(across >= 0) & (across < len(steps))]] = False
  if np.any(steps[increasing] <= 0):
    return None
  return _Columns(np.array(sizes, np.int64), def_op, kind, counts, used)


def _check_workload(w: Workload) -> _Columns | None:
  """Semantic checks shared by every way of building a workload; the buffers' columns when
  they were checked at once (`_plainly_valid`)."""
  where = w.name or "workload"
  if not w.ops:
    fail(where, "empty schedule: the workload has no ops")
  if not w.buffers:
    fail(where, "the workload has no buffers")
  try:
    columns = _plainly_valid(w)
  except (TypeError, ValueError, OverflowError):  # Values no file could hold: checked below.
    columns = None
  if columns is not None:
    return columns
  num_ops = len(w.ops)
  for t, op in enumerate(w.ops):
    if not is_int(op.weight) or not 1 <= op.weight <= MAX_FILE_INT:
      fail(
        where,
        f"op {t} ('{op.name}'): 'weight' must be an integer from 1 to 2**60, got {op.weight!r}",
      )
    if not is_int(op.loop_depth) or not 0 <= op.loop_depth <= MAX_LOOP_DEPTH:
      fail(
        where,
        f"op {t} ('{op.name}'): 'loop_depth' must be an integer from 0 to {MAX_LOOP_DEPTH}, got "
        f"{op.loop_depth!r}",
      )
  if sum(op.weight for op in w.ops) > MAX_FILE_INT:
    fail(where, "the ops' weights add up to more than 2**60 steps")
  total_bytes = sum(b.size for b in w.buffers)
  if total_bytes > MAX_TOTAL_BYTES:
    fail(
      where, f"the buffers' sizes add up to {show_int(total_bytes)} bytes, above the limit of 2**62"
    )
  seen: set[int] = set()
  for b in w.buffers:
    label = f"buffer {b.id} ('{b.name}')"
    if b.id < 0:
      fail(where, f"{label}: buffer ids must be >= 0, got {b.id}")
    if b.id in seen:
      fail(where, f"duplicate buffer id {b.id}")
    seen.add(b.id)
    if any(u >= v for u, v in zip(b.uses, b.uses[1:])):
      fail(where, f"{label}: 'uses' must be sorted with each op once")
    if b.kind not in KINDS:
      # Quoted as Python writes it when not printable (a line break would end the one line).
      kind = f"'{b.kind}'" if str(b.kind).isprintable() else repr(b.kind)
      fail(where, f"{label}: unknown kind {kind} (expected one of {', '.join(KINDS)})")
    if b.size <= 0:
      fail(where, f"{label}: size must be positive, got {b.size}")
    if b.kind in PREFETCHED_KINDS:
      if b.def_op != PROGRAM_START:
        fail(where, f"{label}: a {b.kind} exists at program start, so 'def' must be null")
    elif not 0 <= b.def_op < num_ops:
      fail(
        where, f"{label}: 'def' refers to unknown op {b.def_op} (the schedule has {num_ops} ops)"
      )
    for u in b.uses:
      if not 0 <= u < num_ops:
        fail(where, f"{label}: use at unknown op {u} (the schedule has {num_ops} ops)")
      if u <= b.def_op:
        fail(where, f"{label}: used at op {u} before its definition at op {b.def_op}")
    if b.use_bytes is not None:
      if len(b.use_bytes) != len(b.uses):
        fail(where, f"{label}: 'use_bytes' has {len(b.use_bytes)} entries for {len(b.uses)} uses")
      bad = next((x for x in b.use_bytes if not 0 <= x <= b.size), None)
      if bad is not None:
        fail(where, f"{label}: 'use_bytes' entry {show_int(bad)} is outside 0..size ({b.size})")
    if b.def_bytes is not None:
      if b.def_op == PROGRAM_START:
        fail(where, f"{label}: 'def_bytes' is given but the buffer has no defining op")
      if not 0 <= b.def_bytes <= b.size:
        fail(where, f"{label}: 'def_bytes' {show_int(b.def_bytes)} is outside 0..size ({b.size})")
  return None


def _build_arrays(w: Workload) -> WorkloadArrays:
  columns = getattr(w, "_columns", None)
  if columns is not None:
    return _arrays_from_columns(w, columns)
  num_ops, bufs = w.num_ops, w.buffers
  sizes = np.array([b.size for b in bufs], np.int64)
  def_op = np.array([b.def_op for b in bufs], np.int64)
  last_use = np.array([b.uses[-1] if b.uses else -1 for b in bufs], np.int64)
  is_prefetched = np.array([b.kind in PREFETCHED_KINDS for b in bufs])
  is_output = np.array([b.kind == "output" for b in bufs])
  counts = np.fromiter((len(b.uses) + (b.def_op >= 0) for b in bufs), np.int64, count=len(bufs))
  starts = np.concatenate([[0], np.cumsum(counts)])
  check_fits_in_memory(w.name or "workload", num_ops, len(bufs), int(starts[-1]))
  inc_buf = np.repeat(np.arange(len(bufs), dtype=np.int64), counts)
  # Streamed, not copied per buffer: the uses are already the workload's largest part.
  inc_op = np.fromiter(
    itertools.chain.from_iterable(
      itertools.chain((b.def_op,), b.uses) if b.def_op >= 0 else b.uses for b in bufs
    ),
    np.int64,
    count=int(starts[-1]),
  )
  inc_bytes = sizes[inc_buf].astype(np.float64)
  for i, b in enumerate(bufs):  # Partial accesses (rare): overwrite the whole-buffer default.
    if b.def_bytes is None and b.use_bytes is None:
      continue
    lo = int(starts[i])
    if b.def_op >= 0:
      if b.def_bytes is not None:
        inc_bytes[lo] = b.def_bytes
      lo += 1
    if b.use_bytes is not None:
      inc_bytes[lo : lo + len(b.uses)] = b.use_bytes
  return _weighted_arrays(
    w, sizes, def_op, last_use, is_prefetched, is_output, inc_buf, inc_op, inc_bytes, starts
  )


def _arrays_from_columns(w: Workload, c: _Columns) -> WorkloadArrays:
  """`_build_arrays` from the columns the checks kept (every access whole): the same arrays,
  without another pass over the buffers."""
  num_ops = w.num_ops
  n = len(c.sizes)
  has_def = c.def_op >= 0
  ends = np.cumsum(c.use_counts)
  last_use = np.where(c.use_counts > 0, c.uses[np.maximum(ends - 1, 0)] if len(c.uses) else 0, -1)
  is_prefetched = np.isin(c.kind, [KINDS.index(k) for k in PREFETCHED_KINDS])
  is_output = c.kind == KINDS.index("output")
  counts = c.use_counts + has_def
  starts = np.concatenate([[0], np.cumsum(counts)])
  check_fits_in_memory(w.name or "workload", num_ops, n, int(starts[-1]))
  inc_buf = np.repeat(np.arange(n, dtype=np.int64), counts)
  inc_op = np.empty(int(starts[-1]), np.int64)
  inc_op[starts[:-1][has_def]] = c.def_op[has_def]
  # Each use at its buffer's first incidence after the definition, then one further per use.
  first_use = starts[:-1] + has_def
  within = np.arange(len(c.uses)) - np.repeat(ends - c.use_counts, c.use_counts)
  inc_op[np.repeat(first_use, c.use_counts) + within] = c.uses
  inc_bytes = c.sizes[inc_buf].astype(np.float64)
  return _weighted_arrays(
    w, c.sizes, c.def_op, last_use, is_prefetched, is_output, inc_buf, inc_op, inc_bytes, starts
  )


def _weighted_arrays(
  w: Workload,
  sizes: np.ndarray,
  def_op: np.ndarray,
  last_use: np.ndarray,
  is_prefetched: np.ndarray,
  is_output: np.ndarray,
  inc_buf: np.ndarray,
  inc_op: np.ndarray,
  inc_bytes: np.ndarray,
  starts: np.ndarray,
) -> WorkloadArrays:
  """The arrays both builders share: live ranges from definitions and last uses (-1: none), and
  each op's flops and each incidence's bytes times its op's weight."""
  live_start = np.where(is_prefetched, 0, def_op)
  live_end = np.maximum(last_use, def_op) + 1
  live_end = np.where(is_prefetched & (last_use < 0), 0, live_end)
  live_end = np.where(is_output, w.num_ops, live_end)
  weight = np.array([o.weight for o in w.ops], np.float64)
  return WorkloadArrays(
    flops=np.array([o.flops for o in w.ops], np.float64) * weight,
    sizes=sizes,
    def_op=def_op,
    live_start=live_start,
    live_end=live_end,
    is_prefetched=is_prefetched,
    is_output=is_output,
    incidence_buffer=inc_buf,
    incidence_op=inc_op,
    incidence_bytes=inc_bytes * weight[inc_op],
    buffer_incidence_start=starts,
  )


# ----------------------------------------------------------------------------- for file readers


def int_out_of_range(value: int, field: str, limit: int = MAX_FILE_INT) -> str | None:
  """The one-line complaint about `field` when |value| exceeds `limit`, else None (the caller's
  own checks then judge the sign and the meaning)."""
  if abs(int(value)) <= limit:
    return None
  return (
    f"'{field}' = {show_int(value)} is beyond the limit of {show_power_of_two(limit)} in magnitude"
  )


def _is_number(x: Any) -> bool:
  return isinstance(x, (int, float, np.integer, np.floating)) and not isinstance(x, bool)


def finite_number(x: Any) -> float | None:
  """`x` as a float when it is a finite number, else None: an integer too large for a float
  (a JSON integer of 400 digits) is not one, rather than an OverflowError."""
  if not _is_number(x):
    return None
  try:
    value = float(x)
  except OverflowError:
    return None
  return value if np.isfinite(value) else None


@contextlib.contextmanager
def collection_paused() -> Iterator[None]:
  """Python's cyclic garbage collection paused while a workload's objects are built: every one
  of them is kept, so the collections that their number sets off would scan them again and again
  for nothing (a third of the time to read a 200k-row CSV)."""
  enabled = gc.isenabled()
  gc.disable()
  try:
    yield
  finally:
    if enabled:
      gc.enable()
