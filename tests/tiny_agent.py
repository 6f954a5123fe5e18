"""The tiny config's agent that the actor and greedy-play tests share: one set of networks per
process (their compiled functions are reused across test modules), the tiny suite's programs,
and parameters made to exercise masking."""

import jax
import numpy as np

from malloczero.actors.games import suite_games
from malloczero.configs.config import get_config
from malloczero.env import make_game
from malloczero.learner.learner import make_initial_state
from malloczero.learner.networks import make_networks

CONFIG = get_config("tiny")
NETWORKS = make_networks(CONFIG.network, CONFIG.game)  # Shared: compiled functions are reused.
A = CONFIG.game.num_actions
L = CONFIG.learner.sequence_length
TRAIN_SPECS = suite_games("tiny", "train")
ALL_SPECS = suite_games("tiny", "all")
SPECS_BY_NAME = {s.name: s for s in ALL_SPECS}


def initial_params():
  return make_initial_state(NETWORKS, CONFIG, jax.random.PRNGKey(0)).params


def noisy(params, seed: int, scale: float = 1.0):
  """Parameters with large random perturbations: peaked priors on arbitrary (often illegal)
  actions and a legality head that is wrong about them, so masking is really exercised."""
  leaves, treedef = jax.tree_util.tree_flatten(params)
  rng = np.random.default_rng(seed)
  return jax.tree_util.tree_unflatten(
    treedef,
    [np.asarray(x) + scale * rng.standard_normal(np.shape(x)).astype(np.float32) for x in leaves],
  )


def game_of(spec):
  return make_game(spec.workload, spec.hardware, CONFIG.game)


def all_default_moves(spec) -> int:
  game = game_of(spec)
  timestep, moves = game.reset(), 0
  while not timestep.last():
    timestep, moves = game.step(0), moves + 1
  return moves
