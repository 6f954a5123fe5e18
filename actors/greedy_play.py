"""Evaluation play: the network with MCTS on fixed programs, every mapping validated.

One loop serves every evaluation: the learning curve of a training run, the final report, the
`evaluate` command and the agent solver. `play_programs` plays `attempts` copies of each program
in one batch: the first copy with the greedy evaluation search (no noise), the others sampling
root actions with Gumbel noise, and optionally one more copy played by the network's policy
alone (the legal argmax of its prior, no search); it keeps each program's fastest complete
trajectory.
"""

from __future__ import annotations

import dataclasses
import functools
import time
from typing import Any, Callable, Optional, Sequence

import jax
import numpy as np

from malloczero.actors.actor import stack_observations
from malloczero.actors.games import GameSpec
from malloczero.actors.search import SearchFn, make_search_fn
from malloczero.common.signals import raise_pending
from malloczero.configs.config import Config, SearchConfig
from malloczero.env.game import GameConfig, make_game
from malloczero.env.mapping import Mapping
from malloczero.env.solvers.time_limit import now
from malloczero.env.validator import validate_mapping
from malloczero.learner.networks import MuZeroNetworks, Params


@dataclasses.dataclass(frozen=True)
class EvaluationResult:
  program: str
  episode_return: float  # The greedy trajectory's return (so far, when it was cut).
  # The kept (fastest finished) mapping's speed-up over all-slow; 0.0 when none finished.
  speedup: float
  time_s: float  # The kept mapping's estimated program time; inf when none finished.
  # The kept mapping; it has passed the validator. None when the deadline came before any of
  # the program's trajectories finished.
  mapping: Optional[Mapping]
  # The greedy trajectory's speed-up (equal to `speedup` if attempts=1); None when it was cut.
  greedy_speedup: Optional[float]
  # [attempts], the greedy trajectory first; with `policy_alone`, [attempts + 1] when the greedy
  # search has simulations (the policy's trajectory last). None for a trajectory the deadline cut.
  attempt_speedups: tuple[Optional[float], ...]
  best_attempt: int
  requests: int  # Moves of the greedy trajectory (the requests game: its requests).
  actions: tuple[int, ...] = ()  # The kept trajectory's moves.
  # The msa game only: each attempt's departures from msa, {(buffer, use): slot} (evo-msa's
  # genomes, env/solvers/evo_msa.py), and the search's policy `[A]` at every decision any
  # attempt met, averaged over the attempts that met it (evo-msa's proposals).
  genomes: tuple[dict, ...] = ()
  proposals: Optional[dict] = None
  # With `policy_alone`: the trajectory of the network's policy alone (no search, no noise),
  # the network's own play apart from search as well as from msa.
  policy_speedup: Optional[float] = None
  unfinished: int = 0  # Trajectories a deadline or a stop cut (0 without either).


# Cached: a fresh `make_search_fn` is a new jitted closure, so without this every evaluation (every
# learning-curve point of a training run, every program of `evaluate`) would compile again.
@functools.lru_cache(maxsize=16)
def _search_fn(networks: MuZeroNetworks, search: SearchConfig, evaluation: bool) -> SearchFn:
  return make_search_fn(networks, search, evaluation=evaluation)


def with_simulations(search: SearchConfig, simulations: Optional[int]) -> SearchConfig:
  """The search config with `simulations` for both modes (None keeps the config's own)."""
  if simulations is None:
    return search
  return dataclasses.replace(search, num_simulations=simulations, eval_num_simulations=simulations)


def _batch_size(active: int, full: int) -> int:
  """The search batch for `active` unfinished games of a group of `full`: the full batch, then
  16, 4 or 1 as games finish. Why: the msa game's episodes differ in length by 1,000x (16 to
  16,855 decisions on the default suite), and searching a full batch of finished games until
  the longest ends would cost most of the evaluation; a few fixed sizes bound the compiles."""
  for size in (1, 4, 16):
    if active <= size < full:
      return size
  return full


# A search call plays at most this many games x simulations²: a call's time grows faster than its
# simulations (mctx writes its tree every simulation) and its batch. Measured with the tiny
# config on resnet50-b8-train (2 cores): 1,024 simulations take 0.4 s for one game, 16 s for 8;
# 512 take 0.6 s for 4. Bounding a call keeps a time limit and SIGTERM effective within about a
# second; at the configs' own simulations (at most 256) only batches beyond 16 games are split.
CALL_COST = 1 << 20


def games_per_call(simulations: int, games: int) -> int:
  """How many of `games` one search call of `simulations` simulations plays (`CALL_COST`)."""
  return max(1, min(games, CALL_COST // max(1, simulations) ** 2))


def play_programs(
  networks: MuZeroNetworks,
  params: Params,
  search: SearchConfig,
  game_config: GameConfig,
  specs: Sequence[GameSpec],
  attempts: int = 1,
  seed: int = 0,
  solver_name: str = "muzero",
  policy_alone: bool = False,
  deadline: Optional[float] = None,
  should_stop: Optional[Callable[[], bool]] = None,
) -> list[EvaluationResult]:
  """Plays `attempts` trajectories of every spec, all in one batch; one result per spec.

  As games end, the search runs on the unfinished ones only (padded to a few fixed batch
  sizes, `_batch_size`). Sampled attempts use `search.num_simulations`, the greedy one
  `search.eval_num_simulations`. `policy_alone`: one more attempt played by the network's
  policy alone (`policy_speedup`); where the greedy search has no simulations, the greedy
  attempt is that play already and no game is added.

  `deadline`: a time on the solvers' clock (env/solvers/time_limit.py `now`) after which no game
  is built and no search starts, nor one that its group's previous call says would end after
  it; the trajectories unfinished then are dropped (`unfinished`, their speed-ups None), so that
  the play ends by the deadline give or take one search call (`CALL_COST`) and the kept
  mapping's validation. `should_stop`: the same, from when it returns True (a training run
  stopping).
  """
  if attempts < 1:
    raise ValueError(f"attempts must be at least 1, got {attempts}")
  greedy = _search_fn(networks, search, True)
  sampled = _search_fn(networks, search, False) if attempts > 1 else None
  policy = None
  if policy_alone and search.eval_num_simulations > 0:
    policy = _search_fn(networks, with_simulations(search, 0), True)
  # games[a * P + p]: attempt a of program p, so the greedy attempts are the first P games (and
  # the policy's, when played, the last P).
  num_programs = len(specs)

  def late(expected_s: float = 0.0) -> bool:
    if should_stop is not None and should_stop():
      return True
    return deadline is not None and now() + expected_s >= deadline

  firsts = [make_game(s.workload, s.hardware, game_config) for s in specs]
  # A copy the deadline leaves unbuilt is None: dropped as a cut trajectory is.
  games = firsts + [
    None
    if late()
    else make_game(s.workload, s.hardware, game_config, getattr(first, "reference", None))
    for _ in range(attempts - 1 + (policy is not None))
    for s, first in zip(specs, firsts)
  ]
  observations = [None if g is None else g.reset().observation for g in games]
  returns = np.zeros(len(games))
  moves: list[list[int]] = [[] for _ in games]
  done = np.array([g is None for g in games])
  finished = np.zeros(len(games), bool)
  rng = jax.random.PRNGKey(seed)
  params = jax.device_put(params)
  # (search, its games, its simulations)
  groups = [(greedy, np.arange(num_programs), search.eval_num_simulations)]
  if sampled is not None:
    members = np.arange(num_programs, num_programs * attempts)
    groups.append((sampled, members, search.num_simulations))
  if policy is not None:
    groups.append((policy, np.arange(num_programs * attempts, len(games)), 0))
  last_call_s = [0.0] * len(groups)  # Each group's previous search call, for the deadline.
  stopped = False
  # The msa game's decisions, for the agent solver's guided search (actors/agent.py).
  record = game_config.decisions == "msa"
  genomes: list[dict] = [{} for _ in games]
  proposals: list[dict] = [{} for _ in specs]

  def play_moves(active: np.ndarray, output: Any) -> None:
    actions, weights = np.asarray(output.action), np.asarray(output.action_weights)
    for j, (i, action) in enumerate(zip(active, actions)):
      if record:  # The proposals are the search's: the policy's own play adds no weights.
        searched = i < num_programs * attempts
        _record(
          games[i],
          int(action),
          weights[j],
          genomes[i],
          proposals[i % num_programs] if searched else None,
        )
      timestep = games[i].step(int(action))
      moves[i].append(int(action))
      returns[i] += timestep.reward
      observations[i] = timestep.observation
      done[i] = finished[i] = timestep.last()

  def advance(g: int, key: Any) -> bool:
    """One move of group `g`'s unfinished games; False when the deadline or a stop cut it."""
    search_fn, members, simulations = groups[g]
    playing = members[~done[members]]
    full = games_per_call(simulations, len(members))
    for c, first in enumerate(range(0, len(playing), full)):
      if late(last_call_s[g]):
        return False
      active = playing[first : first + full]
      batch = _batch_size(len(active), full)
      padded = [observations[i] for i in active]
      padded += [observations[active[0]]] * (batch - len(active))
      started = now()
      # The group's key for its first call, as when no batch is split.
      call_key = key if c == 0 else jax.random.fold_in(key, c)
      output = jax.device_get(search_fn(params, call_key, stack_observations(padded)))
      last_call_s[g] = now() - started
      play_moves(active, output)
    return True

  # The policy alone first, to the end: one network call per move and no search, it is the
  # cheapest trajectory by far, so a deadline that cuts the searches' trajectories on a large
  # program still leaves the network's own play (reported, and a seed of the agent's guided
  # search). Its moves are its argmax (no noise in evaluation), so its keys do not matter.
  if policy is not None:
    policy_group, policy_members = len(groups) - 1, groups[-1][1]
    unused_key = jax.random.PRNGKey(0)
    while not done[policy_members].all() and not stopped:
      raise_pending()
      stopped = not advance(policy_group, unused_key)
  keys = _KeyStream(rng)
  while not done.all() and not stopped:
    raise_pending()  # A signal whose exception a weakref callback swallowed (common/signals.py).
    # One key per possible group, so that a group's keys do not depend on which others play.
    for g, key in enumerate(keys.next()[: len(groups)]):
      stopped = stopped or not advance(g, key)
      if stopped:
        break

  results = []
  for p, spec in enumerate(specs):
    copies = games[p::num_programs]
    ended = finished[p::num_programs]
    times = [g.total_time if end else np.inf for g, end in zip(copies, ended)]
    best = int(np.argmin(times))
    mapping = None
    if ended[best]:
      mapping = copies[best].mapping(solver_name)
      validate_mapping(spec.workload, spec.hardware, mapping)
    slow = firsts[p].cost_model.slow_only_time
    speedups = tuple(float(slow / t) if end else None for t, end in zip(times, ended))
    policy_speedup = None
    if policy_alone:
      policy_speedup = speedups[-1] if policy is not None else speedups[0]
    results.append(
      EvaluationResult(
        spec.name,
        float(returns[p]),
        0.0 if mapping is None else mapping.speedup,
        np.inf if mapping is None else mapping.estimated_time_s,
        mapping,
        greedy_speedup=speedups[0],
        attempt_speedups=speedups,
        best_attempt=best,
        requests=firsts[p].num_steps,
        actions=tuple(moves[best * num_programs + p]),
        genomes=tuple(genomes[p::num_programs]) if record else (),
        proposals=(
          {key: total / count for key, (total, count) in proposals[p].items()} if record else None
        ),
        policy_speedup=policy_speedup,
        unfinished=int((~ended).sum()),
      )
    )
  return results


class _KeyStream:
  """The keys of the plain loop's iterations, `rng, *keys = jax.random.split(rng, 4)` each, made
  a block of iterations at a time by one jitted scan (the same keys: splitting is deterministic;
  eagerly, each split and its unpacking cost more than a search of the policy alone)."""

  BLOCK = 1024

  def __init__(self, rng: Any):
    self._rng = rng
    self._block: np.ndarray = np.zeros((0, 3, 2), np.uint32)
    self._next = 0

  def next(self) -> np.ndarray:
    """`[3, ...]` the next iteration's three keys."""
    if self._next == len(self._block):
      self._rng, block = _split_chain(self._rng, self.BLOCK)
      self._block, self._next = np.asarray(jax.device_get(block)), 0
    self._next += 1
    return self._block[self._next - 1]


@functools.partial(jax.jit, static_argnums=1)
def _split_chain(rng: Any, count: int) -> tuple[Any, Any]:
  """`count` iterations of `rng, *keys = jax.random.split(rng, 4)`: the last `rng` and the keys
  `[count, 3, ...]`."""

  def split(key, _):
    parts = jax.random.split(key, 4)
    return parts[0], parts[1:]

  return jax.lax.scan(split, rng, None, length=count)


def _record(
  game, action: int, weights: np.ndarray, genome: dict, proposals: Optional[dict]
) -> None:
  """Notes a move of the msa game before it is played: a departure from msa's slot in the
  attempt's genome, the search's policy in the program's proposals (summed, with a count)."""
  decision = game.decision
  key = (decision.buffer, decision.use)
  if action != game.msa_action:
    genome[key] = action
  if proposals is None:
    return
  total, count = proposals.get(key, (0.0, 0))
  proposals[key] = (total + weights, count + 1)


def compile_searches(
  networks: MuZeroNetworks,
  params: Params,
  search: SearchConfig,
  game_config: GameConfig,
  spec: GameSpec,
  num_programs: int = 1,
  attempts: int = 1,
  policy_alone: bool = False,
) -> float:
  """Compiles the searches `play_programs` will call for this batch shape (and the smaller
  batches it moves to as games finish), so that the play it times afterwards is play alone;
  returns the seconds compiling took."""
  start = time.perf_counter()
  observation = make_game(spec.workload, spec.hardware, game_config).reset().observation
  rng = jax.random.PRNGKey(0)
  batches = [(search, True, num_programs, search.eval_num_simulations)]
  if attempts > 1:
    batches.append((search, False, num_programs * (attempts - 1), search.num_simulations))
  if policy_alone and search.eval_num_simulations > 0:
    batches.append((with_simulations(search, 0), True, num_programs, 0))
  for config, evaluation, games, simulations in batches:
    full = games_per_call(simulations, games)
    for size in sorted({_batch_size(n, full) for n in (1, 4, 16, full)}):
      output = _search_fn(networks, config, evaluation)(
        params, rng, stack_observations([observation] * size)
      )
      jax.block_until_ready(output.action)
  return time.perf_counter() - start


def evaluate_params(
  networks: MuZeroNetworks,
  params: Any,
  config: Config,
  specs: Sequence[GameSpec],
  seed: int = 0,
  solver_name: str = "muzero",
  policy_alone: bool = False,
  should_stop: Optional[Callable[[], bool]] = None,
) -> list[EvaluationResult]:
  """Greedy play of every spec once with the config's evaluation search: the learning curve.
  `policy_alone`: the network's policy alone plays each spec too (`policy_speedup`); a result's
  kept mapping is then the faster of the two games (`greedy_speedup` is the search's)."""
  return play_programs(
    networks,
    params,
    config.search,
    config.game,
    specs,
    attempts=1,
    seed=seed,
    solver_name=solver_name,
    policy_alone=policy_alone,
    should_stop=should_stop,
  )
