"""The steps of XLA's `AllocateSegment`, and the state they check and commit: the alternate
memory's chunk heaps, the copy resources and the outstanding-copy limits.

Reimplements, from reading openxla/xla `xla/service/memory_space_assignment/algorithm.cc`:
`AllocateInAlternateMemoryNoCopy` (`plan_keep`), `Evict` (`plan_eviction`), `Prefetch` /
`PrefetchWithResourceConstraints` / `CheckPrefetchFit` (`plan_all_prefetches`) and
`UncommitPendingChunks` (`uncommit`), with `MsaAlgorithm`'s constructor (the copy budgets) and
its members (`SegmentAllocator`). Each `plan_*` checks without committing anything; its
`apply_*` commits the plan. The loop that calls them in XLA's order, and the rules they share
(time conventions, three memory levels), are algorithm.py's.
"""

from __future__ import annotations

from typing import NamedTuple

import numpy as np

from malloczero.common.lazy import lazy_module
from malloczero.env.cost_model import NO_COPY
from malloczero.env.hardware import Hardware
from malloczero.env.msa.chunks import ChunkHeap
from malloczero.env.msa.copy_resource import (
  AsyncCopy,
  AsynchronousCopyOrdering,
  AsynchronousCopyResource,
  OutstandingCopyLimit,
)
from malloczero.env.msa.cost_analysis import CostAnalysis, CostAnalysisOptions
from malloczero.env.msa.decision import MsaOption, prefetch_option
from malloczero.env.msa.interval_picker import (
  CostAnalysisPrefetchIntervalPicker,
  InstructionCountPrefetchIntervalPicker,
)
from malloczero.env.msa.overrides import read_preferred_prefetch_times
from malloczero.env.msa.settings import MsaOptions
from malloczero.env.workload import Workload

# Without a cost analysis (the instruction-count picker), XLA budgets each op 1 and charges each
# copy 0.1 (`Evict`: `options_.cost_analysis ? GetAsyncCopyElapsed(...) : 0.1`).
_COUNT_PICKER_OP_BUDGET = 1.0
_COUNT_PICKER_COPY_RESOURCE = 0.1
# The per-start mask `plan_prefetch_starts` ignores when FIFO order and the outstanding limit
# are off (never written; left writeable so that the kernel has one signature).
_NO_MASK = np.zeros(0, bool)

_chunk_kernels = lazy_module("malloczero.env.msa.kernels.live_lists")
_prefetch_kernels = lazy_module("malloczero.env.msa.kernels.prefetch")


class PrefetchRequest(NamedTuple):
  """One prefetch's loop as `prefetch.plan_prefetch_starts` reads it: the use it serves, the
  buffer's bytes and use times, the level's capacity, how many starts to return, the copy's
  demand on the resource and whether to check it, and the per-start mask of the checks made
  here (read only when `check_allowed`)."""

  use: int
  size: int
  uses: np.ndarray
  max_size: int
  max_starts: int
  resource: float
  check_resource: bool
  check_allowed: bool
  allowed: np.ndarray


class Segment:
  """One fast allocation under construction (mutable while its buffer is being allocated):
  op range `[start, end)` reported, chunk held over `[start, reserved_end)`."""

  __slots__ = (
    "level",
    "offset",
    "start",
    "end",
    "reserved_end",
    "prefetch_done",
    "evict_start",
    "evict_done",
  )

  def __init__(
    self,
    level: int,
    offset: int,
    start: int,
    end: int,
    reserved_end: int,
    prefetch_done: int = NO_COPY,
  ):
    self.level, self.offset, self.start, self.end = level, offset, start, end
    self.reserved_end, self.prefetch_done = reserved_end, prefetch_done
    self.evict_start = self.evict_done = NO_COPY


class Pending:
  """Everything one buffer has committed so far, to take back on `kFailRequiresUncommit`."""

  def __init__(self):
    self.chunks: list[tuple[int, int]] = []  # (level, heap handle)
    self.prefetches: list[tuple[AsyncCopy, int, int]] = []  # (copy, inclusive start, end)
    self.evictions: list[tuple[AsyncCopy, int, int]] = []
    self.kept = self.default_uses = 0


class SegmentAllocator:
  """What `AllocateSegment` checks against and commits to, per fast level (one cost analysis,
  interval picker and chunk heap each) and shared by all levels (the copy resources and
  outstanding-copy limits: the hardware has one copy engine), with its steps."""

  def __init__(self, workload: Workload, hardware: Hardware, options: MsaOptions):
    self.workload, self.hardware, self.options = workload, hardware, options
    self.num_fast = hardware.num_fast_levels
    self.analyses = [
      CostAnalysis(
        workload,
        hardware,
        CostAnalysisOptions(
          alternate_level=level, while_execution_count=options.while_execution_count
        ),
      )
      for level in range(self.num_fast)
    ]
    self.capacity = [int(hardware.levels[level].capacity_bytes) for level in range(self.num_fast)]
    self.pickers, budgets = self._pickers_and_budgets()
    self.heaps = [ChunkHeap(hardware.alignment_bytes) for _ in range(self.num_fast)]
    self.prefetch_resource = AsynchronousCopyResource(budgets)
    self.eviction_resource = AsynchronousCopyResource(budgets)
    self.prefetch_limit = OutstandingCopyLimit(options.max_outstanding_prefetches)
    self.eviction_limit = OutstandingCopyLimit(options.max_outstanding_evictions)
    self.ordering = AsynchronousCopyOrdering()
    self.preferred_times = (
      read_preferred_prefetch_times(options.preferred_prefetch_overrides, workload)
      if options.preferred_prefetch_overrides
      else None
    )
    # The (buffer, use) pairs whose prefetch an override set the preferred start of: XLA
    # charges such a copy nothing in the copy resources (`CheckPrefetchFit`).
    self._preferred_uses: set[tuple[int, int]] = set()
    self._next_copy_id = 0
    # Per buffer and per incidence, as Python floats: several plans a step read them, and numpy
    # scalars cost more to read and add one at a time.
    self._copy_elapsed = self.analyses[0].async_copy_elapsed(workload.arrays.sizes).tolist()
    self._reductions = [analysis.use_elapsed_reduction.tolist() for analysis in self.analyses]

  def _pickers_and_budgets(self) -> tuple[list, np.ndarray]:
    """One prefetch interval picker per fast level, and what each op lends the copy resources
    (`MsaAlgorithm`'s constructor; `MsaOptions.copy_budget`)."""
    options = self.options
    if options.picker == "cost":
      pickers = [
        CostAnalysisPrefetchIntervalPicker.from_cost_analysis(
          ca, self.capacity[level], options.interval_options
        )
        for level, ca in enumerate(self.analyses)
      ]
      ca = self.analyses[0]
      budgets = (
        ca.elapsed
        if options.copy_budget == "elapsed"
        else np.maximum(ca.elapsed - ca.memory_elapsed, 0.0)
      )
      return pickers, budgets
    pickers = [
      InstructionCountPrefetchIntervalPicker(
        options.instruction_count_min, options.instruction_count_max
      )
    ] * self.num_fast
    return pickers, np.full(self.workload.num_ops, _COUNT_PICKER_OP_BUDGET)

  # ------------------------------------------------------------------ AllocateSegment's steps
  # Each `plan_*` checks without committing anything; its `apply_*` commits the plan.

  def plan_keep(
    self,
    prev: Segment | None,
    size: int,
    segment_start: int,
    use: int,
    uses: np.ndarray,
    incidence: int | None,
    def_incidence: int | None = None,
  ) -> MsaOption | None:
    """`AllocateInAlternateMemoryNoCopy`. With a previous fast allocation: its level and offset
    only, extended to the use. Without (an activation's first segment): produced in place at
    the best chunk of the fastest level that has one. None when it fails."""
    if prev is not None:
      level = prev.level
      if not self.pickers[level].can_allocate_in_alternate_memory_no_copy(segment_start, use):
        return None  # Live range too long.
      reserved_end = prev.reserved_end
      if use + 1 > prev.reserved_end:
        if prev.offset + size > self.capacity[level] or not self.heaps[level].fits_at(
          prev.reserved_end, use + 1, size, prev.offset
        ):
          return None
        reserved_end = use + 1
      return MsaOption(
        "keep",
        level,
        segment_start,
        reserved_end,
        prev.offset,
        size,
        self.saving(level, incidence),
        plan=(reserved_end,),
      )
    for level in range(self.num_fast):
      picker = self.pickers[level]
      if not picker.can_allocate_in_alternate_memory_no_copy(segment_start, use):
        continue
      # `find_best_chunk_candidate`, jitted (as the prefetch loop's).
      found, offset, end_use = _chunk_kernels().best_chunk_candidate_indexed(
        *self.heaps[level].search_state(),
        picker.kernel_state(),
        segment_start,
        use,
        size,
        uses,
        self.capacity[level],
        picker.nest_state(),
      )
      if not found:
        continue
      reserved_end = end_use + 1
      saving = self.saving(level, incidence, def_incidence if incidence != def_incidence else None)
      return MsaOption(
        "keep", level, segment_start, reserved_end, offset, size, saving, plan=(reserved_end,)
      )
    return None

  def apply_keep(
    self, prev: Segment | None, option: MsaOption, use: int, pending: Pending
  ) -> Segment:
    """Commits a keep: the previous allocation extended to the use, or a new one produced in
    place; the segment."""
    (reserved_end,) = option.plan
    level = option.level
    if prev is not None:
      if reserved_end > prev.reserved_end:
        pending.chunks.append(
          (level, self.heaps[level].add(prev.reserved_end, reserved_end, prev.offset, option.size))
        )
        prev.reserved_end = reserved_end
      prev.end = max(prev.end, use + 1)
      return prev
    pending.chunks.append(
      (level, self.heaps[level].add(option.start, reserved_end, option.offset, option.size))
    )
    return Segment(level, option.offset, option.start, use + 1, reserved_end)

  def plan_eviction(self, prev: Segment, b: int, size: int, use: int) -> int | None:
    """`Evict`'s checks: the op from which default memory will hold the value (the eviction
    copy's end), or None (refused: the buffer must be uncommitted)."""
    level = prev.level
    picker = self.pickers[level]
    copy_elapsed = self.copy_elapsed(b)
    exclusive_start = prev.start  # The producing op.
    last_kept = prev.end - 1  # XLA's inclusive end of the previous allocation.
    preferred_end = max(
      picker.preferred_eviction_end_time(copy_elapsed, exclusive_start, use), last_kept
    )
    preferred_end = min(preferred_end, use)  # Done by the use (XLA's latest_prefetch_time).
    # Keep the chunk until the eviction is done, shortening while the offset is taken.
    end = preferred_end
    heap = self.heaps[level]
    while end > last_kept:
      if end <= prev.reserved_end or heap.fits_at(prev.reserved_end, end, size, prev.offset):
        break
      end -= 1
    if end <= exclusive_start:
      return None  # The eviction interval is too short.
    if self.eviction_limit.violates(exclusive_start + 1, end):
      return None
    return end

  def apply_eviction(self, prev: Segment, b: int, size: int, end: int, pending: Pending) -> int:
    """Commits the eviction `plan_eviction` accepted; returns its end."""
    level, exclusive_start = prev.level, prev.start
    if end > prev.reserved_end:
      pending.chunks.append(
        (level, self.heaps[level].add(prev.reserved_end, end, prev.offset, size))
      )
      prev.reserved_end = end
    prev.end = max(prev.end, end)
    prev.evict_start, prev.evict_done = exclusive_start + 1, end
    resource = self.copy_resource(b)
    if not self.eviction_resource.has_enough_resource(exclusive_start, end, resource):
      resource = 0.0  # XLA's last retry (the only one with max_retries 1) charges nothing.
    copy = self._new_copy(exclusive_start, end, resource)
    self.eviction_resource.add_copy(copy)
    self.eviction_limit.add(exclusive_start + 1, end)
    pending.evictions.append((copy, exclusive_start + 1, end))
    return end

  def plan_all_prefetches(
    self,
    prev: Segment | None,
    segments: list[Segment],
    b: int,
    size: int,
    available: int,
    eviction_end: int | None,
    use: int,
    incidence: int,
    uses: np.ndarray,
    max_starts: int,
    msa_only: bool,
  ) -> list[MsaOption]:
    """The prefetch options of one segment, fastest level first: from default memory, as
    soon as it holds the value (`available`; XLA: the default allocation's earliest available
    time, not the previous use), but not while an earlier fast segment of the buffer is still
    held (a buffer's segments may not overlap here). After an eviction (`eviction_end`), as if
    it were committed: it holds its chunk until the copy is done. With `msa_only`, no slower
    level once a faster one has a start."""
    earliest = available
    if segments:
      last_end = segments[-1].end if eviction_end is None else max(segments[-1].end, eviction_end)
      earliest = max(earliest, last_end - 1)
    held = None
    if eviction_end is not None and eviction_end > prev.reserved_end:
      held = self.heaps[prev.level].add(prev.reserved_end, eviction_end, prev.offset, size)
    prefetches: list[MsaOption] = []
    for level in range(self.num_fast):
      if msa_only and prefetches:
        break
      prefetches += self._plan_level_prefetches(
        level, b, size, earliest, use, incidence, uses, max_starts, eviction_end is not None
      )
    if held is not None:
      self.heaps[prev.level].remove(held)
    return prefetches

  def _plan_level_prefetches(
    self,
    level: int,
    b: int,
    size: int,
    earliest: int,
    use: int,
    incidence: int,
    uses: np.ndarray,
    max_starts: int,
    evicts: bool,
  ) -> list[MsaOption]:
    """`PrefetchWithResourceConstraints` into `level`: the first `max_starts` starts the picker
    offers that pass `CheckPrefetchFit`, in the picker's order (msa takes the first)."""
    picker = self.pickers[level]
    copy_elapsed = self.copy_elapsed(b)
    resource = self.copy_resource(b)
    reduction = self._reductions[level][incidence]
    window = picker.start_window(copy_elapsed, earliest, use, reduction)
    preferred = self.preferred_times.time(b, use, earliest) if self.preferred_times else None
    if preferred is not None:
      self._preferred_uses.add((b, use))
      resource = 0.0
      first, last, _, explored = window
      if preferred <= last:  # Else the picker's own preferred start (`Begin`).
        window = (first, last, max(preferred, first), explored)
    # FIFO order and the outstanding limit depend on the start only: checked here for every
    # start, the loop skips those not allowed (both off by default, as in XLA).
    fifo = self.options.enforce_prefetch_fifo_order
    check_resource = bool(self.options.use_copy_resource)
    # A resource whose checks rebuild the queue (`exact`) is checked here too, per start.
    exact = check_resource and resource != 0 and self.prefetch_resource.exact
    check_allowed = fifo or self.prefetch_limit.max_outstanding >= 0 or exact
    allowed = _NO_MASK
    if check_allowed:
      starts = picker.start_time_array(copy_elapsed, earliest, use, reduction)
      allowed = np.ones(len(starts), bool)
      for i, start in enumerate(starts.tolist()):
        allowed[i] = not (
          (fifo and self.ordering.violates_ordering(start, use))
          or self.prefetch_limit.violates(start + 1, use)
          or (exact and not self.prefetch_resource.has_enough_resource(start, use, resource))
        )
      check_resource = check_resource and not exact
    # The loop over starts (resource, chunk, XLA's out-of-memory cache) runs jitted: with every
    # option planned it was most of the decision process's time as Python calls.
    request = (
      use,
      size,
      uses,
      self.capacity[level],
      max_starts,
      float(resource),
      check_resource,
      check_allowed,
      allowed,
    )  # A `PrefetchRequest`'s fields.
    rows = _prefetch_kernels().plan_prefetch_starts(
      window,
      request,
      self.prefetch_resource.kernel_state(),
      *self.heaps[level].search_state(),
      picker.kernel_state(),
      picker.nest_state(),
    )
    return [
      prefetch_option(
        level, start + 1, end_use + 1, offset, size, reduction, evicts, (start, end_use + 1)
      )
      for start, offset, end_use in rows.tolist()
    ]

  def apply_prefetch(
    self, option: MsaOption, b: int, size: int, use: int, pending: Pending
  ) -> Segment:
    """Commits a prefetch `plan_all_prefetches` offered: its chunk, its copy; the segment."""
    level, (start, reserved_end) = option.level, option.plan
    resource = 0.0 if (b, use) in self._preferred_uses else self.copy_resource(b)
    pending.chunks.append(
      (level, self.heaps[level].add(start + 1, reserved_end, option.offset, size))
    )
    copy = self._new_copy(start, use, resource)
    if self.options.use_copy_resource:
      self.prefetch_resource.add_copy(copy)
    self.prefetch_limit.add(start + 1, use)
    if self.options.enforce_prefetch_fifo_order:
      self.ordering.add_copy(start, use)
    pending.prefetches.append((copy, start + 1, use))
    return Segment(level, option.offset, start + 1, use + 1, reserved_end, prefetch_done=use)

  def uncommit(self, pending: Pending) -> None:
    """`UncommitPendingChunks`: takes back one buffer's chunks and copies."""
    for level, handle in pending.chunks:
      self.heaps[level].remove(handle)
    for copy, inclusive_start, end in pending.prefetches:
      if self.options.use_copy_resource:
        self.prefetch_resource.remove_copy(copy)
      self.prefetch_limit.remove(inclusive_start, end)
      if self.options.enforce_prefetch_fifo_order:
        self.ordering.remove_copy(copy.start, copy.end)
    for copy, inclusive_start, end in pending.evictions:
      self.eviction_resource.remove_copy(copy)
      self.eviction_limit.remove(inclusive_start, end)

  # ------------------------------------------------------------------ helpers

  def copy_arrays(self) -> np.ndarray:
    """`[2, N]` per buffer `copy_elapsed` and `copy_resource` (msa's jitted run reads them)."""
    elapsed = np.asarray(self._copy_elapsed, np.float64)
    if self.options.picker == "cost":
      return np.stack([elapsed, elapsed])
    return np.stack([elapsed, np.full(len(elapsed), _COUNT_PICKER_COPY_RESOURCE)])

  def copy_elapsed(self, b: int) -> float:
    """`GetAsyncCopyElapsed` of the buffer (the picker's copy time)."""
    return self._copy_elapsed[b]

  def copy_resource(self, b: int) -> float:
    """What a copy of the buffer charges the copy resource."""
    if self.options.picker == "cost":
      return self.copy_elapsed(b)
    return _COUNT_PICKER_COPY_RESOURCE

  def _new_copy(self, exclusive_start: int, end: int, resource: float) -> AsyncCopy:
    self._next_copy_id += 1
    return AsyncCopy(exclusive_start, end, resource, self._next_copy_id)

  def saving(self, level: int, incidence: int | None, def_incidence: int | None = None) -> float:
    """msa's estimate of the seconds fast memory at `level` saves at these incidences (the
    use's and, for a value produced in place, its definition's)."""
    reductions = self._reductions[level]
    saved = 0.0 if incidence is None else reductions[incidence]
    return saved if def_incidence is None else saved + reductions[def_incidence]
