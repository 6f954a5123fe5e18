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
chain of copies a new one affects. This module computes the same FIFO queue afresh on each query
(Lindley's recursion as cumulative sums; numpy when copies change, one jitted pass per check,
`_jit_kernels.resource_fits`): with copies in start order, the work
waiting at the end of op t is W(t) = max(0, W(t-1) + arriving(t) - budget(t)), and copy i has
finished by op d when the work served by then covers every copy up to i. The two agree on XLA's
tests (tests/test_msa_parts.py). Float tolerances: XLA computes in float32 and its
`ConsumeResourceScaledIntegerResource` test exists because of rounding; here float64 with a
relative tolerance of 1e-9 of the total budget.

XLA keeps two of these resources, one for prefetches and one for evictions, both starting from
the ops' elapsed times (`MsaAlgorithm`'s constructor); the caller builds both the same way.

Not modelled, and why: copy engines per fast level (the hardware has one copy bandwidth;
docs/msa.md), and `Dump` (debug output).
"""

from __future__ import annotations

import dataclasses
from typing import Sequence

import numpy as np

from malloczero.env.msa._jit import kernels

_RELATIVE_TOLERANCE = 1e-9


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
  far, and the checks against them."""

  def __init__(self, initial_resources: Sequence[float] | np.ndarray):
    self.initial_resources = np.asarray(initial_resources, np.float64).copy()  # [T]
    if np.any(self.initial_resources < 0):
      raise ValueError("resources must be >= 0")
    self._budget_sum = float(self.initial_resources.sum())  # For the tolerance.
    self._copies: list[AsyncCopy] = []  # In start order; ties in the order added.
    self._refresh()

  def _refresh(self) -> None:
    """Caches the queue of the copies added so far, for `has_enough_resource`'s fast path:
    starts, ends, demands `[C]` in order, then `_derive`."""
    copies = self._copies
    self._starts = np.array([c.start for c in copies], np.int64)
    self._ends = np.array([c.end for c in copies], np.int64)
    self._demands = np.array([c.resource for c in copies], np.float64)
    self._derive()

  def _derive(self) -> None:
    """From the ordered starts, ends and demands: owed `[C]` (cumulative demand), arriving,
    waiting after each op (Lindley's W) and cumulative arrivals `[T]`. O(T + C) jitted work, so
    that adding or removing one copy does not rebuild the arrays from the Python list."""
    self._demand_sum = float(self._demands.sum())
    self._owed, self._arriving, self._waiting, self._arrived = kernels().resource_queue(
      self.initial_resources, self._starts, self._demands
    )

  @property
  def copies(self) -> tuple[AsyncCopy, ...]:
    return tuple(self._copies)

  def _with(self, added: Sequence[AsyncCopy]) -> list[AsyncCopy]:
    copies = list(self._copies)
    for copy in added:
      position = len(copies)
      while position > 0 and copies[position - 1].start > copy.start:
        position -= 1
      copies.insert(position, copy)
    return copies

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
    or one it delays, missing its end.

    Only the queue from the new copy's first op on changes, and only the copies queued behind
    it can be delayed (FIFO), so the check recomputes just that part: O(T - start + copies
    behind) work on the cached queue, in one jitted pass."""
    if resource == 0:
      return True  # As XLA: a copy that needs nothing changes nothing.
    return bool(
      kernels().resource_fits(
        self.initial_resources,
        self._starts,
        self._ends,
        self._demands,
        self._arriving,
        self._arrived,
        self._waiting,
        self._owed,
        int(start),
        int(end),
        float(resource),
        _RELATIVE_TOLERANCE,
        self._budget_sum + self._demand_sum,
      )
    )

  def kernel_state(self) -> tuple:
    """The queue as the jitted kernels take it (`_jit_kernels.resource_fits`' arguments but
    the copy): budgets, ordered starts, ends, demands, arriving, arrived, waiting, owed, the
    relative tolerance and the budgets' and demands' sum."""
    return (
      self.initial_resources,
      self._starts,
      self._ends,
      self._demands,
      self._arriving,
      self._arrived,
      self._waiting,
      self._owed,
      _RELATIVE_TOLERANCE,
      self._budget_sum + self._demand_sum,
    )

  def has_enough_resource_multi_check(self, specs: Sequence[tuple[int, int, float]]) -> bool:
    """`HasEnoughResourceMultiCheck`: the copies (start, end, resource) can all be added."""
    added = [AsyncCopy(s, e, r, -1 - i) for i, (s, e, r) in enumerate(specs)]
    finished, _ = self._simulate(self._with(added))
    return bool(finished.all())

  def add_copy(self, copy: AsyncCopy) -> None:
    """`AddCopy`; like XLA (which CHECK-fails) it refuses a copy that does not fit. It goes
    after every copy that starts no later (XLA: the same start keeps the order added)."""
    if not self.has_enough_resource(copy.start, copy.end, copy.resource):
      raise ValueError(f"not enough copy resource for {copy}")
    position = int(np.searchsorted(self._starts, copy.start, side="right"))
    self._copies.insert(position, copy)
    self._starts = _insert(self._starts, position, copy.start)
    self._ends = _insert(self._ends, position, copy.end)
    self._demands = _insert(self._demands, position, copy.resource)
    self._derive()

  def remove_copy(self, copy: AsyncCopy) -> None:
    """`RemoveCopy`: removes the first added copy equal to `copy`."""
    try:
      position = self._copies.index(copy)
    except ValueError:
      raise KeyError(f"no such copy {copy}") from None
    del self._copies[position]
    self._starts = np.delete(self._starts, position)
    self._ends = np.delete(self._ends, position)
    self._demands = np.delete(self._demands, position)
    self._derive()

  def current_resources(self) -> np.ndarray:
    """`GetCurrentResources` `[T]`: each op's budget left after the copies."""
    waiting = np.concatenate([[0.0], self._waiting[:-1]]) + self._arriving
    return np.maximum(0.0, self.initial_resources - waiting)


def _insert(array: np.ndarray, position: int, value: float) -> np.ndarray:
  """`np.insert` of one value into a 1-d array, without its generic-axis overhead."""
  out = np.empty(len(array) + 1, array.dtype)
  out[:position], out[position], out[position + 1 :] = array[:position], value, array[position:]
  return out


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
