"""`Placement.place_where_it_saves_most` over a run of requests, jitted (numba): evo's decode.

Why: a decode places every request of a program, and in Python each placement costs about
0.1 ms of numpy calls (the saving per level, the free gaps, the incremental cost and the copy
queue's re-simulation), so a decode of a 6,000-request training step took 0.6 s and evo got a
dozen decodes within a 10 s limit. Here the same rules run as one loop per run of requests, and
the copies' stall is kept by the simulator's `StallTracker` kernels (env/simulator_kernels.py)
instead of re-simulating the whole queue after each placement.

The rules are `Placement`'s (env/placement.py), step for step: a request blocked by a placed
request of its buffer stays slow; otherwise the levels are tried in the order of their estimated
saving (`CostModel.saving_per_fast_level`), stopping at the first that saves nothing; in the
first with room, at the best-fit offset (the smallest free gap that holds it, the lowest of
equal ones), it is placed and kept only if the exact program time falls by more than rounding
(`Placement.min_saving`). The program time is the same quantity summed in another order (loops
here, numpy's pairwise sums there): the two agree to rounding, and so place alike
(tests/test_placement_kernels.py). Compiled with env/kernel_cache.py's `njit`.
"""

from __future__ import annotations

import numpy as np

from malloczero.env.kernel_cache import njit
from malloczero.env.simulator import DIRTY_FROM, LAST_IDLE
from malloczero.env.simulator_kernels import queue_insert, queue_remove, queue_stall


@njit
def _set_idle(state, op, idle_s):
  """`StallTracker.set_idle` inside a kernel (`state`: a `TrackerState`'s fields)."""
  idle, meta = state[1], state[2]
  if idle[op] != idle_s:
    idle[op] = idle_s
    meta[DIRTY_FROM] = min(meta[DIRTY_FROM], op)
    meta[LAST_IDLE] = max(meta[LAST_IDLE], op)


@njit
def _best_fit(rects, count, level, capacity, start, end, size, low_scratch, high_scratch):
  """`Placement.best_fit`: the start of the smallest free gap of `level` throughout ops
  `[start, end)` that holds `size` bytes (ties: the lowest), or -1."""
  rect_start, rect_end, rect_low, rect_high = rects
  n = 0
  for i in range(count[level]):
    if rect_start[level, i] < end and rect_end[level, i] > start:
      low_scratch[n] = rect_low[level, i]
      high_scratch[n] = rect_high[level, i]
      n += 1
  order = np.argsort(low_scratch[:n], kind="mergesort")
  best, best_gap = -1, np.int64(-1)
  covered = np.int64(0)
  for k in range(n + 1):
    gap_high = low_scratch[order[k]] if k < n else capacity[level]
    gap = gap_high - covered
    if gap > 0 and gap >= size and (best < 0 or gap < best_gap):
      best, best_gap = covered, gap
    if k < n:
      covered = max(covered, high_scratch[order[k]])
  return best


@njit
def place_in_order(
  order,
  requests,
  incidence,
  costs,
  times,
  rects,
  count,
  copies,
  placed,
  buffer_requests,
  tracker,
  sums,
  counts,
  exclusive,
  min_saving,
  scratch,
):
  """Places each request of `order` where it saves most, as `Placement.place_where_it_saves_most`
  with best fit, updating the state in place.

  Arguments (plain tuples of arrays, each in the order named):
  * `requests`: start, end, size, buffer, first_use, evict_start, evict_done `[R]` int64,
    is_prefetch and evicts `[R]` bool, exposed copy time `[R]` float64;
  * `incidence`: CSR offsets `[R + 1]`, ops `[E]`, bytes `[E]`;
  * `costs`: compute time `[T]`, inverse bandwidths `[L]`, copy time per buffer `[N]`, fast
    capacities `[F]` int64;
  * `times`: memory time, default-memory time, op time `[T]` (Placement's);
  * `rects`: start, end, low, high `[F, R]` int64; `count` `[F]` in use per level;
  * `copies`: start, done `[R]` int64, work `[R]` float64 (a copy's tracker id is its request);
  * `placed`: rows (request, level, offset) `[R, 3]` and a placed flag `[R]` bool;
  * `buffer_requests`: CSR offsets per buffer `[N + 1]` and request ids `[R]`;
  * `tracker`: a `StallTracker`'s copies, jumps and state tuples;
  * `sums`: op time sum, stall time, total time (float64 `[3]`); `counts`: copies, placed;
  * `min_saving`: the seconds a kept placement must save (`Placement.min_saving`);
  * `scratch`: int64 `[R]` twice, float64 `[max ops per request]` three times.
  """
  start, end, size, buffer, first_use, evict_start, evict_done, is_prefetch, evicts, exposed = (
    requests
  )
  inc_start, inc_op, inc_bytes = incidence
  compute, inverse_bandwidth, copy_time, capacity = costs
  memory_time, default_time, op_time = times
  copy_start, copy_done, copy_work = copies
  rows, is_placed = placed
  by_buffer_start, by_buffer = buffer_requests
  tracked, jumps, state = tracker
  low_scratch, high_scratch, old_memory, old_op, old_default = scratch
  num_fast = len(capacity)
  slow = inverse_bandwidth[len(inverse_bandwidth) - 1]
  saving = np.empty(num_fast)
  for r in order:
    if exclusive:
      b = buffer[r]
      blocked = False
      for k in range(by_buffer_start[b], by_buffer_start[b + 1]):
        other = by_buffer[k]
        if is_placed[other] and start[other] < end[r] and end[other] > start[r]:
          blocked = True
          break
      if blocked:
        continue
    lo, hi = inc_start[r], inc_start[r + 1]
    for f in range(num_fast):
      per_byte = slow - inverse_bandwidth[f]
      total = 0.0
      for e in range(lo, hi):
        op = inc_op[e]
        total += op_time[op] - max(compute[op], memory_time[op] - inc_bytes[e] * per_byte)
      saving[f] = total - exposed[r]
    for level in np.argsort(-saving, kind="mergesort"):
      if saving[level] <= 0:
        break
      offset = _best_fit(
        rects, count, level, capacity, start[r], end[r], size[r], low_scratch, high_scratch
      )
      if offset < 0:
        continue
      # Place: the ops' times, the copy (a prefetch, or an eviction of its own value), the stall.
      per_byte = slow - inverse_bandwidth[level]
      op_saved = 0.0
      for e in range(lo, hi):
        op, i = inc_op[e], e - lo
        old_memory[i], old_op[i], old_default[i] = memory_time[op], op_time[op], default_time[op]
        memory_time[op] -= inc_bytes[e] * per_byte
        new_time = max(compute[op], memory_time[op])
        op_saved += op_time[op] - new_time
        op_time[op] = new_time
        default_time[op] -= inc_bytes[e] * slow
        _set_idle(state, op, max(op_time[op] - default_time[op], 0.0))
      before_sum, before_stall, before_total = sums[0], sums[1], sums[2]
      sums[0] -= op_saved
      k = counts[0]
      has_copy = is_prefetch[r] or evicts[r]
      if has_copy:
        copy_start[k] = start[r] if is_prefetch[r] else evict_start[r]
        copy_done[k] = first_use[r] if is_prefetch[r] else evict_done[r]
        copy_work[k] = copy_time[buffer[r]]
        queue_insert(tracked, state, copy_start[k], copy_done[k], copy_work[k], r)
        counts[0] = k + 1
      # As Placement.place: with no stall and no new copy, a placement leaves no stall.
      if counts[0] > 0 and (has_copy or sums[1] > 0):
        sums[1] = queue_stall(tracked, jumps, state)
      sums[2] = sums[0] + sums[1]
      if before_total - sums[2] > min_saving:
        i = count[level]
        rects[0][level, i], rects[1][level, i] = start[r], end[r]
        rects[2][level, i], rects[3][level, i] = offset, offset + size[r]
        count[level] = i + 1
        n = counts[1]
        rows[n, 0], rows[n, 1], rows[n, 2] = r, level, offset
        counts[1] = n + 1
        is_placed[r] = True
        break
      # It does not pay under contention: take it back and leave it slow.
      for e in range(lo, hi):
        op, i = inc_op[e], e - lo
        memory_time[op], op_time[op], default_time[op] = old_memory[i], old_op[i], old_default[i]
        _set_idle(state, op, max(op_time[op] - default_time[op], 0.0))
      if has_copy:
        queue_remove(tracked, state, copy_start[k], copy_done[k], r)
        counts[0] = k
      sums[0], sums[1], sums[2] = before_sum, before_stall, before_total
      break
