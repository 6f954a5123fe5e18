"""XLA memory-space-assignment style cost model, vectorised with numpy.

  op time      = max(flops / peak, sum over the op's operands and results of bytes / bw(level))
  program time = sum of op times + copy time that could not be hidden behind ops

A buffer is in a fast level at op `t` when an allocation of that buffer covers `t`; otherwise it
is in the slow default memory. An allocation of a parameter or input is filled by an
asynchronous copy at the copy bandwidth that starts at the allocation's start; the copy is
hidden behind the ops between the allocation's start and the first use it serves, and what
is left over is exposed (added to program time). Hiding is measured against each op's
*reference time*, the time it would take with all its buffers in the fastest level: the
smallest time the op can take under any mapping, so exposed copy time is never understated
and does not depend on the rest of the mapping. Concurrent copies are not modelled as
contending for the copy engine.
"""

from __future__ import annotations

import dataclasses
import functools

import numpy as np

from malloczero.env.hardware import Hardware
from malloczero.env.workload import Workload


@dataclasses.dataclass(frozen=True)
class Allocations:
  """Fast-memory placements as parallel arrays `[n]` (buffer = position in `workload.buffers`)."""
  buffer: np.ndarray
  level: np.ndarray
  offset: np.ndarray
  start: np.ndarray
  end: np.ndarray

  @classmethod
  def empty(cls) -> "Allocations":
    z = np.zeros(0, np.int64)
    return cls(z, z, z, z, z)

  def __len__(self) -> int:
    return len(self.buffer)


@dataclasses.dataclass(frozen=True)
class Evaluation:
  total_time_s: float
  op_time_s: np.ndarray        # [T]
  exposed_copy_s: np.ndarray   # [n] per allocation

  @property
  def compute_and_memory_s(self) -> float:
    return float(self.op_time_s.sum())


class CostModel:
  """Precomputed per-(workload, hardware) quantities and a fresh evaluation of any mapping."""

  def __init__(self, workload: Workload, hardware: Hardware):
    self.workload = workload
    self.hardware = hardware
    a = workload.arrays
    self.num_ops = workload.num_ops
    self.inverse_bandwidth = hardware.inverse_bandwidths        # [L]
    self.compute_time = a.flops / hardware.peak_flops_per_s     # [T]
    self.copy_time = a.sizes / hardware.copy_bandwidth_bytes_per_s  # [N]
    fastest_memory = np.bincount(a.incidence_op, a.incidence_bytes * self.inverse_bandwidth[0],
                                 minlength=self.num_ops)
    self.reference_time = np.maximum(self.compute_time, fastest_memory)  # [T]
    self.reference_prefix = np.concatenate([[0.0], np.cumsum(self.reference_time)])  # [T + 1]
    self.slow_memory_time = np.bincount(
        a.incidence_op, a.incidence_bytes * self.inverse_bandwidth[-1], minlength=self.num_ops)
    # Incidence keys sorted by (buffer, op): the order `WorkloadArrays` already has.
    self._incidence_key = a.incidence_buffer * (self.num_ops + 1) + a.incidence_op

  @functools.cached_property
  def slow_only_time(self) -> float:
    """Program time with every buffer in the slow default memory."""
    return float(np.maximum(self.compute_time, self.slow_memory_time).sum())

  def hidden_time(self, start: np.ndarray, first_use: np.ndarray) -> np.ndarray:
    """Reference time of the ops in `[start, first_use)`, behind which a copy can hide."""
    return self.reference_prefix[first_use] - self.reference_prefix[start]

  def exposed_copy_time(self, buffer: np.ndarray, start: np.ndarray,
                        first_use: np.ndarray) -> np.ndarray:
    """Copy time left over after hiding; zero for buffers that are not prefetched."""
    exposed = np.maximum(0.0, self.copy_time[buffer] - self.hidden_time(start, first_use))
    return np.where(self.workload.arrays.is_prefetched[buffer], exposed, 0.0)

  def placement_delta(self, memory_time: np.ndarray, op_time: np.ndarray, ops: np.ndarray,
                      nbytes: np.ndarray, level: int,
                      exposed_copy_s: float) -> tuple[np.ndarray, np.ndarray, float]:
    """Incremental update for moving `nbytes` [k] touched by distinct `ops` [k] from slow memory
    to `level`, given the current per-op memory and op times [T].

    Returns (new memory time [k], new op time [k], seconds saved including the exposed copy)."""
    memory = memory_time[ops] - nbytes * (self.inverse_bandwidth[-1] - self.inverse_bandwidth[level])
    new_time = np.maximum(self.compute_time[ops], memory)
    return memory, new_time, float((op_time[ops] - new_time).sum()) - exposed_copy_s

  def saving_per_fast_level(self, memory_time: np.ndarray, op_time: np.ndarray, ops: np.ndarray,
                            nbytes: np.ndarray, exposed_copy_s: float) -> np.ndarray:
    """[F] seconds `placement_delta` would save for each fast level, computed in one pass."""
    saved_per_byte = self.inverse_bandwidth[-1] - self.inverse_bandwidth[:-1]
    memory = memory_time[ops][None, :] - nbytes[None, :] * saved_per_byte[:, None]
    new_time = np.maximum(self.compute_time[ops][None, :], memory)
    return (op_time[ops][None, :] - new_time).sum(axis=1) - exposed_copy_s

  def evaluate(self, allocations: Allocations) -> Evaluation:
    """Fresh evaluation from scratch. Assumes allocations of one buffer do not overlap in time
    (the validator checks that); it does not use any of the game's incremental state."""
    a = self.workload.arrays
    stride = self.num_ops + 1
    n = len(allocations)
    incidence_level = np.full(len(a.incidence_op), self.hardware.slow_level, np.int64)
    exposed = np.zeros(n)
    if n:
      order = np.argsort(allocations.buffer * stride + allocations.start, kind="stable")
      alloc_buffer = allocations.buffer[order]
      alloc_start, alloc_end = allocations.start[order], allocations.end[order]
      alloc_key = alloc_buffer * stride + alloc_start
      # The allocation of the same buffer with the latest start at or before each incidence.
      idx = np.searchsorted(alloc_key, self._incidence_key, side="right") - 1
      safe = np.maximum(idx, 0)
      covered = ((idx >= 0) & (alloc_buffer[safe] == a.incidence_buffer)
                 & (a.incidence_op < alloc_end[safe]))
      incidence_level[covered] = allocations.level[order][safe[covered]]
      # First incidence served by each allocation: where its copy must have finished.
      pos = np.searchsorted(self._incidence_key, alloc_key, side="left")
      pos_safe = np.minimum(pos, len(a.incidence_op) - 1)
      serves = ((pos < len(a.incidence_op)) & (a.incidence_buffer[pos_safe] == alloc_buffer)
                & (a.incidence_op[pos_safe] < alloc_end))
      first_use = np.where(serves, a.incidence_op[pos_safe], alloc_end)
      exposed[order] = self.exposed_copy_time(alloc_buffer, alloc_start, first_use)
    memory = np.bincount(a.incidence_op,
                         a.incidence_bytes * self.inverse_bandwidth[incidence_level],
                         minlength=self.num_ops)
    op_time = np.maximum(self.compute_time, memory)
    return Evaluation(float(op_time.sum() + exposed.sum()), op_time, exposed)
