"""What the single-process trainer and the distributed nodes both do with the builder's parts: step
the learner, step the actor, and summarise the actor's finished games for its log."""

from __future__ import annotations

import collections
import contextlib
import signal
import threading
from typing import Any, Callable, Iterator, Optional

import numpy as np

from malloczero.actors.actor import BatchedActor, EpisodeResult
from malloczero.common.signals import STOPPING_SIGNALS, signal_exception
from malloczero.learner.learner import MuZeroLearner


def run_learner(
  learner: MuZeroLearner,
  logger: Any,
  should_stop: Callable[[], bool],
  max_steps: int,
  on_step: Optional[Callable[[], None]] = None,
) -> None:
  """Steps the learner until `should_stop()` or `max_steps`, logging each step's metrics;
  `on_step()` follows every step, before its metrics are logged.

  A sample that the rate limiter held back for `SAMPLE_TIMEOUT_MS` (system/builder.py) raises
  TimeoutError: the loop re-checks for a stop and waits again, so a stop is never blocked by a
  learner waiting for data."""
  while not should_stop() and learner.num_steps < max_steps:
    try:
      metrics = learner.step()
    except TimeoutError:
      continue
    if on_step is not None:
      on_step()
    logger.write(metrics)


def step_actor(actor: BatchedActor, stopping: Callable[[], bool]) -> bool:
  """One move in every game. False when the step was cut short by the run stopping: a replay write
  the stop abandoned (WriterStopped), or replay stopped under a blocked write. Raises otherwise."""
  try:
    actor.step()
  except Exception:
    if stopping():
      return False
    raise
  return True


class EpisodeStatistics:
  """The games an actor finished, summarised for a row of its log.

  With a `window`, the row averages the last `window` games (a moving average); without one, the
  games since the last `clear()`.
  """

  def __init__(self, window: Optional[int] = None):
    self._episodes: collections.deque[EpisodeResult] = collections.deque(maxlen=window)

  def add(self, result: EpisodeResult) -> None:
    self._episodes.append(result)

  def __len__(self) -> int:
    return len(self._episodes)

  def summary(self) -> dict[str, float]:
    return {
      "mean_return": float(np.mean([e.episode_return for e in self._episodes])),
      "mean_speedup": float(np.mean([e.speedup for e in self._episodes])),
    }

  def clear(self) -> None:
    self._episodes.clear()


@contextlib.contextmanager
def interrupt_sets(stop: threading.Event) -> Iterator[None]:
  """Within the block, Ctrl-C (SIGINT), SIGTERM and SIGHUP set `stop` instead of raising at once;
  leaving the block after one raises KeyboardInterrupt (SIGINT) or common/signals.py's
  `Terminated`, so the caller's loop ends at its next `stop` check, saves, and the command still
  exits as interrupted or terminated. A second signal raises at once.

  Why not let KeyboardInterrupt propagate: Python raises it wherever the main thread happens to be,
  and where that is a garbage-collection callback (JAX registers one) the exception is printed
  as "ignored" and dropped, so a training run would go on as if Ctrl-C had never been pressed.
  Outside the main thread (where handlers cannot be installed) this does nothing.
  """
  if threading.current_thread() is not threading.main_thread():
    yield
    return
  received: list[int] = []

  def on_signal(signum: int, frame: Any) -> None:
    del frame
    if received:
      raise signal_exception(signum)
    received.append(signum)
    stop.set()

  previous = {s: signal.signal(s, on_signal) for s in STOPPING_SIGNALS}
  try:
    yield
  finally:
    for signum, handler in previous.items():
      signal.signal(signum, handler)
  if received:
    raise signal_exception(received[0])
