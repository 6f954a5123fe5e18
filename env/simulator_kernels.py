"""The simulator's jitted (numba) copy-queue loops: the total stall of a set of copies
(env/simulator.py's `total_stall_loop`), and the same kept up to date as copies and idle times
change a few at a time (`StallTracker`, which the msa game updates after every step).

Why: the game steps at least 10,000 times a second (`malloczero bench`); rebuilding a `CopyQueue`
per step in numpy costs mostly numpy's per-call overhead, and re-simulating the whole queue per
step (sort, then a pass over every op) most of a step on a large program. Loaded on first use
(`lazy_module` in env/simulator.py), so that `import malloczero` does not load numba; compiled
with env/kernel_cache.py's `njit` on a machine's first use and read from the cache beside this
file after that. The tracker's arrays travel as plain tuples in the order of env/simulator.py's
named tuples, of at most four arrays each (env/msa/kernels/__init__.py says why).
"""

from __future__ import annotations

import numpy as np

from malloczero.env.kernel_cache import njit
from malloczero.env.simulator import (
  COPIES_CHANGED,
  COUNT,
  CUMULATIVE,
  DIRTY_FROM,
  DONE,
  DUE,
  FOLD,
  ISSUED,
  ISSUED_IN,
  LAST_IDLE,
  NUM_JUMPS,
  SIZE,
  START,
  WORK,
  X_IN,
  Jumps,
  TrackedCopies,
  TrackerState,
)


@njit
def stall_loop(idle_s, start, done, work_s):
  """env/simulator.py's clamps as one pass over the boundaries, after a stable sort of the copies
  by (start, done): O(K log K + T), the total stall only."""
  num_ops = len(idle_s)
  span = num_ops + 2
  order = np.argsort(start * span + done, kind="mergesort")
  issued = np.zeros(num_ops + 1)  # work issued at each boundary
  due = np.zeros(num_ops + 1)  # W_d: queue work up to the last copy due at d
  cumulative = 0.0
  for k in order:
    cumulative += work_s[k]
    issued[start[k]] += work_s[k]
    if cumulative > due[done[k]]:
      due[done[k]] = cumulative
  x = 0.0
  issued_so_far = 0.0
  stall = 0.0
  for t in range(num_ops + 1):
    issued_so_far += issued[t]
    if due[t] > x:
      stall += due[t] - x
      x = due[t]
    if t == num_ops:
      break
    x = min(x + idle_s[t], issued_so_far)
  return stall


@njit
def _requeue(copies, bounds, count, p, start):
  """After the copies from position `p` on changed: their queue work, the work due where they
  are due (the last copy due at a boundary has the most: the work only grows along the queue),
  and the work issued at `start`, each summed in queue order as `stall_loop` sums them."""
  c = TrackedCopies(*copies)
  starts, done, work, cumulative = c.times[START], c.times[DONE], c.amounts[WORK], c.amounts[1]
  due, issued = bounds[DUE], bounds[ISSUED]
  total = cumulative[p - 1] if p > 0 else 0.0
  for k in range(p, count):
    total += work[k]
    cumulative[k] = total
    due[done[k]] = total
  first = p
  while first > 0 and starts[first - 1] == start:
    first -= 1
  acc = 0.0
  k = first
  while k < count and starts[k] == start:
    acc += work[k]
    k += 1
  issued[start] = acc


@njit
def _shift(copies, source, target):
  """Copies the tracked copy at position `source` to position `target`."""
  times, amounts, ids = copies
  times[START, target], times[DONE, target] = times[START, source], times[DONE, source]
  amounts[WORK, target], ids[target] = amounts[WORK, source], ids[source]


@njit
def queue_insert(copies, state, start, done, work, copy_id):
  """Files a copy in the tracked queue (`copies`: a `TrackedCopies`' fields, `state`: a
  `TrackerState`'), after every copy of the same (start, done): `stall_loop`'s stable sort of
  copies in the order they were added."""
  c, s = TrackedCopies(*copies), TrackerState(*state)
  starts, done_at, meta = c.times[START], c.times[DONE], s.meta
  n = meta[COUNT]
  lo, hi = 0, n
  while lo < hi:
    mid = (lo + hi) // 2
    if starts[mid] < start or (starts[mid] == start and done_at[mid] <= done):
      lo = mid + 1
    else:
      hi = mid
  p = lo
  for k in range(n, p, -1):
    _shift(copies, k - 1, k)
  starts[p], done_at[p], c.amounts[WORK, p], c.ids[p] = start, done, work, copy_id
  meta[COUNT] = n + 1
  _requeue(copies, s.bounds, n + 1, p, start)
  meta[DIRTY_FROM] = min(meta[DIRTY_FROM], start)
  meta[COPIES_CHANGED] = 1


@njit
def queue_remove(copies, state, start, done, copy_id):
  """Takes a copy `queue_insert` filed out of the tracked queue; False when it is not there."""
  c, s = TrackedCopies(*copies), TrackerState(*state)
  starts, done_at, ids, meta = c.times[START], c.times[DONE], c.ids, s.meta
  n = meta[COUNT]
  lo, hi = 0, n
  while lo < hi:
    mid = (lo + hi) // 2
    if starts[mid] < start or (starts[mid] == start and done_at[mid] < done):
      lo = mid + 1
    else:
      hi = mid
  p = lo
  while p < n and starts[p] == start and done_at[p] == done and ids[p] != copy_id:
    p += 1
  if p == n or ids[p] != copy_id or starts[p] != start or done_at[p] != done:
    return False
  for k in range(p, n - 1):
    _shift(copies, k + 1, k)
  n -= 1
  meta[COUNT] = n
  # The work due at its boundary, from the copies before it; those after are `_requeue`'s.
  due = s.bounds[DUE]
  due[done] = 0.0
  for k in range(p - 1, -1, -1):
    if done_at[k] == done:
      due[done] = c.amounts[CUMULATIVE, k]
      break
  _requeue(copies, s.bounds, n, p, start)
  meta[DIRTY_FROM] = min(meta[DIRTY_FROM], start)
  meta[COPIES_CHANGED] = 1
  return True


@njit
def queue_stall(copies, jumps, state):
  """The total stall of the tracked queue under the tracked idle times: `stall_loop`'s sweep,
  again from the first boundary a change since the last call reaches (`meta[DIRTY_FROM]`), each
  boundary's entering state (`X_IN`, `ISSUED_IN`) kept for the next. When only idle times
  changed, the sweep stops at the first boundary past them where the engine's completed work is
  what it was: from there everything is as before but the running total, summed again over the
  kept jumps. Each jump (a boundary where a due point lifts the engine, and by how much) is kept
  in boundary order, with the running total after it (`FOLD`), so the total is the same
  left-to-right sum of the same terms as `stall_loop`'s, bit for bit. (`jumps`: a `Jumps`'
  fields; their second halves are the new jumps' scratch.)"""
  j, s = Jumps(*jumps), TrackerState(*state)
  idle, meta, bounds = s.idle, s.meta, s.bounds
  issued, due, x_in, issued_in = bounds[ISSUED], bounds[DUE], bounds[X_IN], bounds[ISSUED_IN]
  at, size, fold = j.at, j.amounts[SIZE], j.amounts[FOLD]
  num_ops = len(idle)
  num_jumps = meta[NUM_JUMPS]
  t0 = meta[DIRTY_FROM]
  if t0 > num_ops:
    return fold[num_jumps - 1] if num_jumps else 0.0
  # Boundaries from `settle` on read the inputs the kept states were computed from.
  settle = num_ops + 1 if meta[COPIES_CHANGED] else meta[LAST_IDLE] + 1
  scratch = num_ops + 1
  x, so_far = x_in[t0], issued_in[t0]
  starts, count = TrackedCopies(*copies).times[START], meta[COUNT]
  later = np.searchsorted(starts[:count], t0)  # The first copy issued at or after t.
  found = 0
  stop = num_ops + 1
  t = t0
  while t <= num_ops:
    if t >= settle and t > t0 and x == x_in[t]:
      stop = t
      break
    if x == so_far:
      # Nothing queued: until the next copy is issued the engine waits at x, so a boundary that
      # issues nothing and lifts nothing (a copy due there was issued before and is done, but
      # for the rounding of its queue's sum: `due` is compared still) leaves x as it is.
      while later < count and starts[later] < t:
        later += 1
      until = starts[later] if later < count else num_ops + 1
      u = t
      while u < until and not due[u] > x:
        if u >= settle and u > t0 and x == x_in[u]:
          stop = u
          break
        x_in[u], issued_in[u] = x, so_far
        u += 1
      if stop <= num_ops:
        break
      t = u
      if t > num_ops:
        break
      if t >= settle and t > t0 and x == x_in[t]:
        stop = t
        break
    x_in[t], issued_in[t] = x, so_far
    so_far += issued[t]
    if due[t] > x:
      at[scratch + found], size[scratch + found] = t, due[t] - x
      found += 1
      x = due[t]
    if t == num_ops:
      break
    x = min(x + idle[t], so_far)
    t += 1
  # Splice the jumps found over [t0, stop) in place of the old ones there.
  first = np.searchsorted(at[:num_jumps], t0)
  last = np.searchsorted(at[:num_jumps], stop) if stop <= num_ops else num_jumps
  same = last - first == found
  if same:
    for i in range(found):
      if at[first + i] != at[scratch + i] or size[first + i] != size[scratch + i]:
        same = False
        break
  if not same:
    new_count = num_jumps - (last - first) + found
    tail = num_jumps - last
    if found > last - first:
      for i in range(tail - 1, -1, -1):
        at[first + found + i], size[first + found + i] = at[last + i], size[last + i]
    else:
      for i in range(tail):
        at[first + found + i], size[first + found + i] = at[last + i], size[last + i]
    for i in range(found):
      at[first + i], size[first + i] = at[scratch + i], size[scratch + i]
    total = fold[first - 1] if first > 0 else 0.0
    for i in range(first, new_count):
      total += size[i]
      fold[i] = total
    num_jumps = new_count
  meta[NUM_JUMPS] = num_jumps
  meta[DIRTY_FROM] = num_ops + 1
  meta[LAST_IDLE] = -1
  meta[COPIES_CHANGED] = 0
  return fold[num_jumps - 1] if num_jumps else 0.0
