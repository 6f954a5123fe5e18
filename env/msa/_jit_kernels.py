"""Jitted (numba) kernels of msa's per-start checks: the chunk heap's best-fit search, the copy
resource's FIFO queue and check, the prefetch picker's window and start sequence, and the
prefetch loop over starts that combines them (`plan_prefetch_starts`).

Why: msa's decision process (`algorithm.py`, all options) runs these checks several times per
step, each over a few hundred ops or chunks; as numpy expressions their cost was mostly numpy's
per-call overhead (tens of small array operations per query), which kept the process near 2,800
decisions a second, under what the game needs (it now runs 15,000-22,000; docs/msa.md). Each
kernel computes exactly what the numpy code it replaces computes, with the same floating-point
operations in the same order (sequential cumulative sums, as `np.cumsum`; no fastmath), so that
no decision changes (tests/test_msa_parts.py checks them against XLA's cases and the picker's
against its numpy searches and iterator; the decision sequences were compared step by step
with the numpy code's).

Loaded on first use (`_jit.kernels()`), so that importing the solvers does not load numba;
compiled on the first use on a machine (about 5 s) and loaded from numba's cache beside this
file after that (`cache=True`, about 0.35 s with numba's import). The kernels take int64 /
float64 arrays and Python scalars only, as flat arguments: numba's dispatch types a tuple
argument element by element in Python, slower than the kernel runs.
"""

from __future__ import annotations

import numba
import numpy as np

_INT64_MAX = np.iinfo(np.int64).max


@numba.njit(cache=True)
def _live_sorted(starts, ends, offsets, sizes, alive, count, start, end, alignment):
  """The chunks live at some op of `[start, end)`, sorted by offset (stable): their offsets and
  ends rounded up to the alignment (`ChunkHeap.free_chunks`' used ranges)."""
  k = 0
  hit = np.empty(count, np.int64)
  for i in range(count):
    if alive[i] and starts[i] < end and start < ends[i]:
      hit[k] = i
      k += 1
  used_start = np.empty(k, np.int64)
  for j in range(k):
    used_start[j] = offsets[hit[j]]
  order = np.argsort(used_start, kind="mergesort")
  sorted_start = np.empty(k, np.int64)
  used_end = np.empty(k, np.int64)
  for j in range(k):
    i = hit[order[j]]
    sorted_start[j] = offsets[i]
    used_end[j] = (offsets[i] + sizes[i] + alignment - 1) // alignment * alignment
  return sorted_start, used_end


@numba.njit(cache=True)
def fits_at(starts, ends, offsets, sizes, alive, count, start, end, size, offset, alignment):
  """`ChunkHeap.fits_at` for an aligned, non-negative offset: inside one free range of
  `[start, end)` that holds `size` bytes."""
  used_start, used_end = _live_sorted(
    starts, ends, offsets, sizes, alive, count, start, end, alignment
  )
  reach = 0
  for j in range(len(used_start) + 1):
    free_start = reach
    free_end = used_start[j] if j < len(used_start) else _INT64_MAX
    if free_end - free_start >= size and free_start <= offset and offset + size <= free_end:
      return True
    if j < len(used_start) and used_end[j] > reach:
      reach = used_end[j]
  return False


@numba.njit(cache=True)
def best_fit(starts, ends, offsets, sizes, alive, count, start, end, size, alignment):
  """`ChunkHeap.find_chunk` without a preferred offset: the start of the smallest free range of
  `[start, end)` that holds `size` bytes, the lowest on a tie (the top range is unbounded)."""
  used_start, used_end = _live_sorted(
    starts, ends, offsets, sizes, alive, count, start, end, alignment
  )
  best_start, best_length = -1, _INT64_MAX
  reach = 0
  for j in range(len(used_start) + 1):
    free_start = reach
    free_end = used_start[j] if j < len(used_start) else _INT64_MAX
    length = free_end - free_start
    if length >= size and (
      best_start < 0 or length < best_length or (length == best_length and free_start < best_start)
    ):
      best_start, best_length = free_start, length
    if j < len(used_start) and used_end[j] > reach:
      reach = used_end[j]
  return best_start


@numba.njit(cache=True)
def resource_queue(budget, starts, demands):
  """`AsynchronousCopyResource._derive`'s queue `[T]` of the ordered copies: (owed `[C]`
  cumulative demand, arriving per op, work waiting after each op (Lindley's W), cumulative
  arrivals), as numpy's cumsum / bincount / minimum.accumulate compute them."""
  t, c = len(budget), len(starts)
  owed = np.empty(c, np.float64)
  total = 0.0
  for i in range(c):
    total += demands[i]
    owed[i] = total
  arriving = np.zeros(t, np.float64)
  top = max(t - 1, 0)
  for i in range(c):
    op = min(max(starts[i] + 1, 0), top)
    if op < t:
      arriving[op] += demands[i]
  waiting = np.empty(t, np.float64)
  arrived = np.empty(t, np.float64)
  balance, lowest, cumulative = 0.0, np.inf, 0.0
  for i in range(t):
    balance += arriving[i] - budget[i]
    if balance < lowest:
      lowest = balance
    waiting[i] = balance - min(0.0, lowest)
    cumulative += arriving[i]
    arrived[i] = cumulative
  return owed, arriving, waiting, arrived


@numba.njit(cache=True)
def resource_fits(
  budget,
  starts,
  ends,
  demands,
  arriving,
  arrived,
  waiting,
  owed,
  start,
  end,
  resource,
  relative_tolerance,
  total,
):
  """`AsynchronousCopyResource.has_enough_resource` for a copy that needs resource: the queue
  from its first op on with it arriving there (Lindley's recursion from the work waiting
  before); it must be served by its end, and every copy queued behind it (a later start) that
  needs resource by its own. `total`: the budgets' and demands' sum, for the tolerance."""
  t = len(budget)
  first = max(start + 1, 0)
  deadline = min(end - 1, t - 1)
  if deadline < first:
    return False
  behind = np.searchsorted(starts, start, side="right")
  waiting_before = waiting[first - 1] if first > 0 else 0.0
  tolerance = relative_tolerance * (total + resource)
  # The queue is needed up to the last deadline checked (all of it if one lies before `first`,
  # which numpy's negative indexing would read from the end).
  last = deadline
  for j in range(behind, len(demands)):
    if demands[j] > 0:
      d = min(ends[j] - 1, t - 1)
      last = t - 1 if d < first else max(last, d)
  served = np.empty(t - first, np.float64)
  balance = 0.0
  lowest = -waiting_before
  for i in range(first, last + 1):
    balance += arriving[i] - budget[i]
    shifted = balance + resource
    if shifted < lowest:
      lowest = shifted
    served[i - first] = arrived[i] + resource - (shifted - lowest)
  owed_before = owed[behind - 1] if behind else 0.0
  if served[deadline - first] < owed_before + resource - tolerance:
    return False
  for j in range(behind, len(demands)):
    if demands[j] > 0:
      d = min(ends[j] - 1, t - 1) - first
      if d < 0:
        d += len(served)  # numpy's negative indexing, as the array expression reads.
      if not served[d] >= owed[j] + resource - tolerance:
        return False
  return True


@numba.njit(cache=True)
def prefetch_window(
  prefix, copy_elapsed, start, end, use_elapsed_reduction, min_ratio, preferred_ratio, max_elapsed
):
  """`CostAnalysisPrefetchIntervalPicker.window` without a preferred time, for start >= -1:
  (earliest, latest, preferred); elapsed(s, end) = prefix[end] - prefix[s + 1]."""
  # LatestPrefetchStartTime: the latest s in [start, end) whose overlap (plus the use's saving)
  # covers min_ratio x the copy.
  min_interval = min_ratio * copy_elapsed
  latest = min(start, end) - 1
  for s in range(end - 1, max(start, -1) - 1, -1):
    if not min_interval > (prefix[end] - prefix[s + 1]) + use_elapsed_reduction:
      latest = s
      break
  earliest = start
  if earliest < latest:
    earliest = latest
    for s in range(start, latest):
      if not max_elapsed < prefix[end] - prefix[s + 1]:
        earliest = s
        break
  if earliest > latest:
    return earliest, latest, earliest
  if latest <= earliest:
    return earliest, latest, earliest
  # PreferredPrefetchStartTime: closest to preferred_ratio x the copy, the earliest on a tie.
  preferred_interval = preferred_ratio * copy_elapsed
  preferred, best = earliest, np.inf
  for s in range(earliest, latest + 1):
    distance = abs(preferred_interval - (prefix[end] - prefix[s + 1]))
    if distance < best:
      preferred, best = s, distance
  return earliest, latest, preferred


@numba.njit(cache=True)
def prefetch_starts(prefix, earliest, latest, preferred, end, num_explored):
  """Every start `PrefetchIntervalIterator` yields for a window (none when empty), in its order
  (XLA's `Next` until `Done`): the preferred start, then alternately one later and one earlier; once
  the later side is used up, the earlier side thinned to steps of at least 1/`num_explored` of
  the window's elapsed time. elapsed(s, end) = prefix[end] - prefix[s + 1] (every s < end)."""
  if earliest > latest:
    return np.zeros(0, np.int64)
  out = np.empty(latest - earliest + 1, np.int64)
  k = 0
  increasing = decreasing = preferred
  use_increasing = True
  first = True  # XLA's Begin calls Next once: that start is yielded again by the earlier side.
  while first or not (increasing > latest and decreasing < earliest):
    if use_increasing:
      time = increasing
      increasing += 1
      if decreasing >= earliest:
        use_increasing = False
    else:
      time = decreasing
      decreasing -= 1
      target = 0.0
      if increasing > latest:
        target = (prefix[end] - prefix[time + 1]) + (
          prefix[end] - prefix[earliest + 1]
        ) / num_explored
      while decreasing >= earliest and prefix[end] - prefix[decreasing + 1] < target:
        decreasing -= 1
      if increasing <= latest:
        use_increasing = True
    if not first:
      out[k] = time
      k += 1
    first = False
  return out[:k]


@numba.njit(cache=True)
def best_chunk_candidate(
  start,
  end_use,
  size,
  uses,
  max_size,
  h_start,
  h_end,
  h_offset,
  h_size,
  h_alive,
  h_count,
  alignment,
  count_picker,
  prefix,
  max_elapsed,
  max_count,
):
  """`chunks.find_best_chunk_candidate` without a preferred offset: (found, offset, end use).
  `h_start` .. `alignment`: `ChunkHeap.kernel_state()`; `count_picker` .. `max_count`: the
  picker's `kernel_state()`, for `can_allocate_in_alternate_memory_no_copy` between
  consecutive uses."""
  n = len(uses)
  first = np.searchsorted(uses, end_use, side="left")
  if first == n:
    raise ValueError("no use at or after the request's end")
  last = first
  while last + 1 < n:
    u, v = uses[last], uses[last + 1]
    if count_picker:
      keep = v - u <= max_count
    else:
      keep = max_elapsed > (0.0 if u == v else prefix[v] - prefix[u + 1])
    if not keep:
      break
    last += 1
  found, best_offset, best_use = False, 0, 0
  # std::lower_bound over uses[first : last + 1] with "the chunk fits" as the predicate.
  lo, count = first, last + 1 - first
  while count > 0:
    step = count // 2
    mid = lo + step
    use = uses[mid]
    offset = best_fit(
      h_start, h_end, h_offset, h_size, h_alive, h_count, start, use + 1, size, alignment
    )
    if offset + size <= max_size:
      if not found or use > best_use:
        found, best_offset, best_use = True, offset, use
      lo = mid + 1
      count -= step + 1
    else:
      count = step
  return found, best_offset, best_use


@numba.njit(cache=True)
def plan_prefetch_starts(
  starts,
  check_allowed,
  allowed,
  use,
  size,
  uses,
  max_size,
  max_starts,
  resource,
  check_resource,
  budget,
  q_starts,
  q_ends,
  demands,
  arriving,
  arrived,
  waiting,
  owed,
  rel_tol,
  total,
  h_start,
  h_end,
  h_offset,
  h_size,
  h_alive,
  h_count,
  alignment,
  count_picker,
  prefix,
  max_elapsed,
  max_count,
):
  """`SegmentAllocator._plan_level_prefetches`' loop (allocate_segment.py; XLA's
  `PrefetchWithResourceConstraints` and `CheckPrefetchFit`): over the picker's `starts` in
  order, skipping those not `allowed` (when `check_allowed`: the FIFO order and
  outstanding-limit checks, made by the caller), the copy resource (`budget` .. `total`:
  `AsynchronousCopyResource.kernel_state()`, when `check_resource`), then the chunk (`h_start`
  .. `max_count`: as `best_chunk_candidate`); the first `max_starts` that pass, as rows (start,
  offset, end use). A chunk failure caches the start and any start not after it ends the search
  (XLA's `exclusive_out_of_mem_start`)."""
  out = np.empty((max_starts, 3), np.int64)
  k = 0
  out_of_memory, out_of_memory_start = False, 0
  for i in range(len(starts)):
    start = starts[i]
    if out_of_memory and start <= out_of_memory_start:
      break  # An earlier start holds the chunk longer: it cannot fit either.
    if check_allowed and not allowed[i]:
      continue
    if (
      check_resource
      and resource != 0
      and not resource_fits(
        budget,
        q_starts,
        q_ends,
        demands,
        arriving,
        arrived,
        waiting,
        owed,
        start,
        use,
        resource,
        rel_tol,
        total,
      )
    ):
      continue
    found, offset, end_use = best_chunk_candidate(
      start + 1,
      use,
      size,
      uses,
      max_size,
      h_start,
      h_end,
      h_offset,
      h_size,
      h_alive,
      h_count,
      alignment,
      count_picker,
      prefix,
      max_elapsed,
      max_count,
    )
    if not found:
      out_of_memory_start = max(out_of_memory_start, start) if out_of_memory else start
      out_of_memory = True
      continue
    out[k, 0], out[k, 1], out[k, 2] = start, offset, end_use
    k += 1
    if k == max_starts:
      break
  return out[:k]


@numba.njit(cache=True)
def window_starts(
  prefix,
  copy_elapsed,
  start,
  end,
  use_elapsed_reduction,
  min_ratio,
  preferred_ratio,
  max_elapsed,
  num_explored,
):
  """`prefetch_window` then `prefetch_starts`: `begin`'s whole iteration in one call."""
  earliest, latest, preferred = prefetch_window(
    prefix, copy_elapsed, start, end, use_elapsed_reduction, min_ratio, preferred_ratio, max_elapsed
  )
  return prefetch_starts(prefix, earliest, latest, preferred, end, num_explored)
