"""The copy resource's checks (env/msa/copy_resource.py's `AsynchronousCopyResource`): its trees,
updated in O(log ops) per copy, and the op-by-op queue rebuilt for what the trees cannot hold.

Two segment trees with range add and range minimum (`tree_*`; the maximum of a value is the
minimum of its negation), as arrays `values [2n]` and `adds [2n]` over `n` leaves (a power of
two; leaf i at node n + i). Each node's value is the minimum of its children's plus its own
pending add; a query pushes the adds on its two boundary paths down first. Beside them a Fenwick
tree of what the copies owe by key. They travel as a `CopyTrees`' fields (a tree as one array
`[2, 2n]`: its values, its pending adds), the queue as an `OpQueue`'s and a `QueuedCopies`'
(copy_resource.py; the package docstring says why plain tuples, of few arrays).
"""

from __future__ import annotations

import numpy as np

from malloczero.env.kernel_cache import njit
from malloczero.env.msa.copy_resource import CopyTrees, OpQueue, QueuedCopies


@njit
def copy_trees(trees):
  """The resource's `kernel_state()` named (a `CopyTrees`)."""
  return CopyTrees(*trees)


@njit
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


@njit
def resource_fits(ops, copies, start, end, resource, relative_tolerance, total):
  """`AsynchronousCopyResource.has_enough_resource` for a copy that needs resource, on the queue
  (`OpQueue`' and `QueuedCopies`' fields): the queue from its first op on with it arriving there
  (Lindley's recursion from the work waiting before); it must be served by its end, and every copy
  queued behind it (a later start) that needs resource by its own. `total`: the budgets' and
  demands' sum, for the tolerance."""
  q, c = OpQueue(*ops), QueuedCopies(*copies)
  budget, ends, demands, owed = q.budget, c.ends, c.demands, c.owed
  t = len(budget)
  first = max(start + 1, 0)
  deadline = min(end - 1, t - 1)
  if deadline < first:
    return False
  behind = np.searchsorted(c.starts, start, side="right")
  waiting_before = q.waiting[first - 1] if first > 0 else 0.0
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
    balance += q.arriving[i] - budget[i]
    shifted = balance + resource
    if shifted < lowest:
      lowest = shifted
    served[i - first] = q.arrived[i] + resource - (shifted - lowest)
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


@njit
def _tree_apply(values, adds, n, node, amount):
  values[node] += amount
  if node < n:
    adds[node] += amount


@njit
def _tree_rebuild(values, adds, node):
  """Recomputes the ancestors of `node` from their children."""
  while node > 1:
    node >>= 1
    values[node] = min(values[2 * node], values[2 * node + 1]) + adds[node]


@njit
def _tree_push(values, adds, n, node):
  """Pushes the pending adds of the ancestors of `node` down, from the root."""
  height = 0
  while (1 << height) < n:
    height += 1
  for level in range(height, 0, -1):
    i = node >> level
    if adds[i] != 0.0:
      _tree_apply(values, adds, n, 2 * i, adds[i])
      _tree_apply(values, adds, n, 2 * i + 1, adds[i])
      adds[i] = 0.0


@njit
def tree_add(values, adds, n, first, last, amount):
  """Adds `amount` to leaves `first` .. `last` (inclusive; nothing when empty)."""
  if first > last:
    return
  lo, hi = first + n, last + n + 1
  lo0, hi0 = lo, hi
  while lo < hi:
    if lo & 1:
      _tree_apply(values, adds, n, lo, amount)
      lo += 1
    if hi & 1:
      hi -= 1
      _tree_apply(values, adds, n, hi, amount)
    lo >>= 1
    hi >>= 1
  _tree_rebuild(values, adds, lo0)
  _tree_rebuild(values, adds, hi0 - 1)


@njit
def tree_min(values, adds, n, first, last):
  """The minimum of leaves `first` .. `last` (inclusive; +inf when empty)."""
  if first > last:
    return np.inf
  lo, hi = first + n, last + n + 1
  _tree_push(values, adds, n, lo)
  _tree_push(values, adds, n, hi - 1)
  best = np.inf
  while lo < hi:
    if lo & 1:
      best = min(best, values[lo])
      lo += 1
    if hi & 1:
      hi -= 1
      best = min(best, values[hi])
    lo >>= 1
    hi >>= 1
  return best


@njit
def tree_set(values, adds, n, leaf, value):
  """Sets leaf `leaf` to `value`."""
  node = leaf + n
  _tree_push(values, adds, n, node)
  values[node] = value
  _tree_rebuild(values, adds, node)


@njit
def fenwick_add(tree, key, amount):
  """Adds `amount` at `key` of a Fenwick tree over keys 0 .. len(tree) - 2."""
  i = key + 1
  while i < len(tree):
    tree[i] += amount
    i += i & -i


@njit
def fenwick_sum(tree, key):
  """The sum over keys 0 .. `key` (0.0 when `key` < 0)."""
  total = 0.0
  i = min(key + 1, len(tree) - 1)
  while i > 0:
    total += tree[i]
    i -= i & -i
  return total


@njit
def _track(r, start, demand):
  """Records (`demand` > 0) or takes back (< 0) a copy's demand in the trees (a `CopyTrees`):
  it arrives at op start + 1 (clamped to the ops), so the backlog of every op from there on
  grows by it, and every copy behind it in the FIFO order (key > start + 1) owes it too. The
  copy's own key in `queue` is the caller's to set."""
  t = len(r.served)
  op = min(max(start + 1, 0), t - 1)
  tree_add(r.backlog[0], r.backlog[1], r.n_ops, op, t - 1, demand)
  fenwick_add(r.owed, start + 1, demand)
  # `queue` holds minus (owed - budget by the deadline): owing more lowers it.
  tree_add(r.queue[0], r.queue[1], r.n_keys, start + 2, len(r.owed) - 2, -demand)


@njit
def resource_track(trees, start, demand):
  """`_track` on the resource's trees (`CopyTrees`' fields)."""
  _track(CopyTrees(*trees), start, demand)


@njit
def resource_add(trees, start, end, demand):
  """`resource_track` for a copy added with `demand` > 0, and its own key in `queue`: what it
  owes by its deadline (every copy up to it, itself included) less the budget served by then,
  negated (`queue` keeps per key the largest over its copies)."""
  r = CopyTrees(*trees)
  _track(r, start, demand)
  key = start + 1
  deadline = min(end - 1, len(r.served) - 1)
  behind = r.served[deadline] - fenwick_sum(r.owed, key)
  queue, queue_adds = r.queue[0], r.queue[1]
  own = tree_min(queue, queue_adds, r.n_keys, key, key)
  tree_set(queue, queue_adds, r.n_keys, key, min(own, behind))


@njit
def fits_tree(r, start, end, resource):
  """`resource_fits_tree` on named trees (a `CopyTrees`)."""
  t = len(r.served)
  first = max(start + 1, 0)
  deadline = min(end - 1, t - 1)
  if deadline < first:
    return False
  tolerance = r.relative_tolerance * (r.total + resource)
  backlog, backlog_adds = r.backlog[0], r.backlog[1]
  idle = min(0.0, tree_min(backlog, backlog_adds, r.n_ops, 0, first - 1))
  served = r.served[deadline] + min(
    idle, tree_min(backlog, backlog_adds, r.n_ops, first, deadline) + resource
  )
  if served < fenwick_sum(r.owed, start + 1) + resource - tolerance:
    return False
  most_owed = -tree_min(r.queue[0], r.queue[1], r.n_keys, max(start + 2, 0), len(r.owed) - 2)
  return not most_owed + resource - tolerance > idle


@njit
def resource_fits_tree(trees, start, end, resource):
  """`AsynchronousCopyResource.has_enough_resource` for a copy that needs resource, in
  O(log ops) from the trees (`CopyTrees`' fields; copy_resource.py derives the conditions).
  With B the budget served by op i (`served`) and S(i) the arrivals minus B up to i
  (`backlog`), the work served by op i once the copy arrives at op f = start + 1 is B(i) +
  min(0, min S[.. f - 1], min S[f .. i] + resource). It must cover what the copies up to it owe
  by its deadline, and what each copy behind it owes by its own: owed_j + resource - B(d_j) <=
  min(0, min S[.. f - 1]) (the largest such, `queue`), as min S[f .. d_j] + resource already
  covers it (that copy fit when it was added, and nothing added since served less)."""
  return fits_tree(CopyTrees(*trees), start, end, resource)
