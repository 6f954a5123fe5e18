"""Copy contention as XLA's `RuntimeSimulator` models it, vectorised with numpy.

XLA (xla/service/memory_space_assignment/simulator.cc, `SimulateComputeInstruction`,
`ProcessAsyncCopiesInIdleTime`, `SimulateAsyncCopyDone`) runs the program op by op. Outstanding
asynchronous copies wait in FIFO queues and advance at the copy bandwidth only during each op's
*default-memory idle time*: the op's time minus the time its own default-memory bytes take at the
default bandwidth (a memory-bound op that reads everything from default memory leaves no room
for copies). When a `copy-done` is reached before its copy finished, the program stalls for what
remains, and during the stall the queue advances at the full copy bandwidth. Program time is the
sum of op times plus the stalls.

One queue, not two. XLA keeps a read queue (prefetches, default -> alternate) and a write queue
(evictions, alternate -> default) and halves the bandwidth while both are busy, so both drain
together at the full bandwidth in total. We keep one FIFO queue for both directions, ordered by
issue: both are work-conserving at the same bandwidth, so the engine moves the same bytes in
the same idle time; what differs is the order when a prefetch and an eviction overlap (XLA's
halving lets both progress; here the earlier-issued one finishes sooner and the other later, so
a copy due soon can wait longer behind an eviction issued before it, and less when it was first).
One queue is what makes the closed form below possible, and it is how each of MSA's own
`AsynchronousCopyResource`s, the budgets it plans copies against, works (one FIFO budget per op
consumed in start order; MSA keeps one for prefetches and one for evictions).

Conventions (op indices; `T` ops; boundary `t` is just before op `t`, boundary `T` the end):

* a copy is issued at boundary `start` and must be complete at boundary `done` (`start <= done`,
  `done <= T`); at one boundary, copies are issued before the done points are checked, so a
  copy with `start == done` stalls for all of its work;
* FIFO order is (start, done, input order);
* work is in seconds: bytes / copy bandwidth.

Closed form. Count the copy engine's progress as completed work `x` (seconds of copy work,
FIFO, so the work of the first copies in order). Op `t` lets it advance by its idle time
`idle[t]` but not past the work issued so far `V(t)`; a due point at boundary `d` forces it up to
`W_d`, the work of the queue up to and including the last copy due there, and the program
stalls for the difference (the engine runs at full speed while the program waits):

  op t:  x <- min(x + idle[t], V(t))        due d:  x <- max(x, W_d), stall += the jump.

With `P[t]` the idle time before boundary `t`, `z = x - P` turns both into plain clamps:
`z <- min(z, V(t) - P[t + 1])` and `z <- max(z, W_d - P[d])`. Between two due boundaries the
mins fold into one (`np.minimum.reduceat`), so the program is a chain of `D` maps
`z -> max(min(z, hi_i), lo_i)`, one per due boundary. Such maps compose into one of the same
form, `(lo, hi) = (max(min(lo_1, hi_2), lo_2), min(hi_1, hi_2))`, so every prefix of the chain
comes from a log2(D)-step doubling scan of three numpy operations each, and the stall at each
due boundary is how far its `lo` lifts the `z` that arrives there.
`reference_stalls` in tests/test_cost_model.py is the op-by-op loop this must equal.
"""

from __future__ import annotations

import dataclasses
from typing import NamedTuple

import numpy as np

from malloczero.common.lazy import lazy_module


@dataclasses.dataclass(frozen=True)
class Copies:
  """Asynchronous copies (prefetches and evictions alike), `[K]` each."""

  start: np.ndarray  # [K] int64 boundary at which the copy is issued
  done: np.ndarray  # [K] int64 boundary by which it must be complete (start <= done <= T)
  work_s: np.ndarray  # [K] float64 seconds at the copy bandwidth

  @classmethod
  def empty(cls) -> "Copies":
    z = np.zeros(0, np.int64)
    return cls(z, z, np.zeros(0))

  def __len__(self) -> int:
    return len(self.start)


@dataclasses.dataclass(frozen=True)
class CopySchedule:
  """What the queue did: per-boundary stalls `[T + 1]` and each copy's finish `[K]`.

  `finish_s` is on the copy engine's clock (cumulative idle time plus stalls), in input order."""

  stall_s: np.ndarray
  finish_s: np.ndarray

  @property
  def total_stall_s(self) -> float:
    return float(self.stall_s.sum())


class CopyQueue:
  """A fixed set of copies, ready to be simulated under any idle times.

  What depends only on the copies (their FIFO order, the work issued by each op, the due
  boundaries) is computed once here; `schedule` then costs a few numpy operations per call.
  The game re-simulates after every placement, but only a prefetch changes the copies."""

  def __init__(self, copies: Copies, num_ops: int):
    self.copies, self.num_ops = copies, num_ops
    if len(copies) == 0:
      return
    self.order = np.lexsort((copies.done, copies.start))
    self.start = copies.start[self.order]
    self.work = copies.work_s[self.order]
    issued_work = np.concatenate(([0.0], np.cumsum(self.work)))  # W along the queue [K + 1]
    self.cumulative = issued_work[1:]
    # Due boundaries, and the work up to the last copy (in queue order) due at each.
    done = copies.done[self.order]
    due_order = np.argsort(done, kind="stable")
    due_sorted = done[due_order]
    first = np.flatnonzero(np.concatenate(([True], due_sorted[1:] != due_sorted[:-1])))
    self.boundaries = due_sorted[first]  # [D]
    self.due_work = self.cumulative[np.maximum.reduceat(due_order, first)]  # [D]
    # Op t caps the engine at the work issued by its boundary (minus P[t + 1], per call); the
    # ops between two due boundaries fold into their smallest cap (none before boundary 0).
    last = int(self.boundaries[-1])
    self.issued_by_op = issued_work[np.searchsorted(self.start, np.arange(last), side="right")]
    self.previous = np.concatenate(([0], self.boundaries[:-1]))

  def schedule(self, idle_s: np.ndarray, finish: bool = True) -> CopySchedule:
    """Stalls under `idle_s` [T]; each copy's finish too unless `finish` is False."""
    k = len(self.copies)
    stall = np.zeros(self.num_ops + 1)
    if k == 0:
      return CopySchedule(stall, np.zeros(0))
    idle_before = np.concatenate(([0.0], np.cumsum(idle_s)))  # P [T + 1]
    boundaries = self.boundaries
    low = self.due_work - idle_before[boundaries]  # [D]
    last = len(self.issued_by_op)
    if last == 0:
      high = np.full(1, np.inf)
    else:
      high = np.minimum.reduceat(self.issued_by_op - idle_before[1 : last + 1], self.previous)
      if boundaries[0] == 0:
        high[0] = np.inf
    # Prefix compositions of z -> max(min(z, high), low), by doubling.
    lo, hi = low.copy(), high.copy()
    shift = 1
    while shift < len(lo):
      lo_prev, hi_prev = lo[:-shift], hi[:-shift]
      lo_new = np.maximum(np.minimum(lo_prev, hi[shift:]), lo[shift:])
      hi[shift:] = np.minimum(hi_prev, hi[shift:])
      lo[shift:] = lo_new
      shift *= 2
    after = np.maximum(np.minimum(0.0, hi), lo)  # z just after each due boundary
    arriving = np.minimum(np.concatenate(([0.0], after[:-1])), high)
    stall[boundaries] = np.maximum(low - arriving, 0.0)
    if not finish:
      return CopySchedule(stall, np.full(k, np.nan))
    # Finish of each copy on the engine's clock: FIFO from its arrival, stalls now known.
    stalls_before = np.concatenate(([0.0], np.cumsum(stall)))[self.start]
    arrival = idle_before[self.start] + stalls_before
    finish_s = np.empty(k)
    finish_s[self.order] = self.cumulative + np.maximum.accumulate(
      arrival - (self.cumulative - self.work)
    )
    return CopySchedule(stall, finish_s)

  def total_stall(self, idle_s: np.ndarray) -> float:
    """Seconds the program waits for the copies in all."""
    return self.schedule(idle_s, finish=False).total_stall_s


def simulate_copies(idle_s: np.ndarray, copies: Copies, finish: bool = True) -> CopySchedule:
  """Stalls of `copies` sharing one FIFO copy engine that advances during `idle_s` [T]; each
  copy's finish too unless `finish` is False."""
  return CopyQueue(copies, len(idle_s)).schedule(idle_s, finish)


def total_stall(idle_s: np.ndarray, copies: Copies) -> float:
  """Seconds the program waits for copies in all (see `simulate_copies`)."""
  return CopyQueue(copies, len(idle_s)).total_stall(idle_s)


# The copy-queue loop, jitted (env/simulator_kernels.py), imported on first use so that importing
# the cost model does not load numba (about 0.1 s).
_kernels = lazy_module("malloczero.env.simulator_kernels")


def total_stall_loop(idle_s: np.ndarray, copies: Copies) -> float:
  """`total_stall`, jitted (numba) as one loop over the boundaries: the game's per-step
  re-simulation, where rebuilding a `CopyQueue` for each new copy costs more than the loop.
  Equal to `total_stall` (tests/test_cost_model.py); the first call compiles or loads it from
  numba's cache."""
  if len(copies) == 0:
    return 0.0
  return float(
    _kernels().stall_loop(
      np.ascontiguousarray(idle_s, np.float64),
      np.ascontiguousarray(copies.start, np.int64),
      np.ascontiguousarray(copies.done, np.int64),
      np.ascontiguousarray(copies.work_s, np.float64),
    )
  )


# `TrackerState.meta`'s entries: the copies tracked, the stalls kept, the first boundary and the
# last op whose inputs changed since the last sweep (T + 1 and -1: none), whether copies did.
COUNT, NUM_JUMPS, DIRTY_FROM, LAST_IDLE, COPIES_CHANGED = range(5)
# The rows of `TrackedCopies.times` and `.amounts`, of `TrackerState.bounds` and `Jumps.amounts`.
START, DONE = 0, 1
WORK, CUMULATIVE = 0, 1
ISSUED, DUE, X_IN, ISSUED_IN = 0, 1, 2, 3
SIZE, FOLD = 0, 1


class TrackedCopies(NamedTuple):
  """`StallTracker`'s copies in FIFO order (start, done, the order they were added), the first
  `meta[COUNT]` of `[capacity]` in use: the boundaries each is issued at and due by (`times`,
  rows `START`, `DONE`), its work and the queue's work up to and including it (`amounts`, rows
  `WORK`, `CUMULATIVE`, seconds), and its id."""

  times: np.ndarray  # [2, capacity] int64
  amounts: np.ndarray  # [2, capacity] float64
  ids: np.ndarray  # [capacity] int64


class Jumps(NamedTuple):
  """`StallTracker`'s stalls in boundary order, the first `meta[NUM_JUMPS]`: where each is, how
  long and the running total after it (`amounts`, rows `SIZE`, `FOLD`); both are `[2 (T + 1)]`
  long, their second halves a sweep's scratch for the new ones."""

  at: np.ndarray  # [2 (T + 1)] int64
  amounts: np.ndarray  # [2, 2 (T + 1)] float64


class TrackerState(NamedTuple):
  """The rest of `StallTracker`'s state: per boundary `[4, T + 1]` the work issued there, the
  work due by it (the queue up to the last copy due there) and the sweep's state entering it
  (the engine's completed work, the work issued before it: rows `ISSUED`, `DUE`, `X_IN`,
  `ISSUED_IN`); the ops' idle times `[T]`; its counts and what changed since the last sweep
  (`meta`, entries `COUNT` ...)."""

  bounds: np.ndarray
  idle: np.ndarray
  meta: np.ndarray


class StallTracker:
  """The total stall of a set of copies that changes a few at a time, as `total_stall_loop`
  gives it for the same copies (in the order they were added) and idle times, bit for bit.

  Why: the msa game adds or takes back a copy, or changes an op's idle time, at most steps, and
  re-simulating the whole queue each time (sorting the copies, then a pass over every op) was
  most of a step's time on large programs (at 100,000 buffers, about 1 ms a step). The tracker
  keeps the copies sorted in FIFO order with the queue's work through each, the work issued and
  due at each boundary, and the sweep's state entering each boundary; a change re-runs the same
  sequential sums and the same sweep from the first boundary it reaches only (and, when only
  idle times changed, until the sweep meets its old path again), so no floating-point operation
  is reordered. Kernels: env/simulator_kernels.py."""

  def __init__(self, idle_s: np.ndarray, capacity: int = 64):
    num_ops = len(idle_s)
    self.num_ops = num_ops
    capacity = max(int(capacity), 1)
    # The kernels take each group as a plain tuple in its named tuple's order, of few arrays: a
    # kernel's arguments cost more than its work on a small program (env/msa/kernels/
    # __init__.py says why).
    self._copies = (
      np.zeros((2, capacity), np.int64),
      np.zeros((2, capacity)),
      np.zeros(capacity, np.int64),
    )  # A `TrackedCopies`' fields.
    self._jumps = (np.zeros(2 * num_ops + 2, np.int64), np.zeros((2, 2 * num_ops + 2)))
    meta = np.zeros(5, np.int64)
    meta[DIRTY_FROM], meta[LAST_IDLE] = num_ops + 1, -1
    self.idle = np.array(idle_s, np.float64)  # [T], read only: `set_idle` changes it.
    self._meta = meta
    self._state = (np.zeros((4, num_ops + 1)), self.idle, meta)  # A `TrackerState`'s fields.
    self._next_id = 0
    self._stall = 0.0

  def __len__(self) -> int:
    return int(self._meta[COUNT])

  def add(self, start: int, done: int, work_s: float) -> int:
    """Adds a copy (`Copies`' conventions); returns its id for `remove`."""
    if len(self) == len(self._copies[2]):
      self._grow()
    copy_id = self._next_id
    self._next_id += 1
    _kernels().queue_insert(self._copies, self._state, start, done, float(work_s), copy_id)
    return copy_id

  def remove(self, copy_id: int, start: int, done: int) -> None:
    """Takes back the copy `add` returned `copy_id` for (added with `start` and `done`)."""
    if not _kernels().queue_remove(self._copies, self._state, start, done, copy_id):
      raise KeyError(f"no tracked copy {copy_id} issued at {start} and due at {done}")

  def set_idle(self, op: int, idle_s: float) -> None:
    """Sets op `op`'s idle time."""
    idle, meta = self.idle, self._meta
    if idle[op] == idle_s:
      return
    idle[op] = idle_s
    if op < meta[DIRTY_FROM]:
      meta[DIRTY_FROM] = op
    if op > meta[LAST_IDLE]:
      meta[LAST_IDLE] = op

  def stall(self) -> float:
    """The total stall now (seconds)."""
    if self._meta[DIRTY_FROM] <= self.num_ops:
      self._stall = float(_kernels().queue_stall(self._copies, self._jumps, self._state))
    return self._stall

  def kernel_arrays(self) -> tuple[tuple, tuple, tuple]:
    """The tuples the kernels take (a `TrackedCopies`', a `Jumps`' and a `TrackerState`'s
    fields), for a kernel that files and takes back copies itself (env/placement_kernels.py):
    it must keep within the capacity, which only `add` grows."""
    return self._copies, self._jumps, self._state

  def _grow(self) -> None:
    self._copies = tuple(np.concatenate([a, np.zeros_like(a)], axis=-1) for a in self._copies)
