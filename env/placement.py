"""The state of a partial mapping: rectangles placed per fast level and the incremental cost.

mallocGame and every baseline solver place requests through this one class, so they share the
rules for free gaps and candidates and the exact incremental cost; only the choices differ.
"""

from __future__ import annotations

import numpy as np

from malloczero.env.cost_model import Allocations, CostModel
from malloczero.env.mapping import Mapping
from malloczero.env.requests import Requests


class Placement:
  """Placements of `requests` (any order, each at most once) in the fast levels."""

  def __init__(self, model: CostModel, requests: Requests):
    self.model, self.requests = model, requests
    self.hardware = model.hardware
    self.num_fast = self.hardware.num_fast_levels
    self.capacity = self.hardware.capacities[:-1].astype(np.int64)  # [F]
    self.reset()

  def reset(self) -> None:
    num_requests, num_fast = len(self.requests), self.num_fast
    self.memory_time = self.model.slow_memory_time.copy()                       # [T]
    self.op_time = np.maximum(self.model.compute_time, self.memory_time)        # [T]
    self.total_time = float(self.op_time.sum())
    # Rectangles per fast level: [F, R], the first `count[f]` entries used.
    self._rect_start = np.zeros((num_fast, num_requests), np.int64)
    self._rect_end = np.zeros((num_fast, num_requests), np.int64)
    self._rect_low = np.zeros((num_fast, num_requests), np.int64)
    self._rect_high = np.zeros((num_fast, num_requests), np.int64)
    self.count = [0] * num_fast
    self.placed: list[tuple[int, int, int]] = []  # (request, level, offset)

  def free_gaps(self, level: int, start: int, end: int) -> tuple[np.ndarray, np.ndarray]:
    """Free address intervals `[low, high)` of `level` throughout ops `[start, end)`, by address."""
    n = self.count[level]
    whole = (np.zeros(1, np.int64), self.capacity[level:level + 1])
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
    gap_high = np.concatenate((low, self.capacity[level:level + 1]))
    keep = gap_high > gap_low
    return gap_low[keep], gap_high[keep]

  def saving(self, r: int) -> np.ndarray:
    """[F] seconds placing request `r` in each fast level would save now (copy cost included)."""
    ops, nbytes = self.requests.ops(r)
    return self.model.saving_per_fast_level(self.memory_time, self.op_time, ops, nbytes,
                                            float(self.requests.exposed_copy_time[r]))

  def place(self, r: int, level: int, offset: int) -> float:
    """Places request `r`; returns the seconds saved. The caller guarantees the spot is free."""
    req = self.requests
    ops, nbytes = req.ops(r)
    memory, new_time, saved = self.model.placement_delta(
        self.memory_time, self.op_time, ops, nbytes, level, float(req.exposed_copy_time[r]))
    self.memory_time[ops] = memory
    self.op_time[ops] = new_time
    self.total_time -= saved
    i = self.count[level]
    self._rect_start[level, i] = req.start[r]
    self._rect_end[level, i] = req.end[r]
    self._rect_low[level, i] = offset
    self._rect_high[level, i] = offset + req.size[r]
    self.count[level] = i + 1
    self.placed.append((r, level, offset))
    return saved

  def first_fit(self, r: int, level: int) -> int | None:
    """Lowest free offset of `level` that holds request `r` for its whole window, if any."""
    low, high = self.free_gaps(level, int(self.requests.start[r]), int(self.requests.end[r]))
    fits = np.flatnonzero(high - low >= self.requests.size[r])
    return int(low[fits[0]]) if fits.size else None

  def best_fit(self, r: int, level: int) -> int | None:
    """Start of the smallest free gap of `level` that holds request `r` (ties: lowest offset)."""
    low, high = self.free_gaps(level, int(self.requests.start[r]), int(self.requests.end[r]))
    gap = high - low
    fits = np.flatnonzero(gap >= self.requests.size[r])
    return int(low[fits[np.argmin(gap[fits])]]) if fits.size else None

  def place_where_it_saves_most(self, r: int, fit: str = "best") -> bool:
    """Places request `r` in the level where it saves most now among those with room, at the
    `fit` ("best" or "first") offset; leaves it in slow memory if it saves nothing anywhere."""
    saving = self.saving(r)
    find = self.best_fit if fit == "best" else self.first_fit
    for level in np.argsort(-saving, kind="stable"):
      if saving[level] <= 0:
        return False
      offset = find(r, int(level))
      if offset is not None:
        self.place(r, int(level), offset)
        return True
    return False

  def request_indices(self) -> np.ndarray:
    return np.array([p[0] for p in self.placed], np.int64)

  def allocations(self) -> Allocations:
    """Placements so far, in the order they were made."""
    rows = np.array(self.placed, np.int64).reshape(len(self.placed), 3)
    req = self.requests
    return Allocations(buffer=req.buffer[rows[:, 0]], level=rows[:, 1], offset=rows[:, 2],
                       start=req.start[rows[:, 0]], end=req.end[rows[:, 0]])

  def mapping(self, solver: str) -> Mapping:
    return Mapping.from_arrays(self.model.workload, self.hardware, solver,
                               request=self.request_indices(), allocations=self.allocations(),
                               estimated_time_s=self.total_time,
                               slow_only_time_s=self.model.slow_only_time)
