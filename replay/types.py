"""What actors write to Reverb and what the learner samples: the contract between them.

One `Step` per acting step of one game. A replay item is a sequence of `L = K + n + 1` consecutive
steps of one episode (K = unroll steps, n = TD steps; see LearnerConfig.sequence_length), one item
per real step t of the episode, covering steps t .. t + L - 1. After an episode's last action the
writer
appends the terminal state (valid = 0, zero action/reward/policy) and then zero padding, so every
item has exactly L steps; `valid` tells real steps from the terminal state and padding.

Reward convention: `reward[t]` is the reward received for `action[t]` (r_{t+1} in MuZero's
notation), in the game's raw units (normalised time saved); networks scale it themselves.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, NamedTuple, Union

import numpy as np
from dm_env import specs

from malloczero.env.game import GameConfig, observation_spec

if TYPE_CHECKING:  # The learner's batches are JAX arrays; replay itself needs no JAX.
  import jax

# numpy where actors write and Reverb stores, JAX in the learner; leaves may carry leading
# dimensions ([B], [B, L]) on top of the shapes below. A spec tree (`step_spec`) has the same type.
Array = Union[np.ndarray, "jax.Array", specs.Array]


class Step(NamedTuple):
  observation: dict[str, Array]  # The game's observation at t (see env.game), leaves [..., *shape].
  action: Array  # int32 []: action taken at t.
  reward: Array  # float32 []: reward received for it.
  policy: Array  # float32 [A]: the search's action weights at t (policy target).
  root_value: Array  # float32 []: the search's root value at t, raw return units.
  valid: Array  # float32 []: 1 for a state where an action was taken, else 0.


class Batch(NamedTuple):
  """A learner batch: steps with leaves `[B, L, ...]` plus Reverb bookkeeping."""

  steps: Step
  keys: np.ndarray  # [B] uint64 item keys, for priority updates.
  probabilities: np.ndarray  # [B] float64 sampling probabilities, for importance weights.


def step_spec(game: GameConfig) -> Step:
  """Specs of one step (no leading dimensions)."""
  return Step(
    observation=observation_spec(game),
    action=specs.Array((), np.int32, "action"),
    reward=specs.Array((), np.float32, "reward"),
    policy=specs.Array((game.num_actions,), np.float32, "policy"),
    root_value=specs.Array((), np.float32, "root_value"),
    valid=specs.Array((), np.float32, "valid"),
  )


def zero_step(game: GameConfig) -> Step:
  """A padding step: zeros of the right shapes and dtypes."""
  import tree

  return tree.map_structure(lambda s: np.zeros(s.shape, s.dtype), step_spec(game))
