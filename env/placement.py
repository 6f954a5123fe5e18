"""The state of a partial mapping: rectangles placed per fast level and the incremental cost.

mallocGame and every baseline solver place requests through this one class, so they share the
rules for free gaps and candidates and the exact incremental cost; only the choices differ.

Op times update locally (a placement changes only the ops its buffer touches), but copy
contention is not local: a placement changes the default-memory idle time of its ops, and a
prefetch joins the copy queue, so every later copy may finish at another time. After each
placement the copy queue is re-simulated (env/simulator.py, vectorised over the copies placed so
far), so `total_time` is always the exact program time and the saving `place` returns is exact.
`saving` is an estimate (op time saved minus the prefetch's exposed copy time against reference
time, no contention) that players may use to choose; it is not what `place` returns.
"""

from __future__ import annotations

import functools

import numpy as np

from malloczero.common.lazy import lazy_module
from malloczero.env.cost_model import NO_COPY, Allocations, CostModel
from malloczero.env.mapping import Mapping
from malloczero.env.requests import Requests, has_rivals
from malloczero.env.simulator import Copies, CopyQueue, StallTracker

# `place_in_order`'s loop, jitted (env/placement_kernels.py), loaded on first use so that
# importing the game does not load numba.
_kernels = lazy_module("malloczero.env.placement_kernels")
ROUNDING = 1e-12  # The program time's relative rounding that no kept placement may be within.


class Placement:
  """Placements of `requests` (any order, each at most once) in the fast levels."""

  def __init__(self, model: CostModel, requests: Requests):
    self.model, self.requests = model, requests
    self.hardware = model.hardware
    self.num_fast = self.hardware.num_fast_levels
    self.capacity = self.hardware.capacities[:-1].astype(np.int64)  # [F]
    # Requests of one buffer overlap in time only where they are alternatives (an activation's
    # whole live range and its groups, build_requests' late prefetches): one excludes the other.
    self._exclusive = has_rivals(requests)
    # A placement is kept only if it saves more than the rounding of the program time's sums:
    # one that saves nothing exactly (a prefetch whose stall takes back all it saves) can come
    # out a few 1e-19 s either way, and would then hold fast memory for nothing.
    self.min_saving = ROUNDING * model.slow_only_time
    self.reset()

  def reset(self) -> None:
    num_requests, num_fast = len(self.requests), self.num_fast
    self.memory_time = self.model.slow_memory_time.copy()  # [T]
    self.default_time = self.model.slow_memory_time.copy()  # [T] of it in default memory
    self.op_time = np.maximum(self.model.compute_time, self.memory_time)  # [T]
    self.op_time_sum = float(self.op_time.sum())
    self.stall_time = 0.0
    self.total_time = self.op_time_sum
    # Copies (prefetches and evictions) placed so far: the first `num_copies` entries.
    self._copy_start = np.zeros(num_requests, np.int64)
    self._copy_done = np.zeros(num_requests, np.int64)
    self._copy_work = np.zeros(num_requests)
    self.num_copies = 0
    self._queue: CopyQueue | None = None  # The copies' queue, rebuilt when a prefetch is added.
    # Rectangles per fast level: [F, R], the first `count[f]` entries used.
    self._rect_start = np.zeros((num_fast, num_requests), np.int64)
    self._rect_end = np.zeros((num_fast, num_requests), np.int64)
    self._rect_low = np.zeros((num_fast, num_requests), np.int64)
    self._rect_high = np.zeros((num_fast, num_requests), np.int64)
    self.count = [0] * num_fast
    self.placed: list[tuple[int, int, int]] = []  # (request, level, offset)
    self._undo: tuple | None = None  # What the last `place` changed, for `undo_last`.
    self._windows: dict[int, list[tuple[int, int]]] = {}  # buffer -> placed windows
    # `place_in_order`'s own state (the copies' stall tracker, rows, counts), made on its first
    # call after a reset; `place` drops it, since it places without it.
    self._jitted: tuple | None = None

  def free_gaps(self, level: int, start: int, end: int) -> tuple[np.ndarray, np.ndarray]:
    """Free address intervals `[low, high)` of `level` throughout ops `[start, end)`, by address."""
    n = self.count[level]
    whole = (np.zeros(1, np.int64), self.capacity[level : level + 1])
    if n == 0:
      return whole
    live = (self._rect_start[level, :n] < end) & (self._rect_end[level, :n] > start)
    low = self._rect_low[level, :n][live]
    if low.size == 0:
      return whole
    order = np.argsort(low, kind="stable")
    low = low[order]
    covered = np.maximum.accumulate(self._rect_high[level, :n][live][order])
    gap_low = np.concatenate(([0], covered))
    gap_high = np.concatenate((low, self.capacity[level : level + 1]))
    keep = gap_high > gap_low
    return gap_low[keep], gap_high[keep]

  def blocked(self, r: int) -> bool:
    """Whether a placed request of the same buffer overlaps request `r`'s window."""
    if not self._exclusive:
      return False
    lo, hi = int(self.requests.start[r]), int(self.requests.end[r])
    return any(s < hi and e > lo for s, e in self._windows.get(int(self.requests.buffer[r]), ()))

  def saving(self, r: int) -> np.ndarray:
    """[F] seconds placing request `r` in each fast level would save now (copy cost included)."""
    ops, nbytes = self.requests.ops(r)
    return self.model.saving_per_fast_level(
      self.memory_time, self.op_time, ops, nbytes, float(self.requests.exposed_copy_time[r])
    )

  def place(self, r: int, level: int, offset: int) -> float:
    """Places request `r`; returns the exact seconds saved (copy contention included). The caller
    guarantees the spot is free."""
    req, model = self.requests, self.model
    ops, nbytes = req.ops(r)
    self._jitted = None
    self._undo = (
      ops,
      self.memory_time[ops],
      self.op_time[ops],
      self.default_time[ops],
      self.op_time_sum,
      self.stall_time,
      self.total_time,
      self.num_copies,
    )
    memory, new_time, op_saved = model.placement_delta(
      self.memory_time, self.op_time, ops, nbytes, level, 0.0
    )
    self.memory_time[ops] = memory
    self.op_time[ops] = new_time
    self.default_time[ops] -= nbytes * model.inverse_bandwidth[-1]
    self.op_time_sum -= op_saved
    copies = bool(req.is_prefetch[r] or req.evict_start[r] != NO_COPY)
    if copies:  # A request has at most one copy: a prefetch, or an eviction of its own value.
      k = self.num_copies
      evicts = not req.is_prefetch[r]
      self._copy_start[k] = req.evict_start[r] if evicts else req.start[r]
      self._copy_done[k] = req.evict_done[r] if evicts else req.first_use[r]
      self._copy_work[k] = model.copy_time[req.buffer[r]]
      self.num_copies = k + 1
      self._queue = None
    before = self.total_time
    # Moving bytes out of default memory never shortens an op's idle time, and more idle time
    # never adds a stall: with no stall now, placing an activation leaves none to simulate.
    if self.num_copies and (copies or self.stall_time > 0):
      k = self.num_copies
      if self._queue is None:
        self._queue = CopyQueue(
          Copies(
            self._copy_start[:k].copy(), self._copy_done[:k].copy(), self._copy_work[:k].copy()
          ),
          model.num_ops,
        )
      self.stall_time = self._queue.total_stall(model.idle_time(self.op_time, self.default_time))
    self.total_time = self.op_time_sum + self.stall_time
    saved = before - self.total_time
    i = self.count[level]
    self._rect_start[level, i] = req.start[r]
    self._rect_end[level, i] = req.end[r]
    self._rect_low[level, i] = offset
    self._rect_high[level, i] = offset + req.size[r]
    self.count[level] = i + 1
    self.placed.append((r, level, offset))
    if self._exclusive:
      self._windows.setdefault(int(req.buffer[r]), []).append((int(req.start[r]), int(req.end[r])))
    return saved

  def first_fit(self, r: int, level: int) -> int | None:
    """Lowest free offset of `level` that holds request `r` for its whole window, if any."""
    if self.blocked(r):
      return None
    low, high = self.free_gaps(level, int(self.requests.start[r]), int(self.requests.end[r]))
    fits = np.flatnonzero(high - low >= self.requests.size[r])
    return int(low[fits[0]]) if fits.size else None

  def best_fit(self, r: int, level: int) -> int | None:
    """Start of the smallest free gap of `level` that holds request `r` (ties: lowest offset)."""
    if self.blocked(r):
      return None
    low, high = self.free_gaps(level, int(self.requests.start[r]), int(self.requests.end[r]))
    gap = high - low
    fits = np.flatnonzero(gap >= self.requests.size[r])
    return int(low[fits[np.argmin(gap[fits])]]) if fits.size else None

  def undo_last(self) -> None:
    """Takes back the last `place` (only the last one: what it changed was kept)."""
    if self._undo is None:
      raise ValueError("nothing to undo: undo_last follows a place() it has not undone")
    ops, memory, op_time, default, op_sum, stall, total, copies = self._undo
    if copies != self.num_copies:
      self._queue = None
    self.memory_time[ops], self.op_time[ops], self.default_time[ops] = memory, op_time, default
    self.op_time_sum, self.stall_time, self.total_time = op_sum, stall, total
    self.num_copies = copies
    r, level, _ = self.placed.pop()
    self.count[level] -= 1
    if self._exclusive:
      self._windows[int(self.requests.buffer[r])].pop()
    self._undo = None

  def place_where_it_saves_most(self, r: int, fit: str = "best") -> bool:
    """Places request `r` in the level where it is estimated to save most now (`saving`) among
    those with room, at the `fit` ("best" or "first") offset, and keeps it there only if it
    really saves time (copy contention can make an estimated saving a loss; it must save more
    than `min_saving`, the rounding); otherwise, or if it saves nothing anywhere, leaves it in
    slow memory."""
    if self.blocked(r):
      return False
    saving = self.saving(r)
    find = self.best_fit if fit == "best" else self.first_fit
    for level in np.argsort(-saving, kind="stable"):
      if saving[level] <= 0:
        return False
      offset = find(r, int(level))
      if offset is not None:
        if self.place(r, int(level), offset) > self.min_saving:
          return True
        self.undo_last()
        return False
    return False

  @functools.cached_property
  def _kernel_inputs(self) -> tuple[tuple, tuple]:
    """What `place_in_order`'s kernel reads and never changes, and its scratch arrays: made on
    its first call, since the game and the other solvers never need them."""
    requests, model = self.requests, self.model
    num_requests = len(requests)
    by_buffer = np.argsort(requests.buffer, kind="stable")
    num_buffers = int(requests.buffer.max()) + 1 if num_requests else 0
    model_arrays = (model.compute_time, model.inverse_bandwidth, model.copy_time, self.capacity)
    constant = (
      (
        requests.start.astype(np.int64),
        requests.end.astype(np.int64),
        requests.size.astype(np.int64),
        requests.buffer.astype(np.int64),
        requests.first_use.astype(np.int64),
        requests.evict_start.astype(np.int64),
        requests.evict_done.astype(np.int64),
        requests.is_prefetch.astype(bool),
        requests.evict_start != NO_COPY,
        requests.exposed_copy_time.astype(np.float64),
      ),
      (
        requests.incidence_start.astype(np.int64),
        requests.incidence_op.astype(np.int64),
        requests.incidence_bytes.astype(np.float64),
      ),
      tuple(np.ascontiguousarray(a) for a in model_arrays),
      (
        np.searchsorted(requests.buffer[by_buffer], np.arange(num_buffers + 1)).astype(np.int64),
        by_buffer.astype(np.int64),
      ),
    )
    widest = int(np.diff(requests.incidence_start).max()) if num_requests else 0
    scratch = (
      np.zeros(num_requests, np.int64),
      np.zeros(num_requests, np.int64),
      np.zeros(widest),
      np.zeros(widest),
      np.zeros(widest),
    )
    return constant, scratch

  def place_in_order(self, order: np.ndarray) -> None:
    """`place_where_it_saves_most(r, fit="best")` for each request `r` of `order` [k] in turn,
    in one jitted loop (env/placement_kernels.py; the same rules, the program time equal to
    rounding), for evo's decodes. It continues a placement that it alone made since `reset`."""
    if self._jitted is None:
      if self.placed:  # `place` made them, without the kernel's state.
        raise ValueError("place_in_order continues only its own placements since reset()")
      num_requests = len(self.requests)
      idle = self.model.idle_time(self.op_time, self.default_time)
      self._jitted = (
        (np.zeros((num_requests, 3), np.int64), np.zeros(num_requests, bool)),
        np.zeros(self.num_fast, np.int64),
        StallTracker(idle, capacity=max(num_requests, 1)).kernel_arrays(),
        np.array([self.op_time_sum, self.stall_time, self.total_time]),
        np.zeros(2, np.int64),
      )
    placed, count, tracker, sums, counts = self._jitted
    (requests, incidence, costs, buffer_requests), scratch = self._kernel_inputs
    _kernels().place_in_order(
      np.ascontiguousarray(order, np.int64),
      requests,
      incidence,
      costs,
      (self.memory_time, self.default_time, self.op_time),
      (self._rect_start, self._rect_end, self._rect_low, self._rect_high),
      count,
      (self._copy_start, self._copy_done, self._copy_work),
      placed,
      buffer_requests,
      tracker,
      sums,
      counts,
      self._exclusive,
      self.min_saving,
      scratch,
    )
    before = len(self.placed)
    rows = placed[0][before : counts[1]]
    self.placed.extend((int(r), int(level), int(offset)) for r, level, offset in rows)
    if self._exclusive:
      for r in rows[:, 0]:
        window = (int(self.requests.start[r]), int(self.requests.end[r]))
        self._windows.setdefault(int(self.requests.buffer[r]), []).append(window)
    self.op_time_sum, self.stall_time, self.total_time = (float(x) for x in sums)
    self.num_copies = int(counts[0])
    self.count = [int(c) for c in count]
    self._queue, self._undo = None, None

  def request_indices(self) -> np.ndarray:
    return np.array([p[0] for p in self.placed], np.int64)

  def allocations(self) -> Allocations:
    """Placements so far, in the order they were made."""
    rows = np.array(self.placed, np.int64).reshape(len(self.placed), 3)
    req = self.requests
    r = rows[:, 0]
    return Allocations(
      buffer=req.buffer[r],
      level=rows[:, 1],
      offset=rows[:, 2],
      start=req.start[r],
      end=req.end[r],
      prefetch_done=np.where(req.is_prefetch[r], req.first_use[r], NO_COPY),
      evict_start=req.evict_start[r],
      evict_done=req.evict_done[r],
    )

  def mapping(self, solver: str) -> Mapping:
    return Mapping.from_arrays(
      self.model.workload,
      self.hardware,
      solver,
      request=self.request_indices(),
      allocations=self.allocations(),
      estimated_time_s=self.total_time,
      slow_only_time_s=self.model.slow_only_time,
    )
