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
issue: the bytes moved per second of idle time are the same, so a program's total copy work and
the time the copy engine is busy are the same; what differs is only which copy finishes first
when a prefetch and an eviction overlap (XLA's halving lets both progress; here the earlier one
finishes first, the later one no later than under XLA). One queue is what makes the closed form
below possible, and it is what `AsynchronousCopyResource`, the resource MSA itself plans
prefetches against, assumes (one budget per op consumed in start order).

Conventions (op indices; `T` ops; boundary `t` is just before op `t`, boundary `T` the end):

* a copy is issued at boundary `start` and must be complete at boundary `done` (`start <= done`,
  `done <= T`); at one boundary, copies are issued before the done points are checked, so a
  copy with `start == done` stalls for all of its work;
* FIFO order is (start, done, input order);
* work is in seconds: bytes / copy bandwidth.

Closed form. Measure time on the copy engine's clock, which advances by each op's idle time and
by every stall (during a stall the engine runs at full speed). With `P[t]` the idle time before
boundary `t` and `S(t)` the stalls at boundaries before `t`, copy `k` arrives at
`A_k = P[start_k] + S(start_k)` and, FIFO with one server, finishes at
`C_k = max(A_k, C_{k-1}) + w_k`, that is `C_k = W_k + cummax_i(A_i - W_{i-1})` with `W` the
cumulative work. The engine clock after boundary `d`'s stall is `max(P[d] + S, max C_k over
copies done at d)`, so the cumulative stall after `d` is `max(0, cummax over d' <= d of
(M_d' - P[d']))`. Stalls shift later arrivals and arrivals shift later stalls; the two are
solved by iterating both cumulative maxima from no stalls: each pass is exact for one more
alternation of "queue empties, then a stall", the stalls only grow, and the pass that changes
nothing is the exact answer (at most one pass per boundary with a done point, usually 2-3).
`reference_stalls` in tests/test_cost_model.py is the op-by-op loop this must equal.
"""

from __future__ import annotations

import dataclasses

import numpy as np


@dataclasses.dataclass(frozen=True)
class Copies:
  """Asynchronous copies (prefetches and evictions alike), `[K]` each."""
  start: np.ndarray   # [K] int64 boundary at which the copy is issued
  done: np.ndarray    # [K] int64 boundary by which it must be complete (start <= done <= T)
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


def simulate_copies(idle_s: np.ndarray, copies: Copies) -> CopySchedule:
  """Stalls of `copies` sharing one FIFO copy engine that advances during `idle_s` [T]."""
  num_ops, k = len(idle_s), len(copies)
  stall = np.zeros(num_ops + 1)
  if k == 0:
    return CopySchedule(stall, np.zeros(0))
  order = np.lexsort((copies.done, copies.start))
  start, done, work = copies.start[order], copies.done[order], copies.work_s[order]
  idle_before = np.concatenate(([0.0], np.cumsum(idle_s)))  # [T + 1]
  cumulative = np.cumsum(work)
  before = cumulative - work
  # Boundaries with a done point, and the last copy (in FIFO order) due at each: its finish is
  # the latest of the copies due there, since finishes never decrease along the queue.
  due_order = np.argsort(done, kind="stable")
  due_sorted = done[due_order]
  first = np.flatnonzero(np.concatenate(([True], due_sorted[1:] != due_sorted[:-1])))
  boundaries = due_sorted[first]                                   # [D]
  last_due = np.maximum.reduceat(due_order, first)                 # [D]
  idle_at_due = idle_before[boundaries]
  # Stalls before a copy's issue are those at done boundaries < start (issue comes first).
  previous_due = np.searchsorted(boundaries, start, side="left") - 1  # [K], -1: none
  arrival_idle = idle_before[start]
  has_previous = previous_due >= 0
  previous_safe = np.maximum(previous_due, 0)
  stalled = np.zeros(k)
  for _ in range(len(boundaries) + 1):
    finish = cumulative + np.maximum.accumulate(arrival_idle + stalled - before)
    after = np.maximum(np.maximum.accumulate(finish[last_due] - idle_at_due), 0.0)  # [D]
    new = np.where(has_previous, after[previous_safe], 0.0)
    if np.array_equal(new, stalled):
      break
    stalled = new
  stall[boundaries] = np.diff(after, prepend=0.0)
  finish_s = np.empty(k)
  finish_s[order] = finish
  return CopySchedule(stall, finish_s)


def total_stall(idle_s: np.ndarray, copies: Copies) -> float:
  """Seconds the program waits for copies in all (see `simulate_copies`)."""
  return simulate_copies(idle_s, copies).total_stall_s
