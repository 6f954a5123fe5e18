"""Greedy evaluation: each program played once with the evaluation search (more simulations, no
noise); every mapping it produces is checked by the independent validator."""

from __future__ import annotations

import dataclasses
import functools
from typing import Any, Sequence

import jax
import numpy as np

from actors.actor import stack_observations
from actors.games import GameSpec
from actors.search import make_search_fn
from configs.config import Config, SearchConfig
from env.game import MallocGame
from env.mapping import Mapping
from env.validator import validate_mapping
from learner.networks import MuZeroNetworks


@dataclasses.dataclass(frozen=True)
class EvaluationResult:
  program: str
  episode_return: float
  speedup: float
  time_s: float            # The mapping's estimated program time.
  mapping: Mapping


# Cached: a fresh `make_search_fn` is a new jitted closure, so without this every evaluation (every
# learning-curve point of a training run) would compile the search again.
@functools.lru_cache(maxsize=8)
def _evaluation_search(networks: MuZeroNetworks, search: SearchConfig) -> Any:
  return make_search_fn(networks, search, evaluation=True)


def evaluate_params(networks: MuZeroNetworks, params: Any, config: Config,
                    specs: Sequence[GameSpec], seed: int = 0,
                    solver_name: str = "muzero") -> list[EvaluationResult]:
  """Plays every spec once, all in one batch (games that end early idle on action 0)."""
  search = _evaluation_search(networks, config.search)
  games = [MallocGame(s.workload, s.hardware, config.game) for s in specs]
  observations = [g.reset().observation for g in games]
  returns = np.zeros(len(games))
  done = np.zeros(len(games), bool)
  rng = jax.random.PRNGKey(seed)
  params = jax.device_put(params)
  while not done.all():
    rng, key = jax.random.split(rng)
    actions = np.asarray(search(params, key, stack_observations(observations)).action)
    for i, game in enumerate(games):
      if done[i]:
        continue
      timestep = game.step(int(actions[i]))
      returns[i] += timestep.reward
      observations[i] = timestep.observation
      done[i] = timestep.last()
  results = []
  for spec, game, episode_return in zip(specs, games, returns):
    mapping = game.mapping(solver_name)
    validate_mapping(spec.workload, spec.hardware, mapping)
    results.append(EvaluationResult(spec.name, float(episode_return), mapping.speedup,
                                    mapping.estimated_time_s, mapping))
  return results
