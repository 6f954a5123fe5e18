"""Single-process training: an in-process Reverb server, one batched actor, one learner thread.

Tests and debugging use this; the Launchpad program (system/program.py) places the same classes on
separate nodes. The actor plays in the calling thread and the learner runs in a second thread; the
Reverb table's SampleToInsertRatio rate limiter keeps the two in step.
"""

from __future__ import annotations

import dataclasses
import os
import threading
import time
from typing import Any, Callable

import jax
import numpy as np
import reverb
from acme.utils import loggers

from malloczero.actors.actor import BatchedActor, EpisodeResult
from malloczero.actors.games import GamePool, suite_games
from malloczero.actors.variable_client import VariableClient
from malloczero.configs.config import Config
from malloczero.env.game import observation_spec
from malloczero.learner.learner import MuZeroLearner
from malloczero.learner.networks import make_networks
from malloczero.replay import Sampler, SequenceWriter, start_server
from malloczero.system.training import LearningCurve, Stopwatch, save_config


# How long one sample may wait on the rate limiter before the learner thread re-checks for shutdown.
# Stopping the server does not wake a sample blocked in the in-process dataset (it reads the table
# directly, not over gRPC), so without a bound a learner waiting for inserts never returns and
# joining it would hang the trainer (e.g. on max_seconds, or when the actor fails).
SAMPLE_TIMEOUT_MS = 1000


@dataclasses.dataclass
class TrainingResult:
  learner_steps: int
  actor_steps: int
  episodes: int
  elapsed_s: float
  curve: list[dict[str, Any]]
  baselines: dict[str, dict[str, float]]  # {split: {baseline: geomean speed-up}}
  workdir: str


def _logger(workdir: str, label: str, print_fn: Callable[[str], None] | None,
            time_delta: float) -> loggers.Logger:
  targets = [loggers.CSVLogger(workdir, label=label, add_uid=False)]
  if print_fn is not None:
    targets.append(loggers.TerminalLogger(label=label, print_fn=print_fn, time_delta=time_delta))
  return loggers.Dispatcher(targets, serialize_fn=loggers.to_numpy)


def train_single_process(config: Config, workdir: str, max_learner_steps: int | None = None,
                         max_seconds: float | None = None, eval_every_steps: int | None = None,
                         print_fn: Callable[[str], None] | None = print,
                         log_every_s: float = 10.0) -> TrainingResult:
  """Trains until `max_learner_steps` (default: the config's) or `max_seconds`, whichever is first.

  A work directory that already holds a checkpoint resumes from it. Evaluations (greedy search on
  the suite's train and held-out programs) happen every `eval_every_steps` learner steps (default:
  the config's) and at the end; they are appended to workdir/learning_curve.csv and drawn to learning_curve.png.
  """
  max_learner_steps = max_learner_steps or config.max_learner_steps
  eval_every_steps = eval_every_steps or config.eval_every_steps
  save_config(config, workdir)
  networks = make_networks(config.network, config.game)
  train_specs = suite_games(config.suite, "train")
  heldout_specs = suite_games(config.suite, "heldout")

  server, address = start_server(config)
  sampler = Sampler(address, config, rate_limiter_timeout_ms=SAMPLE_TIMEOUT_MS)
  client = reverb.Client(address)
  try:  # Restores a checkpoint: an unusable one raises MalloczeroError before anything runs.
    learner = MuZeroLearner(networks, config, sample_fn=sampler.sample,
                            update_priorities_fn=sampler.update_priorities, seed=config.seed,
                            checkpoint_dir=os.path.join(workdir, "checkpoints"))
  except BaseException:
    server.stop()  # Otherwise it keeps its port and threads until garbage-collected.
    raise
  learner_logger = _logger(workdir, "learner", print_fn, log_every_s)
  curve = LearningCurve(networks, config, workdir, {"train": train_specs, "heldout": heldout_specs})
  actor_logger = _logger(workdir, "actor", print_fn, log_every_s)
  episodes: list[EpisodeResult] = []

  def on_episode(result: EpisodeResult) -> None:
    episodes.append(result)

  stop = threading.Event()
  writer = SequenceWriter(client, config, config.actor.num_games, should_stop=stop.is_set)
  variables = VariableClient(learner, config.actor.variable_update_period)
  actor = BatchedActor(networks, config, GamePool(train_specs, config.game, config.actor.num_games,
                                                  seed=config.seed),
                       variables, writer, seed=config.seed, on_episode=on_episode)
  clock = Stopwatch()
  failure: list[BaseException] = []

  def learner_loop() -> None:
    try:
      while not stop.is_set() and learner.num_steps < max_learner_steps:
        try:
          metrics = learner.step()
        except TimeoutError:  # Rate limited for SAMPLE_TIMEOUT_MS: check `stop`, wait again.
          continue
        learner_logger.write(metrics)
    except Exception as e:  # Surfaces in the main thread.
      failure.append(e)
    finally:
      # Only this thread samples, and only before this point: the server may not be stopped under
      # a sample (one blocked in the stopped in-process table never returns). Dropping the dataset
      # waits for its workers, which give up within SAMPLE_TIMEOUT_MS. Stopping the server then
      # wakes the actor if it waits on the rate limiter to insert.
      stop.set()
      sampler.close()
      server.stop()

  if learner.num_steps == 0 or not curve.rows:
    curve.evaluate(learner.get_variables(), learner.num_steps, clock.elapsed)
  thread = threading.Thread(target=learner_loop, name="learner", daemon=True)
  thread.start()
  next_eval = (learner.num_steps // eval_every_steps + 1) * eval_every_steps
  last_log = time.monotonic()
  try:
    while not stop.is_set():
      if max_seconds is not None and clock.elapsed > max_seconds:
        break
      try:
        actor.step()
      except Exception:
        if stop.is_set():  # The learner finished and stopped the server under a blocked write.
          break
        raise
      if learner.num_steps >= next_eval:
        curve.evaluate(learner.get_variables(), learner.num_steps, clock.elapsed)
        next_eval += eval_every_steps
      if time.monotonic() - last_log > log_every_s and episodes:
        recent = episodes[-50:]
        actor_logger.write({"actor_steps": actor.num_steps, "episodes": actor.num_episodes,
                            "mean_return": float(np.mean([e.episode_return for e in recent])),
                            "mean_speedup": float(np.mean([e.speedup for e in recent]))})
        last_log = time.monotonic()
  finally:
    stop.set()
    thread.join()  # Within about SAMPLE_TIMEOUT_MS plus one learner step; it stops the server.
    variables.close()
    learner_logger.close()
    actor_logger.close()
    if not failure:  # Also on Ctrl-C: the run so far is kept and a restart resumes from it.
      learner.save()
  if failure:
    raise failure[0]
  if not curve.rows or int(curve.rows[-1]["learner_steps"]) != learner.num_steps:
    curve.evaluate(learner.get_variables(), learner.num_steps, clock.elapsed)
  return TrainingResult(learner.num_steps, actor.num_steps, actor.num_episodes, clock.elapsed,
                        curve.rows, curve.baseline_geomeans(), workdir)
