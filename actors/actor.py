"""The batched self-play actor: B games stepped together, one search call per step for all of
them."""

from __future__ import annotations

import concurrent.futures
import dataclasses
import logging
import time
from typing import Any, Callable, Sequence

import jax
import numpy as np

from malloczero.actors.games import GamePool
from malloczero.actors.search import make_search_fn
from malloczero.actors.variable_client import VariableClient
from malloczero.configs.config import Config
from malloczero.learner.networks import MuZeroNetworks
from malloczero.learner.probes import Prober, greedy_policies
from malloczero.replay.types import Step

_log = logging.getLogger("malloczero.actors")

# `offer(program, actions, episode_return) -> best return known for the program`: the learner's
# `offer_demonstration` (learner/demonstrations/).
OfferFn = Callable[[str, Sequence[int], float], float]
# `offer_probe(observation, advantages [A], msa_action) -> probes stored`: the learner's
# `offer_probe`, called with nested lists.
OfferProbeFn = Callable[[dict[str, list], list, int], int]


@dataclasses.dataclass(frozen=True)
class EpisodeResult:
  program: str
  # Sum of rewards: the mapping's advantage over msa's, (T_msa - T) / T_msa, with the msa game's
  # default reward; (slow-only time - T) / slow-only time with the "time" reward.
  episode_return: float
  speedup: float  # Slow-only time / final time.
  length: int


def stack_observations(observations: list[dict[str, np.ndarray]]) -> dict[str, np.ndarray]:
  """Per-game observation dicts -> one dict of `[B, ...]` arrays."""
  return {key: np.stack([o[key] for o in observations]) for key in observations[0]}


class BatchedActor:
  """Plays `pool.num_slots` games at once with Gumbel MuZero search and writes them to replay.

  `writer` (replay.SequenceWriter) may be None, e.g. for a pure acting benchmark. With `offer`,
  a finished game that earned more than the best return known for its program is offered as a
  demonstration, in a background thread so that acting does not wait for the learner's replay
  of it; the answer (the best return now known) updates what counts as better.

  With `prober` and `offer_probe`, `config.probes.share` of the actor's time goes to
  probing decisions (learner/probes/), each sent to the learner in a background thread.
  """

  def __init__(
    self,
    networks: MuZeroNetworks,
    config: Config,
    pool: GamePool,
    variable_client: VariableClient,
    writer: Any = None,
    seed: int = 0,
    on_episode: Callable[[EpisodeResult], None] | None = None,
    offer: OfferFn | None = None,
    prober: Prober | None = None,
    offer_probe: OfferProbeFn | None = None,
  ):
    self._pool = pool
    self._offer = offer
    self._best_known: dict[str, float] = {}
    self._offers: list[tuple[str, concurrent.futures.Future]] = []
    self._offer_executor = (
      concurrent.futures.ThreadPoolExecutor(1, thread_name_prefix="offers")
      if offer is not None
      else None
    )
    # Its own thread: a probe's send must not wait behind a demonstration the learner replays.
    self._probe_executor = (
      concurrent.futures.ThreadPoolExecutor(1, thread_name_prefix="probes")
      if offer_probe is not None
      else None
    )
    self.num_offers = 0
    self._prober = prober if offer_probe is not None else None
    self._offer_probe = offer_probe
    self._probe_share = config.probes.share
    # The network's policy alone, for probes along its own trajectory (compiled on first use).
    on_policy = self._prober is not None and self._prober.on_policy > 0
    self._greedy = greedy_policies(networks) if on_policy else None
    self._probe_sends: list[concurrent.futures.Future] = []
    self._acting_s = self._probing_s = 0.0
    self._client = variable_client
    self._writer = writer
    self._search = make_search_fn(networks, config.search)
    self._rng = jax.random.PRNGKey(seed)
    self._segment_moves = config.actor.segment_moves
    # With `imitate_gains_only`, each game's steps and msa's move at each (slot `[T]`), held
    # until its end decides their policy targets (`_write_episode`).
    self._imitate_gains_only = config.actor.imitate_gains_only
    self._held: list[list[tuple[Step, int]]] = [[] for _ in range(pool.num_slots)]
    self.num_departures_unlearned = 0
    self._start_rng = np.random.default_rng(seed)
    self._on_episode = on_episode
    self._games = []
    self._programs = []
    self._observations = []
    self._actions: list[list[int]] = []
    self._returns = np.zeros(pool.num_slots)
    self._lengths = np.zeros(pool.num_slots, np.int64)
    for slot in range(pool.num_slots):
      self._start_episode(slot)
    self.num_steps = 0
    self.num_episodes = 0

  @property
  def num_games(self) -> int:
    return self._pool.num_slots

  @property
  def num_programs(self) -> int:
    return len(self._pool.specs)

  def _start_episode(self, slot: int) -> None:
    index, game = self._pool.draw(slot)
    if self._segment_moves and hasattr(game, "reset_segment"):
      start = int(self._start_rng.integers(game.msa_moves))
      observation = game.reset_segment(start, self._segment_moves).observation
    else:
      observation = game.reset().observation
    if slot < len(self._games):
      self._games[slot], self._programs[slot], self._observations[slot] = game, index, observation
      self._actions[slot] = []
    else:
      self._games.append(game)
      self._programs.append(index)
      self._observations.append(observation)
      self._actions.append([])
    self._returns[slot] = 0.0
    self._lengths[slot] = 0

  @property
  def num_probes(self) -> int:
    """Decisions probed and sent to the learner."""
    return self._prober.num_probes if self._prober is not None else 0

  @property
  def num_on_policy_probes(self) -> int:
    """Of `num_probes`, those drawn along the network's own trajectory."""
    return self._prober.num_on_policy if self._prober is not None else 0

  @property
  def probing_share(self) -> float:
    """The share of acting and probing time spent probing so far."""
    return self._probing_s / max(self._acting_s + self._probing_s, 1e-9)

  def step(self) -> list[EpisodeResult]:
    """One move in every game (and probes while they are below their share of the actor's
    time); returns the episodes that finished with it."""
    started = time.perf_counter()
    finished = self._act()
    self._acting_s += time.perf_counter() - started
    if self._prober is not None:
      self._probe_while_due()
    return finished

  def _probe_while_due(self) -> None:
    share = self._probe_share
    while self._probing_s < share / (1.0 - share) * self._acting_s:
      started = time.perf_counter()
      policy = self._greedy(self._client.params) if self._greedy is not None else None
      probe = self._prober.probe(policy)
      self._probing_s += time.perf_counter() - started
      if probe is None:
        continue
      for sent in [f for f in self._probe_sends if f.done()]:
        self._probe_sends.remove(sent)
        try:
          sent.result()
        except Exception as e:  # pylint: disable=broad-except  # Learner busy or stopping.
          _log.warning("probe offer failed: %s", e)
      # As lists: Launchpad's courier times out on numpy arrays as call arguments.
      observation = {k: v.tolist() for k, v in probe.observation.items()}
      self._probe_sends.append(
        self._probe_executor.submit(
          self._offer_probe, observation, probe.advantages.tolist(), probe.msa_action
        )
      )

  def _act(self) -> list[EpisodeResult]:
    self._client.update()
    self._rng, key = jax.random.split(self._rng)
    batch = stack_observations(self._observations)
    output = jax.device_get(self._search(self._client.params, key, batch))
    finished = []
    for slot, game in enumerate(self._games):
      action = int(output.action[slot])
      msa_action = game.msa_action if self._imitate_gains_only else -1
      timestep = game.step(action)
      if self._writer is not None:
        step = Step(
          observation=self._observations[slot],
          action=np.int32(action),
          reward=np.float32(timestep.reward),
          policy=output.action_weights[slot],
          root_value=output.root_value[slot],
          valid=np.float32(1.0),
        )
        if self._imitate_gains_only:
          self._held[slot].append((step, msa_action))
        else:
          self._writer.append(slot, step)
      self._returns[slot] += timestep.reward
      self._lengths[slot] += 1
      self._actions[slot].append(action)
      if timestep.last():
        if self._writer is not None:
          if self._imitate_gains_only:
            self._write_episode(slot, beat_msa=game.total_time < game.msa_time)
          self._writer.end_episode(slot, timestep.observation)
        spec = self._pool.specs[self._programs[slot]]
        # A short game's moves are only part of its trajectory: offer the whole of it.
        actions = getattr(game, "played_actions", self._actions[slot])
        self._maybe_offer(spec.name, actions, float(self._returns[slot]))
        finished.append(
          EpisodeResult(
            spec.name,
            float(self._returns[slot]),
            game.cost_model.slow_only_time / game.total_time,
            int(self._lengths[slot]),
          )
        )
        self._start_episode(slot)
      else:
        self._observations[slot] = timestep.observation
    self.num_steps += 1
    self.num_episodes += len(finished)
    if self._on_episode is not None:
      for result in finished:
        self._on_episode(result)
    return finished

  def _write_episode(self, slot: int, beat_msa: bool) -> None:
    """Writes a finished game's held steps: as played when it `beat_msa`, else with msa's move
    as the policy target (one-hot `[A]`) at every step that left it."""
    for step, msa_action in self._held[slot]:
      if not beat_msa and int(step.action) != msa_action:
        policy = np.zeros_like(step.policy)
        policy[msa_action] = 1.0
        step = step._replace(policy=policy)
        self.num_departures_unlearned += 1
      self._writer.append(slot, step)
    self._held[slot] = []

  def _maybe_offer(self, program: str, actions: list[int], episode_return: float) -> None:
    if self._offer_executor is None:
      return
    still_waiting = []
    for name, future in self._offers:  # Answers so far: the best returns the learner knows.
      if not future.done():
        still_waiting.append((name, future))
        continue
      try:
        self._best_known[name] = max(self._best_known.get(name, -np.inf), future.result())
      except Exception as e:  # pylint: disable=broad-except  # Learner busy or stopping.
        _log.warning("demonstration offer for %s failed: %s", name, e)
    self._offers = still_waiting
    if episode_return <= self._best_known.get(program, -np.inf):
      return
    self._best_known[program] = episode_return  # No second offer of the same until answered.
    self.num_offers += 1
    self._offers.append(
      (program, self._offer_executor.submit(self._offer, program, list(actions), episode_return))
    )

  def close(self, wait: bool = False) -> None:
    """Stops the offer and probe threads: with `wait`, after every offer and probe was answered;
    otherwise those not sent yet are dropped (at a stop the learner may be gone), and so are the
    replay items not yet inserted (`SequenceWriter.abandon`)."""
    for executor in (self._offer_executor, self._probe_executor):
      if executor is not None:
        executor.shutdown(wait=wait, cancel_futures=not wait)
    if not wait and self._writer is not None:
      self._writer.abandon()

  def run(self, should_stop: Callable[[], bool], num_steps: int | None = None) -> None:
    steps = 0
    while not should_stop() and (num_steps is None or steps < num_steps):
      self.step()
      steps += 1


def acting_moves_per_s(actor: BatchedActor, num_steps: int) -> float:
  """Game moves per second (all B games), search and game stepping included."""
  actor.step()  # compile
  start = time.perf_counter()
  for _ in range(num_steps):
    actor.step()
  return num_steps * actor.num_games / (time.perf_counter() - start)
