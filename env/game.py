"""The game's config, and the requests game: mallocGame over whole requests.

`GameConfig.decisions` picks the game: "msa" (env/msa_game.py, the default, what the agent
trains on: one step per decision point of XLA's msa loop) or "requests" (`MallocGame` below, the
project's first game, which the `bestfit` baseline still plays). `make_game` builds either.

In the requests game each step presents one request (see requests.py) and offers `A = 1 + K` actions: `0` leaves it in
the slow default memory, `k >= 1` places it at the k-th candidate (level, offset). Candidates are
the starts of the free address gaps of each fast level over the request's window that are large
enough, ordered best fit first (least wasted bytes, ties to the lowest offset), the fast levels
interleaved fastest first. The reward is the exact decrease of the cost model's program time
caused by the step, divided by the all-slow program time, so an episode's return is the
fractional time saved over "everything in slow memory".

Observations are fixed-size float32 arrays, laid out feature by feature in env/observation.py, so
one network serves every workload and every hardware with up to `max_fast_levels` fast levels.
After the last request the terminal observation is all zeros with only action 0 legal.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import dm_env
import numpy as np
from dm_env import specs

from malloczero.env.cost_model import Allocations, CostModel
from malloczero.env.errors import HardwareError, IllegalActionError, MalloczeroError
from malloczero.env.hardware import Hardware, check_fits
from malloczero.env.mapping import Mapping
from malloczero.env.observation import (ObservationLayout, msa_observation_layout,
                                         observation_layout, observation_spec)
from malloczero.env.placement import Placement
from malloczero.env.requests import Requests, build_requests
from malloczero.env.workload import Workload


DECISIONS = ("msa", "requests")


@dataclasses.dataclass(frozen=True)
class GameConfig:
  """What the game plays and how wide its observations are.

  decisions: "msa" (env/msa_game.py, the default: one step per decision point of XLA's msa
    loop, the actions the options msa weighs there) or "requests" (this module: one step per
    request, the actions its best-fit candidates).
  num_candidates: K of the requests game (1 + K actions).
  max_prefetch_starts: prefetch starts offered per fast level in the msa game
    (2 + max_prefetch_starts x max_fast_levels actions).
  skip_below: msa game only. 0 offers every decision. Above 0, msa's own choice is played, not
    offered, at decisions with a single option or whose best option msa estimates to save less
    than this fraction of the all-slow time (issue 15: most moves cannot matter); their rewards
    go to the next move the agent makes.
  """
  num_candidates: int = 16
  occupancy_bins: int = 32
  lookahead: int = 8            # M
  max_fast_levels: int = 2      # Observation width: hardware may have up to this many fast levels.
  decisions: str = "msa"
  max_prefetch_starts: int = 4
  skip_below: float = 0.0

  def __post_init__(self):
    if self.decisions not in DECISIONS:
      raise ValueError(f"unknown game decisions '{self.decisions}' (choose from "
                       f"{', '.join(DECISIONS)})")
    for name in ("num_candidates", "occupancy_bins", "max_fast_levels", "max_prefetch_starts"):
      if getattr(self, name) < 1:
        raise ValueError(f"{name} must be at least 1, got {getattr(self, name)}")
    if self.lookahead < 0:
      raise ValueError(f"lookahead must be >= 0, got {self.lookahead}")
    if not 0.0 <= self.skip_below < 1.0:
      raise ValueError(f"skip_below must be a fraction in [0, 1), got {self.skip_below}")

  @property
  def num_actions(self) -> int:
    if self.decisions == "msa":
      return 2 + self.max_prefetch_starts * self.max_fast_levels
    return 1 + self.num_candidates

  @property
  def candidate_slots(self) -> int:
    """Rows of the candidates observation: one per action after action 0."""
    return self.num_actions - 1

  @property
  def layout(self) -> ObservationLayout:
    """The named features of each observation part."""
    if self.decisions == "msa":
      return msa_observation_layout(self.max_fast_levels)
    return observation_layout(self.max_fast_levels)

  @property
  def static_features(self) -> int:
    return self.layout.static.size

  @property
  def request_features(self) -> int:
    return self.layout.request.size

  @property
  def candidate_features(self) -> int:
    return self.layout.candidate.size

  @property
  def lookahead_features(self) -> int:
    return self.layout.lookahead.size


REQUESTS_GAME = GameConfig(decisions="requests")


def make_game(workload: Workload, hardware: Hardware, config: GameConfig = GameConfig()
              ) -> dm_env.Environment:
  """The game `config.decisions` names: `MsaGame` ("msa") or `MallocGame` ("requests")."""
  if config.decisions == "msa":
    from malloczero.env.msa_game import MsaGame  # It builds on this module's GameConfig.
    return MsaGame(workload, hardware, config)
  return MallocGame(workload, hardware, config)


class GameBase(dm_env.Environment):
  """What both games share: the dm_env specs, reset, and the legality check of an action.
  Subclasses set `config`, `workload`, `_obs_spec` and `_legal` [A], and define
  `_reset_state` and `_observe`."""
  config: GameConfig
  workload: Workload
  _obs_spec: dict[str, specs.Array]
  _legal: np.ndarray

  def observation_spec(self) -> dict[str, specs.Array]:
    return self._obs_spec

  def action_spec(self) -> specs.DiscreteArray:
    return specs.DiscreteArray(self.config.num_actions, name="action")

  def reward_spec(self) -> specs.Array:
    return specs.Array((), np.float64, "reward")

  def discount_spec(self) -> specs.BoundedArray:
    return specs.BoundedArray((), np.float64, 0.0, 1.0, "discount")

  def reset(self) -> dm_env.TimeStep:
    self._reset_state()
    return dm_env.restart(self._observe())

  def _reset_state(self) -> None:
    raise NotImplementedError

  def _observe(self) -> dict[str, np.ndarray]:
    raise NotImplementedError

  def _checked(self, action: Any, where: str) -> int:
    """`action` as an int, or a one-line error naming the step (`where`) and the legal ones."""
    action = int(action)
    if not (0 <= action < self.config.num_actions) or not self._legal[action]:
      raise IllegalActionError(
          f"action {action} is illegal {where} of '{self.workload.name}': "
          f"legal actions are {np.flatnonzero(self._legal).tolist()}")
    return action


class MallocGame(GameBase):
  """mallocGame for one (workload, hardware) pair; deterministic, usable from Acme's loops."""

  def __init__(self, workload: Workload, hardware: Hardware,
               config: GameConfig = REQUESTS_GAME):
    if config.decisions != "requests":
      raise ValueError(f"MallocGame plays requests; the config asks for '{config.decisions}' "
                       "(env/msa_game.py's MsaGame, or `make_game`)")
    if hardware.num_fast_levels > config.max_fast_levels:
      raise HardwareError(f"hardware '{hardware.name}' has {hardware.num_fast_levels} fast levels; "
                          f"this game config observes at most {config.max_fast_levels}")
    check_fits(hardware, workload.peak_live_bytes, workload.name)
    self.workload, self.hardware, self.config = workload, hardware, config
    self.cost_model = CostModel(workload, hardware)
    self.requests: Requests = build_requests(self.cost_model)
    if len(self.requests) == 0:
      raise MalloczeroError(f"{workload.name}: nothing to play on '{hardware.name}': no buffer fits "
                            "in fast memory and saves time there")
    self.normaliser = self.cost_model.slow_only_time
    self._placement = Placement(self.cost_model, self.requests)
    self._num_fast = hardware.num_fast_levels
    self._capacity = self._placement.capacity  # [F]
    self._static = self._static_features()
    self._bin_edges = [np.linspace(0, c, config.occupancy_bins + 1) for c in self._capacity]
    self._obs_spec = observation_spec(config)
    self._reset_state()

  # -------------------------------------------------------------------------- dm_env API

  def step(self, action: Any) -> dm_env.TimeStep:
    if self._done:
      return self.reset()
    action = self._checked(action, f"for request {self._cursor}")
    saved = self._place(action) if action else 0.0
    reward = saved / self.normaliser
    self._cursor += 1
    if self._cursor == len(self.requests):
      self._done = True
      return dm_env.termination(reward, self._terminal_observation())
    return dm_env.transition(reward, self._observe())

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
  def done(self) -> bool:
    return self._done

  @property
  def legal_actions(self) -> np.ndarray:
    """[A] bool mask of the current step."""
    return self._legal.copy()

  @property
  def candidates(self) -> tuple[np.ndarray, np.ndarray]:
    """(level [n], offset [n]) of the current candidates; action k >= 1 picks entry k - 1."""
    return self._cand_level.copy(), self._cand_offset.copy()

  def allocations(self) -> Allocations:
    """Placements made so far, in the order they were made."""
    return self._placement.allocations()

  def mapping(self, solver: str) -> Mapping:
    """The mapping built so far (normally called when the episode is over)."""
    return self._placement.mapping(solver)

  # -------------------------------------------------------------------------- internals

  def _reset_state(self) -> None:
    self._cursor = 0
    self._done = False
    self._placement.reset()

  def _place(self, action: int) -> float:
    return self._placement.place(self._cursor, int(self._cand_level[action - 1]),
                                 int(self._cand_offset[action - 1]))

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
    legal[1:1 + n] = True
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
    following = self._static[r + 1:r + 1 + cfg.lookahead]
    lookahead[:len(following), layout.lookahead.index("valid")] = 1.0
    lookahead[:len(following), layout.lookahead.slice("static")] = following
    return {"request": request, "occupancy": occupancy, "candidates": cand,
            "lookahead": lookahead, "legal_actions": legal}

  def _terminal_observation(self) -> dict[str, np.ndarray]:
    obs = {k: np.zeros(spec.shape, spec.dtype) for k, spec in self._obs_spec.items()}
    obs["legal_actions"][0] = True
    self._legal = obs["legal_actions"]
    return obs

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
        req.size[:, None] / self._capacity[None, :], 2.0)
    f[:, s.index("start")] = axis[req.start] / length
    f[:, s.index("end")] = axis[req.end] / length
    f[:, s.index("duration")] = (axis[req.end] - axis[req.start]) / length
    f[:, s.slice("standalone_saving", num_fast)] = req.standalone_saving / self._saving_scale
    f[:, s.index("exposed_copy_time")] = np.minimum(req.exposed_copy_time / self._saving_scale,
                                                    10.0)
    f[:, s.index("log_size")] = np.log2(req.size) / 32.0
    f[:, s.index("position")] = np.arange(num_requests) / num_requests
    return f
