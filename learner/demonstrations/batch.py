"""How demonstrations enter the learner's batches: windows after the sampled replay items, marked
so that the loss bootstraps them with their exact returns, and what the learner logs of them."""

from __future__ import annotations

import jax
import numpy as np

from malloczero.learner.demonstrations.store import Demonstrations
from malloczero.replay.types import Step


def mix_demonstrations(
  demonstrations: Demonstrations, count: int, steps: Step, weights: np.ndarray
) -> tuple[Step, np.ndarray, np.ndarray]:
  """The sampled items `steps` (leaves `[B, L, ...]`) and their importance `weights` `[B]`
  followed by `count` demonstration windows (`Demonstrations.sample`): (steps `[B + count, L,
  ...]`, weights `[B + count]`, exact values `[B + count]` bool, true at the demonstration items:
  learner/losses.py `muzero_loss`'s `exact_values`)."""
  num_sampled = len(weights)
  demo_steps, demo_weights = demonstrations.sample(count)
  steps = jax.tree_util.tree_map(lambda a, b: np.concatenate([a, b]), steps, demo_steps)
  weights = np.concatenate([weights, demo_weights])
  return steps, weights, np.arange(len(weights)) >= num_sampled


def demonstration_metrics(demonstrations: Demonstrations) -> dict[str, float]:
  """What the learner logs of its demonstrations each step: the programs whose demonstration is
  no longer msa's own play, the replays of offered games and their seconds in all, and the steps
  where the demonstrations leave msa's move."""
  return {
    "demonstrations_improved": float(demonstrations.num_improved()),
    "demonstration_replays": float(demonstrations.num_replays),
    "demonstration_replay_s": demonstrations.replay_seconds,
    "demonstration_departures": float(demonstrations.num_departures()),
  }
