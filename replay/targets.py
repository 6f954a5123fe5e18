"""The n-step value target and the priority made from it, for both sides of the replay table.

The writer gives each item an initial priority when it creates it (numpy, replay/writer.py); the
learner fits the same targets and sends updated priorities back (jax, learner/losses.py). Both
use these definitions so that written and updated priorities are on one scale. They use only
operators and methods that numpy and jax arrays share, so one function serves both.
"""

from __future__ import annotations

from typing import Any

import numpy as np

# Keeps items whose value is already exact sampleable.
PRIORITY_EPSILON = 1e-3


def value_targets(
  rewards: Any,
  valid: Any,
  bootstrap_values: Any,
  unroll_steps: int,
  td_steps: int,
  discount: float = 1.0,
) -> Any:
  """n-step value targets of the K + 1 states 0..K of a sequence.

  Args:
    rewards: `[..., L]` reward for the action at each step (0 for the terminal state and padding).
    valid: `[..., L]` 1 for real steps, 0 for the terminal state and padding.
    bootstrap_values: `[..., L]` value estimates of each step's state; only entries
      `td_steps .. td_steps + unroll_steps` are read, and only where `valid` is 1.
    unroll_steps: K.
    td_steps: n.
    discount: per-step discount (mallocGame: 1).

  Returns:
    `[..., K+1]`: `z_k = sum_{i<n} discount^i r_{k+i} valid_{k+i} + discount^n valid_{k+n} v_{k+n}`,
    and 0 for states that are not real (the terminal state and beyond have no future), in the
    array type and dtype of `rewards`.
  """
  length = rewards.shape[-1]
  k, n = unroll_steps, td_steps
  if length < k + n + 1:
    raise ValueError(
      f"sequences of {length} steps are too short for {k} unroll steps and "
      f"{n} TD steps (need {k + n + 1})"
    )
  # A static [L, K+1] matrix of discounts: column k sums rewards k .. k+n-1.
  weights = np.zeros((length, k + 1), np.float64)
  for col in range(k + 1):
    weights[col : col + n, col] = discount ** np.arange(n)
  rewards = rewards * valid
  n_step = rewards @ weights.astype(rewards.dtype)  # [..., K+1]
  bootstrap = (valid * bootstrap_values)[..., n : n + k + 1]  # [..., K+1]
  return (n_step + discount**n * bootstrap) * valid[..., : k + 1]


def priority(target: Any, value: Any) -> Any:
  """Replay priority of items whose first state has value target `target` and value estimate
  `value` (arrays of one shape, or scalars): the absolute error plus `PRIORITY_EPSILON`."""
  return abs(target - value) + PRIORITY_EPSILON
