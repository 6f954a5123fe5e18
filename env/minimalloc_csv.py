"""MiniMalloc's CSV format, read as a workload and written from one.

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
by the interval's length (an op's `weight`, env/workload.py). A buffer's definition and last use
are then ops of one step each, so the compressed workload costs exactly what the same reading
with one op per time step costs; the challenge instances (times up to 2**20, about 150-450
buffers) become a few hundred ops instead of a million.

Other workloads are not compressed: a program from XLA defines a new result at every op, so no
two consecutive ops touch the same buffers, and merging ops would also coarsen the points where
a parameter's prefetch window may start, which changes the game's requests.
"""

from __future__ import annotations

import csv
import io
import re
from typing import Sequence

import numpy as np

from malloczero.common import strict_json
from malloczero.common.strict_json import show_value
from malloczero.env.memory_guard import check_fits_in_memory
from malloczero.env.workload import (
  MAX_FILE_INT,
  Buffer,
  Op,
  Workload,
  collection_paused,
  fail,
  int_out_of_range,
)

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
