"""The prefetch picker's window and start sequence (env/msa/interval_picker.py's
`CostAnalysisPrefetchIntervalPicker`), and the prefetch loop over starts that combines them with
the copy resource's trees and the chunk heap (`plan_prefetch_starts`, for
env/msa/allocate_segment.py's `SegmentAllocator`).

The picker's rule travels as a `WindowRule`'s fields, a window as a `StartWindow`'s, a prefetch
as a `PrefetchRequest`'s (interval_picker.py, allocate_segment.py; the package docstring says why
plain tuples). A program with loops adds its `WhileNest`'s fields (`nest`, the picker's
`nest_state()`; interval_picker.py's "Loops"): elapsed times divided by the smallest level's
multiplier, and only starts at the end's while nest level. Without loops `nest` is None and the
kernels run their flat code, compiled without the loop branches.
"""

from __future__ import annotations

import numpy as np

from malloczero.env.kernel_cache import njit
from malloczero.env.msa.allocate_segment import PrefetchRequest
from malloczero.env.msa.interval_picker import StartWindow, WhileNest, WindowRule
from malloczero.env.msa.kernels.copy_trees import copy_trees, fits_tree
from malloczero.env.msa.kernels.live_lists import chunk_candidate, heap_search, no_copy_bound
from malloczero.env.msa.kernels.shared import nested_elapsed, while_level

# What `_next_start` returns once a window's starts are used up.
NO_START = -(1 << 62)


@njit
def prefetch_window(rule, copy_elapsed, start, end, use_elapsed_reduction, nest=None):
  """`CostAnalysisPrefetchIntervalPicker.window` without a preferred time, for start >= -1:
  (earliest, latest, preferred); elapsed(s, end) = prefix[end] - prefix[s + 1] (`rule`:
  `WindowRule`' fields). `monotone`: no op has a negative elapsed time, so elapsed(s, end) never
  grows with s and each search bisects (the same answers as the scans, which run otherwise).
  `nest`: a program's loops (`_nested_window`), None without."""
  rule = WindowRule(*rule)
  if nest is not None:
    return _nested_window(rule, WhileNest(*nest), copy_elapsed, start, end, use_elapsed_reduction)
  if not rule.monotone:
    return _window_scan(rule, copy_elapsed, start, end, use_elapsed_reduction)
  prefix = rule.prefix
  # LatestPrefetchStartTime: the latest s in [start, end) whose overlap (plus the use's saving)
  # covers min_ratio x the copy (true up to some s, then false).
  min_interval = rule.min_ratio * copy_elapsed
  latest = min(start, end) - 1
  lo, hi = max(start, -1), end - 1
  if lo <= hi and not min_interval > (prefix[end] - prefix[lo + 1]) + use_elapsed_reduction:
    while lo < hi:
      mid = (lo + hi + 1) // 2
      if not min_interval > (prefix[end] - prefix[mid + 1]) + use_elapsed_reduction:
        lo = mid
      else:
        hi = mid - 1
    latest = lo
  # The earliest s in [start, latest) whose overlap is within max_elapsed (false, then true).
  earliest = start
  if earliest < latest:
    earliest = latest
    lo, hi = start, latest  # hi: none is.
    while lo < hi:
      mid = (lo + hi) // 2
      if not rule.max_elapsed < prefix[end] - prefix[mid + 1]:
        hi = mid
      else:
        lo = mid + 1
    earliest = lo
  if earliest > latest:
    return earliest, latest, earliest
  if latest <= earliest:
    return earliest, latest, earliest
  # PreferredPrefetchStartTime: closest to preferred_ratio x the copy, the earliest on a tie.
  # The distance never grows up to the last s whose elapsed reaches the target (`below` - 1),
  # and never shrinks from `below` on: the earliest of the left side's ties, or `below`.
  preferred_interval = rule.preferred_ratio * copy_elapsed
  lo, hi = earliest, latest + 1
  while lo < hi:
    mid = (lo + hi) // 2
    if prefix[end] - prefix[mid + 1] < preferred_interval:
      hi = mid
    else:
      lo = mid + 1
  below = lo
  if below == earliest:
    return earliest, latest, earliest
  left = abs(preferred_interval - (prefix[end] - prefix[below]))  # At s = below - 1.
  lo, hi = earliest, below - 1
  while lo < hi:
    mid = (lo + hi) // 2
    if abs(preferred_interval - (prefix[end] - prefix[mid + 1])) <= left:
      hi = mid
    else:
      lo = mid + 1
  preferred = lo
  if below <= latest and abs(preferred_interval - (prefix[end] - prefix[below + 1])) < left:
    preferred = below
  return earliest, latest, preferred


@njit
def prefetch_window_scan(rule, copy_elapsed, start, end, use_elapsed_reduction):
  """`prefetch_window` by scanning the ops, for any elapsed times."""
  return _window_scan(WindowRule(*rule), copy_elapsed, start, end, use_elapsed_reduction)


@njit
def _window_scan(rule, copy_elapsed, start, end, use_elapsed_reduction):
  prefix = rule.prefix
  # LatestPrefetchStartTime: the latest s in [start, end) whose overlap (plus the use's saving)
  # covers min_ratio x the copy.
  min_interval = rule.min_ratio * copy_elapsed
  latest = min(start, end) - 1
  for s in range(end - 1, max(start, -1) - 1, -1):
    if not min_interval > (prefix[end] - prefix[s + 1]) + use_elapsed_reduction:
      latest = s
      break
  earliest = start
  if earliest < latest:
    earliest = latest
    for s in range(start, latest):
      if not rule.max_elapsed < prefix[end] - prefix[s + 1]:
        earliest = s
        break
  if earliest > latest:
    return earliest, latest, earliest
  if latest <= earliest:
    return earliest, latest, earliest
  # PreferredPrefetchStartTime: closest to preferred_ratio x the copy, the earliest on a tie.
  preferred_interval = rule.preferred_ratio * copy_elapsed
  preferred, best = earliest, np.inf
  for s in range(earliest, latest + 1):
    distance = abs(preferred_interval - (prefix[end] - prefix[s + 1]))
    if distance < best:
      preferred, best = s, distance
  return earliest, latest, preferred


@njit
def _nested_window(rule, nest, copy_elapsed, start, end, use_elapsed_reduction):
  """`prefetch_window` of a program with loops (`nest`: a `WhileNest`), XLA's `Begin` as the
  Python picker's `window` makes it: elapsed times from `nested_elapsed`, and latest, earliest
  and the preferred start's rivals only at the end's while nest level. Still monotone in s (a
  wider interval adds ops and can only lower the smallest level, W >= 1), so each search bisects
  over every start, then steps to the nearest start at the end's level: as far as the ops
  between, at most a loop's."""
  prefix, levels = rule.prefix, nest.levels
  level = levels[0, end]
  # LatestPrefetchStartTime: the latest s at the end's level whose overlap (plus the use's
  # saving) covers min_ratio x the copy.
  min_interval = rule.min_ratio * copy_elapsed
  lo = max(start, -1)
  reduction = use_elapsed_reduction
  s = end - 1
  if rule.monotone:  # The rule holds up to some s: that s, then down to the end's level.
    s, hi = lo - 1, end - 1
    if lo <= hi and not min_interval > nested_elapsed(prefix, nest, lo, end) + reduction:
      while lo < hi:
        mid = (lo + hi + 1) // 2
        if not min_interval > nested_elapsed(prefix, nest, mid, end) + reduction:
          lo = mid
        else:
          hi = mid - 1
      s = lo
    lo = max(start, -1)
  latest = min(start, end) - 1
  while s >= lo:
    if while_level(levels, s) == level and (
      rule.monotone or not min_interval > nested_elapsed(prefix, nest, s, end) + reduction
    ):
      latest = s
      break
    s -= 1
  # The earliest s in [start, latest) at the end's level whose overlap is within max_elapsed;
  # latest when none is.
  earliest = start
  if earliest < latest:
    s = start
    if rule.monotone:  # False, then true: the first s where it holds.
      lo, hi = start, latest
      while lo < hi:
        mid = (lo + hi) // 2
        if not rule.max_elapsed < nested_elapsed(prefix, nest, mid, end):
          hi = mid
        else:
          lo = mid + 1
      s = lo
    earliest = latest
    while s < latest:
      if while_level(levels, s) == level and (
        rule.monotone or not rule.max_elapsed < nested_elapsed(prefix, nest, s, end)
      ):
        earliest = s
        break
      s += 1
  if earliest >= latest:
    return earliest, latest, earliest
  # PreferredPrefetchStartTime: earliest, then the starts at the end's level in (earliest,
  # latest], the closest to preferred_ratio x the copy winning (the earlier on a tie). Earliest is
  # at the end's level here (found so, or latest).
  preferred_interval = rule.preferred_ratio * copy_elapsed
  if not rule.monotone:
    preferred = earliest
    best = abs(preferred_interval - nested_elapsed(prefix, nest, earliest, end))
    for s in range(earliest + 1, latest + 1):
      if while_level(levels, s) == level:
        distance = abs(preferred_interval - nested_elapsed(prefix, nest, s, end))
        if distance < best:
          preferred, best = s, distance
    return earliest, latest, preferred
  # As the flat search: the distance never grows up to `below` - 1 (the last s whose elapsed
  # reaches the target) and never shrinks from `below` on; over the starts at the end's level,
  # the left side's best is its last such start (or an earlier one at the same distance), the
  # right side's its first.
  lo, hi = earliest, latest + 1
  while lo < hi:
    mid = (lo + hi) // 2
    if nested_elapsed(prefix, nest, mid, end) < preferred_interval:
      hi = mid
    else:
      lo = mid + 1
  below = lo
  if below == earliest:
    return earliest, latest, earliest
  last = below - 1
  while while_level(levels, last) != level:
    last -= 1
  left = abs(preferred_interval - nested_elapsed(prefix, nest, last, end))
  lo, hi = earliest, last
  while lo < hi:
    mid = (lo + hi) // 2
    if abs(preferred_interval - nested_elapsed(prefix, nest, mid, end)) <= left:
      hi = mid
    else:
      lo = mid + 1
  preferred = lo
  while while_level(levels, preferred) != level:
    preferred += 1
  right = below
  while right <= latest and while_level(levels, right) != level:
    right += 1
  if right <= latest and abs(preferred_interval - nested_elapsed(prefix, nest, right, end)) < left:
    preferred = right
  return earliest, latest, preferred


@njit
def _first_start(window, state, end=0, nest=None):
  """Sets `state` [3] (next later start, next earlier start, whether the later side is next) to
  a window's first (`window`: a `StartWindow`): XLA's `Begin` calls `Next` once, taking the
  preferred start from the later side, and the earlier side yields it again. With loops
  (`nest`), the later side moves on to the next start at the level of the use at `end`."""
  earliest, latest, preferred = window.earliest, window.latest, window.preferred
  state[0], state[1] = preferred + 1, preferred
  state[2] = 0 if preferred >= earliest else 1
  if earliest > latest:
    state[0], state[1] = latest + 1, earliest - 1
  elif nest is not None:
    levels = WhileNest(*nest).levels
    while state[0] <= latest and while_level(levels, state[0]) != levels[0, end]:
      state[0] += 1


@njit
def _next_start(prefix, window, end, state, nest=None):
  """The next start `PrefetchIntervalIterator` yields (XLA's `Next`), or `NO_START` once it is
  `Done`: alternately one later and one earlier than the preferred start; once the later side is
  used up, the earlier side thinned to steps of at least 1/`num_explored` of the window's
  elapsed time. elapsed(s, end) = prefix[end] - prefix[s + 1] (every s < end); `prefix` is read
  only while earlier starts remain. With loops (`nest`), `_next_nested_start`."""
  if nest is not None:
    return _next_nested_start(prefix, WhileNest(*nest), window, end, state)
  earliest, latest = window.earliest, window.latest
  increasing, decreasing = state[0], state[1]
  if increasing > latest and decreasing < earliest:
    return NO_START
  if state[2]:
    time = increasing
    state[0] = increasing + 1
    if decreasing >= earliest:
      state[2] = 0
    return time
  time = decreasing
  decreasing -= 1
  if decreasing >= earliest:
    target = 0.0
    if increasing > latest:
      target = (prefix[end] - prefix[time + 1]) + (
        prefix[end] - prefix[earliest + 1]
      ) / window.num_explored
    while decreasing >= earliest and prefix[end] - prefix[decreasing + 1] < target:
      decreasing -= 1
  state[1] = decreasing
  if increasing <= latest:
    state[2] = 1
  return time


@njit
def _next_nested_start(prefix, nest, window, end, state):
  """`_next_start` with loops (`nest`: a `WhileNest`), as XLA's `Next`: each side skips the
  starts at another while nest level than the end's, and the thinning reads `nested_elapsed`."""
  earliest, latest = window.earliest, window.latest
  increasing, decreasing = state[0], state[1]
  if increasing > latest and decreasing < earliest:
    return NO_START
  levels = nest.levels
  level = levels[0, end]
  if state[2]:
    time = increasing
    increasing += 1
    while increasing <= latest and while_level(levels, increasing) != level:
      increasing += 1
    state[0] = increasing
    if decreasing >= earliest:
      state[2] = 0
    return time
  time = decreasing
  decreasing -= 1
  if decreasing >= earliest:
    target = 0.0
    if increasing > latest:
      target = (
        nested_elapsed(prefix, nest, time, end)
        + nested_elapsed(prefix, nest, earliest, end) / window.num_explored
      )
    while decreasing >= earliest and (
      while_level(levels, decreasing) != level
      or nested_elapsed(prefix, nest, decreasing, end) < target
    ):
      decreasing -= 1
  state[1] = decreasing
  if increasing <= latest:
    state[2] = 1
  return time


@njit
def prefetch_starts(prefix, window, end, nest=None):
  """Every start `PrefetchIntervalIterator` yields for a window (`StartWindow`' fields; none
  when empty), in its order (XLA's `Next` until `Done`, `_next_start`; `nest`: a program's
  loops, None without)."""
  window = StartWindow(*window)
  if window.earliest > window.latest:
    return np.zeros(0, np.int64)
  out = np.empty(window.latest - window.earliest + 1, np.int64)
  state = np.empty(3, np.int64)
  _first_start(window, state, end, nest)
  k = 0
  while True:
    time = _next_start(prefix, window, end, state, nest)
    if time == NO_START:
      return out[:k]
    out[k] = time
    k += 1


@njit
def plan_prefetch_starts(window, request, trees, index, lists, chunks, scratch, picker, nest=None):
  """`SegmentAllocator._plan_level_prefetches`' loop (allocate_segment.py; XLA's
  `PrefetchWithResourceConstraints` and `CheckPrefetchFit`): `plan_starts` on the picker's window
  (`StartWindow`' fields), a `PrefetchRequest`'s fields, the copy resource's trees
  (`AsynchronousCopyResource.kernel_state()`), the heap (`index` .. `scratch`:
  `ChunkHeap.search_state()`), the picker's `kernel_state()` and `nest_state()`."""
  return plan_starts(
    StartWindow(*window),
    PrefetchRequest(*request),
    copy_trees(trees),
    heap_search(index, lists, chunks, scratch),
    no_copy_bound(picker),
    nest,
  )


@njit
def plan_starts(window, request, trees, heap, picker, nest=None):
  """The prefetch loop over the picker's starts for the window (a `StartWindow`:
  `prefetch_starts`' order, each made only when the loop gets to it), skipping those not
  `allowed` (by position; when `check_allowed`: the FIFO order and outstanding-limit checks, made
  by the caller), the copy resource (`trees`, a `CopyTrees`, when `check_resource`), then the
  chunk (`heap`, a `HeapSearch`; `picker`, a `NoCopyBound`: as `chunk_candidate`); the first
  `max_starts` that pass, as rows (start, offset, end use). `request`: a `PrefetchRequest`. A
  chunk failure caches the start and any start not after it ends the search (XLA's
  `exclusive_out_of_mem_start`). `nest`: the program's loops (the picker's `nest_state()`)."""
  use, resource = request.use, request.resource
  check_resource = request.check_resource and resource != 0
  out = np.empty((request.max_starts, 3), np.int64)
  k = 0
  out_of_memory, out_of_memory_start = False, 0
  state = np.empty(3, np.int64)
  _first_start(window, state, use, nest)
  i = -1
  while True:
    start = _next_start(picker.prefix, window, use, state, nest)
    if start == NO_START:
      break
    i += 1
    if out_of_memory and start <= out_of_memory_start:
      break  # An earlier start holds the chunk longer: it cannot fit either.
    if request.check_allowed and not request.allowed[i]:
      continue
    if check_resource and not fits_tree(trees, start, use, resource):
      continue
    found, offset, end_use = chunk_candidate(
      heap, picker, start + 1, use, request.size, request.uses, request.max_size, nest
    )
    if not found:
      out_of_memory_start = max(out_of_memory_start, start) if out_of_memory else start
      out_of_memory = True
      continue
    out[k, 0], out[k, 1], out[k, 2] = start, offset, end_use
    k += 1
    if k == request.max_starts:
      break
  return out[:k]
