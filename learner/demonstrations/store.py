"""The best trajectory known for each training program, mixed into every learner batch.

Self-imitation (Oh et al. 2018) and MuZero Unplugged (Schrittwieser et al. 2021, section 3) both
train on good trajectories beside the agent's own: here one per training program, the fastest
mapping any source has produced so far. It starts as msa's own play (the heuristic's action is
known at every step of the msa game), and an actor or an evaluation that finishes a game faster
than that offers its moves (`Demonstrations.offer`), which replace it. So the policy starts as
msa's (behaviour
cloning) and is pulled toward every improvement found since, and the run's best mapping per
program can only get better.

A demonstration is stored as its moves: the game is deterministic, so `offer` replays them to
rebuild the observations and checks the return it was told. Its steps follow the actors' replay
layout (replay/types.py: real steps, the terminal state, zero padding), with
  policy      one-hot of the move played (the behaviour-cloning target),
  root_value  the exact return still to come from that step (the learner's value target for
              demonstration items is this Monte-Carlo return, not a bootstrap),
so `sample` hands the learner windows it fits with the same loss as replay items.

Programs are drawn uniformly, then a start step uniformly within the program: replay items are
per move, so long programs dominate replay, while here every program counts the same.
"""

from __future__ import annotations

import dataclasses
import json
import math
import os
import threading
import time
from typing import Callable, Optional, Sequence

import numpy as np
import tree

from malloczero.common.errors import MalloczeroError
from malloczero.common.files import write_text
from malloczero.common.inputs import read_input_text
from malloczero.env.game import GameConfig, make_game
from malloczero.replay.types import Step, zero_step

DEMONSTRATIONS_FILENAME = "demonstrations.json"

# A replayed return may differ from the one the actor summed by float rounding only.
RETURN_TOLERANCE = 1e-6


@dataclasses.dataclass(frozen=True)
class Demonstration:
  """The moves of one complete game and what they earned."""

  program: str
  actions: tuple[int, ...]
  episode_return: float
  source: str  # "msa" or "agent"


def heuristic_actions(game) -> Optional[list[int]]:
  """msa's own move at every step of a fresh episode of `game`, or None for a game that does not
  know the heuristic's move (the requests game)."""
  if game.config.decisions != "msa":
    return None
  game.reset()
  actions = []
  while not game.done:
    actions.append(game.msa_action)
    game.step(actions[-1])
  return actions


def demonstration_steps(
  game, actions: Sequence[int], sequence_length: int, config: GameConfig
) -> tuple[Step, float, np.ndarray]:
  """Replays `actions` in a fresh episode of `game`.

  Returns:
    (steps, episode return, departures): steps with leaves `[T + L - 1, ...]` (T =
    len(actions) real steps, the terminal state, L - 2 padding steps), laid out as the actors'
    replay writer lays them out; departures `[D]`, the steps whose move is not msa's own (none in
    a game that does not know msa's move).

  Raises:
    MalloczeroError: an action is illegal, or the game ends before or after the moves do.
  """
  timestep = game.reset()
  knows_msa = config.decisions == "msa"
  observations, rewards, departures = [], [], []
  for action in actions:
    if timestep.last():
      raise MalloczeroError(
        f"demonstration for '{game.workload.name}' has more moves than the game"
      )
    if knows_msa and int(action) != game.msa_action:
      departures.append(len(observations))
    observations.append(timestep.observation)
    timestep = game.step(int(action))
    rewards.append(float(timestep.reward))
  if not timestep.last():
    raise MalloczeroError(f"demonstration for '{game.workload.name}' stops before the game ends")
  num_real = len(actions)
  zero = zero_step(config)
  steps = [zero] * (num_real + sequence_length - 1)
  returns_to_go = np.cumsum(np.asarray(rewards, np.float64)[::-1])[::-1]
  for t, (observation, action) in enumerate(zip(observations, actions)):
    policy = np.zeros(config.num_actions, np.float32)
    policy[int(action)] = 1.0
    steps[t] = Step(
      observation=observation,
      action=np.int32(action),
      reward=np.float32(rewards[t]),
      policy=policy,
      root_value=np.float32(returns_to_go[t]),
      valid=np.float32(1.0),
    )
  steps[num_real] = zero._replace(observation=timestep.observation)
  stacked = tree.map_structure(
    lambda s, *xs: np.stack([np.asarray(x, s.dtype) for x in xs]), zero, *steps
  )
  episode_return = float(returns_to_go[0]) if num_real else 0.0
  return stacked, episode_return, np.asarray(departures, np.int64)


class Demonstrations:
  """The best known trajectory of each of `specs`' programs; thread-safe (actors offer through
  the learner's server thread while the learner samples)."""

  def __init__(
    self,
    specs: Sequence,
    config: GameConfig,
    sequence_length: int,
    seed: int = 0,
    on_improve: Optional[Callable[[Demonstration, object], None]] = None,
    departure_share: float = 0.0,
    unroll_steps: int = 0,
  ):
    """Args:
    specs: the training programs (`actors.games.GameSpec`: name, workload, hardware).
    config: the game they are played in.
    sequence_length: L, steps per sampled window.
    seed: seeds the sampling.
    departure_share: the share of windows drawn, for a program whose demonstration leaves
      msa's move somewhere, so that a departure lies among the window's first `unroll_steps` + 1
      steps (those with a policy target); the rest start uniformly.
    unroll_steps: K, the learner's unroll.
    on_improve: called with each newly kept demonstration and the game at its end (e.g. to
      write the mapping: system/builder.py `write_best_mapping`).
    """
    self._on_improve = on_improve
    self._specs = {spec.name: spec for spec in specs}
    self._config = config
    self._length = sequence_length
    if not 0.0 <= departure_share <= 1.0:
      raise ValueError(f"departure_share must be in [0, 1], got {departure_share}")
    self._departure_share = departure_share
    self._unroll_steps = unroll_steps
    self._rng = np.random.default_rng(seed)
    self._games: dict[str, object] = {}
    self._best: dict[str, Demonstration] = {}
    self._steps: dict[str, Step] = {}
    self._departures: dict[str, np.ndarray] = {}
    # `_lock` guards what the learner samples (the held demonstrations); `_replay_lock` the
    # games, which a replay steps through a whole program (seconds on the largest): held apart,
    # the learner samples while an actor's offer or msa's own play is being replayed.
    self._lock = threading.RLock()
    self._replay_lock = threading.Lock()
    # Replays done by `offer` and their seconds, in all: what demonstrations cost the learner's
    # process (each replays a whole program).
    self.num_replays = 0
    self.replay_seconds = 0.0
    self._zero = tree.map_structure(
      lambda x: np.zeros((sequence_length,) + x.shape, x.dtype), zero_step(config)
    )

  def __len__(self) -> int:
    return len(self._best)

  def holds(self, program: str) -> bool:
    """Whether `program` is one of the programs this store keeps a demonstration of."""
    return program in self._specs

  def best(self) -> dict[str, Demonstration]:
    with self._lock:
      return dict(self._best)

  def num_departures(self) -> int:
    """Steps, over every program's demonstration, whose move is not msa's own."""
    with self._lock:
      return sum(len(d) for d in self._departures.values())

  def num_improved(self) -> int:
    """Programs whose demonstration is no longer msa's own play."""
    with self._lock:
      return sum(d.source != "msa" for d in self._best.values())

  def best_return(self, program: str) -> float:
    with self._lock:
      known = self._best.get(program)
    return known.episode_return if known is not None else -np.inf

  def _game(self, program: str):
    if program not in self._games:
      spec = self._specs[program]
      self._games[program] = make_game(spec.workload, spec.hardware, self._config)
    return self._games[program]

  def add_heuristic(self) -> int:
    """Offers msa's own play of every program; returns how many programs it was offered for."""
    offered = 0
    for program in self._specs:
      with self._replay_lock:  # The games are shared with `offer`.
        actions = heuristic_actions(self._game(program))
      if actions is not None:
        self.offer(program, actions, None, "msa")
        offered += 1
    return offered

  def offer(
    self, program: str, actions: Sequence[int], episode_return: Optional[float], source: str
  ) -> float:
    """Keeps `actions` as `program`'s demonstration if they earn more than the one held.

    Args:
      program: a training program's name.
      actions: the moves of one complete game.
      episode_return: what the offering side summed; when given and not better than the best
        held, the moves are not even replayed. A replay that earns a different return is refused.
      source: who found it (kept with it, for reports).

    Returns:
      The best return now held for `program`.
    """
    if program not in self._specs:
      raise MalloczeroError(f"demonstration for unknown program '{program}'")
    best = self.best_return(program)
    if episode_return is not None and episode_return <= best:
      return best
    with self._replay_lock:  # One replay at a time: the games are shared.
      game = self._game(program)
      started = time.perf_counter()
      steps, replayed, departures = demonstration_steps(game, actions, self._length, self._config)
      with self._lock:
        self.num_replays += 1
        self.replay_seconds += time.perf_counter() - started
      if episode_return is not None and abs(replayed - episode_return) > RETURN_TOLERANCE:
        raise MalloczeroError(
          f"demonstration for '{program}' replays to return {replayed:.9g}, not the "
          f"{episode_return:.9g} offered (was it played with another game config?)"
        )
      with self._lock:
        known = self._best.get(program)
        improved = known is None or replayed > known.episode_return
        if improved:
          self._best[program] = Demonstration(
            program, tuple(int(a) for a in actions), replayed, source
          )
          self._steps[program] = steps
          self._departures[program] = departures
        best = self._best[program]
      if improved and self._on_improve is not None:
        self._on_improve(best, game)  # The game stands at the replay's end until released.
      return best.episode_return

  def sample(self, batch_size: int) -> tuple[Step, np.ndarray]:
    """`batch_size` windows of L steps: (steps with leaves `[N, L, ...]`, weights `[N]`).

    Programs are drawn uniformly, then a start step: with probability `departure_share`, where
    the program's demonstration departs from msa's move, one that puts a departure drawn
    uniformly among the window's first K + 1 steps; otherwise uniformly within the
    demonstration. A departure is a handful of a program's thousands of steps, so uniform
    windows would fit the policy to it a few times a run against msa's move everywhere else.
    With no demonstration held yet, the windows are padding with weight 0."""
    with self._lock:
      programs = list(self._steps)
      if not programs:
        empty = tree.map_structure(lambda x: np.stack([x] * batch_size), self._zero)
        return empty, np.zeros(batch_size, np.float32)
      windows = []
      for index in self._rng.integers(len(programs), size=batch_size):
        steps = self._steps[programs[index]]
        departures = self._departures[programs[index]]
        if len(departures) and self._rng.random() < self._departure_share:
          departure = int(self._rng.choice(departures))
          start = int(self._rng.integers(max(departure - self._unroll_steps, 0), departure + 1))
        else:
          start = int(self._rng.integers(steps.valid.shape[0] - self._length + 1))
        windows.append(tree.map_structure(lambda x: x[start : start + self._length], steps))
    stacked = tree.map_structure(lambda *xs: np.stack(xs), *windows)
    return stacked, np.ones(batch_size, np.float32)

  # ---------------------------------------------------------------------------- files

  def save(self, directory: str) -> str:
    """Writes the demonstrations' moves to `directory`/demonstrations.json (atomically)."""
    path = os.path.join(directory, DEMONSTRATIONS_FILENAME)
    data = [dataclasses.asdict(d) for d in self.best().values()]
    write_text(path, json.dumps(data))
    return path

  def restore(self, directory: str) -> int:
    """Replays the demonstrations saved in `directory`, if any, of the programs this store
    keeps (`holds`; a resume with a smaller `learner.demonstration_programs` drops the rest);
    returns how many were kept. A file that cannot be read, or one for another game, is a
    one-line MalloczeroError."""
    items = [d for d in read_demonstrations(directory) if self.holds(d.program)]
    for item in items:
      self.offer(item.program, item.actions, item.episode_return, item.source)
    return len(items)


def read_demonstrations(directory: str) -> list[Demonstration]:
  """The demonstrations saved in `directory` (none when it has no file), read and checked
  without replaying them: what a resumed run checks before any node starts. A file that cannot
  be read is a one-line MalloczeroError."""
  path = os.path.join(directory, DEMONSTRATIONS_FILENAME)
  if not os.path.exists(path):
    return []
  try:
    data = json.loads(read_input_text(path, MalloczeroError))
    items = [
      Demonstration(
        str(d["program"]),
        tuple(int(a) for a in d["actions"]),
        float(d["episode_return"]),
        str(d["source"]),
      )
      for d in data
    ]
  except MalloczeroError as e:
    raise MalloczeroError(f"demonstrations file unusable: {e}") from None
  except (ValueError, TypeError, KeyError) as e:
    raise MalloczeroError(
      f"demonstrations file '{path}' is unusable ({type(e).__name__}: {e})".replace("\n", " ")
    ) from None
  if not all(math.isfinite(d.episode_return) for d in items):
    raise MalloczeroError(f"demonstrations file '{path}' is unusable (a return is not finite)")
  return items
