"""XLA's memory-space-assignment allocation loop, assembled from the parts in this package.

Reimplements, from reading openxla/xla `xla/service/memory_space_assignment/algorithm.cc`:

* `MsaAlgorithm::Finish` / `AllocateAllocationValues`: buffers one at a time in
  `MemoryBoundednessBufferIntervalComparator` order (`buffer_order.py`); per buffer its uses in
  time order, each use one request (a *segment*) from the previous use (or the definition) to
  the use.
* `AllocateSegment`, trying in XLA's order, the first success winning:
  1. `AllocateInAlternateMemoryNoCopy`: only when the previous allocation is in fast memory (or
     there is none and the value may start there: an activation); refused when the segment is
     longer than the picker allows ("live range too long",
     `CanAllocateInAlternateMemoryNoCopy`); the previous offset is the only one tried when there
     is a previous allocation, else `FindBestChunkCandidates` (best fit, end extended to later
     uses while it fits: `chunks.find_best_chunk_candidate`).
  2. `Evict`: when the previous allocation is in fast memory and default memory has no copy
     yet. The eviction copy runs from just after the producing op to
     max(`PreferredEvictionEndTime`, the allocation's end), capped at the use; the fast chunk is
     kept until then where its offset stays free (the end shortened one op at a time otherwise).
     An eviction refused by the outstanding-eviction limit fails the whole buffer
     (`kFailRequiresUncommit`): its chunks and copies are taken back and it stays in default
     memory. XLA's eviction resource check is kept, with XLA's last-retry rule (with one retry,
     XLA's default, a copy the eviction resource cannot fit is charged 0), so it never refuses.
  3. `Prefetch` / `PrefetchWithResourceConstraints` / `CheckPrefetchFit`: the picker's start
     times in its order (preferred first, then alternately later and earlier); for each, the
     FIFO ordering (option), the outstanding-prefetch limit, the prefetch copy resource
     (option), then the chunk; the first start that passes wins. A chunk failure caches the
     start (`exclusive_out_of_mem_start`) and any earlier start ends the search.
  4. Otherwise the use reads default memory; the other segments keep what they got.

The loop is a decision process (issue 14 item 2): `MsaAlgorithm.steps()` yields one
`MsaDecision` per `AllocateSegment` call with the options msa weighs there (option 0: default
memory, or the eviction, or the uncommit it forces; keep; prefetch at the picker's first K
fitting starts per fast level) and msa's own choice, and applies the option it is sent;
`MsaDecisions` is its state-object form. The `msa` solver sends msa's choice every time
(`run`), planning only the options up to it, as XLA stops at its first success. Why: the game
must offer the heuristic's own decisions, so that its answer is always reachable and every
deviation is the agent's (docs/msa.md).

Why: this is the heuristic the project's agent must beat, so it must make XLA's decisions on
this project's workloads: XLA's acceptance of partly exposed prefetches (min ratio 0.8 with the
use's saving credited), its preferred start, its evictions, its chunk rules.

Output: `Allocations` segments in the cost model's terms (env/cost_model.py): an activation
kept in fast memory is produced in place at its defining op; a prefetch for a use at op `u`
whose copy XLA starts after op `t` is an allocation over `[t + 1, ...)` with `prefetch_done =
u` (the copy-done sits just before the use, XLA's `latest_prefetch_time`); an eviction started
after producing op `d` and done before op `e` is `evict_start = d + 1`, `evict_done = e`.

A prefetch may start as soon as default memory holds the value (XLA's
`earliest_available_time`), also before earlier uses that read default memory, but not while an
earlier fast segment of the same buffer is held: XLA may hold two copies of a value in
alternate memory at once, the project's segments of a buffer may not overlap in time.

Time conventions. XLA's logical times are op indices here, a parameter's definition -1 (the
program start). XLA holds a chunk over inclusive times; the chunk heap here holds exactly the
op range `[start, end)` of the allocation the mapping reports, so the mapping and the heap
agree by construction (one op shorter than XLA's reservation at an eviction's end and at a
prefetch's start, where XLA keeps the chunk over the copy-start's own op). Kept segments reuse
the chunk reserved by `FindBestChunkCandidates`' extension; beyond it the previous offset is
checked only over the new ops (XLA checks from the previous allocation's end).

A value nothing reads gets one segment, its definition alone, kept in fast memory without a
copy when a chunk is free: producing it there still saves the write.

Copy budgets: XLA budgets each op its default-memory elapsed time for copies; the cost model,
like XLA's own `RuntimeSimulator`, advances copies only in default-memory idle time, so a copy
msa hides behind a memory-bound op can stall the program (`MsaOptions.copy_budget`, docs/msa.md).

Three memory levels (docs/msa.md's extension; XLA has one alternate memory): one cost analysis,
interval picker and chunk heap per fast level, the buffer order from the fastest level's
memory-boundedness. A kept segment stays in its previous allocation's level; a first segment
and a prefetch try the fastest level first, then the next. The prefetch copy resource and the
outstanding-copy limits are shared by all levels (the hardware has one copy engine).

Not modelled, and why:
* sliced prefetch (`max_slices` >= 2) and window prefetch: off by default in XLA;
* cross-program prefetch: it keeps one parameter across program runs; this project evaluates a
  single run;
* while-loop nesting (the picker's nest levels, while uses' extra outstanding prefetches): this
  project's schedules are flat;
* repacking (`max_repacks` 0 by default) and retries (`max_retries` 1: a single attempt);
* colocations, aliasing and required assignments (a buffer here is one value; program outputs
  stay in default memory whole, as the validator requires, where XLA could keep their early
  segments in fast memory and evict);
* inefficient-allocation retries (`inefficient_use_to_copy_ratio`, 0 by default: off) and
  window prefetch;
* parameter instructions as schedule slots: XLA's parameters occupy times 0, 1, ... before the
  first op, here they exist at the program start (-1), so instruction counts from a parameter
  are shorter by the number of parameters (only the instruction-count picker counts them);
* XLA's peak-memory shortcut (`FindEarliestExclusiveTimeToSatisfyPeakMemory`) and
  `EnsureSomeSpatialPrefetchFitExists`: compile-time optimisations that skip starts the chunk
  search would refuse anyway.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable, Generator
from typing import Any

import numpy as np

from malloczero.env.cost_model import NO_COPY, Allocations, CostModel
from malloczero.env.hardware import Hardware
from malloczero.env.mapping import Mapping
from malloczero.env.msa._jit import kernels
from malloczero.env.msa.buffer_order import buffer_order
from malloczero.env.msa.chunks import ChunkHeap
from malloczero.env.msa.copy_resource import (
    AsyncCopy, AsynchronousCopyOrdering, AsynchronousCopyResource, OutstandingCopyLimit)
from malloczero.env.msa.cost_analysis import CostAnalysis, CostAnalysisOptions
from malloczero.env.msa.interval_picker import (
    CostAnalysisPrefetchIntervalPicker, InstructionCountPrefetchIntervalPicker,
    PrefetchIntervalOptions)
from malloczero.env.workload import PROGRAM_START, Workload

PICKERS = ("cost", "instruction_count")
COPY_BUDGETS = ("elapsed", "idle")
# Without a cost analysis (the instruction-count picker), XLA budgets each op 1 and charges each
# copy 0.1 (`Evict`: `options_.cost_analysis ? GetAsyncCopyElapsed(...) : 0.1`).
_COUNT_PICKER_OP_BUDGET = 1.0
_COUNT_PICKER_COPY_RESOURCE = 0.1


@dataclasses.dataclass(frozen=True)
class MsaOptions:
  """msa's options; defaults are XLA's test values (`memory_space_assignment_test_base.h`) where
  XLA's tests set them, else XLA's `Options` defaults.

  min_overlap_to_async_copy_ratio: 0.8. A prefetch start is accepted while the ops between it
    and the use, plus the use's own saving, cover this x the copy time.
  preferred_overlap_to_async_copy_ratio: 1.5. The first start tried covers this x the copy time.
  max_overlap_to_mem_size_async_copy_ratio: 10. The earliest start, and the longest segment
    kept without a copy, cover at most this x the time to copy the whole fast memory.
  max_outstanding_prefetches / max_outstanding_evictions: XLA's `Options` default -1 (no limit).
  use_copy_resource: check each prefetch against `AsynchronousCopyResource` (XLA always does;
    False lets copies overlap freely, for comparison).
  enforce_prefetch_fifo_order: XLA's option (default false): no prefetch nested in another.
  picker: "cost" (`CostAnalysisPrefetchIntervalPicker`, what XLA runs with a cost analysis) or
    "instruction_count" (`InstructionCountPrefetchIntervalPicker`, most of XLA's unit tests).
  instruction_count_min / instruction_count_max: that picker's bounds (XLA's tests: 2 and 10).
  copy_budget: what each op lends the copy resources. "elapsed" (XLA: `MsaAlgorithm`'s
    constructor budgets each op its default-memory elapsed time) or "idle" (not XLA: the op's
    default-memory idle time with everything in default memory, max(0, compute - memory), the
    time in which the cost model's copy engine, like XLA's `RuntimeSimulator`, advances). With
    "elapsed", msa believes a copy hides behind a memory-bound op that the simulator gives no
    room to, and the copy stalls the program (docs/msa.md's open question). Only with the cost
    picker (the instruction-count picker budgets 1 per op, as XLA without a cost analysis).
  """
  min_overlap_to_async_copy_ratio: float = 0.8
  preferred_overlap_to_async_copy_ratio: float = 1.5
  max_overlap_to_mem_size_async_copy_ratio: float = 10.0
  max_outstanding_prefetches: int = -1
  max_outstanding_evictions: int = -1
  use_copy_resource: bool = True
  enforce_prefetch_fifo_order: bool = False
  picker: str = "cost"
  instruction_count_min: int = 2
  instruction_count_max: int = 10
  copy_budget: str = "elapsed"

  def __post_init__(self):
    for name in ("min_overlap_to_async_copy_ratio", "preferred_overlap_to_async_copy_ratio",
                 "max_overlap_to_mem_size_async_copy_ratio"):
      value = getattr(self, name)
      if not math.isfinite(value) or value <= 0:
        raise ValueError(f"{name} must be a positive number, got {value}")
    for name in ("max_outstanding_prefetches", "max_outstanding_evictions"):
      if getattr(self, name) < -1:
        raise ValueError(f"{name} must be -1 (no limit) or a count >= 0, got {getattr(self, name)}")
    if not 0 <= self.instruction_count_min <= self.instruction_count_max:
      raise ValueError(f"the instruction-count picker needs 0 <= instruction_count_min <= "
                       f"instruction_count_max, got {self.instruction_count_min} and "
                       f"{self.instruction_count_max}")
    if self.picker not in PICKERS:
      raise ValueError(f"unknown picker '{self.picker}' (choose from {', '.join(PICKERS)})")
    if self.copy_budget not in COPY_BUDGETS:
      raise ValueError(f"unknown copy budget '{self.copy_budget}' (choose from "
                       f"{', '.join(COPY_BUDGETS)})")

  @property
  def interval_options(self) -> PrefetchIntervalOptions:
    return PrefetchIntervalOptions(self.min_overlap_to_async_copy_ratio,
                                   self.preferred_overlap_to_async_copy_ratio,
                                   self.max_overlap_to_mem_size_async_copy_ratio)


@dataclasses.dataclass(frozen=True)
class MsaStats:
  """What the loop did: segments kept without a copy, prefetches, evictions, uses left in
  default memory, buffers sent back whole (a failed eviction)."""
  kept: int
  prefetches: int
  evictions: int
  default_uses: int
  uncommitted_buffers: int

  def to_dict(self) -> dict[str, int]:
    return dataclasses.asdict(self)


class _Segment:
  """One fast allocation under construction (mutable while its buffer is being allocated):
  op range `[start, end)` reported, chunk held over `[start, reserved_end)`."""
  __slots__ = ("level", "offset", "start", "end", "reserved_end", "prefetch_done",
               "evict_start", "evict_done")

  def __init__(self, level: int, offset: int, start: int, end: int, reserved_end: int,
               prefetch_done: int = NO_COPY):
    self.level, self.offset, self.start, self.end = level, offset, start, end
    self.reserved_end, self.prefetch_done = reserved_end, prefetch_done
    self.evict_start = self.evict_done = NO_COPY


class _Pending:
  """Everything one buffer has committed so far, to take back on `kFailRequiresUncommit`."""

  def __init__(self):
    self.chunks: list[tuple[int, int]] = []               # (level, heap handle)
    self.prefetches: list[tuple[AsyncCopy, int, int]] = []  # (copy, inclusive start, end)
    self.evictions: list[tuple[AsyncCopy, int, int]] = []
    self.kept = self.default_uses = 0


OPTION_KINDS = ("default", "evict", "uncommit", "keep", "prefetch")
# Prefetch options offered per fast level at one decision point: the picker's first starts that
# pass every check (msa itself takes the first). A bound keeps the action space small and
# fixed-size for the game; 4 covers the preferred start and its nearest neighbours.
DEFAULT_PREFETCH_STARTS = 4
# The per-start mask `plan_prefetch_starts` ignores when FIFO order and the outstanding limit
# are off (never written; left writeable so that the kernel has one signature).
_NO_MASK = np.zeros(0, bool)


@dataclasses.dataclass(frozen=True)
class MsaOption:
  """One outcome msa's `AllocateSegment` can give a segment, with what an observation needs.

  kind: "default" (the use reads default memory, no new copy), "evict" (the value, held only in
    fast memory, is copied out; the use reads default memory), "uncommit" (an eviction is needed
    and refused: the whole buffer goes back to default memory, XLA's `kFailRequiresUncommit`,
    and its remaining uses are no longer steps), "keep" (fast memory without a copy: the
    previous allocation extended to the use, or an activation produced in place), "prefetch"
    (a copy from default memory into `level`, after an eviction when `evicts`).
  level: the fast level the value is held in (-1: none; "evict": the level copied out of).
  start, end: the op range `[start, end)` this option newly holds in fast memory (a prefetch's
    copy runs from the boundary before `start` to the use; "keep" may reserve past the use,
    as `FindBestChunkCandidates` extends it); "evict": the copy's ops `[start, end)`, the
    chunk held until it is done; both -1 when nothing is allocated.
  offset, size: the chunk in bytes (-1, 0 when nothing is allocated).
  saving: msa's own estimate of the seconds saved (`use_elapsed_reduction` of the cost
    analysis at `level`) at the use, plus the definition when the value is produced in place.
  evicts: an eviction copy is started first (the fast copy is the value's only one).
  """
  kind: str
  level: int = -1
  start: int = -1
  end: int = -1
  offset: int = -1
  size: int = 0
  saving: float = 0.0
  evicts: bool = False
  # What `choose` applies; not part of the description.
  plan: tuple = dataclasses.field(default=(), repr=False, compare=False)


@dataclasses.dataclass(frozen=True)
class MsaDecision:
  """One decision point of msa's loop: one `AllocateSegment` call (a use's segment, from the
  previous use or the definition), or the definition alone of a value nothing reads.

  buffer: the buffer being allocated; use: the op the segment serves (the definition op for a
  value nothing reads); segment_start: the previous use, or the definition (-1 for a
  parameter); options: what msa weighs there, option 0 always the one that allocates nothing
  new ("default", "evict" or "uncommit"); msa_choice: the index msa itself takes.
  """
  buffer: int
  use: int
  segment_start: int
  options: tuple[MsaOption, ...]
  msa_choice: int


class MsaAlgorithm:
  """One run of msa's allocation loop over a (workload, hardware) pair.

  `steps()` is the loop as a coroutine: it yields an `MsaDecision` at each decision point and
  is sent the index of the option to apply; `run()` sends msa's own choice every time, which is
  the `msa` solver (one implementation: the solver is the decision process played by msa).
  Attributes after the loop ends: `stats`."""

  def __init__(self, workload: Workload, hardware: Hardware, options: MsaOptions = MsaOptions()):
    self.workload, self.hardware, self.options = workload, hardware, options
    self.num_fast = hardware.num_fast_levels
    self.analyses = [CostAnalysis(workload, hardware, CostAnalysisOptions(alternate_level=level))
                     for level in range(self.num_fast)]
    self.capacity = [int(hardware.levels[level].capacity_bytes) for level in range(self.num_fast)]
    if options.picker == "cost":
      self.pickers = [CostAnalysisPrefetchIntervalPicker.from_cost_analysis(
          ca, self.capacity[level], options.interval_options)
          for level, ca in enumerate(self.analyses)]
      ca = self.analyses[0]
      budgets = ca.elapsed if options.copy_budget == "elapsed" else np.maximum(
          ca.elapsed - ca.memory_elapsed, 0.0)
    else:
      self.pickers = [InstructionCountPrefetchIntervalPicker(
          options.instruction_count_min, options.instruction_count_max)] * self.num_fast
      budgets = np.full(workload.num_ops, _COUNT_PICKER_OP_BUDGET)
    self.heaps = [ChunkHeap(hardware.alignment_bytes) for _ in range(self.num_fast)]
    self.prefetch_resource = AsynchronousCopyResource(budgets)
    self.eviction_resource = AsynchronousCopyResource(budgets)
    self.prefetch_limit = OutstandingCopyLimit(options.max_outstanding_prefetches)
    self.eviction_limit = OutstandingCopyLimit(options.max_outstanding_evictions)
    self.ordering = AsynchronousCopyOrdering()
    self._next_copy_id = 0
    self._copy_elapsed_cache: dict[int, float] = {}
    self._use_table: tuple[list[int], np.ndarray, np.ndarray, list[int]] | None = None
    self._counts = dict(kept=0, prefetches=0, evictions=0, default_uses=0, uncommitted_buffers=0)
    self.stats: MsaStats | None = None
    # The buffers done and the one being allocated (its segment list, filled as it goes).
    self._rows: list[tuple[int, _Segment]] = []
    self._open: tuple[int, list[_Segment]] = (-1, [])

  # ------------------------------------------------------------------ the loop

  def run(self) -> Allocations:
    """msa's own choice at every step; the segments, in allocation order. Only the options up
    to msa's own are planned (`steps(msa_only=True)`): the same steps, as fast as XLA's loop."""
    steps = self.steps(1, msa_only=True)
    try:
      decision = next(steps)
      while True:
        decision = steps.send(decision.msa_choice)
    except StopIteration as stop:
      return stop.value

  def steps(self, max_prefetch_starts: int = DEFAULT_PREFETCH_STARTS, msa_only: bool = False
            ) -> Generator[MsaDecision, int, Allocations]:
    """Every buffer in XLA's order, one decision per segment; returns the segments, in
    allocation order. Each yielded decision must be answered (`send`) with an option index.

    msa_only: plan only what XLA's `AllocateSegment` tries before its first success (no
    prefetch once a keep fits, no slower level once a faster one has a start, one start), so
    that the options are option 0 and msa's own: the `msa` solver at XLA's loop's cost (planning
    every option costs it 3-6x on the default suite)."""
    if max_prefetch_starts < 1:
      raise ValueError(f"max_prefetch_starts must be >= 1, got {max_prefetch_starts}")
    a = self.workload.arrays
    order = buffer_order(self.workload, self.analyses[0].memory_boundedness)
    self._rows = rows = []
    for b in order:
      b = int(b)
      if a.is_output[b] or a.sizes[b] == 0:
        continue
      self._open = (b, [])
      segments = yield from self._buffer_steps(b, max_prefetch_starts, msa_only)
      rows += [(b, s) for s in segments]
      self._open = (-1, [])
    self.stats = MsaStats(**self._counts)
    return self._to_allocations(rows)

  def allocations_so_far(self) -> Allocations:
    """The segments committed so far, the current buffer's included, as they stand now (a
    kept segment's end and an eviction's copy are final only once its buffer is done)."""
    b, open_segments = self._open
    return self._to_allocations(self._rows + [(b, s) for s in open_segments])

  @staticmethod
  def _to_allocations(rows: list[tuple[int, _Segment]]) -> Allocations:
    col = lambda f: np.array([f(b, s) for b, s in rows], np.int64)
    return Allocations(buffer=col(lambda b, s: b), level=col(lambda b, s: s.level),
                       offset=col(lambda b, s: s.offset), start=col(lambda b, s: s.start),
                       end=col(lambda b, s: s.end),
                       prefetch_done=col(lambda b, s: s.prefetch_done),
                       evict_start=col(lambda b, s: s.evict_start),
                       evict_done=col(lambda b, s: s.evict_done))

  def _uses(self, b: int) -> tuple[np.ndarray, np.ndarray, int | None]:
    """The buffer's use ops `[U]` (sorted, the definition excluded), their incidences, and the
    definition's incidence (None for a parameter)."""
    if self._use_table is None:
      self._use_table = self._all_uses()
    bounds, ops, incidences, def_incidences = self._use_table
    lo, hi = bounds[b], bounds[b + 1]
    def_incidence = def_incidences[b]
    return ops[lo:hi], incidences[lo:hi], None if def_incidence < 0 else def_incidence

  def _all_uses(self) -> tuple[list[int], np.ndarray, np.ndarray, list[int]]:
    """`_uses` of every buffer in one numpy pass (per buffer, it was a tenth of a step's time):
    CSR bounds `[N + 1]`, use ops and their incidences (per buffer: sorted by op, stable, the
    first incidence of each op), each buffer's first definition incidence (-1: none)."""
    a = self.workload.arrays
    start = a.buffer_incidence_start
    num_buffers = len(start) - 1
    buffer = np.repeat(np.arange(num_buffers), np.diff(start))               # [E]
    ops = a.incidence_op[:start[-1]]
    is_def = ops == a.def_op[buffer]
    def_incidences = np.full(num_buffers, -1, np.int64)
    defs = np.flatnonzero(is_def)
    def_buffers, first_def = np.unique(buffer[defs], return_index=True)
    def_incidences[def_buffers] = defs[first_def]
    uses = np.flatnonzero(~is_def)
    uses = uses[np.lexsort((ops[uses], buffer[uses]))]  # Stable: ties keep incidence order.
    use_buffer, use_op = buffer[uses], ops[uses]
    first = np.ones(len(uses), bool)
    first[1:] = (use_buffer[1:] != use_buffer[:-1]) | (use_op[1:] != use_op[:-1])
    uses, use_buffer = uses[first], use_buffer[first]
    bounds = np.searchsorted(use_buffer, np.arange(num_buffers + 1))
    return (bounds.tolist(), ops[uses].astype(np.int64), uses.astype(np.int64),
            def_incidences.tolist())

  def _saving(self, level: int, *incidences: int | None) -> float:
    return float(sum(self.analyses[level].use_elapsed_reduction[i] for i in incidences
                     if i is not None))

  def _decide(self, b: int, use: int, segment_start: int, options: list[MsaOption],
              msa_choice: int) -> Generator[MsaDecision, int, MsaOption]:
    """Yields the decision point; the option sent back."""
    choice = yield MsaDecision(b, use, segment_start, tuple(options), msa_choice)
    if not isinstance(choice, (int, np.integer)) or not 0 <= choice < len(options):
      raise ValueError(f"option {choice!r} out of range: {len(options)} options")
    return options[int(choice)]

  def _buffer_steps(self, b: int, max_starts: int,
                    msa_only: bool) -> Generator[MsaDecision, int, list[_Segment]]:
    """`AllocateAllocationValues` for one buffer: one decision per `AllocateSegment`; the
    segments committed (none when the buffer was uncommitted)."""
    a = self.workload.arrays
    uses, incidences, def_incidence = self._uses(b)
    size = int(self.hardware.align(int(a.sizes[b])))
    def_op = int(a.def_op[b])
    is_activation = def_op != PROGRAM_START
    if len(uses) == 0:
      if not is_activation:
        return []
      # A value nothing reads: its definition alone, one segment ending where it starts.
      pending = _Pending()
      options = [MsaOption("default")]
      keep = self._plan_keep(None, size, def_op, def_op, np.array([def_op]), def_incidence)
      if keep is not None:
        options.append(keep)
      option = yield from self._decide(b, def_op, def_op, options, len(options) - 1)
      if option.kind == "keep":
        self._counts["kept"] += 1
        return [self._apply_keep(None, option, def_op, pending)]
      self._counts["default_uses"] += 1
      return []
    # When default memory holds the value (XLA: the default allocation's earliest available
    # time); None while it does not (an activation produced in fast memory, not yet evicted).
    default_available: int | None = None if is_activation else PROGRAM_START
    pending = _Pending()
    segments = self._open[1]
    prev: _Segment | None = None  # The previous allocation when it is in fast memory.
    prev_in_default = False        # The previous allocation is the default one.
    for k, (use, incidence) in enumerate(zip(uses.tolist(), incidences.tolist())):
      segment_start = def_op if k == 0 else int(uses[k - 1])
      # 1. Keep in fast memory without a copy.
      keep = None
      if prev is not None or (not prev_in_default and is_activation):
        keep = self._plan_keep(prev, size, segment_start, use, uses, incidence,
                               def_incidence if prev is None else None)
      # 2. Evict when the fast copy is the only one; XLA uncommits the buffer if it cannot.
      needs_eviction = prev is not None and default_available is None
      eviction_end = self._plan_eviction(prev, b, size, use) if needs_eviction else None
      options = [MsaOption("default")]
      prefetches: list[MsaOption] = []
      if needs_eviction and eviction_end is None:
        options = [MsaOption("uncommit")]
      else:
        if needs_eviction:
          options = [MsaOption("evict", prev.level, prev.start + 1, eviction_end, prev.offset,
                               size, evicts=True)]
          available = eviction_end
        else:
          available = def_op if default_available is None else default_available
        if not (msa_only and keep is not None):
          prefetches = self._plan_all_prefetches(
              prev, segments, b, size, available, eviction_end, use, incidence, uses,
              max_starts, msa_only)
      if keep is not None:
        options.append(keep)
      options += prefetches
      # msa: keep if it can, else (the eviction, then) the first prefetch that fits, else 0.
      msa_choice = 1 if keep is not None or prefetches else 0
      option = yield from self._decide(b, use, segment_start, options, msa_choice)
      if option.kind == "keep":
        kept = self._apply_keep(prev, option, use, pending)
        if prev is None:
          segments.append(kept)
        prev = kept
        pending.kept += 1
        continue
      if option.kind == "uncommit":
        self._uncommit(pending)
        segments.clear()
        self._counts["uncommitted_buffers"] += 1
        self._counts["default_uses"] += len(uses)
        return []
      if needs_eviction:
        default_available = self._apply_eviction(prev, b, size, eviction_end, pending)
      elif default_available is None:
        default_available = def_op  # Produced in default memory.
      if option.kind == "prefetch":
        fetched = self._apply_prefetch(option, b, size, use, pending)
        segments.append(fetched)
        prev, prev_in_default = fetched, False
      else:
        # 4. The use reads default memory.
        prev, prev_in_default = None, True
        pending.default_uses += 1
    self._counts["kept"] += pending.kept
    self._counts["default_uses"] += pending.default_uses
    self._counts["prefetches"] += len(pending.prefetches)
    self._counts["evictions"] += len(pending.evictions)
    return segments

  # ------------------------------------------------------------------ AllocateSegment's steps
  # Each `_plan_*` checks without committing anything; its `_apply_*` commits the plan.

  def _plan_keep(self, prev: _Segment | None, size: int, segment_start: int, use: int,
                 uses: np.ndarray, incidence: int | None,
                 def_incidence: int | None = None) -> MsaOption | None:
    """`AllocateInAlternateMemoryNoCopy`. With a previous fast allocation: its level and offset
    only, extended to the use. Without (an activation's first segment): produced in place at
    the best chunk of the fastest level that has one. None when it fails."""
    if prev is not None:
      level = prev.level
      if not self.pickers[level].can_allocate_in_alternate_memory_no_copy(segment_start, use):
        return None  # Live range too long.
      reserved_end = prev.reserved_end
      if use + 1 > prev.reserved_end:
        if (prev.offset + size > self.capacity[level]
            or not self.heaps[level].fits_at(prev.reserved_end, use + 1, size, prev.offset)):
          return None
        reserved_end = use + 1
      return MsaOption("keep", level, segment_start, reserved_end, prev.offset, size,
                       self._saving(level, incidence), plan=(reserved_end,))
    for level in range(self.num_fast):
      picker = self.pickers[level]
      if not picker.can_allocate_in_alternate_memory_no_copy(segment_start, use):
        continue
      # `find_best_chunk_candidate`, jitted (as the prefetch loop's).
      found, offset, end_use = kernels().best_chunk_candidate(
          segment_start, use, size, uses, self.capacity[level],
          *self.heaps[level].kernel_state(), *picker.kernel_state())
      if not found:
        continue
      reserved_end = end_use + 1
      saving = self._saving(level, incidence, def_incidence if incidence != def_incidence
                            else None)
      return MsaOption("keep", level, segment_start, reserved_end, offset, size, saving,
                       plan=(reserved_end,))
    return None

  def _apply_keep(self, prev: _Segment | None, option: MsaOption, use: int,
                  pending: _Pending) -> _Segment:
    """Commits a keep: the previous allocation extended to the use, or a new one produced in
    place; the segment."""
    (reserved_end,) = option.plan
    level = option.level
    if prev is not None:
      if reserved_end > prev.reserved_end:
        pending.chunks.append((level, self.heaps[level].add(prev.reserved_end, reserved_end,
                                                            prev.offset, option.size)))
        prev.reserved_end = reserved_end
      prev.end = max(prev.end, use + 1)
      return prev
    pending.chunks.append((level, self.heaps[level].add(option.start, reserved_end,
                                                        option.offset, option.size)))
    return _Segment(level, option.offset, option.start, use + 1, reserved_end)

  def _plan_eviction(self, prev: _Segment, b: int, size: int, use: int) -> int | None:
    """`Evict`'s checks: the op from which default memory will hold the value (the eviction
    copy's end), or None (refused: the buffer must be uncommitted)."""
    level = prev.level
    picker = self.pickers[level]
    copy_elapsed = self._copy_elapsed(b)
    exclusive_start = prev.start            # The producing op.
    last_kept = prev.end - 1                # XLA's inclusive end of the previous allocation.
    preferred_end = max(picker.preferred_eviction_end_time(copy_elapsed, exclusive_start, use),
                        last_kept)
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

  def _apply_eviction(self, prev: _Segment, b: int, size: int, end: int,
                      pending: _Pending) -> int:
    """Commits the eviction `_plan_eviction` accepted; returns its end."""
    level, exclusive_start = prev.level, prev.start
    if end > prev.reserved_end:
      pending.chunks.append((level, self.heaps[level].add(prev.reserved_end, end, prev.offset,
                                                          size)))
      prev.reserved_end = end
    prev.end = max(prev.end, end)
    prev.evict_start, prev.evict_done = exclusive_start + 1, end
    resource = self._copy_resource(b)
    if not self.eviction_resource.has_enough_resource(exclusive_start, end, resource):
      resource = 0.0  # XLA's last retry (the only one with max_retries 1) charges nothing.
    copy = self._new_copy(exclusive_start, end, resource)
    self.eviction_resource.add_copy(copy)
    self.eviction_limit.add(exclusive_start + 1, end)
    pending.evictions.append((copy, exclusive_start + 1, end))
    return end

  def _plan_all_prefetches(self, prev: _Segment | None, segments: list[_Segment], b: int,
                           size: int, available: int, eviction_end: int | None, use: int,
                           incidence: int, uses: np.ndarray, max_starts: int,
                           msa_only: bool) -> list[MsaOption]:
    """The prefetch options of one segment, fastest level first: from default memory, as
    soon as it holds the value (`available`; XLA: the default allocation's earliest available
    time, not the previous use), but not while an earlier fast segment of the buffer is still
    held (a buffer's segments may not overlap here). After an eviction (`eviction_end`), as if
    it were committed: it holds its chunk until the copy is done. With `msa_only`, no slower
    level once a faster one has a start."""
    earliest = available
    if segments:
      last_end = segments[-1].end if eviction_end is None else max(segments[-1].end,
                                                                   eviction_end)
      earliest = max(earliest, last_end - 1)
    held = None
    if eviction_end is not None and eviction_end > prev.reserved_end:
      held = self.heaps[prev.level].add(prev.reserved_end, eviction_end, prev.offset, size)
    prefetches: list[MsaOption] = []
    for level in range(self.num_fast):
      if msa_only and prefetches:
        break
      prefetches += self._plan_prefetches(level, b, size, earliest, use, incidence, uses,
                                          max_starts, eviction_end is not None)
    if held is not None:
      self.heaps[prev.level].remove(held)
    return prefetches

  def _plan_prefetches(self, level: int, b: int, size: int, earliest: int, use: int,
                       incidence: int, uses: np.ndarray, max_starts: int,
                       evicts: bool) -> list[MsaOption]:
    """`PrefetchWithResourceConstraints` into `level`: the first `max_starts` starts the picker
    offers that pass `CheckPrefetchFit`, in the picker's order (msa takes the first)."""
    picker = self.pickers[level]
    copy_elapsed = self._copy_elapsed(b)
    resource = self._copy_resource(b)
    reduction = float(self.analyses[level].use_elapsed_reduction[incidence])
    starts = picker.start_time_array(copy_elapsed, earliest, use, reduction)
    # FIFO order and the outstanding limit depend on the start only: checked here for every
    # start, the loop skips those not allowed (both off by default, as in XLA).
    fifo = self.options.enforce_prefetch_fifo_order
    check_allowed = fifo or self.prefetch_limit.max_outstanding >= 0
    allowed = _NO_MASK
    if check_allowed:
      allowed = np.ones(len(starts), bool)
      for i, start in enumerate(starts.tolist()):
        allowed[i] = not ((fifo and self.ordering.violates_ordering(start, use))
                          or self.prefetch_limit.violates(start + 1, use))
    # The loop over starts (resource, chunk, XLA's out-of-memory cache) runs jitted: with every
    # option planned it was most of the decision process's time as Python calls.
    rows = kernels().plan_prefetch_starts(
        starts, check_allowed, allowed, use, size, uses, self.capacity[level], max_starts,
        float(resource), bool(self.options.use_copy_resource),
        *self.prefetch_resource.kernel_state(), *self.heaps[level].kernel_state(),
        *picker.kernel_state())
    return [MsaOption("prefetch", level, start + 1, end_use + 1, offset, size, reduction, evicts,
                      plan=(start, end_use + 1))
            for start, offset, end_use in rows.tolist()]

  def _apply_prefetch(self, option: MsaOption, b: int, size: int, use: int,
                      pending: _Pending) -> _Segment:
    level, (start, reserved_end) = option.level, option.plan
    resource = self._copy_resource(b)
    pending.chunks.append((level, self.heaps[level].add(start + 1, reserved_end, option.offset,
                                                        size)))
    copy = self._new_copy(start, use, resource)
    if self.options.use_copy_resource:
      self.prefetch_resource.add_copy(copy)
    self.prefetch_limit.add(start + 1, use)
    if self.options.enforce_prefetch_fifo_order:
      self.ordering.add_copy(start, use)
    pending.prefetches.append((copy, start + 1, use))
    return _Segment(level, option.offset, start + 1, use + 1, reserved_end, prefetch_done=use)

  def _uncommit(self, pending: _Pending) -> None:
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

  def _copy_elapsed(self, b: int) -> float:
    """`GetAsyncCopyElapsed` of the buffer (the picker's copy time), computed once per buffer
    (several plans a step ask for it)."""
    elapsed = self._copy_elapsed_cache.get(b)
    if elapsed is None:
      elapsed = float(self.analyses[0].async_copy_elapsed(int(self.workload.arrays.sizes[b])))
      self._copy_elapsed_cache[b] = elapsed
    return elapsed

  def _copy_resource(self, b: int) -> float:
    """What a copy of the buffer charges the copy resource."""
    if self.options.picker == "cost":
      return self._copy_elapsed(b)
    return _COUNT_PICKER_COPY_RESOURCE

  def _new_copy(self, exclusive_start: int, end: int, resource: float) -> AsyncCopy:
    self._next_copy_id += 1
    return AsyncCopy(exclusive_start, end, resource, self._next_copy_id)


def option_slots(options: tuple[MsaOption, ...], max_prefetch_starts: int) -> np.ndarray:
  """`[n]` the fixed slot of each option of a decision, the msa game's action
  (env/game/game.py): option 0 -> 0, keep -> 1, the k-th prefetch start into fast level f ->
  `2 + f * max_prefetch_starts + k`."""
  slots = np.zeros(len(options), np.int64)
  rank = {}
  for i, option in enumerate(options):
    if i == 0:
      continue
    if option.kind == "keep":
      slots[i] = 1
      continue
    k = rank.get(option.level, 0)
    rank[option.level] = k + 1
    slots[i] = 2 + option.level * max_prefetch_starts + k
  return slots



def worth_deciding(options: tuple[MsaOption, ...], threshold_s: float) -> bool:
  """Whether a decision offers a choice whose best option msa estimates to save at least
  `threshold_s` seconds (the msa game's `skip_below`; 0: any choice at all)."""
  return len(options) > 1 and (threshold_s <= 0 or max(o.saving for o in options) >= threshold_s)

class MsaDecisions:
  """msa's allocation loop as a decision process: `options()` at the current decision point
  (`decision`), `choose(i)` to apply one and advance, `done` when every buffer is allocated,
  then `allocations()` and `stats`.

  Why a state object over the coroutine `MsaAlgorithm.steps()`: the game (issue 14 item 2)
  needs to look at the options, pick one, and ask again; a generator's send protocol (prime,
  StopIteration carrying the result) is kept inside.

  max_prefetch_starts: prefetch options per fast level (the picker's first starts that fit).
  """

  def __init__(self, workload: Workload, hardware: Hardware, options: MsaOptions = MsaOptions(),
               max_prefetch_starts: int = DEFAULT_PREFETCH_STARTS):
    self.algorithm = MsaAlgorithm(workload, hardware, options)
    self._steps = self.algorithm.steps(max_prefetch_starts)
    self._allocations: Allocations | None = None
    self.decision: MsaDecision | None = None
    self.num_steps = 0
    self._advance(None)

  def _advance(self, choice: int | None) -> None:
    try:
      self.decision = next(self._steps) if choice is None else self._steps.send(choice)
    except StopIteration as stop:
      self.decision, self._allocations = None, stop.value

  @property
  def done(self) -> bool:
    return self.decision is None

  def options(self) -> tuple[MsaOption, ...]:
    if self.decision is None:
      raise RuntimeError("no decision left: every buffer is allocated")
    return self.decision.options

  @property
  def msa_choice(self) -> int:
    """The index of the option msa itself takes here."""
    if self.decision is None:
      raise RuntimeError("no decision left: every buffer is allocated")
    return self.decision.msa_choice

  def choose(self, index: int) -> None:
    """Applies option `index` of the current decision and moves to the next one."""
    options = self.options()
    if not 0 <= index < len(options):
      raise ValueError(f"option {index} out of range: {len(options)} options")
    self.num_steps += 1
    self._advance(int(index))

  def allocations(self) -> Allocations:
    if self._allocations is None:
      raise RuntimeError("the decision process is not done")
    return self._allocations

  def allocations_so_far(self) -> Allocations:
    """The segments the choices so far have committed (all of them once `done`)."""
    if self._allocations is not None:
      return self._allocations
    return self.algorithm.allocations_so_far()

  @property
  def stats(self) -> MsaStats:
    if self.algorithm.stats is None:
      raise RuntimeError("the decision process is not done")
    return self.algorithm.stats


Policy = Callable[[MsaDecision], int]


def msa_policy(decision: MsaDecision) -> int:
  """msa's own choice: the policy that is the `msa` solver."""
  return decision.msa_choice


def play(workload: Workload, hardware: Hardware, policy: Policy = msa_policy,
         options: MsaOptions = MsaOptions(),
         max_prefetch_starts: int = DEFAULT_PREFETCH_STARTS) -> tuple[Allocations, MsaStats]:
  """The segments a policy's choices give at every decision point, and the loop's counts."""
  decisions = MsaDecisions(workload, hardware, options, max_prefetch_starts)
  while not decisions.done:
    decisions.choose(policy(decisions.decision))
  return decisions.allocations(), decisions.stats


def msa_allocations(workload: Workload, hardware: Hardware,
                    options: MsaOptions = MsaOptions()) -> tuple[Allocations, MsaStats]:
  """msa's segments for a workload on a hardware, and what the loop did: the decision process
  played with msa's own choice at every step (`MsaAlgorithm.run`)."""
  algorithm = MsaAlgorithm(workload, hardware, options)
  allocations = algorithm.run()
  return allocations, algorithm.stats


def allocations_mapping(model: CostModel, allocations: Allocations, solver: str) -> Mapping:
  """A mapping of the segments, timed by the cost model (copies contending,
  env/simulator.py)."""
  evaluation = model.evaluate(allocations)
  return Mapping.from_arrays(model.workload, model.hardware, solver,
                             np.full(len(allocations), -1, np.int64), allocations,
                             evaluation.total_time_s, model.slow_only_time)


def msa_mapping(model: CostModel, options: MsaOptions = MsaOptions(),
                solver: str = "msa") -> tuple[Mapping, dict[str, Any]]:
  """msa's mapping, timed by the cost model (copies contending, env/simulator.py), and an info
  dict with the loop's counts."""
  allocations, stats = msa_allocations(model.workload, model.hardware, options)
  return allocations_mapping(model, allocations, solver), stats.to_dict()
