"""The trained agent as a solver: a checkpoint's networks with MCTS at test time.

`solve_with_agent` plays `attempts` copies of one program in a single batch: the first with the
greedy evaluation search (no noise), the others sampling root actions with Gumbel noise, all with
`simulations` simulations per move, and keeps the best complete trajectory. Every mapping it
returns has passed the independent validator.
"""

from __future__ import annotations

import dataclasses
import json
import os
import time
from typing import Any, Optional

import jax
import numpy as np

from actors.actor import stack_observations
from actors.search import make_search_fn
from configs.config import SearchConfig
from env.errors import MalloczeroError
from env.game import GameConfig, MallocGame
from env.hardware import Hardware
from env.solvers import SolveResult
from env.validator import validate_mapping
from env.workload import Workload
from learner.learner import (CHECKPOINT_FILENAME, check_params_fit, checkpoint_configs,
                             checkpoint_steps, load_params)
from learner.networks import MuZeroNetworks, Params, make_networks

DEFAULT_ATTEMPTS = 8


@dataclasses.dataclass(frozen=True)
class Agent:
  networks: MuZeroNetworks
  params: Params
  search: SearchConfig
  game: GameConfig
  learner_steps: int
  checkpoint: str


def find_checkpoint(path: str) -> str:
  """A training work directory, its checkpoints/ folder, or the checkpoint file -> the file."""
  for candidate in (os.path.join(path, "checkpoints", CHECKPOINT_FILENAME),
                    os.path.join(path, CHECKPOINT_FILENAME), path):
    if os.path.isfile(candidate):
      return candidate
  raise MalloczeroError(f"no learner checkpoint at '{path}' (give a training work directory, "
                        "its checkpoints/ folder or a learner_state.pkl file)")


def load_agent(path: str) -> Agent:
  """Loads a checkpoint; the search settings come from the run's config.json when present."""
  file = find_checkpoint(path)
  network_config, game_config = checkpoint_configs(file)
  networks = make_networks(network_config, game_config)
  params = load_params(file)
  check_params_fit(networks, params, file)
  search = SearchConfig()
  config_file = os.path.join(os.path.dirname(os.path.dirname(file)), "config.json")
  if os.path.isfile(config_file):
    with open(config_file, encoding="utf-8") as f:
      search = SearchConfig(**json.load(f).get("search", {}))
  return Agent(networks, params, search, game_config, checkpoint_steps(file), file)


def solve_with_agent(agent: Agent, workload: Workload, hardware: Hardware,
                     simulations: Optional[int] = None, attempts: int = DEFAULT_ATTEMPTS,
                     seed: int = 0) -> SolveResult:
  """Plays `attempts` trajectories (1 greedy, the rest sampled) and keeps the fastest."""
  if attempts < 1:
    raise MalloczeroError(f"attempts must be at least 1, got {attempts}")
  simulations = simulations or 2 * agent.search.eval_num_simulations
  start = time.perf_counter()
  search = dataclasses.replace(agent.search, num_simulations=simulations,
                               eval_num_simulations=simulations)
  greedy = make_search_fn(agent.networks, search, evaluation=True)
  sampled = make_search_fn(agent.networks, search, evaluation=False) if attempts > 1 else None
  games = [MallocGame(workload, hardware, agent.game) for _ in range(attempts)]
  observations = [g.reset().observation for g in games]
  done = np.zeros(attempts, bool)
  rng = jax.random.PRNGKey(seed)
  params = jax.device_put(agent.params)
  while not done.all():
    rng, greedy_key, sampled_key = jax.random.split(rng, 3)
    actions = [int(greedy(params, greedy_key, stack_observations(observations[:1])).action[0])]
    if sampled is not None:
      actions += [int(a) for a in np.asarray(
          sampled(params, sampled_key, stack_observations(observations[1:])).action)]
    for i, game in enumerate(games):
      if not done[i]:
        timestep = game.step(actions[i])
        observations[i] = timestep.observation
        done[i] = timestep.last()
  times = [g.total_time for g in games]
  best = int(np.argmin(times))
  mapping = games[best].mapping("agent")
  validate_mapping(workload, hardware, mapping)
  info: dict[str, Any] = {
      "requests": len(games[0].requests), "attempts": attempts, "best_attempt": best,
      "greedy_speedup": games[0].cost_model.slow_only_time / times[0],
      "attempt_speedups": [games[0].cost_model.slow_only_time / t for t in times],
      "simulations": simulations, "learner_steps": agent.learner_steps,
      "checkpoint": agent.checkpoint}
  return SolveResult(mapping, time.perf_counter() - start, info)
