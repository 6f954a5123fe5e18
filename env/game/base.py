"""What both games share (env/game/game.py, env/game/requests_game.py): the dm_env specs, reset,
the step (check the action, play it, reward the time it saved), the legal mask and the terminal
observation."""

from __future__ import annotations

from typing import Any

import dm_env
import numpy as np
from dm_env import specs

from malloczero.common.errors import IllegalActionError
from malloczero.env.game.config import GameConfig
from malloczero.env.workload import Workload


class GameBase(dm_env.Environment):
  """What both games share. Subclasses set `config`, `workload`, `normaliser` (the all-slow
  time), `_obs_spec`, `_legal` [A] and `_done`, and define `_reset_state`, `_observe`,
  `_step_label` (where a step is, for errors), `_play` (a legal action's time saved) and
  `_finished`."""
  config: GameConfig
  workload: Workload
  normaliser: float
  _obs_spec: dict[str, specs.Array]
  _legal: np.ndarray
  _done: bool

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
    action = self._checked(action, self._step_label())
    reward = self._play(action) / self.normaliser
    if self._finished():
      self._done = True
      return dm_env.termination(reward, self._terminal_observation())
    return dm_env.transition(reward, self._observe())

  @property
  def done(self) -> bool:
    return self._done

  @property
  def legal_actions(self) -> np.ndarray:
    """[A] bool mask of the current step."""
    return self._legal.copy()

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

  def _checked(self, action: Any, where: str) -> int:
    """`action` as an int, or a one-line error naming the step (`where`) and the legal ones."""
    action = int(action)
    if not (0 <= action < self.config.num_actions) or not self._legal[action]:
      raise IllegalActionError(
          f"action {action} is illegal {where} of '{self.workload.name}': "
          f"legal actions are {np.flatnonzero(self._legal).tolist()}")
    return action
