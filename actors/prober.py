"""Exact one-move advantages over msa: policy targets that need no value estimate.

At a decision of msa's own trajectory of a program, every legal move is played once and msa
finishes the program (`MsaGame.reset_segment(step, 1)`: a one-move short game), so each move's
advantage over msa is exact: (msa's time - the mapping's time) / msa's time, 0 for msa's own
move. The learner fits the policy to softmax(advantage / temperature) over the legal moves at
such decisions (learner/losses.py `probe_policy_loss`).

Why: a deviation that pays is worth 1e-3 to 1e-2 of msa's time, while the value's error is 1.2-3
times the mean |advantage| (docs/results 3.19), so search targets built from the model's
Q-values rank deviations at chance. Fitted to exact advantages offline, the same network beats
msa on 9-12 of 16 held-out programs with no search (docs/results 3.20). A probe costs one msa
pass per legal move, about 0.3 s per decision on the default suite.
"""

from __future__ import annotations

import dataclasses
from typing import Sequence

import numpy as np

from malloczero.actors.games import GameSpec
from malloczero.env.game import GameConfig, make_game

# Draws of a step before the prober gives up on a program whose decisions offer one legal move.
MAX_DRAWS = 16


@dataclasses.dataclass(frozen=True)
class Probe:
  """One decision with the exact advantage of every legal move."""

  program: str
  step: int  # The decision's index in msa's trajectory of the program.
  observation: dict[str, np.ndarray]  # The game's observation there.
  advantages: np.ndarray  # float32 [A]: each legal slot's exact advantage, 0 at illegal slots.
  msa_action: int


def one_move_advantages(game, step: int) -> tuple[dict[str, np.ndarray], np.ndarray, int]:
  """At msa's decision `step` of an msa game with the "advantage" reward: (the observation, the
  exact advantage of every action slot `[A]` float64 (0 at illegal ones and at msa's move), msa's
  move). Leaves the game at an arbitrary state."""
  observation = {k: np.asarray(v) for k, v in game.reset_segment(step, 1).observation.items()}
  return observation, *_advantages_here(game, step, observation["legal_actions"])


def _advantages_here(game, step: int, legal: np.ndarray) -> tuple[np.ndarray, int]:
  """`one_move_advantages` for a game just reset to decision `step` (`reset_segment(step, 1)`),
  whose legal mask is `legal`: (advantages `[A]`, msa's move)."""
  msa_action, msa_time = game.msa_action, game.msa_time
  advantages = np.zeros(legal.shape, np.float64)
  for action in np.flatnonzero(legal).tolist():
    if action != msa_action:
      game.reset_segment(step, 1)
      game.step(action)
      advantages[action] = (msa_time - game.total_time) / msa_time
  return advantages, msa_action


class Prober:
  """Probes decisions of the programs `specs`: each probe a uniformly drawn program, then a
  uniformly drawn step of msa's trajectory that offers more than one legal move.

  Its games are its own, built on first use (with the "advantage" reward whatever `config`'s:
  the advantage is relative to msa's completion)."""

  def __init__(self, specs: Sequence[GameSpec], config: GameConfig, seed: int = 0):
    if config.decisions != "msa":
      raise ValueError("probes need the msa game: only it knows msa's move")
    if not specs:
      raise ValueError("no programs to probe")
    self._specs = list(specs)
    self._config = dataclasses.replace(config, reward="advantage")
    self._games: dict[int, object] = {}
    self._rng = np.random.default_rng(seed)
    self.num_probes = 0

  def _game(self, index: int):
    if index not in self._games:
      spec = self._specs[index]
      self._games[index] = make_game(spec.workload, spec.hardware, self._config)
    return self._games[index]

  def probe(self) -> Probe | None:
    """One decision of a drawn program, or None when `MAX_DRAWS` steps of it offered one legal
    move each."""
    index = int(self._rng.integers(len(self._specs)))
    game = self._game(index)
    for _ in range(MAX_DRAWS):
      step = int(self._rng.integers(game.msa_moves))
      observation = {k: np.asarray(v) for k, v in game.reset_segment(step, 1).observation.items()}
      if observation["legal_actions"].sum() > 1:
        advantages, msa_action = _advantages_here(game, step, observation["legal_actions"])
        self.num_probes += 1
        return Probe(
          self._specs[index].name, step, observation, advantages.astype(np.float32), msa_action
        )
    return None
