"""The independent validator every mapping passes before it leaves the system.

It uses only the workload, the hardware and the mapping file: none of the game's requests,
candidates or incremental bookkeeping. Checks, each failing with one line:

* every allocation names a known buffer that may live in fast memory (program outputs may not),
  a fast level, an aligned offset, and fits under the level's capacity;
* every allocation lies within its buffer's live range;
* how it is filled: without a prefetch it is produced in place, so it starts at its buffer's
  defining op (only activations have one); a prefetch is issued at the allocation's start and
  due at an op inside it (`start <= done < end`); uses in `[start, done)` read default memory,
  which holds the value then (see below);
* an eviction copies a value produced in fast memory (a prefetched value is still in default
  memory), issued after the producing op and done by the allocation's end
  (`def < start <= done <= end`);
* the value is in default memory wherever it is read from there or prefetched: always for
  parameters and inputs; for an activation produced in default memory from the op after its
  definition; for one produced in fast memory only from its eviction's done op on. So an
  activation produced in fast memory and read later from default memory, or prefetched again,
  needs an eviction that is done by then;
* allocations of one buffer do not overlap in time;
* no two allocations in one level overlap in time x address;
* the reported slow-only and estimated times equal a fresh cost-model evaluation, which
  simulates the copies (env/simulator.py) on its own.
"""

from __future__ import annotations

import bisect
import dataclasses
import sys
from typing import Callable

import numpy as np

from malloczero.common.errors import MappingError
from malloczero.common.lazy import lazy_module
from malloczero.env.cost_model import NO_COPY, Allocations, CostModel
from malloczero.env.hardware import Hardware
from malloczero.env.mapping import Mapping
from malloczero.env.workload import Workload

RELATIVE_TIME_TOLERANCE = 1e-6
# Rectangles of one level from which the overlap sweep runs jitted (validator_kernels.py) when
# numba is loaded already (a solve in this process), and from which it runs jitted anyway: the
# Python sweep costs about 3.6 us a rectangle, loading numba and a first kernel 0.6 s.
JIT_SWEEP_MIN = 20_000
JIT_SWEEP_COLD_MIN = 200_000

_kernels = lazy_module("malloczero.env.validator_kernels")


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
    raise MappingError(
      f"mapping was made for hardware '{mapping.hardware.name}' "
      f"({_describe(mapping.hardware)}), not '{hardware.name}' ({_describe(hardware)})"
    )
  alloc = mapping.to_arrays(workload)
  prefetch_start = mapping.prefetch_starts(workload)
  wa = workload.arrays
  size = np.asarray(hardware.align(wa.sizes[alloc.buffer]), np.int64)
  # The checks below, one allocation at a time, run only where a test over all of them at once
  # finds something to say: in order, so the first allocation reported is the same.
  for i in np.flatnonzero(_suspects(workload, hardware, alloc, prefetch_start, size)).tolist():
    b, level = alloc.buffer[i], alloc.level[i]
    buf = workload.buffers[b]
    what = f"allocation {i} (buffer {buf.id} '{buf.name}')"
    if buf.kind == "output":
      raise MappingError(f"{what}: program outputs must stay in default memory")
    if not 0 <= level < hardware.num_fast_levels:
      raise MappingError(
        f"{what}: level {level} is not a fast level of '{hardware.name}' "
        f"(fast levels are 0..{hardware.num_fast_levels - 1})"
      )
    lv = hardware.levels[level]
    if alloc.offset[i] < 0 or alloc.offset[i] % hardware.alignment_bytes:
      raise MappingError(
        f"{what}: offset {alloc.offset[i]} is not a non-negative multiple of the "
        f"alignment {hardware.alignment_bytes}"
      )
    if alloc.offset[i] + size[i] > lv.capacity_bytes:
      raise MappingError(
        f"{what}: bytes [{alloc.offset[i]}, {alloc.offset[i] + size[i]}) exceed "
        f"the capacity {lv.capacity_bytes} of level '{lv.name}'"
      )
    s, e, lo, hi = alloc.start[i], alloc.end[i], wa.live_start[b], wa.live_end[b]
    if not lo <= s < e <= hi:
      raise MappingError(
        f"{what}: ops [{_time(workload, s)}, {_time(workload, e)}) are not a "
        f"non-empty part of its live range [{_time(workload, lo)}, "
        f"{_time(workload, hi)})"
      )
    _check_copies(
      what, buf.kind, int(wa.def_op[b]), alloc, prefetch_start, i, lambda op: _time(workload, op)
    )
  _check_disjoint_per_buffer(workload, alloc)
  model = CostModel(workload, hardware)
  _check_default_copy(workload, model, alloc)
  for level in range(hardware.num_fast_levels):
    _check_no_overlap(workload, hardware, alloc, size, level)
  fresh = model.evaluate(alloc).total_time_s
  for key, reported, expected in (
    ("slow_only_time_s", mapping.slow_only_time_s, model.slow_only_time),
    ("estimated_time_s", mapping.estimated_time_s, fresh),
  ):
    if not np.isclose(reported, expected, rtol=RELATIVE_TIME_TOLERANCE, atol=0.0):
      raise MappingError(
        f"reported {key} = {reported!r} but a fresh cost-model evaluation gives {expected!r}"
      )
  return ValidationReport(len(alloc), fresh, model.slow_only_time)


def _suspects(
  workload: Workload,
  hardware: Hardware,
  alloc: Allocations,
  prefetch_start: np.ndarray,
  size: np.ndarray,
) -> np.ndarray:
  """[n] bool: True for every allocation that fails one of `validate_mapping`'s checks of
  allocations taken one at a time (the buffer's kind, the level, the offset and capacity, the
  live range, `_check_copies`), so that only these need checking one by one."""
  wa = workload.arrays
  kinds = np.array([b.kind for b in workload.buffers])[alloc.buffer]
  level, offset, s, e = alloc.level, alloc.offset, alloc.start, alloc.end
  done, ev_start, ev_done = alloc.prefetch_done, alloc.evict_start, alloc.evict_done
  def_op = wa.def_op[alloc.buffer]
  capacity = np.array([lv.capacity_bytes for lv in hardware.levels[:-1]] + [0], np.int64)
  fast = (level >= 0) & (level < hardware.num_fast_levels)
  activation = kinds == "activation"
  produced = done == NO_COPY
  in_live_range = (wa.live_start[alloc.buffer] <= s) & (s < e) & (e <= wa.live_end[alloc.buffer])
  bad_prefetch = (prefetch_start != s) | (done < s) | (done >= e) | (activation & (s <= def_op))
  evicted = (ev_start != NO_COPY) | (ev_done != NO_COPY)
  good_eviction = (def_op < ev_start) & (ev_start <= ev_done) & (ev_done <= e)
  return (
    (kinds == "output")
    | ~fast
    | (offset < 0)
    | (offset % hardware.alignment_bytes != 0)
    | (offset + size > capacity[np.where(fast, level, -1)])
    | ~in_live_range
    | (produced & (~activation | (s != def_op)))
    | (~produced & bad_prefetch)
    | (evicted & (~produced | ~good_eviction))
  )


def _check_copies(
  what: str,
  kind: str,
  def_op: int,
  alloc: Allocations,
  prefetch_start: np.ndarray,
  i: int,
  at: Callable[[int], int],
) -> None:
  """How allocation `i` is filled and emptied (see the module docstring); `at` writes an op
  boundary on the workload's time axis, as the mapping file does."""
  s, e = int(alloc.start[i]), int(alloc.end[i])
  done, ev_start, ev_done = (
    int(alloc.prefetch_done[i]),
    int(alloc.evict_start[i]),
    int(alloc.evict_done[i]),
  )
  if done == NO_COPY:
    if kind != "activation":
      raise MappingError(
        f"{what}: a {kind} starts in default memory, so a fast allocation of it "
        "must be filled by a prefetch"
      )
    if s != def_op:
      raise MappingError(
        f"{what}: without a prefetch it is produced in place, so it must start "
        f"at its defining op {at(def_op)}, not {at(s)}"
      )
  else:
    if prefetch_start[i] != s:
      raise MappingError(
        f"{what}: its prefetch starts at op {at(prefetch_start[i])}, not at the "
        f"allocation's start {at(s)} (the chunk is reserved from the copy's "
        "issue)"
      )
    if not s <= done < e:
      raise MappingError(
        f"{what}: its prefetch is due at op {at(done)}, outside the allocation's "
        f"ops [{at(s)}, {at(e)})"
      )
    if kind == "activation" and s <= def_op:
      raise MappingError(
        f"{what}: a prefetch at op {at(s)} of an activation defined at op "
        f"{at(def_op)} copies a value not yet produced"
      )
  if ev_start != NO_COPY or ev_done != NO_COPY:
    if done != NO_COPY:
      raise MappingError(
        f"{what}: a prefetched value is still in default memory; only a value "
        "produced in fast memory can be evicted"
      )
    if not def_op < ev_start <= ev_done <= e:
      raise MappingError(
        f"{what}: its eviction [{at(ev_start)}, {at(ev_done)}] must start after "
        f"the producing op {at(def_op)} and be done by the allocation's end "
        f"{at(e)}"
      )


def _check_default_copy(workload: Workload, model: CostModel, alloc: Allocations) -> None:
  """Wherever a value produced in fast memory is read from default memory or prefetched again,
  an eviction must have put it there by then."""
  produced = np.flatnonzero(alloc.prefetch_done == NO_COPY)  # Only activations, checked above.
  if produced.size == 0:
    return
  # From this op on default memory holds the buffer: its eviction's done op, or never.
  never = np.iinfo(np.int64).max
  ready = np.full(workload.num_buffers, -1, np.int64)
  ready[alloc.buffer[produced]] = np.where(
    alloc.evict_done[produced] == NO_COPY, never, alloc.evict_done[produced]
  )
  for i in np.flatnonzero(alloc.prefetch_done != NO_COPY):
    b = alloc.buffer[i]
    if alloc.start[i] < ready[b]:
      buf = workload.buffers[b]
      when = (
        "it is never evicted"
        if ready[b] == never
        else f"its eviction is done only at op {_time(workload, ready[b])}"
      )
      raise MappingError(
        f"allocation {i} (buffer {buf.id} '{buf.name}') prefetches at op "
        f"{_time(workload, alloc.start[i])} a value produced in fast memory, "
        f"but {when}"
      )
  a = workload.arrays
  default_read = (model.serving(alloc) < 0) & (a.incidence_op < ready[a.incidence_buffer])
  if default_read.any():
    e = np.flatnonzero(default_read)[0]
    b, t = a.incidence_buffer[e], a.incidence_op[e]
    buf = workload.buffers[b]
    when = (
      "it is never evicted"
      if ready[b] == never
      else f"its eviction is done only at op {_time(workload, ready[b])}"
    )
    raise MappingError(
      f"buffer {buf.id} '{buf.name}' is read from default memory at op "
      f"{_time(workload, t)} after it was produced in fast memory, but {when}"
    )


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
    raise MappingError(
      f"buffer {buf.id} '{buf.name}' has two allocations overlapping in time: "
      f"ops [{_time(workload, s[i])}, {_time(workload, e[i])}) and "
      f"[{_time(workload, s[i + 1])}, {_time(workload, e[i + 1])})"
    )


def _any_rectangle_overlap(
  start: np.ndarray, end: np.ndarray, lo: np.ndarray, hi: np.ndarray
) -> bool:
  """Whether two of the rectangles `[start, end) x [lo, hi)` may overlap, by a sweep over time
  that keeps the address ranges live at the current op sorted: O(n log n) where the pairwise
  test is O(n^2), the validator's cost on 10^5 allocations (jitted for many rectangles,
  validator_kernels.py: the same answer). A degenerate rectangle (empty in time or in address)
  answers True, leaving it to the pairwise test's strict inequalities."""
  if np.any(start >= end) or np.any(lo >= hi):
    return True
  n = len(start)
  # Ends before starts at the same op: half-open intervals that touch do not overlap.
  times = np.concatenate([end, start])
  is_start = np.repeat([False, True], n)
  which = np.tile(np.arange(n), 2)
  order = np.lexsort((is_start, times))
  if n >= JIT_SWEEP_COLD_MIN or (n >= JIT_SWEEP_MIN and "numba" in sys.modules):
    bounds = np.unique(np.concatenate([lo, hi]))
    low, high = np.searchsorted(bounds, lo), np.searchsorted(bounds, hi)
    return bool(_kernels().any_overlap(which[order], is_start[order], low, high, bounds))
  live_lo: list[int] = []  # Disjoint while nothing overlaps, so sorted by both ends.
  live_hi: list[int] = []
  lo_list, hi_list = lo.tolist(), hi.tolist()
  for opening, i in zip(is_start[order].tolist(), which[order].tolist()):
    a, b = lo_list[i], hi_list[i]
    k = bisect.bisect_left(live_lo, a)
    if not opening:
      del live_lo[k], live_hi[k]
      continue
    if (k > 0 and live_hi[k - 1] > a) or (k < len(live_lo) and live_lo[k] < b):
      return True
    live_lo.insert(k, a)
    live_hi.insert(k, b)
  return False


def _check_no_overlap(
  workload: Workload, hardware: Hardware, alloc, size: np.ndarray, level: int, block: int = 512
) -> None:
  """Time x address overlap test: a sweep says whether any pair overlaps; only then the
  pairwise test, in blocks so memory stays bounded, names the first pair (as it always has)."""
  idx = np.flatnonzero(alloc.level == level)
  if not _any_rectangle_overlap(
    alloc.start[idx], alloc.end[idx], alloc.offset[idx], alloc.offset[idx] + size[idx]
  ):
    return
  s, e = alloc.start[idx], alloc.end[idx]
  lo = alloc.offset[idx]
  hi = lo + size[idx]
  for first in range(0, len(idx), block):
    rows = slice(first, first + block)
    clash = (
      (s[rows, None] < e[None, :])
      & (s[None, :] < e[rows, None])
      & (lo[rows, None] < hi[None, :])
      & (lo[None, :] < hi[rows, None])
    )
    clash[np.arange(clash.shape[0]), np.arange(first, first + clash.shape[0])] = False
    if clash.any():
      i, j = np.argwhere(clash)[0]
      i, j = idx[first + i], idx[j]
      bi, bj = workload.buffers[alloc.buffer[i]], workload.buffers[alloc.buffer[j]]
      raise MappingError(
        f"allocations {i} (buffer {bi.id} '{bi.name}') and {j} (buffer {bj.id} '{bj.name}') "
        f"overlap in level '{hardware.levels[level].name}': "
        f"ops [{_time(workload, alloc.start[i])}, {_time(workload, alloc.end[i])}) "
        f"x bytes [{alloc.offset[i]}, {alloc.offset[i] + size[i]}) "
        f"and ops [{_time(workload, alloc.start[j])}, {_time(workload, alloc.end[j])}) x bytes "
        f"[{alloc.offset[j]}, "
        f"{alloc.offset[j] + size[j]})"
      )
