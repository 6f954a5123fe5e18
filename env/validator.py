"""The independent validator every mapping passes before it leaves the system.

It uses only the workload, the hardware and the mapping file: none of the game's requests,
candidates or incremental bookkeeping. Checks, each failing with one line:

* every allocation names a known buffer that may live in fast memory (program outputs may not),
  a fast level, an aligned offset, and fits under the level's capacity;
* every allocation lies within its buffer's live range; an activation's allocation covers its
  whole live range (activations are produced in place, never copied);
* allocations of one buffer do not overlap in time;
* no two allocations in one level overlap in time x address;
* the reported slow-only and estimated times equal a fresh cost-model evaluation.
"""

from __future__ import annotations

import dataclasses

import numpy as np

from malloczero.env.cost_model import CostModel
from malloczero.env.errors import MappingError
from malloczero.env.hardware import Hardware
from malloczero.env.mapping import Mapping
from malloczero.env.workload import Workload

RELATIVE_TIME_TOLERANCE = 1e-6


@dataclasses.dataclass(frozen=True)
class ValidationReport:
  num_allocations: int
  estimated_time_s: float
  slow_only_time_s: float

  @property
  def speedup(self) -> float:
    return self.slow_only_time_s / self.estimated_time_s


def validate_mapping(workload: Workload, hardware: Hardware, mapping: Mapping) -> ValidationReport:
  """Raises MappingError with a one-line reason, or returns the freshly evaluated times."""
  if mapping.workload != workload.name:
    raise MappingError(f"mapping is for workload '{mapping.workload}', not '{workload.name}'")
  if mapping.hardware is not None and mapping.hardware != hardware:
    raise MappingError(f"mapping was made for hardware '{mapping.hardware.name}' "
                       f"({_describe(mapping.hardware)}), not '{hardware.name}' ({_describe(hardware)})")
  alloc = mapping.to_arrays(workload)
  wa = workload.arrays
  size = np.asarray(hardware.align(wa.sizes[alloc.buffer]), np.int64)
  for i in range(len(alloc)):
    b, level = alloc.buffer[i], alloc.level[i]
    buf = workload.buffers[b]
    what = f"allocation {i} (buffer {buf.id} '{buf.name}')"
    if buf.kind == "output":
      raise MappingError(f"{what}: program outputs must stay in default memory")
    if not 0 <= level < hardware.num_fast_levels:
      raise MappingError(f"{what}: level {level} is not a fast level of '{hardware.name}' "
                         f"(fast levels are 0..{hardware.num_fast_levels - 1})")
    lv = hardware.levels[level]
    if alloc.offset[i] < 0 or alloc.offset[i] % hardware.alignment_bytes:
      raise MappingError(f"{what}: offset {alloc.offset[i]} is not a non-negative multiple of the "
                         f"alignment {hardware.alignment_bytes}")
    if alloc.offset[i] + size[i] > lv.capacity_bytes:
      raise MappingError(f"{what}: bytes [{alloc.offset[i]}, {alloc.offset[i] + size[i]}) exceed "
                         f"the capacity {lv.capacity_bytes} of level '{lv.name}'")
    s, e, lo, hi = alloc.start[i], alloc.end[i], wa.live_start[b], wa.live_end[b]
    if not lo <= s < e <= hi:
      raise MappingError(f"{what}: ops [{_time(workload, s)}, {_time(workload, e)}) are not a "
                         f"non-empty part of its live range [{_time(workload, lo)}, "
                         f"{_time(workload, hi)})")
    if buf.kind == "activation" and (s, e) != (lo, hi):
      raise MappingError(f"{what}: an activation's allocation must cover its whole live range "
                         f"[{_time(workload, lo)}, {_time(workload, hi)}), got "
                         f"[{_time(workload, s)}, {_time(workload, e)})")
  _check_disjoint_per_buffer(workload, alloc)
  for level in range(hardware.num_fast_levels):
    _check_no_overlap(workload, hardware, alloc, size, level)
  model = CostModel(workload, hardware)
  fresh = model.evaluate(alloc).total_time_s
  for key, reported, expected in (("slow_only_time_s", mapping.slow_only_time_s,
                                   model.slow_only_time),
                                  ("estimated_time_s", mapping.estimated_time_s, fresh)):
    if not np.isclose(reported, expected, rtol=RELATIVE_TIME_TOLERANCE, atol=0.0):
      raise MappingError(f"reported {key} = {reported!r} but a fresh cost-model evaluation gives "
                         f"{expected!r}")
  return ValidationReport(len(alloc), fresh, model.slow_only_time)


def _time(workload: Workload, op: int) -> int:
  """An op boundary as the mapping file writes it: on the workload's time axis."""
  axis = workload.time_axis
  return int(axis[op]) if 0 <= op < len(axis) else int(op)


def _describe(hw: Hardware) -> str:
  return ", ".join(f"{lv.name} {lv.capacity_bytes} B" for lv in hw.levels[:-1])


def _check_disjoint_per_buffer(workload: Workload, alloc) -> None:
  order = np.lexsort((alloc.start, alloc.buffer))
  b, s, e = alloc.buffer[order], alloc.start[order], alloc.end[order]
  clash = np.flatnonzero((b[1:] == b[:-1]) & (s[1:] < e[:-1]))
  if clash.size:
    i = clash[0]
    buf = workload.buffers[b[i]]
    raise MappingError(f"buffer {buf.id} '{buf.name}' has two allocations overlapping in time: "
                       f"ops [{_time(workload, s[i])}, {_time(workload, e[i])}) and "
                       f"[{_time(workload, s[i + 1])}, {_time(workload, e[i + 1])})")


def _check_no_overlap(workload: Workload, hardware: Hardware, alloc, size: np.ndarray,
                      level: int, block: int = 512) -> None:
  """Pairwise time x address overlap test, in blocks so memory stays bounded."""
  idx = np.flatnonzero(alloc.level == level)
  s, e = alloc.start[idx], alloc.end[idx]
  lo = alloc.offset[idx]
  hi = lo + size[idx]
  for first in range(0, len(idx), block):
    rows = slice(first, first + block)
    clash = ((s[rows, None] < e[None, :]) & (s[None, :] < e[rows, None])
             & (lo[rows, None] < hi[None, :]) & (lo[None, :] < hi[rows, None]))
    clash[np.arange(clash.shape[0]), np.arange(first, first + clash.shape[0])] = False
    if clash.any():
      i, j = np.argwhere(clash)[0]
      i, j = idx[first + i], idx[j]
      bi, bj = workload.buffers[alloc.buffer[i]], workload.buffers[alloc.buffer[j]]
      raise MappingError(
          f"allocations {i} (buffer {bi.id} '{bi.name}') and {j} (buffer {bj.id} '{bj.name}') "
          f"overlap in level '{hardware.levels[level].name}': ops [{_time(workload, alloc.start[i])}, "
          f"{_time(workload, alloc.end[i])}) x bytes [{alloc.offset[i]}, {alloc.offset[i] + size[i]}) "
          f"and ops [{_time(workload, alloc.start[j])}, {_time(workload, alloc.end[j])}) x bytes "
          f"[{alloc.offset[j]}, "
          f"{alloc.offset[j] + size[j]})")
