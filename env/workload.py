"""Workloads: a compiled program as a schedule of ops and the buffers they read and write.

This module owns the model: ops in schedule order, each with its flops, and buffers, each with a
size in bytes, a defining op (`PROGRAM_START` for parameters and inputs), the ops that use it
(sorted, each op once) and a kind (`KINDS`); the checks every workload passes however it was
built, and the arrays the cost model and the game read; and MiniMalloc's CSV format, read as a
workload and written from one (below). The JSON format, and `load_workload` / `save_workload` for
every format, are env/workload_json.py. What every reader of env's files shares is here too: the
bound on the integers they hold (`MAX_FILE_INT`) with its one-line complaint, finite numbers, and
garbage collection paused while their objects are built.

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

A MiniMalloc CSV (`id,lower,upper,size`, or MiniMalloc's own header `buffer,start,end,size`)
states only each buffer's live range `[lower, upper)` and size; MiniMalloc itself asks only for a
packing (every buffer placed, no two overlapping in time x address). Where its instances come
from, XLA's memory-space assignment, a live range runs from the instruction that defines a buffer
to its last use, and a CSV row is read the same way: the buffer is written in time step `lower`,
read in step `upper - 1` (a buffer of one step is only written), each access moving `size` bytes,
and live but untouched between the two. So a CSV buffer has at most two incidences, and the
workload's size is linear in its rows whatever the lengths of their ranges. Placing a buffer in
fast memory saves the time of those accesses, 2 x size x (1/bw_slow - 1/bw_fast) (once for a
one-step buffer); a full packing is still the best mapping there is (on the `minimalloc` machine,
1000x). Earlier versions read a buffer as touched at every step of its range (saving bytes x
time); that made the incidences grow as buffers x ops (3.4 x 10^8 for 200k rows) and invented
accesses the format does not state.

Its time axis is compressed: one zero-flop op per elementary interval between consecutive
distinct points among 0 and every row's `lower`, `lower + 1`, `upper - 1` and `upper`, weighted
by the interval's length. A buffer's definition and last use are then ops of one step each, so
the compressed workload costs exactly what the same reading with one op per time step costs;
the challenge instances (times up to 2**20, about 150-450 buffers) become a few hundred ops
instead of a million.

Other workloads are not compressed: a program from XLA defines a new result at every op, so no
two consecutive ops touch the same buffers, and merging ops would also coarsen the points where
a parameter's prefetch window may start, which changes the game's requests.
"""

from __future__ import annotations

import contextlib
import csv
import dataclasses
import functools
import gc
import io
import itertools
import re
from typing import Any, Iterator, NoReturn, Sequence

import numpy as np

from malloczero.common import strict_json
from malloczero.common.errors import WorkloadError
from malloczero.common.strict_json import show_value
from malloczero.common.units import show_int, show_power_of_two
from malloczero.env.memory_guard import check_fits_in_memory

PROGRAM_START = -1
KINDS = ("activation", "parameter", "input", "output")
PREFETCHED_KINDS = ("parameter", "input")  # Exist before the program: copied in per use window.
# Integers read from files are bounded so that the int64 arrays built from them, and the sums and
# offsets computed in those arrays, cannot overflow: 2**60 bytes is 1 EiB.
MAX_FILE_INT = 1 << 60
MAX_TOTAL_BYTES = 1 << 62


@dataclasses.dataclass(frozen=True)
class Op:
  """One step of the schedule, or `weight` identical consecutive steps merged into one op (a
  compressed MiniMalloc time interval): `flops` and the bytes it moves are per step."""

  name: str
  flops: float
  weight: int = 1


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
  name: str
  source: str
  ops: tuple[Op, ...]
  buffers: tuple[Buffer, ...]

  def __post_init__(self):
    _check_workload(self)

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


# ----------------------------------------------------------------------------- checks, arrays


def fail(where: str, message: str) -> NoReturn:
  """Raises the one-line WorkloadError `where: message`."""
  error = WorkloadError(f"{where}: {message}")
  error.detail = message  # Lets a file loader name the file instead of the workload.
  raise error


def is_int(x: Any) -> bool:
  """Whether `x` is an integer (Python's or numpy's), not a bool."""
  return type(x) is int or (isinstance(x, (int, np.integer)) and not isinstance(x, bool))


def _check_workload(w: Workload) -> None:
  """Semantic checks shared by every way of building a workload."""
  where = w.name or "workload"
  if not w.ops:
    fail(where, "empty schedule: the workload has no ops")
  if not w.buffers:
    fail(where, "the workload has no buffers")
  num_ops = len(w.ops)
  for t, op in enumerate(w.ops):
    if not is_int(op.weight) or not 1 <= op.weight <= MAX_FILE_INT:
      fail(
        where,
        f"op {t} ('{op.name}'): 'weight' must be an integer from 1 to 2**60, got {op.weight!r}",
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
      fail(where, f"{label}: unknown kind '{b.kind}' (expected one of {', '.join(KINDS)})")
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


def _build_arrays(w: Workload) -> WorkloadArrays:
  num_ops, bufs = w.num_ops, w.buffers
  sizes = np.array([b.size for b in bufs], np.int64)
  def_op = np.array([b.def_op for b in bufs], np.int64)
  last_use = np.array([b.uses[-1] if b.uses else -1 for b in bufs], np.int64)
  is_prefetched = np.array([b.kind in PREFETCHED_KINDS for b in bufs])
  is_output = np.array([b.kind == "output" for b in bufs])
  live_start = np.where(is_prefetched, 0, def_op)
  live_end = np.maximum(last_use, def_op) + 1
  live_end = np.where(is_prefetched & (last_use < 0), 0, live_end)
  live_end = np.where(is_output, num_ops, live_end)
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


# ----------------------------------------------------------------------------- MiniMalloc CSV


# MiniMalloc's own files name the columns buffer,start,end,size; both spellings are read.
CSV_COLUMNS = {
  "id": ("id", "buffer"),
  "lower": ("lower", "start"),
  "upper": ("upper", "end"),
  "size": ("size",),
}
_CSV_INT = re.compile(r"[-+]?[0-9]+")
# Longer integers are refused by their length before Python converts them (its own limit, 4300
# digits, fails in a message about Python's settings); shorter ones by `int_out_of_range`.
MAX_DIGITS = 100


def _csv_text(cells: Sequence[str]) -> str:
  """CSV cells as a message shows them: escaped (a quoted cell may hold a line break) and short."""
  return show_value(",".join(cells)).strip("'\"")


_CSV_COLUMN = re.compile(r"(?:[-+]?[0-9]{1,18}\n)*")


def _csv_columns(
  rows: Sequence[Sequence[str]], col: dict[str, int]
) -> dict[str, np.ndarray] | None:
  """The four columns as int64 arrays when every row is well formed, checked column by column
  (a 200k-row CSV in a fraction of a second); None when some row is not, and then
  `_csv_columns_line_by_line` finds the first bad line and says what is wrong with it."""
  table = {}
  for key in CSV_COLUMNS:
    c = col[key]
    cells = [row[c].strip() if c < len(row) else "" for row in rows]
    if not _CSV_COLUMN.fullmatch("\n".join(cells) + "\n" if cells else ""):
      return None
    try:  # 18 digits at most (the pattern): within int64, but a cell may hold a line break.
      table[key] = np.fromiter(map(int, cells), np.int64, count=len(cells))
    except ValueError:
      return None
  values = np.stack(list(table.values())) if rows else np.zeros((4, 0), np.int64)
  lower, upper = table["lower"], table["upper"]
  if (np.abs(values) > MAX_FILE_INT).any() or (lower < 0).any() or (upper <= lower).any():
    return None
  return table


def _csv_columns_line_by_line(
  rows: Sequence[Sequence[str]], col: dict[str, int], name: str
) -> dict[str, np.ndarray]:
  """`_csv_columns` one line at a time, failing at the first bad line with its reason."""
  records = []
  for line, row in enumerate(rows, start=2):
    cells = [row[col[k]].strip() if col[k] < len(row) else "" for k in CSV_COLUMNS]
    if not all(_CSV_INT.fullmatch(c) for c in cells):
      fail(
        name, f"CSV line {line}: expected integers for id,lower,upper,size, got {_csv_text(row)}"
      )
    for key, cell in zip(CSV_COLUMNS, cells):
      if len(cell) > MAX_DIGITS:
        fail(
          name,
          f"CSV line {line}: '{key}' is an integer of {len(cell.lstrip('+-'))} digits, "
          "too long: no value needs more than 19 digits",
        )
    rec = {k: int(c) for k, c in zip(CSV_COLUMNS, cells)}
    for key in CSV_COLUMNS:
      if problem := int_out_of_range(rec[key], key):
        fail(name, f"CSV line {line}: {problem}")
    if rec["lower"] < 0 or rec["upper"] <= rec["lower"]:
      fail(
        name,
        f"CSV line {line}: buffer {rec['id']} needs 0 <= lower < upper, "
        f"got [{rec['lower']}, {rec['upper']})",
      )
    records.append(rec)
  return {k: np.array([r[k] for r in records], np.int64) for k in CSV_COLUMNS}


def workload_from_minimalloc_csv(text: str, name: str = "minimalloc") -> Workload:
  """Parses MiniMalloc's `id,lower,upper,size` CSV (half-open `[lower, upper)`) into a workload
  of one definition (at `lower`) and one use (at `upper - 1`) per buffer, on a time axis
  compressed to the points where they happen (see the module docstring), so that its size
  follows the number of rows, not the length of time or of the live ranges."""
  with collection_paused():
    return _workload_from_minimalloc_csv(text, name)


def _workload_from_minimalloc_csv(text: str, name: str) -> Workload:
  text = text[len(strict_json.BOM) :] if text.startswith(strict_json.BOM) else text
  try:
    rows = [r for r in csv.reader(io.StringIO(text)) if r and any(c.strip() for c in r)]
  except csv.Error as e:
    fail(name, f"not a readable CSV: {e}")
  if not rows:
    fail(name, "empty CSV: expected a header 'id,lower,upper,size' and one row per buffer")
  header = [c.strip().lower() for c in rows[0]]
  col = {}
  for key, spellings in CSV_COLUMNS.items():
    found = [header.index(k) for k in spellings if k in header]
    if not found:
      fail(
        name,
        "CSV header must contain id,lower,upper,size (or MiniMalloc's "
        f"buffer,start,end,size); got {_csv_text(header)}",
      )
    col[key] = found[0]
  table = _csv_columns(rows[1:], col) or _csv_columns_line_by_line(rows[1:], col, name)
  if not len(table["id"]):
    fail(name, "CSV has a header but no buffers")
  ids, lower, upper, sizes = (table[k] for k in CSV_COLUMNS)
  # Elementary intervals between consecutive distinct points: one op each (module docstring).
  points = np.unique(np.concatenate([[0], lower, lower + 1, upper - 1, upper]))
  def_op = np.searchsorted(points, lower).tolist()
  last_op = np.searchsorted(points, upper - 1).tolist()
  # A definition and at most one use per buffer: refuse before building the Python objects.
  check_fits_in_memory(
    name, len(points) - 1, len(ids), len(ids) + int(np.count_nonzero(upper - 1 > lower))
  )
  ops = tuple(
    Op(f"t{lo}", 0.0, hi - lo) for lo, hi in zip(points[:-1].tolist(), points[1:].tolist())
  )
  buffers = tuple(
    Buffer(i, f"b{i}", size, lo, (last,) if last > lo else (), "activation")
    for i, size, lo, last in zip(ids.tolist(), sizes.tolist(), def_op, last_op)
  )
  return Workload(name, "minimalloc-csv", ops, buffers)


def workload_to_minimalloc_csv(w: Workload) -> str:
  """`id,lower,upper,size` with each buffer's live range on the workload's time axis."""
  a, axis = w.arrays, w.time_axis
  lines = ["id,lower,upper,size"]
  for b, lo, hi in zip(w.buffers, a.live_start, a.live_end):
    lines.append(f"{b.id},{axis[lo]},{axis[hi]},{b.size}")
  return "\n".join(lines) + "\n"
