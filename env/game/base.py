"""What both games share (env/game/game.py, env/game/requests_game.py): the checks and the cost
model they start from, the dm_env specs, reset, the step (check the action, play it, reward the
time it saved), the legal mask, the terminal observation and the mapping played."""

from __future__ import annotations

from typing import Any

import dm_env
import numpy as np
from dm_env import specs

from malloczero.common.errors import HardwareError, IllegalActionError
from malloczero.env.cost_model import Allocations, CostModel
from malloczero.env.game.config import GameConfig, observation_spec
from malloczero.env.hardware import Hardware, check_fits
from malloczero.env.mapping import Mapping
from malloczero.env.workload import Workload


class GameBase(dm_env.Environment):
  """What both games share. Subclasses call `_set_up` first, set `_legal` [A], `_done` and
  `total_time` (the program time of the mapping so far), and define `_reset_state`,
  `_observe`, `_step_label` (where a step is, for errors), `_play` (a legal action's time
  saved), `_finished`, `allocations` and `_request_rows`."""

  config: GameConfig
  workload: Workload
  hardware: Hardware
  cost_model: CostModel
  normaliser: float
  total_time: float
  _obs_spec: dict[str, specs.Array]
  _legal: np.ndarray
  _done: bool

  def _set_up(self, workload: Workload, hardware: Hardware, config: GameConfig) -> None:
    """Checks that the config observes the hardware's levels and that the program fits, then
    holds the pair, the config, the cost model and the all-slow time rewards are divided by."""
    if hardware.num_fast_levels > config.max_fast_levels:
      raise HardwareError(
        f"hardware '{hardware.name}' has {hardware.num_fast_levels} fast levels; "
        f"this game config observes at most {config.max_fast_levels}"
      )
    check_fits(hardware, workload.peak_live_bytes, workload.name)
    self.workload, self.hardware, self.config = workload, hardware, config
    self.cost_model = CostModel(workload, hardware)
    self.normaliser = self.cost_model.slow_only_time
    self._num_fast = hardware.num_fast_levels
    self._obs_spec = observation_spec(config)

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

  def step(self, action: Any) -> dm_env.TimeStep:
    if self._done:
      return self.reset()
    action = self._checked(action)
    reward = self._play(action) / self.reward_scale
    if self._finished():
      self._done = True
      return dm_env.termination(reward, self._terminal_observation())
    return dm_env.transition(reward, self._observe())

  @property
  def done(self) -> bool:
    return self._done

  @property
  def reward_scale(self) -> float:
    """What the time `_play` returns is divided by to give the reward: the all-slow time (the
    "time" reward; the msa game's "advantage" reward divides by msa's own program time)."""
    return self.normaliser

  @property
  def legal_actions(self) -> np.ndarray:
    """[A] bool mask of the current step."""
    return self._legal.copy()

  def allocations(self) -> Allocations:
    """The fast allocations so far (all of them once the episode is over), in play order."""
    raise NotImplementedError

  def mapping(self, solver: str) -> Mapping:
    """The mapping built so far (normally called when the episode is over), reporting the
    game's exact program time."""
    allocations = self.allocations()
    return Mapping.from_arrays(
      self.workload,
      self.hardware,
      solver,
      self._request_rows(len(allocations)),
      allocations,
      self.total_time,
      self.normaliser,
    )

  def _request_rows(self, num_allocations: int) -> np.ndarray:
    """[num_allocations] the request each allocation places (-1: none, a segment of msa's)."""
    raise NotImplementedError

  def _reset_state(self) -> None:
    raise NotImplementedError

  def _observe(self) -> dict[str, np.ndarray]:
    raise NotImplementedError

  def _step_label(self) -> str:
    raise NotImplementedError

  def _play(self, action: int) -> float:
    raise NotImplementedError

  def _finished(self) -> bool:
    raise NotImplementedError

  def _terminal_observation(self) -> dict[str, np.ndarray]:
    """All zeros with only action 0 legal."""
    obs = {k: np.zeros(spec.shape, spec.dtype) for k, spec in self._obs_spec.items()}
    obs["legal_actions"][0] = True
    self._legal = obs["legal_actions"]
    return obs

  def _checked(self, action: Any) -> int:
    """`action` as an int, or a one-line error naming the step (`_step_label`) and the legal
    ones."""
    action = int(action)
    legal = self._legal
    if not 0 <= action < len(legal) or not legal[action]:
      raise IllegalActionError(
        f"action {action} is illegal {self._step_label()} of '{self.workload.name}': "
        f"legal actions are {np.flatnonzero(self._legal).tolist()}"
      )
    return action
