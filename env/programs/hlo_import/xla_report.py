"""XLA's own memory report beside a dump, read and compared with the imported workload.

With `--xla_dump_to=DIR --xla_dump_hlo_as_text`, XLA writes, beside each optimised module
`M.txt`, `M-buffer-assignment.txt` and `M-memory-usage-report.txt`
(xla/service/buffer_assignment.cc, `BufferAssignment::ToString` and
`MemoryUsageReport`). The buffer assignment lists every allocation with the values it holds
(name, size, offset), the total bytes allocated, and XLA's `HloLiveRange` of the module
(xla/hlo/utils/hlo_live_range.cc, `HloLiveRange::ToString`): the flattened instruction sequence,
each value's live range `[start, end]` in that sequence (inclusive), and the values live at the
moment XLA calls the peak.

From that, XLA's peak is taken here as the most memory its live values occupy at one step of the
flattened sequence, each (allocation, offset) counted once: a value written in place into an
operand's buffer (a dynamic-update-slice, a loop's state) shares the operand's memory, and
XLA's inclusive ranges make the two touch at one step. (XLA's own "peak" moment is found with
the size of each value's defining instruction's whole shape, which for a tuple-shaped
instruction is its index table, so it can miss a loop's state; its time and list are reported
as XLA printed them.) The import is then measured by XLA's live-range rules, entry parameters
live for the whole program (`CalculateBufferStartEndMap`: read-only entry parameters live across
the whole computation), and the two peaks and the largest values live at XLA's peak are set side
by side, with the reasons they differ.
"""

from __future__ import annotations

import dataclasses
import os
import re
from typing import Iterator

import numpy as np

from malloczero.common.errors import MalloczeroError
from malloczero.common.inputs import check_input_file
from malloczero.common.units import human_bytes
from malloczero.env.workload import Workload

BUFFER_ASSIGNMENT_SUFFIX = "-buffer-assignment.txt"
MEMORY_REPORT_SUFFIX = "-memory-usage-report.txt"
MAX_REPORT_BYTES = 4 << 30  # A buffer assignment of a 100,000-instruction program is ~100 MB.
LARGEST_VALUES = 8  # Values listed side by side at XLA's peak.

# Older XLA (TensorFlow 2.8's) prints the allocation's address before its size.
_ALLOCATION = re.compile(r"^allocation (\d+): (?:0x[0-9a-f]+, )?size (\d+), (.*)$")
_VALUE = re.compile(r"^ value: <\d+ (\S+?)(?: \(phi\))?(?: @\d+)?> \(size=(\d+),offset=(\d+)\)")
_TOTAL = re.compile(r"^Total bytes used: (\d+)")
_LIVE_RANGE_HEADER = re.compile(r"^HloLiveRange \(max (\d+)\):")
_SEQUENCE = re.compile(r"^    (\d+):(\S+)$")
_RANGE = re.compile(r"^    (\S+\{[0-9,]*\}):(\d+)-(\d+)$")
_PEAK = re.compile(r"^  Live ranges at (\d+) \(peak\):")
_PEAK_VALUE = re.compile(r"^    (\S+): (\d+) bytes(?: \(cumulative: \d+ bytes\))?$")


@dataclasses.dataclass(frozen=True)
class XlaValue:
  """One value of XLA's live range: `[start, end]` (inclusive) in the flattened sequence, its
  size and where it is allocated (allocation index, offset; None when not listed)."""

  name: str  # instruction{shape index}, as XLA prints it.
  start: int
  end: int
  size: int
  slot: tuple[int, int] | None


@dataclasses.dataclass(frozen=True)
class XlaReport:
  """What XLA's buffer assignment says of a module's memory."""

  path: str
  total_bytes: int | None  # "Total bytes used": every allocation, fragmentation included.
  allocated: dict[str, int]  # Bytes by allocation kind: parameter, output, constant, temporary.
  sequence: tuple[str, ...]  # The flattened instruction sequence (HloLiveRange).
  values: tuple[XlaValue, ...]
  reported_peak_step: int | None  # The moment XLA printed as its peak, and its bytes there.
  reported_peak_bytes: int | None

  def occupied(self) -> np.ndarray:
    """[steps] bytes XLA's live values occupy at each step of the flattened sequence, each
    (allocation, offset) counted once (the largest value live there)."""
    steps = max(len(self.sequence), max((v.end + 1 for v in self.values), default=0))
    delta = np.zeros(steps + 1, np.int64)
    by_slot: dict[object, list[XlaValue]] = {}
    for v in self.values:
      by_slot.setdefault(v.slot if v.slot is not None else ("value", v.name), []).append(v)
    for values in by_slot.values():
      for start, end, size in _slot_occupancy(values):
        delta[start] += size
        delta[end] -= size
    return np.cumsum(delta)[:-1]


def _slot_occupancy(values: list[XlaValue]) -> Iterator[tuple[int, int, int]]:
  """Half-open segments [start, end) and the bytes one slot holds over each: the largest value
  live in it."""
  if len(values) == 1:
    v = values[0]
    yield v.start, v.end + 1, v.size
    return
  points = sorted({v.start for v in values} | {v.end + 1 for v in values})
  for a, b in zip(points, points[1:]):
    size = max((v.size for v in values if v.start <= a and v.end + 1 >= b), default=0)
    if size:
      yield a, b, size


def report_beside(hlo_path: str) -> str | None:
  """The buffer-assignment file XLA wrote beside an `*after_optimizations.txt` dump, if any."""
  stem = hlo_path[: -len(".txt")] if hlo_path.endswith(".txt") else hlo_path
  candidate = stem + BUFFER_ASSIGNMENT_SUFFIX
  return candidate if os.path.isfile(candidate) else None


def read_xla_report(path: str) -> XlaReport:
  """Reads XLA's buffer-assignment file; given its `-memory-usage-report.txt`, reads the
  buffer assignment beside it (or, without one, only the total). One-line errors."""
  if path.endswith(MEMORY_REPORT_SUFFIX):
    sibling = path[: -len(MEMORY_REPORT_SUFFIX)] + BUFFER_ASSIGNMENT_SUFFIX
    if os.path.isfile(sibling):
      path = sibling
  check_input_file(path, MalloczeroError)
  try:
    size = os.path.getsize(path)
    if size > MAX_REPORT_BYTES:
      raise MalloczeroError(
        f"{path}: {human_bytes(size)} is larger than an XLA report can be "
        f"({human_bytes(MAX_REPORT_BYTES)})"
      )
    with open(path, encoding="utf-8", errors="replace") as f:
      return _parse(f, path)
  except OSError as e:
    raise MalloczeroError(f"{path}: cannot read XLA's report: {e.strerror or e}") from None


def _parse(lines: Iterator[str], path: str) -> XlaReport:
  allocated: dict[str, int] = {}
  slots: dict[str, tuple[int, int]] = {}
  sizes: dict[str, int] = {}
  sequence: list[str] = []
  ranges: list[tuple[str, int, int]] = []
  peak: list[tuple[str, int]] = []
  total = peak_step = allocation = None
  section = "allocations"
  for raw in lines:
    line = raw.rstrip("\n")
    if section == "allocations":
      m = _ALLOCATION.match(line)
      if m:
        allocation = int(m.group(1))
        kind = _allocation_kind(m.group(3))
        allocated[kind] = allocated.get(kind, 0) + int(m.group(2))
        continue
      m = _VALUE.match(line)
      if m and allocation is not None:
        name = _value_name(m.group(1))
        slots[name] = (allocation, int(m.group(3)))
        sizes[name] = int(m.group(2))
        continue
    m = _TOTAL.match(line)
    if m:
      total, section = int(m.group(1)), "values"
      continue
    if _LIVE_RANGE_HEADER.match(line):
      if section.startswith("live"):
        break  # One module's live range is enough; a second is another thread's.
      section = "live"
      continue
    if section == "live":
      if line.strip() == "BufferLiveRange:":
        section = "live-ranges"
      m = _SEQUENCE.match(line)
      if m:
        sequence.append(m.group(2))
      continue
    if section == "live-ranges":
      m = _RANGE.match(line)
      if m:
        ranges.append((m.group(1), int(m.group(2)), int(m.group(3))))
        continue
      m = _PEAK.match(line)
      if m:
        peak_step, section = int(m.group(1)), "live-peak"
      continue
    if section == "live-peak":
      m = _PEAK_VALUE.match(line)
      if not m:
        break
      peak.append((m.group(1), int(m.group(2))))
  if total is None and not allocated:
    raise MalloczeroError(
      f"{path}: not an XLA buffer assignment or memory usage report (no allocations, no "
      "'Total bytes used'); pass the dump's *-buffer-assignment.txt"
    )
  values = tuple(
    XlaValue(name, start, end, sizes.get(name, 0), slots.get(name)) for name, start, end in ranges
  )
  return XlaReport(
    path,
    total,
    allocated,
    tuple(sequence),
    values,
    peak_step,
    sum(size for _, size in peak) if peak else None,
  )


def _value_name(name: str) -> str:
  return name if "{" in name else name + "{}"


_PLURAL = {
  "parameter": "parameters",
  "output": "outputs",
  "constant": "constants",
  "temporary": "temporaries",
}


def _allocation_kind(header: str) -> str:
  if "parameter" in header:
    return "parameter"
  if "output" in header or "maybe-live-out" in header:
    return "output"
  if "constant" in header:
    return "constant"
  return "temporary"


@dataclasses.dataclass(frozen=True)
class Comparison:
  """The import against XLA's report: both peaks, their ratio, and the lines that say where and
  why they differ."""

  xla_peak_bytes: int | None  # Occupied by XLA's live values at its peak step.
  import_peak_bytes: int  # The workload's own peak (parameters freed after their last use).
  import_peak_xla_rules: int  # The same with entry parameters live to the end, as XLA keeps them.
  lines: tuple[str, ...]

  @property
  def ratio(self) -> float | None:
    """import (XLA's rules) / XLA, or None when the report has no live ranges."""
    if not self.xla_peak_bytes:
      return None
    return self.import_peak_xla_rules / self.xla_peak_bytes


def live_bytes(workload: Workload, parameters_to_end: bool = False) -> np.ndarray:
  """[T] bytes live at each op; with `parameters_to_end`, parameters and inputs live to the
  last op, as XLA keeps read-only entry parameters."""
  a = workload.arrays
  end = np.where(a.is_prefetched, workload.num_ops, a.live_end) if parameters_to_end else a.live_end
  delta = np.zeros(workload.num_ops + 1, np.int64)
  np.add.at(delta, a.live_start, a.sizes)
  np.add.at(delta, end, -a.sizes)
  return np.cumsum(delta)[:-1]


def in_place_pairs(workload: Workload, report: XlaReport) -> list[tuple[int, int, int]]:
  """(operand buffer, result buffer, op) of the import where XLA writes the result into the
  operand's memory as the operand dies, and the import holds both at that op.

  In XLA's report such values follow each other in one allocation slot, the second starting at
  the step where the first ends. A value the import has no buffer of its own for (a loop's
  parameter or result, an element the import merged into a loop's state) belongs to the buffer
  of the value before it in the slot."""
  buffers = {b.name: i for i, b in enumerate(workload.buffers)}
  a = workload.arrays
  by_slot: dict[tuple[int, int], list[XlaValue]] = {}
  for v in report.values:
    if v.slot is not None:
      by_slot.setdefault(v.slot, []).append(v)
  pairs = []
  for values in by_slot.values():
    values.sort(key=lambda v: (v.start, v.end))
    owner = None
    for before, v in zip([None] + values, values):
      if before is not None and before.end != v.start:
        owner = None  # Memory reused after a gap: a different buffer.
      mine = buffers.get(v.name[:-2] if v.name.endswith("{}") else v.name)
      if mine is None or mine == owner:
        continue
      t = int(a.def_op[mine])
      if owner is not None and t >= 0 and not a.is_prefetched[owner] and a.live_end[owner] == t + 1:
        pairs.append((owner, mine, t))
      owner = mine
  return pairs


def compare_with_xla(workload: Workload, report: XlaReport) -> Comparison:
  """Sets the workload's peak beside XLA's and lists the largest values live at XLA's peak."""
  ours = live_bytes(workload)
  pairs = in_place_pairs(workload, report)
  ours_xla = live_bytes(workload, parameters_to_end=True)
  for operand, _, t in pairs:
    ours_xla[t] -= workload.buffers[operand].size
  peak_op = int(ours.argmax())
  lines = [f"XLA's report: {report.path}"]
  if report.allocated:
    kinds = ", ".join(
      f"{_PLURAL[kind]} {human_bytes(n)}"
      for kind, n in sorted(report.allocated.items(), key=lambda kv: -kv[1])
    )
    total = report.total_bytes if report.total_bytes is not None else sum(report.allocated.values())
    lines.append(f"  XLA allocated {human_bytes(total)} ({kinds}), fragmentation included")
  lines.append(
    f"  the import: peak live {human_bytes(int(ours.max()))} at op {peak_op} "
    f"('{workload.ops[peak_op].name}') of {workload.num_ops}; "
    f"{human_bytes(int(ours_xla.max()))} by XLA's rules (entry parameters live to the end, "
    f"{_count(len(pairs), 'result')} written into a dying operand's memory)"
  )
  if not report.values:
    lines.append(
      "  the report has no HloLiveRange section, so live values cannot be compared (only XLA's "
      "allocations); XLA prints it in the *-buffer-assignment.txt of its dump"
    )
    return Comparison(None, int(ours.max()), int(ours_xla.max()), tuple(lines))
  occupied = report.occupied()
  step = int(occupied.argmax())
  xla_peak = int(occupied[step])
  at = _step_name(report, step)
  ratio = ours_xla.max() / xla_peak if xla_peak else float("nan")
  lines.append(
    f"  XLA's live values occupy at most {human_bytes(xla_peak)}, at step {step} ({at}) of "
    f"its flattened sequence of {len(report.sequence)} instructions; the import by XLA's rules is "
    f"{ratio:.3f}x that ({(ratio - 1) * 100:+.1f}%)"
  )
  if report.reported_peak_step is not None and report.reported_peak_step != step:
    lines.append(
      f"  (XLA printed step {report.reported_peak_step} "
      f"({_step_name(report, report.reported_peak_step)}) as its peak, "
      f"{human_bytes(report.reported_peak_bytes or 0)}: it sizes a value by its instruction's "
      "whole shape, which for a loop's state is the tuple's index table)"
    )
  lines += _largest_at(workload, report, step, ours_xla)
  lines += _differences(workload, report, step, pairs)
  return Comparison(xla_peak, int(ours.max()), int(ours_xla.max()), tuple(lines))


def _step_name(report: XlaReport, step: int) -> str:
  return f"'{report.sequence[step]}'" if 0 <= step < len(report.sequence) else "end"


def _op_at_step(workload: Workload, report: XlaReport, step: int) -> int | None:
  """The import's op at XLA's step: the op named as the step's instruction, else the next
  instruction of the sequence that is an op."""
  ops = {}
  for t, op in enumerate(workload.ops):
    ops.setdefault(op.name, t)
  for name in report.sequence[step:]:
    if name in ops:
      return ops[name]
  return None


def _largest_at(
  workload: Workload, report: XlaReport, step: int, ours_xla: np.ndarray
) -> list[str]:
  """The values XLA holds at `step`, largest first, each with what the import holds for it."""
  live = [v for v in report.values if v.start <= step <= v.end and v.size]
  live.sort(key=lambda v: -v.size)
  t = _op_at_step(workload, report, step)
  buffers = {b.name: i for i, b in enumerate(workload.buffers)}
  same_slot: dict[tuple[int, int], list[XlaValue]] = {}
  for v in report.values:
    if v.slot is not None:
      same_slot.setdefault(v.slot, []).append(v)
  a = workload.arrays
  where = f"op {t} ('{workload.ops[t].name}')" if t is not None else "the end"
  lines = [
    f"  largest values live at XLA's peak, and the import at {where}: "
    + (f"{human_bytes(int(ours_xla[t]))} by XLA's rules" if t is not None else "")
  ]

  def buffer_of(name: str) -> int | None:
    return buffers.get(name[:-2] if name.endswith("{}") else name, buffers.get(name))

  def live_at_t(b: int) -> bool:
    return t is not None and bool(a.is_prefetched[b] or a.live_start[b] <= t < a.live_end[b])

  for v in live[:LARGEST_VALUES]:
    # The import names a buffer after the value that defines it; a value XLA writes in place
    # (a loop's state, an update) shares its allocation slot with the import's buffer, which
    # is then the slot's value live in the import at the same op.
    found = [(v.name, buffer_of(v.name))] if buffer_of(v.name) is not None else []
    if not found or not live_at_t(found[0][1]):
      others = [(u.name, buffer_of(u.name)) for u in same_slot.get(v.slot, []) if u is not v]
      others = [(n, b) for n, b in others if b is not None and live_at_t(b)]
      found = others[:1] or found
    if not found:
      mine = "no buffer in the import"
    else:
      n, b = found[0]
      alias = "" if n == v.name else f" as '{workload.buffers[b].name}' (the same memory in XLA)"
      state = "live" if live_at_t(b) else "not live"
      mine = f"{state}{alias}, ops {a.live_start[b]}-{a.live_end[b] - 1}"
    lines.append(f"    {v.name:<40} {human_bytes(v.size):>10}  XLA steps {v.start}-{v.end}; {mine}")
  return lines


def _differences(
  workload: Workload, report: XlaReport, step: int, pairs: list[tuple[int, int, int]]
) -> list[str]:
  """The known reasons the two differ, with the bytes each accounts for at XLA's peak."""
  live = [v for v in report.values if v.start <= step <= v.end]
  params = {b.name for b in workload.buffers if b.kind in ("parameter", "input")}
  names = {b.name for b in workload.buffers}
  param_bytes = sum(v.size for v in live if v.name[:-2] in params and v.name.endswith("{}"))
  small = sum(v.size for v in live if v.size <= 64 and v.name[:-2] not in names)
  lines = ["  where the two differ:"]
  lines.append(
    f"    - entry parameters: XLA keeps read-only ones allocated for the whole program "
    f"({human_bytes(param_bytes)} live at its peak); the import frees each after its last use, "
    "so its own peak is lower where parameters die early (the comparison above uses XLA's rule)"
  )
  lines.append(
    f"    - tuple index tables and constants of at most 64 B are not buffers in the import "
    f"({human_bytes(small)} of values of at most 64 B at XLA's peak)"
  )
  if pairs:
    operand, result, _ = max(pairs, key=lambda p: workload.buffers[p[0]].size)
    example = f", e.g. '{workload.buffers[result].name}' into '{workload.buffers[operand].name}'"
  else:
    example = ""
  lines.append(
    f"    - in-place results: XLA's buffer assignment writes {_count(len(pairs), 'result')} "
    f"into a dying operand's memory{example}; the import keeps "
    "the two apart, as XLA's memory-space assignment sees them (its own peak counts both; the "
    "comparison above counts them once); a loop's state and a conditional's result are one "
    "buffer in both"
  )
  return lines


def _count(n: int, noun: str) -> str:
  return f"{n} {noun}{'' if n == 1 else 's'}"
