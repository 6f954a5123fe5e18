"""Exact one-move advantages over msa: policy targets that need no value estimate.

At a decision of msa's own trajectory of a program, every legal move is played once and msa
finishes the program (`MsaGame.reset_segment(step, 1)`: a one-move short game), so each move's
advantage over msa is exact: (msa's time - the mapping's time) / msa's time, 0 for msa's own
move. The learner fits the policy to softmax(advantage / temperature) over the legal moves at
such decisions (learner/probes/loss.py `probe_policy_loss`).

Why: a deviation that pays is worth 1e-3 to 1e-2 of msa's time, while the value's error is 1.2-3
times the mean |advantage| (docs/results/archive.md 3.19), so search targets built from the
model's Q-values rank deviations at chance. Fitted to exact advantages offline, the same network
beats msa on 9-12 of 16 held-out programs with no search (archive 3.20). A probe costs one msa
pass per legal move, about 0.3 s per decision on the default suite.

With a policy (`Prober.probe(policy)`), a share of the probes is drawn along that policy's own
trajectory instead: its moves from the program's start up to the drawn step, then every legal move
there with msa finishing, each relative to msa's move at that state. Why: a prior fitted on msa's
states alone leaves msa's trajectory at its first departure, into states it never saw, and loses
over whole games what it gains at single decisions (docs/results/archive.md 3.20-3.21); probing the
states the current network reaches and aggregating them is DAgger (Ross, Gordon & Bagnell 2011,
Algorithm 3.1), here with the network of the moment as the rolled-out policy.
"""

from __future__ import annotations

import collections
import dataclasses
from typing import Callable, Protocol, Sequence

import jax
import numpy as np

from malloczero.env import Hardware, Workload
from malloczero.env.game import GameConfig, make_game
from malloczero.env.game.cache import BuiltGames
from malloczero.env.solvers.evo_msa import Genome, decode
from malloczero.learner.networks import MuZeroNetworks, Params


class ProgramSpec(Protocol):
  """A program to probe, as the prober reads it: the actors' `GameSpec` is one. Typed by its
  attributes, since the learner sits below the actors in the layering and may not import them."""

  @property
  def name(self) -> str: ...

  @property
  def workload(self) -> Workload: ...

  @property
  def hardware(self) -> Hardware: ...


# Draws of a step before the prober gives up on a program whose decisions offer one legal move.
MAX_DRAWS = 16


@dataclasses.dataclass(frozen=True)
class Probe:
  """One decision with the exact advantage of every legal move."""

  program: str
  step: int  # The decision's index in the trajectory probed (msa's, or the policy's).
  observation: dict[str, np.ndarray]  # The game's observation there.
  advantages: np.ndarray  # float32 [A]: each legal slot's exact advantage, 0 at illegal slots.
  msa_action: int
  on_policy: bool = False  # Drawn along the policy's own trajectory rather than msa's.


# An observation -> the legal action slot a policy plays there.
Policy = Callable[[dict[str, np.ndarray]], int]


def greedy_policies(networks: MuZeroNetworks) -> Callable[[Params], Policy]:
  """params -> the network's policy alone with them: the legal argmax of its prior (what
  `evaluate --simulations 0` plays, ties to the first legal slot). Compiled once, for any
  params of the same shapes."""

  @jax.jit
  def prior(params: Params, observation: dict) -> jax.Array:
    return networks.predict(params, networks.represent(params, observation)).policy_logits[0]

  def with_params(params: Params) -> Policy:
    def act(observation: dict[str, np.ndarray]) -> int:
      logits = np.asarray(prior(params, {k: np.asarray(v)[None] for k, v in observation.items()}))
      legal = np.flatnonzero(observation["legal_actions"])
      return int(legal[np.argmax(logits[legal])])

    return act

  return with_params


def advantages_after(
  game,
  departures: Genome,
  legal: np.ndarray,
  msa_action: int,
  with_msa: float | None = None,
) -> np.ndarray:
  """At the decision `game` (an msa game) is at, reached by msa's moves with `departures`
  ({(buffer, use): slot}) instead: each legal slot's exact advantage `[A]` float64 over msa's
  move there, msa finishing the program, in fractions of msa's own program time (0 at illegal
  slots and at msa's move). One full msa pass (evo-msa's `decode`) per legal move; `with_msa`,
  the program time of `departures` with msa finishing, spares msa's move its pass where the
  caller knows it (a trajectory played move by move does)."""
  decision = (game.decision.buffer, game.decision.use)
  return _advantages_with(game, departures, decision, legal, msa_action, with_msa)


def _advantages_with(
  game,
  departures: Genome,
  decision: tuple[int, int],
  legal: np.ndarray,
  msa_action: int,
  with_msa: float | None = None,
) -> np.ndarray:
  """`advantages_after` at `decision` ((buffer, use)) of `game`'s program, whatever state the
  game is in: only its program's constants (config, cost model, msa's time) are read."""
  config, model = game.config, game.cost_model

  def program_time(genome: Genome) -> float:
    return decode(
      model, genome, max_prefetch_starts=config.max_prefetch_starts, skip_below=config.skip_below
    )[0]

  if with_msa is None:
    with_msa = program_time(departures)
  advantages = np.zeros(legal.shape, np.float64)
  for action in np.flatnonzero(legal).tolist():
    if action != msa_action:
      departed = program_time({**departures, decision: action})
      advantages[action] = (with_msa - departed) / game.msa_time
  return advantages


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


@dataclasses.dataclass(frozen=True)
class _Pending:
  """A decision of a policy's own trajectory, recorded during its rollout and probed later."""

  index: int  # The program's index in the prober's specs.
  step: int
  observation: dict[str, np.ndarray]
  departures: Genome  # The policy's departures from msa before this decision.
  decision: tuple[int, int]  # (buffer, use) decided here.
  msa_action: int


class Prober:
  """Probes decisions of the programs `specs`: each probe a uniformly drawn program, then a
  uniformly drawn step of msa's trajectory that offers more than one legal move, or, for the
  share `on_policy` of the probes given a policy, a step of that policy's own trajectory.

  One rollout of the policy through a program records `per_rollout` decisions of its trajectory,
  probed by this and the next on-policy draws: the rollout (one network call per move) costs
  several probes' msa passes on a long program, and paid for one probe it halved a run's probes
  (docs/results/archive.md 3.23). The decisions kept from an older rollout were reached by the
  network of that moment, as a DAgger iteration's are (Ross et al. 2011, Algorithm 3.1).

  Its games are its own, built on first use (with the "advantage" reward whatever `config`'s:
  the advantage is relative to msa's completion)."""

  def __init__(
    self,
    specs: Sequence[ProgramSpec],
    config: GameConfig,
    seed: int = 0,
    on_policy: float = 0.0,
    cached_games: int = 0,
    per_rollout: int = 1,
  ):
    if config.decisions != "msa":
      raise ValueError("probes need the msa game: only it knows msa's move")
    if not specs:
      raise ValueError("no programs to probe")
    if not 0.0 <= on_policy <= 1.0:
      raise ValueError(f"on_policy must be in [0, 1], got {on_policy}")
    if per_rollout < 1:
      raise ValueError(f"per_rollout must be at least 1, got {per_rollout}")
    self._on_policy = on_policy
    self._per_rollout = per_rollout
    self._pending: collections.deque[_Pending] = collections.deque()
    self._specs = list(specs)
    self._config = dataclasses.replace(config, reward="advantage")
    self._games = BuiltGames(cached_games)  # At most this many kept (0: all).
    self._rng = np.random.default_rng(seed)
    self.num_probes = 0
    self.num_on_policy = 0
    self.num_rollouts = 0

  @property
  def on_policy(self) -> float:
    """The share of the probes drawn along a given policy's trajectory."""
    return self._on_policy

  def _game(self, index: int):
    spec = self._specs[index]
    return self._games.get(index, lambda: make_game(spec.workload, spec.hardware, self._config))

  def probe(self, policy: Policy | None = None) -> Probe | None:
    """One decision of a drawn program, or None when `MAX_DRAWS` steps of it offered one legal
    move each (on msa's trajectory), or when `policy`'s game ended before the drawn step with
    no decision of more than one legal move after it."""
    if policy is not None and self._on_policy and self._rng.random() < self._on_policy:
      if not self._pending:
        index = int(self._rng.integers(len(self._specs)))
        self._roll_out(index, self._game(index), policy)
      return self._probe_pending() if self._pending else None
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

  def _roll_out(self, index: int, game, policy: Policy) -> None:
    """Plays `policy` through program `index` (`game`, its msa game), keeping for each of
    `per_rollout` uniformly drawn steps the first decision with more than one legal move at or
    after it (a decision drawn twice is kept once)."""
    targets = sorted(int(t) for t in self._rng.integers(game.msa_moves, size=self._per_rollout))
    self.num_rollouts += 1
    departures: Genome = {}
    timestep = game.reset()
    while targets and not timestep.last():
      observation, msa_action = timestep.observation, game.msa_action
      decision = (game.decision.buffer, game.decision.use)
      if game.num_steps >= targets[0] and observation["legal_actions"].sum() > 1:
        self._pending.append(
          _Pending(
            index,
            game.num_steps,
            {k: np.array(v) for k, v in observation.items()},
            dict(departures),
            decision,
            msa_action,
          )
        )
        while targets and targets[0] <= game.num_steps:
          targets.pop(0)
        if not targets:
          break
      action = policy(observation)
      if action != msa_action:
        departures[decision] = action
      timestep = game.step(action)

  def _probe_pending(self) -> Probe:
    """The oldest recorded decision of a policy's trajectory, every legal move played there."""
    pending = self._pending.popleft()
    legal = pending.observation["legal_actions"]
    advantages = _advantages_with(
      self._game(pending.index), pending.departures, pending.decision, legal, pending.msa_action
    )
    self.num_probes += 1
    self.num_on_policy += 1
    return Probe(
      self._specs[pending.index].name,
      pending.step,
      pending.observation,
      advantages.astype(np.float32),
      pending.msa_action,
      on_policy=True,
    )
