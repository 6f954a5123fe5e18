"""When msa starts a prefetch: XLA's `CostAnalysisPrefetchIntervalPicker`.

Reimplements `CostAnalysisPrefetchIntervalPicker` (openxla/xla,
`xla/service/memory_space_assignment/prefetch_interval_picker.cc`): `GetLogicalIntervalElapsed`,
`CanAllocateInAlternateMemoryNoCopy`, `PreferredEvictionEndTime`, `LatestPrefetchStartTime`,
`PreferredPrefetchStartTime`, `EstimatedPrefetchEndTime`, and the `Begin` / `Next` / `Done`
iteration over candidate prefetch start times. Why: a prefetch's start decides how much of its
copy hides behind ops and how long it holds fast memory; XLA tries the preferred start first,
then alternately later and earlier ones, and accepts a start whose overlapped elapsed time plus
the use's own saving covers `min_ratio` x the copy time (so some copy time may stay exposed).

Times are op indices (XLA's logical times). A prefetch with start time `s` for a use at `e`
overlaps the ops strictly between them: `elapsed(s, e)` is the sum of the ops' elapsed times
(everything in default memory, `CostAnalysis.elapsed`) over `s < t < e`. Start -1 is the program
start, before op 0 (a parameter's definition); there `elapsed(-1, e)` covers ops 0 .. e-1. (XLA
clamps a negative start to 0 because its time 0 is a parameter instruction of no elapsed time;
here op 0 is a real op.)

The ratios are named options whose defaults are the values XLA's tests use
(`memory_space_assignment_test_base.h` builds the picker with 0.8 / 1.5 / 10):
* min_overlap_to_async_copy_ratio 0.8: latest start = the latest `t` with
  elapsed(t, e) + the use's elapsed reduction >= 0.8 x copy time.
* preferred_overlap_to_async_copy_ratio 1.5: the first start tried is the one whose elapsed is
  closest to 1.5 x copy time (the earliest on a tie).
* max_overlap_to_mem_size_async_copy_ratio 10: earliest start = the first `t` with
  elapsed(t, e) <= 10 x the time to copy the whole alternate memory (`mem_size_bytes`). The
  same bound refuses keeping a buffer in alternate memory without a copy over a longer interval
  (`CanAllocateInAlternateMemoryNoCopy`, msa's "live range too long").
XLA's own defaults in `options.h`/flags differ per platform; the test values are what the XLA
behaviours reproduced in tests/test_msa_interval_picker.py use.

Loops (the constructor's `while_nest_level_`, `while_nest_level_change_`,
`GetMinWhileNestLevel`, the `computation_nest_level_` checks in `LatestPrefetchStartTime`,
`Begin`, `PreferredPrefetchStartTime` and `Next`). The HLO importer flattens a while loop's
condition and body onto the schedule once (docs/design.md); each op carries its while nest level
(`Op.loop_depth`; cost_analysis.py's "Loops"). As XLA:
* each op's elapsed time is one invocation's (`CostAnalysis.elapsed`) x W ** its level (W =
  `while_execution_count`, 5), and `prefix` sums those;
* elapsed(s, e) is that sum over the ops strictly between, divided by W ** the smallest level of
  ops max(s, 0) .. e (op T, the program end, at level 0): one iteration when s, e and everything
  between lie in one loop body, a loop counted W times by an interval that spans it. A wider
  interval still never counts less (W >= 1), so the searches still bisect;
* a prefetch may start only at an op of the same level as its end (the use): the latest and the
  earliest start are the nearest such ops to XLA's bounds, only such ops compete for the
  preferred start (after the earliest), and the iterator skips the others. The program start (-1)
  is at level 0. `CanAllocateInAlternateMemoryNoCopy`, `PreferredEvictionEndTime` and
  `EstimatedPrefetchEndTime` use the divided elapsed time without the level rule.
One departure: XLA compares the computation nest level (every called computation: while
condition and body, call, conditional branch, async computation), here the while level, the only
nesting the workload keeps. The zoo's programs are compiled by XLA's CPU backend, whose calls of
parallel tasks are called computations a TPU program does not have; as computation levels they
would forbid prefetch starts over most of those programs. Programs without loops are unchanged:
no level array is made, and the kernels run their flat code (`nest_state()` is None).

Not modelled, and why: the while instruction's own time slot (XLA's start "right after the
loop", at the parent's level and of no elapsed time: the importer makes no op for it, so the
first start after a loop is the first op after it); XLA's allocation values, which split a
buffer carried through a loop (the value into the loop, the body's parameter, the loop's result)
and give the while its own use (a prefetch done before the loop begins, the body's uses aliased
to it): a buffer here is one value, so a use inside a loop is prefetched from inside that loop
(or an earlier one at its level) and never before it; the while-use rules that follow from them
(`IsWhileLoopUseBeneficialInAlternateMemory`, required assignments, redundant eviction
elimination, `while_use_extra_outstanding_prefetch_limit`); conditionals
(`ConsecutiveConditionals`: the importer flattens a conditional's branches at their caller's
while level, so a start inside a branch is not refused); `size_override` (no sliced prefetch,
whose slices share one picker); `SetRetryNumber` (retries are off by default, `max_retries` 1, so
the retry number is 0); `strict_timing` with a preferred time (used only by window prefetch and
sliced prefetch); `LatestPrefetchEndTime` (no caller in XLA's algorithm).
"""

from __future__ import annotations

import dataclasses
from typing import Iterator, NamedTuple

import numpy as np

from malloczero.common.lazy import lazy_module
from malloczero.env.msa.cost_analysis import CostAnalysis, while_multipliers

_kernels = lazy_module("malloczero.env.msa.kernels.prefetch")

# XLA's kNumExploredDecreasingIntervals: once the later starts are used up, the earlier side is
# thinned to about this many candidates.
NUM_EXPLORED_DECREASING_INTERVALS = 100
# XLA's kEvictionRetryMultiplier (only with retries, which are off: retry number 0).
EVICTION_RETRY_MULTIPLIER = 2.0


@dataclasses.dataclass(frozen=True)
class PrefetchIntervalOptions:
  """The picker's ratios, defaults = XLA's test values (see the module docstring)."""

  min_overlap_to_async_copy_ratio: float = 0.8
  preferred_overlap_to_async_copy_ratio: float = 1.5
  max_overlap_to_mem_size_async_copy_ratio: float = 10.0
  num_explored_decreasing_intervals: int = NUM_EXPLORED_DECREASING_INTERVALS


@dataclasses.dataclass(frozen=True)
class PrefetchWindow:
  """The window `Begin` computes for one (use, copy): candidate starts lie in
  [earliest, latest]; `preferred` is tried first. Empty when earliest > latest."""

  earliest: int
  latest: int
  preferred: int

  @property
  def empty(self) -> bool:
    return self.earliest > self.latest


class WindowRule(NamedTuple):
  """What the jitted window reads of a picker (kernels/prefetch.py's `prefetch_window`): the
  prefix sums of the ops' elapsed times, the min and preferred ratios, the longest interval kept
  without a copy, and whether no op has a negative elapsed time."""

  prefix: np.ndarray
  min_ratio: float
  preferred_ratio: float
  max_elapsed: float
  monotone: bool


class StartWindow(NamedTuple):
  """What the jitted start sequence walks (`start_window`): the window's earliest, latest and
  preferred starts, and the earlier side's thinning (`num_explored_decreasing_intervals`)."""

  earliest: int
  latest: int
  preferred: int
  num_explored: int


class NoCopyBound(NamedTuple):
  """`can_allocate_in_alternate_memory_no_copy` as the jitted chunk search reads it (a picker's
  `kernel_state()`): whether the picker counts instructions, the prefix sums of the elapsed
  times, the longest interval kept without a copy, and its op count."""

  count_picker: bool
  prefix: np.ndarray
  max_elapsed: float
  max_count: int


class WhileNest(NamedTuple):
  """A program's loops as the picker and its kernels read them (the picker's `nest_state()`;
  None for a program without loops): `levels` `[2, T + 1]` int64, row 0 each op's while nest
  level and the program end's (0), row 1 XLA's `while_nest_level_change_` (the last earlier op
  of a smaller level, -1 when none); `divisors` `[D + 1]`, W ** level for each level up to the
  deepest (`GetWhileNestMultiplier`)."""

  levels: np.ndarray
  divisors: np.ndarray


def while_nest(levels: np.ndarray, divisors: np.ndarray) -> WhileNest:
  """The `WhileNest` of ops at while nest `levels` `[T]`, with XLA's change chain (the
  picker's constructor): for each op, the last earlier op whose level is smaller, so that
  `GetMinWhileNestLevel` follows at most one link per level."""
  levels = np.concatenate([np.asarray(levels, np.int64), [0]])
  change = np.full(len(levels), -1, np.int64)
  index = np.arange(len(levels), dtype=np.int64)
  for level in range(1, int(levels.max(initial=0)) + 1):
    # The last op before each position whose level is below `level` (-1: none).
    below = np.maximum.accumulate(np.where(levels < level, index, -1))
    before = np.concatenate([[-1], below[:-1]])
    change = np.where(levels == level, before, change)
  return WhileNest(np.stack([levels, change]), np.asarray(divisors, np.float64))


class CostAnalysisPrefetchIntervalPicker:
  """The picker over fixed per-op elapsed times `[T]` (XLA: `GetInstructionElapsed`, everything
  in default memory, one invocation of each op).

  `memory_copy_elapsed` is the time to copy the whole alternate memory (XLA:
  `GetAsyncCopyElapsed(mem_size_bytes)`); `max_overlap_to_mem_size_async_copy_ratio` times it is
  the longest interval a buffer may sit in alternate memory (`max_async_copy_elapsed_`).
  `from_cost_analysis` builds one from a `CostAnalysis` and the alternate memory's size.

  `while_nest_level` `[T]` (None: no loops) is each op's while nest level, `while_execution_count`
  the times a loop is assumed to run per level (the module docstring's "Loops"). The picker's
  `op_elapsed` and `prefix` are then the multiplied times, `loops` says whether any op is in a
  loop."""

  def __init__(
    self,
    op_elapsed: np.ndarray,
    memory_copy_elapsed: float,
    options: PrefetchIntervalOptions = PrefetchIntervalOptions(),
    while_nest_level: np.ndarray | None = None,
    while_execution_count: float = 5.0,
  ):
    self.op_elapsed = np.asarray(op_elapsed, np.float64)  # [T]
    self.options = options
    self.num_ops = len(self.op_elapsed)
    self.loops = while_nest_level is not None and bool(np.any(while_nest_level))
    self._nest: WhileNest | None = None
    if self.loops:
      levels = np.asarray(while_nest_level, np.int64)
      if len(levels) != self.num_ops or levels.min() < 0:
        raise ValueError("while_nest_level needs one level >= 0 per op")
      divisors = while_multipliers(while_execution_count, int(levels.max()))
      self._nest = while_nest(levels, divisors)
      # XLA's instructions_elapsed_time: each op's elapsed x GetWhileNestMultiplier(level).
      self.op_elapsed = self.op_elapsed * divisors[levels]
      # Each start's level, the program start's (-1) 0, for the level filter: [T + 1].
      self._start_levels = np.concatenate([[0], levels])
    self.prefix = np.concatenate([[0.0], np.cumsum(self.op_elapsed)])  # [T + 1]
    self._nest_state = None if self._nest is None else tuple(self._nest)
    self.max_async_copy_elapsed = (
      float(memory_copy_elapsed) * options.max_overlap_to_mem_size_async_copy_ratio
    )
    # With no negative elapsed time, elapsed(s, e) only shrinks as s grows and only grows as e
    # does (float subtraction is monotone too), so the searches below can bisect instead of
    # scanning the ops between (programs of 100,000 buffers have windows of thousands of ops).
    self.monotone = bool(np.all(self.op_elapsed >= 0))
    self._prefix_list = self.prefix.tolist()

  @classmethod
  def from_cost_analysis(
    cls,
    cost_analysis: CostAnalysis,
    mem_size_bytes: int,
    options: PrefetchIntervalOptions = PrefetchIntervalOptions(),
  ) -> "CostAnalysisPrefetchIntervalPicker":
    """From a `CostAnalysis` and the alternate memory's size. XLA measures the memory's copy
    time on an s32 array of `mem_size_bytes // 4` elements, i.e. the size rounded down to 4."""
    return cls(
      cost_analysis.elapsed,
      cost_analysis.async_copy_elapsed(mem_size_bytes // 4 * 4),
      options,
      cost_analysis.while_nest_level if cost_analysis.has_loops else None,
      cost_analysis.options.while_execution_count,
    )

  # ----------------------------------------------------------------- elapsed times

  def nest_state(self) -> tuple | None:
    """The loops as the jitted window, start walk and chunk search take them (a `WhileNest`'s
    fields, as a plain tuple), or None for a program without loops (the kernels then run their
    flat code, unchanged)."""
    return self._nest_state

  def min_while_nest_level(self, start: int, end: int) -> int:
    """`GetMinWhileNestLevel`: the smallest while nest level of the ops `max(start, 0) .. end`
    (closed; op `T` is the program end, level 0), following XLA's change chain back from `end`."""
    if self._nest is None:
      return 0
    levels, change = self._nest.levels
    start = max(start, 0)
    level = min(int(levels[start]), int(levels[end]))
    index = int(change[end])
    while index >= start:
      level = min(level, int(levels[index]))
      index = int(change[index])
    return level

  def logical_interval_elapsed(self, start: int, end: int) -> float:
    """`GetLogicalIntervalElapsed`: elapsed time of the ops strictly between start and end, over
    W ** (the smallest while nest level from start to end): one iteration inside a loop body, a
    loop counted W times by an interval that spans it."""
    if start > end:
      raise ValueError(f"interval ({start}, {end}) ends before it starts")
    if start == end:
      return 0.0
    elapsed = self.prefix[end] - self.prefix[start + 1]
    if self._nest is not None:
      elapsed = elapsed / self._nest.divisors[self.min_while_nest_level(start, end)]
    return float(elapsed)

  def _elapsed_to(self, starts: np.ndarray, end: int) -> np.ndarray:
    """`[k]` elapsed(s, end) for starts `[k]`, each < end."""
    elapsed = self.prefix[end] - self.prefix[starts + 1]
    if self._nest is None:
      return elapsed
    # The smallest level from each op to `end`: a running minimum backwards from `end`.
    levels = self._nest.levels[0, : end + 1]
    suffix_min = np.minimum.accumulate(levels[::-1])[::-1]
    return elapsed / self._nest.divisors[suffix_min[np.maximum(starts, 0)]]

  def _elapsed_from(self, start: int, ends: np.ndarray) -> np.ndarray:
    """`[k]` elapsed(start, e) for ends `[k]`, each > start and increasing."""
    elapsed = self.prefix[ends] - self.prefix[start + 1]
    if self._nest is None or not len(ends):
      return elapsed
    first = max(start, 0)
    prefix_min = np.minimum.accumulate(self._nest.levels[0, first : ends[-1] + 1])
    return elapsed / self._nest.divisors[prefix_min[ends - first]]

  def _at_end_level(self, starts: np.ndarray, end: int) -> np.ndarray:
    """`[k]` bool: which starts lie at the prefetch end's while nest level, the only starts XLA
    offers (the module docstring's "Loops"); all of them without loops."""
    if self._nest is None:
      return np.ones(len(starts), bool)
    return self._start_levels[starts + 1] == self._nest.levels[0, end]

  def can_allocate_in_alternate_memory_no_copy(self, start: int, end: int) -> bool:
    """`CanAllocateInAlternateMemoryNoCopy`: false when the interval's elapsed time reaches
    max_ratio x the whole memory's copy time (the "live range too long" rule)."""
    return self.max_async_copy_elapsed > self.logical_interval_elapsed(start, end)

  def preferred_eviction_end_time(self, copy_elapsed: float, start: int, latest_end: int) -> int:
    """`PreferredEvictionEndTime` (retry 0): the first end after `start` whose elapsed time
    covers preferred_ratio x the copy time, else latest_end + 1 (XLA's loop runs past)."""
    target = self.options.preferred_overlap_to_async_copy_ratio * copy_elapsed
    if self.monotone and not self.loops and -1 <= start < latest_end <= self.num_ops:
      # The first end whose elapsed time reaches the target, by bisection.
      prefix, base = self._prefix_list, self._prefix_list[start + 1]
      lo, hi = start + 1, latest_end + 1  # The answer lies in [lo, hi]; hi: none reaches it.
      while lo < hi:
        mid = (lo + hi) // 2
        if prefix[mid] - base >= target:
          hi = mid
        else:
          lo = mid + 1
      return lo if lo <= latest_end else max(start + 1, latest_end + 1)
    ends = np.arange(start + 1, latest_end + 1)
    if len(ends):
      ok = self._elapsed_from(start, ends) >= target
      if ok.any():
        return int(ends[np.argmax(ok)])
    return max(start + 1, latest_end + 1)

  def estimated_prefetch_end_time(self, copy_elapsed: float, start: int, end: int) -> int:
    """`EstimatedPrefetchEndTime`: the first time after `start` by which the copy, started at
    `start`, would be done; `end` if it never is before it."""
    ends = np.arange(start + 1, end)
    if len(ends):
      ok = self._elapsed_from(start, ends) >= copy_elapsed
      if ok.any():
        return int(ends[np.argmax(ok)])
    return max(start + 1, end)

  # ----------------------------------------------------------------- the window

  def latest_prefetch_start_time(
    self, copy_elapsed: float, start: int, end: int, use_elapsed_reduction: float = 0.0
  ) -> int:
    """`LatestPrefetchStartTime`: the latest t in [start, end) at the end's while nest level
    with elapsed(t, end) + the use's elapsed reduction >= min_ratio x copy time; start - 1 when
    there is none."""
    min_interval = self.options.min_overlap_to_async_copy_ratio * copy_elapsed
    starts = np.arange(max(start, -1), end)
    if len(starts):
      ok = ~(min_interval > self._elapsed_to(starts, end) + use_elapsed_reduction)
      ok &= self._at_end_level(starts, end)
      if ok.any():
        return int(starts[len(starts) - 1 - np.argmax(ok[::-1])])
    return min(start, end) - 1

  def preferred_prefetch_start_time(
    self, copy_elapsed: float, earliest: int, latest: int, end: int
  ) -> int:
    """`PreferredPrefetchStartTime`: in [earliest, latest], the start whose elapsed time to
    `end` is closest to preferred_ratio x copy time, the earliest such on a tie; `earliest`, then
    only starts at the end's while nest level."""
    if latest <= earliest:
      return earliest
    preferred_interval = self.options.preferred_overlap_to_async_copy_ratio * copy_elapsed
    starts = np.arange(earliest, latest + 1)
    distance = np.abs(preferred_interval - self._elapsed_to(starts, end))
    if self.loops:
      competes = self._at_end_level(starts, end)
      competes[0] = True
      distance = np.where(competes, distance, np.inf)
    return int(starts[np.argmin(distance)])

  def window(
    self,
    copy_elapsed: float,
    start: int,
    end: int,
    use_elapsed_reduction: float = 0.0,
    preferred_time: int | None = None,
  ) -> PrefetchWindow:
    """The window `Begin` computes: latest from min_ratio (the use's saving credited), earliest
    from max_ratio (never past latest), preferred from preferred_ratio (or `preferred_time` when
    given and not after latest); earliest and latest at the end's while nest level."""
    if preferred_time is None and start >= -1:
      return PrefetchWindow(*self._jitted_window(copy_elapsed, start, end, use_elapsed_reduction))
    latest = self.latest_prefetch_start_time(copy_elapsed, start, end, use_elapsed_reduction)
    earliest = start
    if earliest < latest:
      starts = np.arange(start, latest)
      within = ~(self.max_async_copy_elapsed < self._elapsed_to(starts, end))
      within &= self._at_end_level(starts, end)
      earliest = int(starts[np.argmax(within)]) if within.any() else latest
    if earliest > latest:
      return PrefetchWindow(earliest, latest, earliest)
    if preferred_time is not None and preferred_time <= latest:
      preferred = int(preferred_time)
    else:
      preferred = self.preferred_prefetch_start_time(copy_elapsed, earliest, latest, end)
    return PrefetchWindow(earliest, latest, preferred)

  def _jitted_window(
    self, copy_elapsed: float, start: int, end: int, use_elapsed_reduction: float
  ) -> tuple[int, int, int]:
    """`window`'s three searches as one jitted pass (numpy's per-call overhead was most of
    it), for start >= -1 and no preferred time: (earliest, latest, preferred)."""
    o = self.options
    rule = (
      self.prefix,
      float(o.min_overlap_to_async_copy_ratio),
      float(o.preferred_overlap_to_async_copy_ratio),
      self.max_async_copy_elapsed,
      self.monotone,
    )
    return _kernels().prefetch_window(
      rule,
      float(copy_elapsed),
      int(start),
      int(end),
      float(use_elapsed_reduction),
      self.nest_state(),
    )

  def begin(
    self,
    copy_elapsed: float,
    start: int,
    end: int,
    use_elapsed_reduction: float = 0.0,
    preferred_time: int | None = None,
  ) -> "PrefetchIntervalIterator":
    """`Begin`: an iterator over candidate prefetch start times for a use at `end` whose
    allocation may start at `start`, copying for `copy_elapsed` seconds; the use's op runs
    `use_elapsed_reduction` seconds faster with the operand in alternate memory (XLA:
    `GetInstructionElapsed` - `GetInstructionElapsedInAlternateMemory` of the use)."""
    window = self.window(copy_elapsed, start, end, use_elapsed_reduction, preferred_time)
    return PrefetchIntervalIterator(self, window, end)

  def start_times(
    self, copy_elapsed: float, start: int, end: int, use_elapsed_reduction: float = 0.0
  ) -> list[int]:
    """Every start `Next` yields, in order, until `Done`."""
    return self.start_time_array(copy_elapsed, start, end, use_elapsed_reduction).tolist()

  def start_time_array(
    self, copy_elapsed: float, start: int, end: int, use_elapsed_reduction: float = 0.0
  ) -> np.ndarray:
    """`start_times` as an int64 array, generated jitted (`begin`'s iteration: msa's
    decision process asks for them where it checks each start before its prefetch loop)."""
    window = self.start_window(copy_elapsed, start, end, use_elapsed_reduction)
    return _kernels().prefetch_starts(self.prefix, window, int(end), self.nest_state())

  def start_window(
    self, copy_elapsed: float, start: int, end: int, use_elapsed_reduction: float = 0.0
  ) -> tuple[int, int, int, int]:
    """What `start_time_array` walks, for `prefetch.plan_prefetch_starts` to walk as far as
    it needs: a `StartWindow`'s fields, as a plain tuple (kernels/__init__.py says why)."""
    explored = self.options.num_explored_decreasing_intervals
    if start >= -1:
      return (*self._jitted_window(copy_elapsed, start, end, use_elapsed_reduction), explored)
    window = self.window(copy_elapsed, start, end, use_elapsed_reduction)
    return window.earliest, window.latest, window.preferred, explored

  def kernel_state(self) -> tuple:
    """The picker as the jitted chunk search takes it (`live_lists.best_chunk_candidate_indexed`,
    for `can_allocate_in_alternate_memory_no_copy`): a `NoCopyBound`'s fields, as a plain
    tuple."""
    return (False, self.prefix, self.max_async_copy_elapsed, 0)


class PrefetchIntervalIterator:
  """XLA's `Next` / `Done`: the preferred start first, then alternately one later and one
  earlier; when the later side is used up, the earlier side is thinned so that each step moves
  at least 1/`num_explored_decreasing_intervals` of the window's elapsed time further back."""

  def __init__(self, picker: CostAnalysisPrefetchIntervalPicker, window: PrefetchWindow, end: int):
    self.picker = picker
    self.window = window
    self.end = end
    if window.empty:
      # Positioned so that `done` holds at once (XLA sets the iterators the same way).
      self._increasing, self._decreasing = window.earliest, window.latest
      self._use_increasing = True
      return
    self._increasing = self._decreasing = window.preferred
    self._use_increasing = True
    # XLA's Begin calls Next once, so that the two iterators no longer sit on the same start;
    # the start it returns is yielded again by the decreasing iterator's first step.
    self._step()

  @property
  def latest_time(self) -> int:
    """XLA's `latest_time()`: the latest start this iteration may yield."""
    return self.window.latest

  def done(self) -> bool:
    return self._increasing > self.window.latest and self._decreasing < self.window.earliest

  def next(self) -> int:
    if self.done():
      raise StopIteration("the prefetch interval picker is done")
    return self._step()

  def _other_level(self, time: int) -> bool:
    """Whether a start lies at another while nest level than the end (skipped, as XLA's `Next`
    skips another computation nest level)."""
    picker = self.picker
    return picker.loops and picker._start_levels[time + 1] != picker._nest.levels[0, self.end]

  def _step(self) -> int:
    w = self.window
    if self._use_increasing:
      time = self._increasing
      self._increasing += 1
      while self._increasing <= w.latest and self._other_level(self._increasing):
        self._increasing += 1
      if self._decreasing >= w.earliest:
        self._use_increasing = False
      return time
    time = self._decreasing
    self._decreasing -= 1
    target = 0.0
    if self._increasing > w.latest:
      picker = self.picker
      target = (
        picker.logical_interval_elapsed(time, self.end)
        + picker.logical_interval_elapsed(w.earliest, self.end)
        / picker.options.num_explored_decreasing_intervals
      )
    while self._decreasing >= w.earliest and (
      self._other_level(self._decreasing)
      or self.picker.logical_interval_elapsed(self._decreasing, self.end) < target
    ):
      self._decreasing -= 1
    if self._increasing <= w.latest:
      self._use_increasing = True
    return time

  def __iter__(self) -> Iterator[int]:
    while not self.done():
      yield self.next()


class InstructionCountPrefetchIntervalPicker:
  """XLA's `InstructionCountPrefetchIntervalPicker` (prefetch_interval_picker.cc): the picker
  most of `memory_space_assignment_test.cc` runs with (`AssignMemorySpace`'s default,
  min 2 / max 10 ops), where every op counts as one second. Same interface as
  `CostAnalysisPrefetchIntervalPicker` (the copy time and the use's saving are ignored), so that
  the assembled msa can reproduce XLA's tests that use it (NegateChain, EvictAndPrefetch, ...).

  * keep without a copy while the interval spans at most `max_overlap_count` ops;
  * prefetch starts from max(start, end - max_overlap_count), one op later each time, while at
    least `min_overlap_count` + 1 ops remain before the use (`Done`: end - t <= min);
  * an eviction ends `min_overlap_count` ops after its start (or at the latest end)."""

  # XLA's instruction-count picker knows nothing of loops: every op counts one.
  loops = False

  def __init__(self, min_overlap_count: int = 2, max_overlap_count: int = 10):
    self.min_overlap_count = int(min_overlap_count)
    self.max_overlap_count = int(max_overlap_count)

  def nest_state(self) -> None:
    """As `CostAnalysisPrefetchIntervalPicker.nest_state`: no loops for the kernels to read."""
    return None

  def logical_interval_elapsed(self, start: int, end: int) -> float:
    """`GetLogicalIntervalElapsed`: the ops strictly between, one second each."""
    return float(end - start - 1)

  def can_allocate_in_alternate_memory_no_copy(self, start: int, end: int) -> bool:
    return end - start <= self.max_overlap_count

  def preferred_eviction_end_time(self, copy_elapsed: float, start: int, latest_end: int) -> int:
    return min(start + self.min_overlap_count, latest_end)

  def latest_prefetch_start_time(
    self, copy_elapsed: float, start: int, end: int, use_elapsed_reduction: float = 0.0
  ) -> int:
    """XLA's `LatestPrefetchStartTime` (end - min), one more than `Next` ever yields."""
    return end - self.min_overlap_count

  def preferred_prefetch_start_time(
    self, copy_elapsed: float, earliest: int, latest: int, end: int
  ) -> int:
    return max(earliest, end - self.max_overlap_count)

  def estimated_prefetch_end_time(self, copy_elapsed: float, start: int, end: int) -> int:
    return end

  def begin(
    self,
    copy_elapsed: float,
    start: int,
    end: int,
    use_elapsed_reduction: float = 0.0,
    preferred_time: int | None = None,
  ) -> "InstructionCountIterator":
    first = (
      preferred_time
      if preferred_time is not None
      else self.preferred_prefetch_start_time(copy_elapsed, start, end, end)
    )
    return InstructionCountIterator(first, end, self.min_overlap_count)

  def start_times(
    self, copy_elapsed: float, start: int, end: int, use_elapsed_reduction: float = 0.0
  ) -> list[int]:
    return list(self.begin(copy_elapsed, start, end, use_elapsed_reduction))

  def start_time_array(
    self, copy_elapsed: float, start: int, end: int, use_elapsed_reduction: float = 0.0
  ) -> np.ndarray:
    """`start_times` as an int64 array: from the first start, one op later each time while
    more than `min_overlap_count` ops remain before the use."""
    first = self.preferred_prefetch_start_time(copy_elapsed, start, end, end)
    return np.arange(first, end - self.min_overlap_count, dtype=np.int64)

  def start_window(
    self, copy_elapsed: float, start: int, end: int, use_elapsed_reduction: float = 0.0
  ) -> tuple[int, int, int, int]:
    """As `CostAnalysisPrefetchIntervalPicker.start_window`: a window whose preferred start is
    its earliest walks up one op at a time, as `start_time_array`."""
    first = self.preferred_prefetch_start_time(copy_elapsed, start, end, end)
    return first, end - self.min_overlap_count - 1, first, 1

  def kernel_state(self) -> tuple:
    """As `CostAnalysisPrefetchIntervalPicker.kernel_state`: keeping without a copy is bounded
    by the op count alone."""
    return (True, np.zeros(1), 0.0, self.max_overlap_count)


class InstructionCountIterator:
  """`Next` / `Done` of the instruction-count picker: one op later each time."""

  def __init__(self, first: int, end: int, min_overlap_count: int):
    self._current = first
    self.end = end
    self.min_overlap_count = min_overlap_count

  @property
  def latest_time(self) -> int:
    return self.end - self.min_overlap_count - 1

  def done(self) -> bool:
    return self.end - self._current <= self.min_overlap_count

  def next(self) -> int:
    if self.done():
      raise StopIteration("the prefetch interval picker is done")
    self._current += 1
    return self._current - 1

  def __iter__(self) -> Iterator[int]:
    while not self.done():
      yield self.next()
