"""Writes the B games an actor plays together to Reverb as fixed-length, prioritised sequences.

Each game has its own `reverb.TrajectoryWriter` (one episode at a time per writer). For an
episode of T real steps the game's writer receives T + L - 1 steps: the T real ones, the terminal
state (valid = 0, the terminal observation, zero action/reward/policy/root value) and L - 2 zero
padding steps. Item t (0 <= t < T) is the window of steps t..t+L-1; it is created as soon as step
t+L-1 has been appended, when everything its initial priority needs is known:

  priority_t = |z_t - root_value_t| + PRIORITY_EPSILON,
  z_t = sum_{i<n} d^i reward[t+i] valid[t+i] + d^n valid[t+n] root_value[t+n]

(n = td_steps, d = the learner's discount): the learner's own n-step target (replay/targets.py)
with the search's root values in place of the target network's, so the n-step sum stops at the
episode's end and there is no bootstrap from the terminal state or beyond.
"""

from __future__ import annotations

from typing import Any, Callable, Optional

import numpy as np
import reverb
import tree

from malloczero.configs.config import Config
from malloczero.replay.tables import TABLE_NAME
from malloczero.replay.targets import priority, value_targets
from malloczero.replay.types import Step, step_spec, zero_step

POLL_MS = 500  # How often a write blocked by the rate limiter checks whether to give up.


class WriterStopped(RuntimeError):
  """A write blocked by the rate limiter was abandoned because `should_stop()` became true."""


class _GameState:
  """Per-game bookkeeping for the current episode."""

  def __init__(self, writer: reverb.TrajectoryWriter):
    self.writer = writer
    self.num_real = 0  # T so far: real steps appended this episode.
    self.num_appended = 0  # All steps appended this episode (real, terminal, padding).
    self.rewards: list[float] = []  # Per appended step; 0 for the terminal state and padding.
    self.values: list[float] = []  # Root values, likewise.
    self.valid: list[float] = []  # 1 for real steps, 0 for the terminal state and padding.
    self.done = False  # The terminal state has been appended.


class SequenceWriter:
  """Sequence writer for `num_games` games stepped together by one actor.

  Usage per acting step, for every game `g` that acted: `append(g, Step(...))`; when game `g`'s
  episode ends (after its last action was appended): `end_episode(g, terminal_observation)`.
  Both `append` and `end_episode` block only as the table's rate limiter dictates (inserts are
  throttled when actors run ahead of the learner's samples-per-insert budget).
  """

  def __init__(
    self,
    client: reverb.Client,
    config: Config,
    num_games: int,
    table: str = TABLE_NAME,
    max_in_flight_items: Optional[int] = None,
    should_stop: Optional[Callable[[], bool]] = None,
  ):
    """Args:
    client: client of the server holding `table`.
    config: uses `learner.sequence_length`, `learner.td_steps`, `learner.discount` and `game`.
    num_games: B, the number of games (episodes in progress) written concurrently.
    table: the table to insert into.
    max_in_flight_items: per game, the number of created but unconfirmed items after which
      `append` blocks; defaults to L (about one chunk, so chunks are rarely cut short).
    should_stop: polled while a write waits on the rate limiter; once it returns True the
      write raises `WriterStopped` instead of waiting for a learner that has finished.
    """
    self._should_stop = should_stop
    self._length = config.learner.sequence_length
    self._td_steps = config.learner.td_steps
    self._discount = config.learner.discount
    if self._length <= self._td_steps:
      raise ValueError(
        f"sequence_length ({self._length}) must exceed td_steps ({self._td_steps}) "
        "so that every item holds its bootstrap state"
      )
    self._table = table
    self._spec = step_spec(config.game)
    self._zero = zero_step(config.game)
    self._max_in_flight = self._length if max_in_flight_items is None else max_in_flight_items
    self._games = [
      _GameState(client.trajectory_writer(num_keep_alive_refs=self._length))
      for _ in range(num_games)
    ]

  @property
  def num_games(self) -> int:
    return len(self._games)

  def append(self, game: int, step: Step) -> None:
    """Appends one real step of game `game`: observation at t, action, its reward, search policy
    `[A]` and root value; `valid` is set to 1 whatever the step says."""
    state = self._games[game]
    if state.done:
      raise RuntimeError(f"game {game}: append after end_episode without a new episode")
    state.num_real += 1
    self._append(state, step._replace(valid=1.0))

  def end_episode(self, game: int, terminal_observation: dict[str, Any]) -> None:
    """Ends game `game`'s episode: appends the terminal state and the padding, writes the last
    items, flushes them and starts a fresh episode for the game."""
    state = self._games[game]
    if state.num_real == 0:  # Nothing was played: no item would start in this episode.
      self._wait(state.writer.end_episode, clear_buffers=True)
      self._games[game] = _GameState(state.writer)
      return
    state.done = True
    self._append(state, self._zero._replace(observation=terminal_observation))
    # Item T-1 is the last one and ends at step T+L-2.
    while state.num_appended < state.num_real + self._length - 1:
      self._append(state, self._zero)
    self._wait(state.writer.end_episode, clear_buffers=True)
    self._games[game] = _GameState(state.writer)

  def flush(self) -> None:
    """Blocks until every created item of every game is confirmed by the server."""
    for state in self._games:
      self._wait(state.writer.flush)

  def close(self) -> None:
    """Flushes and closes the writers; episodes in progress are dropped (their later items)."""
    for state in self._games:
      self._wait(state.writer.flush)
      state.writer.close()

  def abandon(self) -> None:
    """Closes every game's stream without flushing, at a stop: items the rate limiter still
    holds are dropped. Why: Reverb's server gives the streams still open at its shutdown a fixed
    5 s (reverb/cc/platform/default/server.cc `Stop`), which a stopping run would wait out."""
    for state in self._games:
      state.writer.close()

  def _wait(self, write: Callable[..., None], **kwargs: Any) -> None:
    """Calls a blocking writer method, giving up with WriterStopped once `should_stop()`."""
    if self._should_stop is None:
      write(**kwargs)
      return
    while True:
      try:
        write(timeout_ms=POLL_MS, **kwargs)
        return
      except reverb.errors.DeadlineExceededError:
        if self._should_stop():
          raise WriterStopped("replay write abandoned: the run is stopping") from None

  def _append(self, state: _GameState, step: Step) -> None:
    # Cast to the spec dtypes: the first append fixes each column's dtype, and the table signature
    # (checked at create_item) wants exactly these; actors may hand in Python or JAX scalars.
    step = tree.map_structure(lambda s, x: np.asarray(x, s.dtype), self._spec, step)
    state.writer.append(step)
    state.rewards.append(float(step.reward))
    state.values.append(float(step.root_value))
    state.valid.append(float(step.valid))
    state.num_appended += 1
    start = state.num_appended - self._length
    if 0 <= start < state.num_real:
      priority = self._priority(state, start)
      trajectory = tree.map_structure(lambda column: column[-self._length :], state.writer.history)
      state.writer.create_item(self._table, priority, trajectory)
      # Back-pressure: without it a long episode would queue all of its items client-side.
      self._wait(state.writer.flush, block_until_num_items=self._max_in_flight)

  def _priority(self, state: _GameState, t: int) -> float:
    window = slice(t, t + self._td_steps + 1)  # State t, its n rewards and its bootstrap state.
    rewards, valid, values = (
      np.asarray(column[window], np.float64)
      for column in (state.rewards, state.valid, state.values)
    )
    target = value_targets(rewards, valid, values, 0, self._td_steps, self._discount)[0]
    return float(priority(target, values[0]))
