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

The loop is a decision process (docs/msa.md): `MsaAlgorithm.steps()` yields one
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

Copy budgets: XLA budgets each op its default-memory elapsed time for copies (one invocation's:
a loop's op lends one iteration, not its trip count); the cost model, like XLA's own
`RuntimeSimulator`, advances copies only in default-memory idle time, so a copy msa hides behind
a memory-bound op can stall the program (`MsaOptions.copy_budget`, docs/msa.md).

Three memory levels (docs/msa.md's extension; XLA has one alternate memory): one cost analysis,
interval picker and chunk heap per fast level, the buffer order from the fastest level's
memory-boundedness. A kept segment stays in its previous allocation's level; a first segment
and a prefetch try the fastest level first, then the next. The prefetch copy resource and the
outstanding-copy limits are shared by all levels (the hardware has one copy engine).

Not modelled, and why:
* sliced prefetch (`max_slices` >= 2) and window prefetch: off by default in XLA;
* cross-program prefetch: it keeps one parameter across program runs; this project evaluates a
  single run;
* loops, in part: the cost analysis counts one iteration of a loop's op and multiplies
  memory-bound benefits by 5 per level, the picker multiplies and divides by the loops' levels
  and starts a prefetch only at its use's level, and the copy budgets are one iteration's
  (cost_analysis.py, interval_picker.py: "Loops"); not XLA's allocation values for a loop's
  state (a buffer carried through a loop is one value here, so a use inside a loop is never
  prefetched from before the loop, and nothing ties the body's offset to the state's), its
  while-use rules, redundant-eviction elimination and the while uses' extra outstanding
  prefetches;
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
from collections.abc import Callable, Generator
from typing import Any

import numpy as np

from malloczero.env.cost_model import Allocations, CostModel
from malloczero.env.hardware import Hardware
from malloczero.env.mapping import Mapping
from malloczero.env.msa import solver_loop
from malloczero.env.msa.allocate_segment import Pending, Segment, SegmentAllocator
from malloczero.env.msa.buffer_order import buffer_order

# The decision encoding and the settings live in their own modules; importers of this module
# keep reaching them here.
from malloczero.env.msa.decision import (  # noqa: F401 (re-exported)
  DEFAULT_PREFETCH_STARTS,
  OPTION_KINDS,
  MsaDecision,
  MsaOption,
  option_slots,
  worth_deciding,
)
from malloczero.env.msa.overrides import read_sort_order_priorities
from malloczero.env.msa.settings import COPY_BUDGETS, PICKERS, MsaOptions  # noqa: F401
from malloczero.env.workload import PROGRAM_START, Workload

# The options that allocate nothing: immutable, so made once (a step makes a few options, and
# msa's loop makes hundreds of thousands of steps on a large program).
_DEFAULT = MsaOption("default")
_UNCOMMIT = MsaOption("uncommit")


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


def _use_table(workload: Workload) -> tuple[list[int], np.ndarray, np.ndarray, list[int]]:
  """`MsaAlgorithm._uses` of every buffer in one numpy pass (per buffer, it was a tenth of a
  step's time): CSR bounds `[N + 1]`, use ops and their incidences (per buffer: sorted by op,
  stable, the first incidence of each op), each buffer's first definition incidence (-1:
  none)."""
  a = workload.arrays
  start = a.buffer_incidence_start
  num_buffers = len(start) - 1
  buffer = np.repeat(np.arange(num_buffers), np.diff(start))  # [E]
  ops = a.incidence_op[: start[-1]]
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
  return (
    bounds.tolist(),
    ops[uses].astype(np.int64),
    uses.astype(np.int64),
    def_incidences.tolist(),
  )


class _Buffer:
  """One buffer between its segments (`AllocateAllocationValues`' state for it)."""

  __slots__ = (
    "b",
    "size",
    "def_op",
    "is_activation",
    "uses",
    "def_incidence",
    "default_available",
    "pending",
    "segments",
    "prev",
    "prev_in_default",
  )

  def __init__(
    self,
    b: int,
    size: int,
    def_op: int,
    uses: np.ndarray,
    def_incidence: int | None,
    segments: list[Segment],
  ):
    self.b, self.size, self.def_op, self.uses = b, size, def_op, uses
    self.def_incidence = def_incidence
    self.is_activation = def_op != PROGRAM_START
    # When default memory holds the value (XLA: the default allocation's earliest available
    # time); None while it does not (an activation produced in fast memory, not yet evicted).
    self.default_available: int | None = None if self.is_activation else PROGRAM_START
    self.pending = Pending()
    self.segments = segments
    self.prev: Segment | None = None  # The previous allocation when it is in fast memory.
    self.prev_in_default = False  # The previous allocation is the default one.

  @property
  def needs_eviction(self) -> bool:
    """The fast copy is the value's only one: a segment that leaves it must evict first."""
    return self.prev is not None and self.default_available is None


class MsaAlgorithm:
  """One run of msa's allocation loop over a (workload, hardware) pair.

  `steps()` is the loop as a coroutine: it yields an `MsaDecision` at each decision point and
  is sent the index of the option to apply; `run()` sends msa's own choice every time, which is
  the `msa` solver (one implementation: the solver is the decision process played by msa).
  `AllocateSegment`'s steps and the state they commit to are `allocator`'s
  (allocate_segment.py); `analyses` and `heaps` are its per-level cost analyses and chunk heaps.
  Attributes after the loop ends: `stats`.

  deferred: buffer ids allocated after all the others (each group in msa's order). Why: a
  measurement of what reordering buffers, which `evo` can do and the game cannot, would be worth
  as a game action (docs/results/defer-measurement.md); empty, the loop is msa's exactly."""

  def __init__(
    self,
    workload: Workload,
    hardware: Hardware,
    options: MsaOptions = MsaOptions(),
    deferred: frozenset[int] = frozenset(),
  ):
    self.workload, self.hardware, self.options = workload, hardware, options
    self.deferred = frozenset(int(b) for b in deferred)
    self.allocator = SegmentAllocator(workload, hardware, options)
    self.analyses, self.heaps = self.allocator.analyses, self.allocator.heaps
    self._use_table: tuple[list[int], np.ndarray, np.ndarray, list[int]] | None = None
    self._counts = dict(kept=0, prefetches=0, evictions=0, default_uses=0, uncommitted_buffers=0)
    # Set between decisions by a caller that will answer the next ones with msa's own choice
    # (the game's short-game prefix and msa's completion, env/game/game.py): the next decision
    # is planned as `steps(msa_only=True)` plans it, its options option 0 and msa's own.
    self.fast_forward = False
    self.stats: MsaStats | None = None
    # The buffers done and the one being allocated (its segment list, filled as it goes).
    self._rows: list[tuple[int, Segment]] = []
    self._fresh = True  # No step made yet: `run` may hand the whole loop to solver_loop.py.
    self.jitted = False  # Whether `run` made its segments with solver_loop.py's jitted loop.
    self._open: tuple[int, list[Segment]] = (-1, [])

  # ------------------------------------------------------------------ the loop

  def run(self, jitted: bool = True) -> Allocations:
    """msa's own choice at every step; the segments, in allocation order. Only the options up
    to msa's own are planned (`steps(msa_only=True)`): the same steps, as fast as XLA's loop.
    Where its options allow, the steps run as one jitted loop (solver_loop.py: the same plans and
    commits on the same state, without a Python step per decision); else, when that loop gives
    up, or with `jitted` False, as the decision process below."""
    resources = (self.allocator.prefetch_resource, self.allocator.eviction_resource)
    if jitted and self._fresh and solver_loop.supported(self.options, resources):
      done = solver_loop.run_loop(self)
      if done is not None:
        allocations, counts = done
        self.stats = MsaStats(**counts)
        self.jitted = True
        return allocations
      self.__init__(self.workload, self.hardware, self.options, self.deferred)  # A fresh state.
    steps = self.steps(1, msa_only=True)
    try:
      decision = next(steps)
      while True:
        decision = steps.send(decision.msa_choice)
    except StopIteration as stop:
      return stop.value

  def steps(
    self, max_prefetch_starts: int = DEFAULT_PREFETCH_STARTS, msa_only: bool = False
  ) -> Generator[MsaDecision, int, Allocations]:
    """Every buffer in XLA's order, one decision per segment; returns the segments, in
    allocation order. Each yielded decision must be answered (`send`) with an option index.

    msa_only: plan only what XLA's `AllocateSegment` tries before its first success (no
    prefetch once a keep fits, no slower level once a faster one has a start, one start), so
    that the options are option 0 and msa's own: the `msa` solver at XLA's loop's cost (planning
    every option costs it 3-6x on the default suite)."""
    if max_prefetch_starts < 1:
      raise ValueError(f"max_prefetch_starts must be >= 1, got {max_prefetch_starts}")
    self._fresh = False
    a = self.workload.arrays
    order = self.allocation_order()
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

  def allocation_order(self) -> list[int]:
    """The buffers in the order the loop allocates them: XLA's sort (buffer_order.py), its
    first key the sort-order overrides' priorities when the options name a file, the deferred
    buffers after the others in the same order (a stable partition)."""
    priority = None
    if self.options.sort_order_overrides:
      priority = read_sort_order_priorities(self.options.sort_order_overrides, self.workload)
    order = buffer_order(self.workload, self.analyses[0].memory_boundedness, priority).tolist()
    if self.deferred:
      deferred = self.deferred
      order = [b for b in order if b not in deferred] + [b for b in order if b in deferred]
    return order

  def allocations_so_far(self) -> Allocations:
    """The segments committed so far, the current buffer's included, as they stand now (a
    kept segment's end and an eviction's copy are final only once its buffer is done)."""
    b, open_segments = self._open
    return self._to_allocations(self._rows + [(b, s) for s in open_segments])

  @staticmethod
  def _to_allocations(rows: list[tuple[int, Segment]]) -> Allocations:
    table = np.array(
      [
        (b, s.level, s.offset, s.start, s.end, s.prefetch_done, s.evict_start, s.evict_done)
        for b, s in rows
      ],
      np.int64,
    ).reshape(len(rows), 8)
    return Allocations(*(np.ascontiguousarray(column) for column in table.T))

  @property
  def use_table(self) -> tuple[list[int], np.ndarray, np.ndarray, list[int]]:
    """Every buffer's uses (`_use_table`): CSR bounds, use ops, their incidences, definition
    incidences."""
    if self._use_table is None:
      self._use_table = _use_table(self.workload)
    return self._use_table

  def _uses(self, b: int) -> tuple[np.ndarray, np.ndarray, int | None]:
    """The buffer's use ops `[U]` (sorted, the definition excluded), their incidences, and the
    definition's incidence (None for a parameter)."""
    if self._use_table is None:
      self._use_table = _use_table(self.workload)
    bounds, ops, incidences, def_incidences = self._use_table
    lo, hi = bounds[b], bounds[b + 1]
    def_incidence = def_incidences[b]
    return ops[lo:hi], incidences[lo:hi], None if def_incidence < 0 else def_incidence

  @staticmethod
  def _chosen(options: list[MsaOption], choice: int) -> MsaOption:
    """The option sent back for a decision (`MsaDecision`, yielded by the caller itself: one
    generator fewer per step)."""
    if not isinstance(choice, (int, np.integer)) or not 0 <= choice < len(options):
      raise ValueError(f"option {choice!r} out of range: {len(options)} options")
    return options[int(choice)]

  def _buffer_steps(
    self, b: int, max_starts: int, msa_only: bool
  ) -> Generator[MsaDecision, int, list[Segment]]:
    """`AllocateAllocationValues` for one buffer: one decision per `AllocateSegment`; the
    segments committed (none when the buffer was uncommitted)."""
    a = self.workload.arrays
    uses, incidences, def_incidence = self._uses(b)
    size = int(self.hardware.align(int(a.sizes[b])))
    def_op = int(a.def_op[b])
    if len(uses) == 0:
      if def_op == PROGRAM_START:
        return []
      return (yield from self._unread_value_step(b, size, def_op, def_incidence))
    buffer = _Buffer(b, size, def_op, uses, def_incidence, self._open[1])
    segment_start = def_op  # Then each previous use.
    for use, incidence in zip(uses.tolist(), incidences.tolist()):
      options, msa_choice, eviction_end = self._segment_options(
        buffer, segment_start, use, incidence, max_starts, msa_only or self.fast_forward
      )
      choice = yield MsaDecision(b, use, segment_start, tuple(options), msa_choice)
      option = self._chosen(options, choice)
      if not self._commit(buffer, option, use, eviction_end):
        return []
      segment_start = use
    pending = buffer.pending
    self._counts["kept"] += pending.kept
    self._counts["default_uses"] += pending.default_uses
    self._counts["prefetches"] += len(pending.prefetches)
    self._counts["evictions"] += len(pending.evictions)
    return buffer.segments

  def _unread_value_step(
    self, b: int, size: int, def_op: int, def_incidence: int | None
  ) -> Generator[MsaDecision, int, list[Segment]]:
    """A value nothing reads: its definition alone, one segment ending where it starts."""
    options = [_DEFAULT]
    keep = self.allocator.plan_keep(None, size, def_op, def_op, np.array([def_op]), def_incidence)
    if keep is not None:
      options.append(keep)
    choice = yield MsaDecision(b, def_op, def_op, tuple(options), len(options) - 1)
    option = self._chosen(options, choice)
    if option.kind == "keep":
      self._counts["kept"] += 1
      return [self.allocator.apply_keep(None, option, def_op, Pending())]
    self._counts["default_uses"] += 1
    return []

  def _segment_options(
    self,
    buffer: _Buffer,
    segment_start: int,
    use: int,
    incidence: int,
    max_starts: int,
    msa_only: bool,
  ) -> tuple[list[MsaOption], int, int | None]:
    """`AllocateSegment`'s options for the segment to `use`, in XLA's order, the index of msa's
    own, and where the eviction the options start with ends (None: no eviction)."""
    allocator, prev, size = self.allocator, buffer.prev, buffer.size
    # 1. Keep in fast memory without a copy.
    keep = None
    if prev is not None or (not buffer.prev_in_default and buffer.is_activation):
      keep = allocator.plan_keep(
        prev,
        size,
        segment_start,
        use,
        buffer.uses,
        incidence,
        buffer.def_incidence if prev is None else None,
      )
    # 2. Evict when the fast copy is the only one; XLA uncommits the buffer if it cannot.
    needs_eviction = buffer.needs_eviction
    eviction_end = allocator.plan_eviction(prev, buffer.b, size, use) if needs_eviction else None
    options = [_DEFAULT]
    prefetches: list[MsaOption] = []
    if needs_eviction and eviction_end is None:
      options = [_UNCOMMIT]
    else:
      if needs_eviction:
        options = [
          MsaOption(
            "evict", prev.level, prev.start + 1, eviction_end, prev.offset, size, evicts=True
          )
        ]
        available = eviction_end
      else:
        available = buffer.def_op if buffer.default_available is None else buffer.default_available
      # 3. Prefetch (none when msa stops at its keep).
      if not (msa_only and keep is not None):
        prefetches = allocator.plan_all_prefetches(
          prev,
          buffer.segments,
          buffer.b,
          size,
          available,
          eviction_end,
          use,
          incidence,
          buffer.uses,
          max_starts,
          msa_only,
        )
    if keep is not None:
      options.append(keep)
    options += prefetches
    # msa: keep if it can, else (the eviction, then) the first prefetch that fits, else 0.
    msa_choice = 1 if keep is not None or prefetches else 0
    return options, msa_choice, eviction_end

  def _commit(self, buffer: _Buffer, option: MsaOption, use: int, eviction_end: int | None) -> bool:
    """Applies the option sent for the segment to `use`; False when it sent the whole buffer
    back to default memory (`kFailRequiresUncommit`)."""
    allocator, pending = self.allocator, buffer.pending
    if option.kind == "keep":
      kept = allocator.apply_keep(buffer.prev, option, use, pending)
      if buffer.prev is None:
        buffer.segments.append(kept)
      buffer.prev = kept
      pending.kept += 1
      return True
    if option.kind == "uncommit":
      allocator.uncommit(pending)
      buffer.segments.clear()
      self._counts["uncommitted_buffers"] += 1
      self._counts["default_uses"] += len(buffer.uses)
      return False
    if buffer.needs_eviction:
      buffer.default_available = allocator.apply_eviction(
        buffer.prev, buffer.b, buffer.size, eviction_end, pending
      )
    elif buffer.default_available is None:
      buffer.default_available = buffer.def_op  # Produced in default memory.
    if option.kind == "prefetch":
      fetched = allocator.apply_prefetch(option, buffer.b, buffer.size, use, pending)
      buffer.segments.append(fetched)
      buffer.prev, buffer.prev_in_default = fetched, False
    else:
      # 4. The use reads default memory.
      buffer.prev, buffer.prev_in_default = None, True
      pending.default_uses += 1
    return True


class MsaDecisions:
  """msa's allocation loop as a decision process: `options()` at the current decision point
  (`decision`), `choose(i)` to apply one and advance, `done` when every buffer is allocated,
  then `allocations()` and `stats`.

  Why a state object over the coroutine `MsaAlgorithm.steps()`: the game (env/game/game.py)
  needs to look at the options, pick one, and ask again; a generator's send protocol (prime,
  StopIteration carrying the result) is kept inside.

  max_prefetch_starts: prefetch options per fast level (the picker's first starts that fit).
  deferred: buffers allocated after all the others (`MsaAlgorithm`); empty: msa's order.
  """

  def __init__(
    self,
    workload: Workload,
    hardware: Hardware,
    options: MsaOptions = MsaOptions(),
    max_prefetch_starts: int = DEFAULT_PREFETCH_STARTS,
    deferred: frozenset[int] = frozenset(),
  ):
    self.algorithm = MsaAlgorithm(workload, hardware, options, deferred)
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


def play(
  workload: Workload,
  hardware: Hardware,
  policy: Policy = msa_policy,
  options: MsaOptions = MsaOptions(),
  max_prefetch_starts: int = DEFAULT_PREFETCH_STARTS,
) -> tuple[Allocations, MsaStats]:
  """The segments a policy's choices give at every decision point, and the loop's counts."""
  decisions = MsaDecisions(workload, hardware, options, max_prefetch_starts)
  while not decisions.done:
    decisions.choose(policy(decisions.decision))
  return decisions.allocations(), decisions.stats


def msa_allocations(
  workload: Workload, hardware: Hardware, options: MsaOptions = MsaOptions()
) -> tuple[Allocations, MsaStats]:
  """msa's segments for a workload on a hardware, and what the loop did: the decision process
  played with msa's own choice at every step (`MsaAlgorithm.run`)."""
  algorithm = MsaAlgorithm(workload, hardware, options)
  allocations = algorithm.run()
  return allocations, algorithm.stats


def allocations_mapping(model: CostModel, allocations: Allocations, solver: str) -> Mapping:
  """A mapping of the segments, timed by the cost model (copies contending,
  env/simulator.py)."""
  evaluation = model.evaluate(allocations)
  return Mapping.from_arrays(
    model.workload,
    model.hardware,
    solver,
    np.full(len(allocations), -1, np.int64),
    allocations,
    evaluation.total_time_s,
    model.slow_only_time,
  )


def msa_mapping(
  model: CostModel, options: MsaOptions = MsaOptions(), solver: str = "msa"
) -> tuple[Mapping, dict[str, Any]]:
  """msa's mapping, timed by the cost model (copies contending, env/simulator.py), and an info
  dict with the loop's counts."""
  allocations, stats = msa_allocations(model.workload, model.hardware, options)
  return allocations_mapping(model, allocations, solver), stats.to_dict()
