"""The requests game: mallocGame over whole requests, the project's first game, which the
`bestfit` baseline still plays (env/game/game.py is the game the agent trains on).

In the requests game each step presents one request (see requests.py) and offers `A = 1 + K`
actions: `0` leaves it in the slow default memory, `k >= 1` places it at the k-th candidate
(level, offset). Candidates are the starts of the free address gaps of each fast level over the
request's window that are large enough, ordered best fit first (least wasted bytes, ties to the
lowest offset), the fast levels interleaved fastest first. The reward is the exact decrease of
the cost model's program time caused by the step, divided by the all-slow program time, so an
episode's return is the fractional time saved over "everything in slow memory".

Observations are fixed-size float32 arrays, laid out feature by feature in
env/game/observation.py, so one network serves every workload and every hardware with up to
`max_fast_levels` fast levels. After the last request the terminal observation is all zeros with
only action 0 legal.
"""

from __future__ import annotations

import numpy as np

from malloczero.common.errors import MalloczeroError
from malloczero.env.cost_model import Allocations
from malloczero.env.game.base import GameBase
from malloczero.env.game.config import REQUESTS_GAME, GameConfig
from malloczero.env.hardware import Hardware
from malloczero.env.placement import Placement
from malloczero.env.requests import Requests, build_requests
from malloczero.env.workload import Workload


class RequestsGame(GameBase):
  """mallocGame for one (workload, hardware) pair; deterministic, usable from Acme's loops."""

  def __init__(self, workload: Workload, hardware: Hardware, config: GameConfig = REQUESTS_GAME):
    if config.decisions != "requests":
      raise ValueError(
        f"RequestsGame plays requests; the config asks for '{config.decisions}' "
        "(env/game/game.py's MsaGame, or `make_game`)"
      )
    self._set_up(workload, hardware, config)
    self.requests: Requests = build_requests(self.cost_model)
    if len(self.requests) == 0:
      raise MalloczeroError(
        f"{workload.name}: nothing to play on '{hardware.name}': no buffer "
        "fits in fast memory and saves time there"
      )
    self._placement = Placement(self.cost_model, self.requests)
    self._capacity = self._placement.capacity  # [F]
    self._static = self._static_features()
    self._bin_edges = [np.linspace(0, c, config.occupancy_bins + 1) for c in self._capacity]
    self._reset_state()

  # -------------------------------------------------------------------------- dm_env API

  def _step_label(self) -> str:
    return f"for request {self._cursor}"

  def _play(self, action: int) -> float:
    saved = self._place(action) if action else 0.0
    self._cursor += 1
    return saved

  def _finished(self) -> bool:
    return self._cursor == len(self.requests)

  # -------------------------------------------------------------------------- queries

  @property
  def total_time(self) -> float:
    """Program time of the current (partial) mapping, tracked incrementally."""
    return self._placement.total_time

  @property
  def num_steps(self) -> int:
    """Moves made so far in this episode (every request is one move)."""
    return self._cursor

  @property
  def cursor(self) -> int:
    """Index of the current request in `self.requests`."""
    return self._cursor

  @property
  def candidates(self) -> tuple[np.ndarray, np.ndarray]:
    """(level [n], offset [n]) of the current candidates; action k >= 1 picks entry k - 1."""
    return self._cand_level.copy(), self._cand_offset.copy()

  def allocations(self) -> Allocations:
    """Placements made so far, in the order they were made."""
    return self._placement.allocations()

  def _request_rows(self, num_allocations: int) -> np.ndarray:
    return self._placement.request_indices()

  # -------------------------------------------------------------------------- internals

  def _reset_state(self) -> None:
    self._cursor = 0
    self._done = False
    self._placement.reset()

  def _place(self, action: int) -> float:
    return self._placement.place(
      self._cursor, int(self._cand_level[action - 1]), int(self._cand_offset[action - 1])
    )

  def _observe(self) -> dict[str, np.ndarray]:
    cfg, r, req = self.config, self._cursor, self.requests
    start, end, size = int(req.start[r]), int(req.end[r]), int(req.size[r])
    num_fast, num_cand = self._num_fast, cfg.num_candidates
    # Current saving per fast level (exact incremental delta, copy cost included).
    saving = self._placement.saving(r)  # [F]
    occupancy = np.zeros((cfg.max_fast_levels, cfg.occupancy_bins), np.float32)
    per_level = []
    for level in range(num_fast):
      low, high = self._placement.free_gaps(level, start, end)
      edges = self._bin_edges[level]
      free = np.clip(edges[:, None] - low[None, :], 0, (high - low)[None, :]).sum(axis=1)
      occupancy[level] = 1.0 - np.diff(free) / (edges[1] - edges[0])
      fit = (high - low) >= size
      low, high = low[fit], high[fit]
      best = np.lexsort((low, high - low))[:num_cand]
      per_level.append((low[best], high[best]))
    # Interleave levels, fastest first: rank 0 of each level, then rank 1, ...
    cand = np.zeros((num_cand, cfg.candidate_features), np.float32)
    levels, offsets, gaps, ranks = [], [], [], []
    for rank in range(num_cand):
      for level in range(num_fast):
        low, high = per_level[level]
        if rank < len(low):
          levels.append(level)
          offsets.append(low[rank])
          gaps.append(high[rank] - low[rank])
          ranks.append(rank)
      if len(levels) >= num_cand:
        break
    n = min(len(levels), num_cand)
    self._cand_level = np.array(levels[:n], np.int64)
    self._cand_offset = np.array(offsets[:n], np.int64)
    legal = np.zeros(cfg.num_actions, bool)
    legal[0] = True
    legal[1 : 1 + n] = True
    self._legal = legal
    layout = cfg.layout
    if n:
      cap = self._capacity[self._cand_level].astype(np.float64)
      gap = np.array(gaps[:n], np.float64)
      c = layout.candidate
      cand[:n, c.index("valid")] = 1.0
      cand[np.arange(n), c.slice("level").start + self._cand_level] = 1.0
      cand[:n, c.index("offset")] = self._cand_offset / cap
      cand[:n, c.index("gap")] = gap / cap
      cand[:n, c.index("slack")] = (gap - size) / cap
      cand[:n, c.index("rank")] = np.array(ranks[:n]) / num_cand
      cand[:n, c.index("saving")] = saving[self._cand_level] / self._saving_scale
    request = np.zeros(cfg.request_features, np.float32)
    q = layout.request
    request[q.slice("static")] = self._static[r]
    request[q.slice("saving", num_fast)] = saving / self._saving_scale
    request[q.slice("level_present", num_fast)] = 1.0
    request[q.index("program_time")] = self._placement.total_time / self.normaliser
    request[q.index("candidates_found")] = n / num_cand
    lookahead = np.zeros((cfg.lookahead, cfg.lookahead_features), np.float32)
    following = self._static[r + 1 : r + 1 + cfg.lookahead]
    lookahead[: len(following), layout.lookahead.index("valid")] = 1.0
    lookahead[: len(following), layout.lookahead.slice("static")] = following
    return {
      "request": request,
      "occupancy": occupancy,
      "candidates": cand,
      "lookahead": lookahead,
      "legal_actions": legal,
    }

  def _static_features(self) -> np.ndarray:
    """[R, static_features] per-request features that do not change during an episode."""
    cfg, req = self.config, self.requests
    num_requests, num_fast = len(req), self._num_fast
    # Positions on the program's time axis, so a compressed (weighted) schedule reads the same.
    axis = self.workload.time_axis
    length = float(axis[-1])
    self._saving_scale = max(float(req.standalone_saving.max()), 1e-30)
    s = cfg.layout.static
    f = np.zeros((num_requests, s.size), np.float32)
    f[:, s.index("is_prefetch")] = req.is_prefetch
    f[:, s.index("is_activation")] = ~req.is_prefetch
    f[:, s.slice("size_vs_capacity", num_fast)] = np.minimum(
      req.size[:, None] / self._capacity[None, :], 2.0
    )
    f[:, s.index("start")] = axis[req.start] / length
    f[:, s.index("end")] = axis[req.end] / length
    f[:, s.index("duration")] = (axis[req.end] - axis[req.start]) / length
    f[:, s.slice("standalone_saving", num_fast)] = req.standalone_saving / self._saving_scale
    f[:, s.index("exposed_copy_time")] = np.minimum(
      req.exposed_copy_time / self._saving_scale, 10.0
    )
    f[:, s.index("log_size")] = np.log2(req.size) / 32.0
    f[:, s.index("position")] = np.arange(num_requests) / num_requests
    return f
