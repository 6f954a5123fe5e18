"""XLA memory-space-assignment style cost model, vectorised with numpy.

  op time      = max(flops / peak, sum over the op's operands and results of bytes / bw(level))
  program time = sum of op times + stalls waiting for copies (env/simulator.py)

A mapping is a set of fast allocations (segments). Each holds one buffer in one fast level over
ops `[start, end)` and is filled in one of two ways:

* produced in place: an activation's allocation starting at its defining op, which writes the
  value straight into fast memory;
* a prefetch: an asynchronous copy from default memory issued at the allocation's start and due
  at `prefetch_done` (the first use it serves). Uses in `[start, prefetch_done)` still read the
  default-memory copy; uses in `[prefetch_done, end)` read the fast one.

An allocation may also be evicted: an asynchronous copy to default memory issued at
`evict_start` and due at `evict_done` (`<= end`), after which default memory holds the value
again. At op `t` a buffer is in the level of the allocation serving `t`, else in default memory.

Every prefetch and eviction shares one copy engine, as XLA's `RuntimeSimulator` models it: FIFO,
advancing only during each op's default-memory idle time (op time minus the op's own
default-memory bytes / default bandwidth), the program stalling at a due point for what is left
(env/simulator.py says why one queue and how it is solved). Times from before copy contention
(copies hidden behind each op's all-fastest reference time, no contention) are not comparable.

`exposed_copy_time`, the copy time a prefetch cannot hide behind the reference time of the ops
before its use, remains as the requests' and the greedy solvers' *estimate* of a prefetch's
cost; it is not the program time.
"""

from __future__ import annotations

import dataclasses
import functools

import numpy as np

from malloczero.env.hardware import Hardware
from malloczero.env.simulator import Copies, simulate_copies
from malloczero.env.workload import Workload

NO_COPY = -1  # In `prefetch_done` / `evict_start` / `evict_done`: no such copy.


@dataclasses.dataclass(frozen=True)
class Allocations:
  """Fast-memory allocations (segments) as parallel arrays `[n]`.

  `buffer` is a position in `workload.buffers`; `[start, end)` op indices. `prefetch_done` is
  the boundary by which the prefetch filling the allocation must be done, `NO_COPY` for one
  produced in place; left `None` it is `NO_COPY` for activations and, for parameters and inputs
  (which only a prefetch can fill), the first use in the allocation (`CostModel.resolve`).
  `evict_start` / `evict_done` are the eviction copy's window, `NO_COPY` when not evicted."""

  buffer: np.ndarray
  level: np.ndarray
  offset: np.ndarray
  start: np.ndarray
  end: np.ndarray
  prefetch_done: np.ndarray | None = None
  evict_start: np.ndarray | None = None
  evict_done: np.ndarray | None = None

  def __post_init__(self):
    for name in ("evict_start", "evict_done"):
      if getattr(self, name) is None:
        object.__setattr__(self, name, np.full(len(self.buffer), NO_COPY, np.int64))

  @classmethod
  def empty(cls) -> "Allocations":
    z = np.zeros(0, np.int64)
    return cls(z, z, z, z, z, z, z, z)

  def __len__(self) -> int:
    return len(self.buffer)

  @property
  def is_prefetch(self) -> np.ndarray:
    """[n] bool: filled by a prefetch copy (needs `prefetch_done` set, see `CostModel.resolve`)."""
    return self.prefetch_done != NO_COPY

  @property
  def is_evicted(self) -> np.ndarray:
    return self.evict_start != NO_COPY


@dataclasses.dataclass(frozen=True)
class Evaluation:
  total_time_s: float
  op_time_s: np.ndarray  # [T]
  stall_s: np.ndarray  # [T + 1] waiting for copies at each boundary (before op t; T: end)
  copy_finish_s: np.ndarray  # [K] each copy's finish on the copy engine's clock (prefetches,
  # then evictions, in allocation order)

  @property
  def compute_and_memory_s(self) -> float:
    return float(self.op_time_s.sum())

  @property
  def total_stall_s(self) -> float:
    return float(self.stall_s.sum())


class CostModel:
  """Precomputed per-(workload, hardware) quantities and a fresh evaluation of any mapping."""

  def __init__(self, workload: Workload, hardware: Hardware):
    self.workload = workload
    self.hardware = hardware
    a = workload.arrays
    self.num_ops = workload.num_ops
    self.inverse_bandwidth = hardware.inverse_bandwidths  # [L]
    self.compute_time = a.flops / hardware.peak_flops_per_s  # [T]
    self.copy_time = a.sizes / hardware.copy_bandwidth_bytes_per_s  # [N]
    fastest_memory = np.bincount(
      a.incidence_op, a.incidence_bytes * self.inverse_bandwidth[0], minlength=self.num_ops
    )
    self.reference_time = np.maximum(self.compute_time, fastest_memory)  # [T]
    self.reference_prefix = np.concatenate([[0.0], np.cumsum(self.reference_time)])  # [T + 1]
    self.slow_memory_time = np.bincount(
      a.incidence_op, a.incidence_bytes * self.inverse_bandwidth[-1], minlength=self.num_ops
    )
    # Incidence keys sorted by (buffer, op): the order `WorkloadArrays` already has.
    self._incidence_key = a.incidence_buffer * (self.num_ops + 1) + a.incidence_op

  @functools.cached_property
  def slow_prefix(self) -> np.ndarray:
    """`[T + 1]` cumulative op time with every buffer in slow memory: the elapsed time XLA's msa
    hides a copy behind (its prefetch-interval picker's `GetInstructionElapsed`)."""
    return np.concatenate([[0.0], np.cumsum(np.maximum(self.compute_time, self.slow_memory_time))])

  @functools.cached_property
  def slow_only_time(self) -> float:
    """Program time with every buffer in the slow default memory."""
    return float(np.maximum(self.compute_time, self.slow_memory_time).sum())

  def hidden_time(self, start: np.ndarray, first_use: np.ndarray) -> np.ndarray:
    """Reference time of the ops in `[start, first_use)`, behind which a copy can hide."""
    return self.reference_prefix[first_use] - self.reference_prefix[start]

  def exposed_copy_time(self, buffer: np.ndarray, start: np.ndarray, due: np.ndarray) -> np.ndarray:
    """Seconds of a copy of each `buffer` issued at `start` and due at `due` left over after
    hiding behind the reference time in between (a prefetch's or an eviction's)."""
    return np.maximum(0.0, self.copy_time[buffer] - self.hidden_time(start, due))

  def placement_delta(
    self,
    memory_time: np.ndarray,
    op_time: np.ndarray,
    ops: np.ndarray,
    nbytes: np.ndarray,
    level: int,
    exposed_copy_s: float,
  ) -> tuple[np.ndarray, np.ndarray, float]:
    """Incremental update for moving `nbytes` [k] touched by distinct `ops` [k] from slow memory
    to `level`, given the current per-op memory and op times [T].

    Returns (new memory time [k], new op time [k], seconds saved including the exposed copy)."""
    memory = memory_time[ops] - nbytes * (
      self.inverse_bandwidth[-1] - self.inverse_bandwidth[level]
    )
    new_time = np.maximum(self.compute_time[ops], memory)
    return memory, new_time, float((op_time[ops] - new_time).sum()) - exposed_copy_s

  def saving_per_fast_level(
    self,
    memory_time: np.ndarray,
    op_time: np.ndarray,
    ops: np.ndarray,
    nbytes: np.ndarray,
    exposed_copy_s: float,
  ) -> np.ndarray:
    """[F] seconds `placement_delta` would save for each fast level, computed in one pass."""
    saved_per_byte = self.inverse_bandwidth[-1] - self.inverse_bandwidth[:-1]
    memory = memory_time[ops][None, :] - nbytes[None, :] * saved_per_byte[:, None]
    new_time = np.maximum(self.compute_time[ops][None, :], memory)
    return (op_time[ops][None, :] - new_time).sum(axis=1) - exposed_copy_s

  def first_use_in(self, buffer: np.ndarray, start: np.ndarray, end: np.ndarray) -> np.ndarray:
    """[n] first op in `[start, end)` at which `buffer` is touched; `end` if none."""
    a = self.workload.arrays
    if len(a.incidence_op) == 0:
      return np.asarray(end, np.int64).copy()
    stride = self.num_ops + 1
    pos = np.searchsorted(self._incidence_key, buffer * stride + start, side="left")
    safe = np.minimum(pos, len(a.incidence_op) - 1)
    serves = (
      (pos < len(a.incidence_op))
      & (a.incidence_buffer[safe] == buffer)
      & (a.incidence_op[safe] < end)
    )
    return np.where(serves, a.incidence_op[safe], end).astype(np.int64)

  def resolve(self, allocations: Allocations) -> Allocations:
    """`allocations` with `prefetch_done` filled in where it was left `None` (see Allocations)."""
    if allocations.prefetch_done is not None:
      return allocations
    first = self.first_use_in(allocations.buffer, allocations.start, allocations.end)
    done = np.where(self.workload.arrays.is_prefetched[allocations.buffer], first, NO_COPY)
    return dataclasses.replace(allocations, prefetch_done=done.astype(np.int64))

  def copy_work(self, buffer: np.ndarray) -> np.ndarray:
    """[n] seconds a copy of each buffer keeps the copy engine busy."""
    return self.copy_time[buffer]

  def copies(self, allocations: Allocations) -> Copies:
    """The prefetches, then the evictions, of resolved `allocations`."""
    pre, ev = allocations.is_prefetch, allocations.is_evicted
    return Copies(
      np.concatenate([allocations.start[pre], allocations.evict_start[ev]]),
      np.concatenate([allocations.prefetch_done[pre], allocations.evict_done[ev]]),
      np.concatenate(
        [self.copy_work(allocations.buffer[pre]), self.copy_work(allocations.buffer[ev])]
      ),
    )

  def serving(self, allocations: Allocations) -> np.ndarray:
    """[E] for each incidence (workload order), the resolved allocation whose fast copy it
    reads or writes, -1 where it uses default memory: the allocation of the same buffer
    covering the op, once its prefetch (if any) is done."""
    a = self.workload.arrays
    stride = self.num_ops + 1
    serving = np.full(len(a.incidence_op), -1, np.int64)
    if len(allocations) == 0:
      return serving
    order = np.argsort(allocations.buffer * stride + allocations.start, kind="stable")
    alloc_buffer = allocations.buffer[order]
    alloc_key = alloc_buffer * stride + allocations.start[order]
    # The allocation of the same buffer with the latest start at or before each incidence.
    idx = np.searchsorted(alloc_key, self._incidence_key, side="right") - 1
    safe = np.maximum(idx, 0)
    covered = (
      (idx >= 0)
      & (alloc_buffer[safe] == a.incidence_buffer)
      & (a.incidence_op < allocations.end[order][safe])
      & (a.incidence_op >= allocations.prefetch_done[order][safe])
    )
    serving[covered] = order[safe[covered]]
    return serving

  def evaluate(self, allocations: Allocations) -> Evaluation:
    """Fresh evaluation from scratch. Assumes allocations of one buffer do not overlap in time
    (the validator checks that); it does not use any of the game's incremental state."""
    allocations = self.resolve(allocations)
    a = self.workload.arrays
    serving = self.serving(allocations)
    incidence_level = np.where(
      serving >= 0,
      allocations.level[np.maximum(serving, 0)] if len(allocations) else 0,
      self.hardware.slow_level,
    )
    memory = np.bincount(
      a.incidence_op,
      a.incidence_bytes * self.inverse_bandwidth[incidence_level],
      minlength=self.num_ops,
    )
    slow = incidence_level == self.hardware.slow_level
    default = np.bincount(
      a.incidence_op[slow],
      a.incidence_bytes[slow] * self.inverse_bandwidth[-1],
      minlength=self.num_ops,
    )
    op_time = np.maximum(self.compute_time, memory)
    schedule = simulate_copies(self.idle_time(op_time, default), self.copies(allocations))
    return Evaluation(
      float(op_time.sum() + schedule.total_stall_s), op_time, schedule.stall_s, schedule.finish_s
    )

  @staticmethod
  def idle_time(op_time: np.ndarray, default_memory_time: np.ndarray) -> np.ndarray:
    """[T] each op's default-memory idle time: when copies can use the default memory."""
    return np.maximum(op_time - default_memory_time, 0.0)
