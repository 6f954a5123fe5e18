"""Made-up learner input for benchmarks and tests: well-formed batches without replay or games.

Not part of the learner's API (`malloczero.learner` does not export it): nothing here trains an
agent, it only exercises the learner's shapes and speed.
"""

from __future__ import annotations

import numpy as np

from malloczero.configs.config import Config
from malloczero.env.game import observation_spec
from malloczero.replay.types import Batch, Step


def random_batch(config: Config, batch_size: int, seed: int = 0) -> Batch:
  """A random but well-formed batch `[B, L, ...]`: plausible observations and legal masks,
  actions drawn from peaked search policies, and episodes that end at random points inside the
  sequence (terminal state, then zero padding) as the replay writer lays them out."""
  rng = np.random.default_rng(seed)
  game = config.game
  length = config.learner.sequence_length
  num_actions = game.num_actions
  spec = observation_spec(game)
  shape = lambda *s: (batch_size, length) + s
  obs = {
    k: rng.random(shape(*s.shape), dtype=np.float32)
    for k, s in spec.items()
    if k != "legal_actions"
  }
  num_candidates = rng.integers(0, game.candidate_slots + 1, shape())  # [B, L]
  legal = np.arange(num_actions) <= num_candidates[..., None]  # [B, L, A]
  obs["candidates"][..., 0] = np.arange(game.candidate_slots) < num_candidates[..., None]
  # Episode end: the terminal state sits at index `end` (beyond L: no end in this item).
  end = rng.integers(1, 2 * length, batch_size)
  index = np.arange(length)[None]
  valid = (index < end[:, None]).astype(np.float32)  # [B, L]
  terminal = index == end[:, None]
  logits = np.where(legal, 3.0 * rng.standard_normal(shape(num_actions)), -np.inf)
  policy = np.exp(logits - logits.max(-1, keepdims=True))
  policy /= policy.sum(-1, keepdims=True)
  action = (policy.cumsum(-1) < rng.random(shape(1))).sum(-1).clip(0, num_actions - 1)
  reward = (rng.exponential(0.02, shape()) * (action > 0)).astype(np.float32)
  root_value = rng.random(shape(), dtype=np.float32) * 0.5
  # The terminal observation is zeros with action 0 legal; padding is zeros with nothing legal.
  for k in obs:
    obs[k] *= valid.reshape(valid.shape + (1,) * (obs[k].ndim - 2))
  legal = (legal & (valid[..., None] > 0)) | (terminal[..., None] & (np.arange(num_actions) == 0))
  obs["legal_actions"] = legal
  steps = Step(
    observation=obs,
    action=(action * valid).astype(np.int32),
    reward=reward * valid,
    policy=(policy * valid[..., None]).astype(np.float32),
    root_value=root_value * valid,
    valid=valid,
  )
  keys = np.arange(batch_size, dtype=np.uint64)
  probabilities = rng.uniform(0.5, 1.5, batch_size) / batch_size
  return Batch(steps=steps, keys=keys, probabilities=probabilities)
