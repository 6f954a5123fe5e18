"""How copies share the copy engine in XLA's msa: `AsynchronousCopyResource`, the
outstanding-copy limit and `AsynchronousCopyOrdering`.

Reimplements (openxla/xla, `xla/service/memory_space_assignment/algorithm.cc`, formerly
`memory_space_assignment.cc`):
* `AsynchronousCopyResource` (`HasEnoughResource`, `HasEnoughResourceMultiCheck`, `AddCopy`,
  `RemoveCopy`, `GetCurrentResources`): each op's elapsed time is a budget that copies consume.
  A copy `(start, end, resource)` may use the budgets of the ops strictly between `start` and
  `end`; copies are served one after another in start order (ties in the order they were
  added), so a copy that has not finished when the next one starts delays it. A copy fits when
  it, and every copy it delays, still finishes by its end.
* `ViolatesMaximumOutstandingAsyncCopies` (`OutstandingCopyLimit`): at most
  `max_outstanding` copies of a kind (prefetches, evictions: one limit each) may overlap an
  inclusive interval; a negative limit is no limit.
* `AsynchronousCopyOrdering::ViolatesOrdering`: with the FIFO ordering option, a copy may not
  nest strictly inside another or around another (an earlier start must not have a later end).

Why: prefetches and evictions contend for one copy engine; XLA's picker proposes starts and
these checks refuse the ones that would not finish in time, which is what makes prefetch timing
a real decision.

XLA implements the resource with a per-time `delay_` array updated incrementally through the
chain of copies a new one affects. This module models the same FIFO queue by Lindley's
recursion: with copies in start order, the work waiting at the end of op t is W(t) = max(0,
W(t-1) + arriving(t) - budget(t)), and copy i has finished by op d when the work served by then
covers every copy up to i. The checks read it from trees updated in O(log T) per copy
(`AsynchronousCopyResource`'s docstring: a program of 100,000 buffers adds about 45,000
copies, and rebuilding the queue per copy took most of msa's time); `current_resources`,
`has_enough_resource_multi_check` and the fallback for copies the trees cannot hold rebuild it
op by op (kernels/copy_trees.py's `resource_queue`, `resource_fits`). Both agree with XLA's tests
(tests/test_msa_copy_resource.py) and with each other (tests/test_msa_index.py). Float
tolerances: XLA computes in float32 and its `ConsumeResourceScaledIntegerResource` test exists
because of rounding; here float64 with a relative tolerance of 1e-9 of the total budget.

XLA keeps two of these resources, one for prefetches and one for evictions, both starting from
the ops' elapsed times (`MsaAlgorithm`'s constructor); the caller builds both the same way.

Not modelled, and why: copy engines per fast level (the hardware has one copy bandwidth;
docs/msa.md), and `Dump` (debug output).
"""

from __future__ import annotations

import dataclasses
from typing import NamedTuple, Sequence

import numpy as np

from malloczero.common.lazy import lazy_module

_kernels = lazy_module("malloczero.env.msa.kernels.copy_trees")

_RELATIVE_TOLERANCE = 1e-9


class CopyTrees(NamedTuple):
  """The trees as the kernels read them (`AsynchronousCopyResource.kernel_state()`): the budget
  served by each op, the backlog tree (values and pending adds, `[2, 2n]`) and its leaf count,
  the queue tree and its leaf count, the owed Fenwick tree, the checks' relative tolerance and
  the budgets' and demands' sum."""

  served: np.ndarray
  backlog: np.ndarray
  n_ops: int
  queue: np.ndarray
  n_keys: int
  owed: np.ndarray
  relative_tolerance: float
  total: float


class OpQueue(NamedTuple):
  """The op-by-op queue of the copies per op `[T]` (`AsynchronousCopyResource._queue_arrays()`):
  the budget, the demand arriving, the work waiting after it, the arrivals so far."""

  budget: np.ndarray
  arriving: np.ndarray
  waiting: np.ndarray
  arrived: np.ndarray


class QueuedCopies(NamedTuple):
  """The copies in FIFO order `[C]` beside an `OpQueue`: their starts, ends and demands, and
  what they owe cumulatively."""

  starts: np.ndarray
  ends: np.ndarray
  demands: np.ndarray
  owed: np.ndarray


@dataclasses.dataclass(frozen=True)
class AsyncCopy:
  """One asynchronous copy: it may run during the ops strictly between `start` (-1 = program
  start) and `end`, and needs `resource` seconds of their budgets. `id` tells apart copies with
  the same interval and resource (XLA's `AsynchronousCopy::id`)."""

  start: int
  end: int
  resource: float
  id: int = 0


class AsynchronousCopyResource:
  """The copy engine's budget per op `[T]` (XLA: the ops' elapsed times), the copies added so
  far, and the checks against them.

  The checks read three trees that adding or removing a copy updates in O(log T)
  (kernels/copy_trees.py's `resource_track`; msa adds tens of thousands of copies on large
  programs, and rebuilding the queue per copy and reading it from the new copy's start on per
  check cost O(T + C) each). With B(i) the budget of ops 0 .. i and S(i) the demand arrived by op
  i less B(i), Lindley's recursion has the work served by op i at B(i) + min(0, min S[.. i]). A
  new copy (start, end, r) adds r to S from its first op f on, so it is served by its deadline d
  when B(d) + min(0, min S[.. f - 1], min S[f .. d] + r) covers what the copies up to it owe
  (theirs and r), and each copy j behind it (a later start) is still served by its deadline d_j
  when also B(d_j) + min(0, min S[.. f - 1]) covers owed_j + r: the other term, min S[f .. d_j] +
  r, does, as copy j was served by d_j before (it fit when it was added, and copies added since
  were checked against it; removing one serves the rest sooner). So a check needs min S over two
  ranges (`_backlog`: range add, range min), the demand of the copies up to a start (`_owed`: a
  Fenwick tree over start + 1) and the largest owed_j - B(d_j) behind it (`_queue`: per start + 1,
  negated, range add, range min). Sums in a tree's order round differently from the op-by-op queue
  by far less than the tolerance. A copy the trees cannot hold (a negative demand, a start before
  -1) makes later checks rebuild the queue (`_exact_fits`, the op-by-op computation the trees
  replace)."""

  def __init__(self, initial_resources: Sequence[float] | np.ndarray):
    self.initial_resources = np.asarray(initial_resources, np.float64).copy()  # [T]
    if np.any(self.initial_resources < 0):
      raise ValueError("resources must be >= 0")
    t = len(self.initial_resources)
    self._budget_sum = float(self.initial_resources.sum())  # For the tolerance.
    self._demand_sum = 0.0
    self._served = np.cumsum(self.initial_resources)  # [T] B(i)
    self._copies: list[AsyncCopy] = []  # In the order added.
    self._by_key: dict[int, list[AsyncCopy]] = {}  # Per start + 1, in the order added.
    self._ordered: list[AsyncCopy] | None = []  # In start order (FIFO); None: to sort again.
    self._exact = False
    # Each tree is one array `[2, 2n]`, its values and its pending adds (`CopyTrees`).
    self._n_ops = _power_of_two(t)
    self._backlog_tree = np.stack([np.full(2 * self._n_ops, np.inf), np.zeros(2 * self._n_ops)])
    self._backlog, self._backlog_adds = self._backlog_tree
    self._backlog[self._n_ops : self._n_ops + t] = -self._served
    width = self._n_ops  # Each level of internal nodes [width // 2, width), from the leaves up.
    while width > 1:
      children = self._backlog[width : 2 * width]
      self._backlog[width // 2 : width] = np.minimum(children[0::2], children[1::2])
      width //= 2
    self._n_keys = _power_of_two(t + 1)
    self._queue_tree = np.stack([np.full(2 * self._n_keys, np.inf), np.zeros(2 * self._n_keys)])
    self._queue, self._queue_adds = self._queue_tree
    self._owed = np.zeros(t + 2)

  @property
  def copies(self) -> tuple[AsyncCopy, ...]:
    """The copies in FIFO order: by start, ties in the order added."""
    return tuple(self._fifo())

  def _fifo(self) -> list[AsyncCopy]:
    if self._ordered is None:
      self._ordered = sorted(self._copies, key=lambda c: c.start)  # Stable: ties as added.
    return self._ordered

  def _with(self, added: Sequence[AsyncCopy]) -> list[AsyncCopy]:
    copies = list(self._fifo())
    for copy in added:
      position = len(copies)
      while position > 0 and copies[position - 1].start > copy.start:
        position -= 1
      copies.insert(position, copy)
    return copies

  def _queue_arrays(self) -> tuple[OpQueue, QueuedCopies]:
    """The op-by-op queue of the copies (`copy_trees.resource_queue`)."""
    copies = self._fifo()
    starts = np.array([c.start for c in copies], np.int64)
    ends = np.array([c.end for c in copies], np.int64)
    demands = np.array([c.resource for c in copies], np.float64)
    budget = self.initial_resources
    owed, arriving, waiting, arrived = _kernels().resource_queue(budget, starts, demands)
    return OpQueue(budget, arriving, waiting, arrived), QueuedCopies(starts, ends, demands, owed)

  def _simulate(self, copies: list[AsyncCopy]) -> tuple[np.ndarray, np.ndarray]:
    """(finished `[C]` bool: each copy done by its end, work waiting `[T]` at each op's start
    with that op's arrivals included: XLA's `delay_`)."""
    budget = self.initial_resources
    t = len(budget)
    if not copies:
      return np.ones(0, bool), np.zeros(t)
    start = np.array([c.start for c in copies], np.int64)
    end = np.array([c.end for c in copies], np.int64)
    demand = np.array([c.resource for c in copies], np.float64)
    first = np.clip(start + 1, 0, max(t - 1, 0))
    arriving = np.bincount(first, demand, minlength=t)[:t]
    balance = np.cumsum(arriving - budget)
    waiting_after = balance - np.minimum(0.0, np.minimum.accumulate(balance))  # W(t)
    waiting_before = np.concatenate([[0.0], waiting_after[:-1]]) + arriving
    served = np.cumsum(arriving) - waiting_after  # [T]
    owed = np.cumsum(demand)  # [C]
    deadline = np.minimum(end - 1, t - 1)
    tolerance = _RELATIVE_TOLERANCE * (budget.sum() + demand.sum())
    has_ops = deadline >= start + 1
    served_by_deadline = np.where(has_ops, served[np.clip(deadline, 0, max(t - 1, 0))], -np.inf)
    finished = (demand == 0) | (served_by_deadline >= owed - tolerance)
    return finished, waiting_before

  def has_enough_resource(self, start: int, end: int, resource: float) -> bool:
    """`HasEnoughResource`: a copy (start, end, resource) can be added without any copy, it
    or one it delays, missing its end. O(log T) on the trees (the class docstring)."""
    if resource == 0:
      return True  # As XLA: a copy that needs nothing changes nothing.
    if self._exact or resource < 0:
      return self._exact_fits(start, end, resource)
    return bool(
      _kernels().resource_fits_tree(self.kernel_state(), int(start), int(end), float(resource))
    )

  def _exact_fits(self, start: int, end: int, resource: float) -> bool:
    """`has_enough_resource` on the op-by-op queue, rebuilt (`copy_trees.resource_fits`:
    from the new copy's first op on, and the copies queued behind it)."""
    ops, copies = self._queue_arrays()
    total = float(self._budget_sum + copies.demands.sum())
    fits = _kernels().resource_fits(
      tuple(ops), tuple(copies), int(start), int(end), float(resource), _RELATIVE_TOLERANCE, total
    )
    return bool(fits)

  @property
  def exact(self) -> bool:
    """Whether the checks rebuild the queue (a copy the trees cannot hold was added)."""
    return self._exact

  @property
  def budget_sum(self) -> float:
    """The ops' budgets added up (the checks' tolerance is relative to it and the demands')."""
    return self._budget_sum

  @property
  def demand_sum(self) -> float:
    """The copies' demands added up, in the order they were added and taken back."""
    return self._demand_sum

  def set_demand_sum(self, demand_sum: float) -> None:
    """Takes the demand sum from a caller that added and removed copies through the kernels
    directly (msa's jitted run, solver_loop.py: it keeps the trees, not the list of copies)."""
    self._demand_sum = float(demand_sum)

  def kernel_state(self) -> tuple:
    """The trees as the jitted kernels take them (`copy_trees.resource_fits_tree`,
    `prefetch.plan_prefetch_starts`): a `CopyTrees`' fields, as a plain tuple (kernels/__init__.py
    says why). Only while not `exact`."""
    return (
      self._served,
      self._backlog_tree,
      self._n_ops,
      self._queue_tree,
      self._n_keys,
      self._owed,
      _RELATIVE_TOLERANCE,
      self._budget_sum + self._demand_sum,
    )

  def has_enough_resource_multi_check(self, specs: Sequence[tuple[int, int, float]]) -> bool:
    """`HasEnoughResourceMultiCheck`: the copies (start, end, resource) can all be added."""
    added = [AsyncCopy(s, e, r, -1 - i) for i, (s, e, r) in enumerate(specs)]
    finished, _ = self._simulate(self._with(added))
    return bool(finished.all())

  def _in_trees(self, copy: AsyncCopy) -> bool:
    """Whether the trees hold the copy: a positive demand from start -1 on (a copy that
    needs nothing changes nothing)."""
    return copy.resource > 0 and copy.start >= -1

  def add_copy(self, copy: AsyncCopy) -> None:
    """`AddCopy`; like XLA (which CHECK-fails) it refuses a copy that does not fit. It goes
    after every copy that starts no later (XLA: the same start keeps the order added)."""
    if not self.has_enough_resource(copy.start, copy.end, copy.resource):
      raise ValueError(f"not enough copy resource for {copy}")
    self._copies.append(copy)
    self._by_key.setdefault(copy.start + 1, []).append(copy)
    self._ordered = None
    self._demand_sum += copy.resource
    if self._in_trees(copy):
      # It fit, so its deadline is at or after its first op, inside the ops.
      _kernels().resource_add(
        self.kernel_state(), int(copy.start), int(copy.end), float(copy.resource)
      )
    elif copy.resource != 0:
      self._exact = True

  def remove_copy(self, copy: AsyncCopy) -> None:
    """`RemoveCopy`: removes a copy equal to `copy` (equal copies are interchangeable)."""
    try:
      self._copies.remove(copy)
    except ValueError:
      raise KeyError(f"no such copy {copy}") from None
    key = copy.start + 1
    same_start = self._by_key[key]
    same_start.remove(copy)
    self._ordered = None
    self._demand_sum -= copy.resource
    if not self._in_trees(copy):
      return
    k = _kernels()
    k.resource_track(self.kernel_state(), int(copy.start), -float(copy.resource))
    # What the copies left at its start owe: the ones added after it owe less now.
    owed = k.fenwick_sum(self._owed, key - 1)
    lowest = np.inf
    for other in same_start:
      if self._in_trees(other):
        owed += other.resource
        deadline = min(other.end - 1, len(self._served) - 1)
        lowest = min(lowest, float(self._served[deadline]) - owed)
    k.tree_set(self._queue, self._queue_adds, self._n_keys, key, lowest)

  def current_resources(self) -> np.ndarray:
    """`GetCurrentResources` `[T]`: each op's budget left after the copies."""
    ops, _ = self._queue_arrays()
    waiting = np.concatenate([[0.0], ops.waiting[:-1]]) + ops.arriving
    return np.maximum(0.0, self.initial_resources - waiting)


def _power_of_two(n: int) -> int:
  """The smallest power of two >= max(n, 1): a tree's leaf count."""
  return 1 << max(int(n) - 1, 0).bit_length()


class OutstandingCopyLimit:
  """`ViolatesMaximumOutstandingAsyncCopies` for one kind of copy (XLA keeps one interval tree
  for prefetches and one for evictions, each with its own limit)."""

  def __init__(self, max_outstanding: int):
    self.max_outstanding = int(max_outstanding)
    self._start: list[int] = []
    self._end: list[int] = []

  def add(self, inclusive_start: int, end: int) -> None:
    """Registers a copy running over the inclusive interval [inclusive_start, end] (XLA adds
    [copy start, copy-done's schedule-before time])."""
    self._start.append(int(inclusive_start))
    self._end.append(int(end))

  def remove(self, inclusive_start: int, end: int) -> None:
    for i, (s, e) in enumerate(zip(self._start, self._end)):
      if s == inclusive_start and e == end:
        del self._start[i], self._end[i]
        return
    raise KeyError(f"no copy over [{inclusive_start}, {end}]")

  def overlapping(self, inclusive_start: int, end: int) -> int:
    """How many registered copies overlap the inclusive interval."""
    if not self._start:
      return 0
    s, e = np.array(self._start), np.array(self._end)
    return int(np.count_nonzero((s <= end) & (e >= inclusive_start)))

  def violates(
    self,
    inclusive_start: int,
    end: int,
    num_additional_copies: int = 1,
    extra_async_copy_limit: int = 0,
  ) -> bool:
    """True when adding `num_additional_copies` over [inclusive_start, end] would exceed the
    limit (raised by `extra_async_copy_limit`); never with a negative limit."""
    if self.max_outstanding < 0:
      return False
    count = self.overlapping(inclusive_start, end) + num_additional_copies
    return count > self.max_outstanding + extra_async_copy_limit


class AsynchronousCopyOrdering:
  """`AsynchronousCopyOrdering`: the copies added so far, and whether a new one would break
  their pipelining order (strictly nested inside or around an existing copy)."""

  def __init__(self):
    self._copies: list[tuple[int, int]] = []

  def add_copy(self, start: int, end: int) -> None:
    self._copies.append((int(start), int(end)))

  def remove_copy(self, start: int, end: int) -> None:
    self._copies.remove((int(start), int(end)))

  def violates_ordering(self, start: int, end: int) -> bool:
    if not self._copies:
      return False
    s, e = np.array(self._copies).T
    return bool(np.any(((s < start) & (e > end)) | ((s > start) & (e < end))))
