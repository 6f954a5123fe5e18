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

Not modelled, and why: computation and while nesting (`computation_nest_level_`,
`while_nest_level_`, `GetMinWhileNestLevel`: this project's schedules are flat, no op sits in a
called computation, so every start time is at the end's nest level and the while multiplier is
1; XLA's tests `PrefetchIntervalOrderWhile`, `NestedWhile` and `ConsecutiveConditionals` have
no counterpart); `size_override` (no sliced prefetch, whose slices share one picker);
`SetRetryNumber` (retries are off by default, `max_retries` 1, so the retry number is 0);
`strict_timing` with a preferred time (used only by window prefetch and sliced prefetch).
"""

from __future__ import annotations

import dataclasses
from typing import Iterator, NamedTuple

import numpy as np

from malloczero.common.lazy import lazy_module
from malloczero.env.msa.cost_analysis import CostAnalysis

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


class CostAnalysisPrefetchIntervalPicker:
  """The picker over fixed per-op elapsed times `[T]` (XLA: `GetInstructionElapsed`, everything
  in default memory).

  `memory_copy_elapsed` is the time to copy the whole alternate memory (XLA:
  `GetAsyncCopyElapsed(mem_size_bytes)`); `max_overlap_to_mem_size_async_copy_ratio` times it is
  the longest interval a buffer may sit in alternate memory (`max_async_copy_elapsed_`).
  `from_cost_analysis` builds one from a `CostAnalysis` and the alternate memory's size."""

  def __init__(
    self,
    op_elapsed: np.ndarray,
    memory_copy_elapsed: float,
    options: PrefetchIntervalOptions = PrefetchIntervalOptions(),
  ):
    self.op_elapsed = np.asarray(op_elapsed, np.float64)  # [T]
    self.options = options
    self.num_ops = len(self.op_elapsed)
    self.prefix = np.concatenate([[0.0], np.cumsum(self.op_elapsed)])  # [T + 1]
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
      cost_analysis.elapsed, cost_analysis.async_copy_elapsed(mem_size_bytes // 4 * 4), options
    )

  # ----------------------------------------------------------------- elapsed times

  def logical_interval_elapsed(self, start: int, end: int) -> float:
    """`GetLogicalIntervalElapsed`: elapsed time of the ops strictly between start and end."""
    if start > end:
      raise ValueError(f"interval ({start}, {end}) ends before it starts")
    if start == end:
      return 0.0
    return float(self.prefix[end] - self.prefix[start + 1])

  def _elapsed_to(self, starts: np.ndarray, end: int) -> np.ndarray:
    """`[k]` elapsed(s, end) for starts `[k]`, each < end."""
    return self.prefix[end] - self.prefix[starts + 1]

  def can_allocate_in_alternate_memory_no_copy(self, start: int, end: int) -> bool:
    """`CanAllocateInAlternateMemoryNoCopy`: false when the interval's elapsed time reaches
    max_ratio x the whole memory's copy time (the "live range too long" rule)."""
    return self.max_async_copy_elapsed > self.logical_interval_elapsed(start, end)

  def preferred_eviction_end_time(self, copy_elapsed: float, start: int, latest_end: int) -> int:
    """`PreferredEvictionEndTime` (retry 0): the first end after `start` whose elapsed time
    covers preferred_ratio x the copy time, else latest_end + 1 (XLA's loop runs past)."""
    target = self.options.preferred_overlap_to_async_copy_ratio * copy_elapsed
    if self.monotone and -1 <= start < latest_end <= self.num_ops:
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
      ok = (self.prefix[ends] - self.prefix[start + 1]) >= target
      if ok.any():
        return int(ends[np.argmax(ok)])
    return max(start + 1, latest_end + 1)

  def estimated_prefetch_end_time(self, copy_elapsed: float, start: int, end: int) -> int:
    """`EstimatedPrefetchEndTime`: the first time after `start` by which the copy, started at
    `start`, would be done; `end` if it never is before it."""
    ends = np.arange(start + 1, end)
    if len(ends):
      ok = (self.prefix[ends] - self.prefix[start + 1]) >= copy_elapsed
      if ok.any():
        return int(ends[np.argmax(ok)])
    return max(start + 1, end)

  # ----------------------------------------------------------------- the window

  def latest_prefetch_start_time(
    self, copy_elapsed: float, start: int, end: int, use_elapsed_reduction: float = 0.0
  ) -> int:
    """`LatestPrefetchStartTime`: the latest t in [start, end) with elapsed(t, end) + the use's
    elapsed reduction >= min_ratio x copy time; start - 1 when there is none."""
    min_interval = self.options.min_overlap_to_async_copy_ratio * copy_elapsed
    starts = np.arange(max(start, -1), end)
    if len(starts):
      ok = ~(min_interval > self._elapsed_to(starts, end) + use_elapsed_reduction)
      if ok.any():
        return int(starts[len(starts) - 1 - np.argmax(ok[::-1])])
    return min(start, end) - 1

  def preferred_prefetch_start_time(
    self, copy_elapsed: float, earliest: int, latest: int, end: int
  ) -> int:
    """`PreferredPrefetchStartTime`: in [earliest, latest], the start whose elapsed time to
    `end` is closest to preferred_ratio x copy time; the earliest such on a tie."""
    if latest <= earliest:
      return earliest
    preferred_interval = self.options.preferred_overlap_to_async_copy_ratio * copy_elapsed
    starts = np.arange(earliest, latest + 1)
    distance = np.abs(preferred_interval - self._elapsed_to(starts, end))
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
    given and not after latest)."""
    if preferred_time is None and start >= -1:
      return PrefetchWindow(*self._jitted_window(copy_elapsed, start, end, use_elapsed_reduction))
    latest = self.latest_prefetch_start_time(copy_elapsed, start, end, use_elapsed_reduction)
    earliest = start
    if earliest < latest:
      starts = np.arange(start, latest)
      within = ~(self.max_async_copy_elapsed < self._elapsed_to(starts, end))
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
      rule, float(copy_elapsed), int(start), int(end), float(use_elapsed_reduction)
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
    return _kernels().prefetch_starts(self.prefix, window, int(end))

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

  def _step(self) -> int:
    w = self.window
    if self._use_increasing:
      time = self._increasing
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
    while (
      self._decreasing >= w.earliest
      and self.picker.logical_interval_elapsed(self._decreasing, self.end) < target
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

  def __init__(self, min_overlap_count: int = 2, max_overlap_count: int = 10):
    self.min_overlap_count = int(min_overlap_count)
    self.max_overlap_count = int(max_overlap_count)

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
