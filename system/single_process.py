"""Single-process training: an in-process Reverb server, one batched actor, one learner thread.

Tests and debugging use this; the Launchpad program (system/distributed.py) places the same
classes on separate nodes. The actor plays in the calling thread and the learner runs in a second
thread; the Reverb table's SampleToInsertRatio rate limiter keeps the two in step.
"""

from __future__ import annotations

import contextlib
import dataclasses
import os
import sys
import threading
import time
from typing import Any, Callable, Iterator

import portpicker
import reverb

from malloczero.actors.games import program_specs, training_specs
from malloczero.configs.config import Config
from malloczero.configs.workdir import WorkDir
from malloczero.learner.networks import make_networks
from malloczero.system import builder
from malloczero.system.guards import WorkDirLock
from malloczero.system.loops import EpisodeStatistics, interrupt_sets, run_learner, step_actor
from malloczero.system.training import (
  Stopwatch,
  check_workdir,
  fit_run_proposer,
  preflight,
  refuse_finished,
  save_config,
)

# The actor's log row averages its last games (the distributed actors' rows average the games
# since their previous row instead: they report far more often).
RECENT_EPISODES = 50


@dataclasses.dataclass
class TrainingResult:
  learner_steps: int
  actor_steps: int
  episodes: int
  elapsed_s: float
  curve: list[dict[str, Any]]
  baselines: dict[str, dict[str, float]]  # {split: {baseline: geomean speed-up}}
  workdir: str


@contextlib.contextmanager
def _native_stderr_to(path: str) -> Iterator[None]:
  """Native libraries' log lines (Reverb's C++ server and clients, XLA) go to `path`; Python's
  own stderr stays on the terminal. Reverb writes straight to file descriptor 2, and its lines
  would otherwise stand before a run's one-line error or interrupt notice."""
  os.makedirs(os.path.dirname(path), exist_ok=True)
  sys.stderr.flush()
  terminal_fd = os.dup(2)
  terminal = os.fdopen(os.dup(terminal_fd), "w", buffering=1)
  python_stderr = sys.stderr
  with open(path, "ab") as log:
    os.dup2(log.fileno(), 2)
  sys.stderr = terminal
  try:
    yield
  finally:
    terminal.flush()
    sys.stderr = python_stderr
    os.dup2(terminal_fd, 2)
    os.close(terminal_fd)
    terminal.close()


def train_single_process(
  config: Config,
  workdir: str,
  max_learner_steps: int | None = None,
  max_seconds: float | None = None,
  eval_every_steps: int | None = None,
  print_fn: Callable[[str], None] | None = print,
  log_every_s: float = 10.0,
) -> TrainingResult:
  """Trains until `max_learner_steps` (default: the config's) or `max_seconds`, whichever is first.

  A work directory that already holds a checkpoint resumes from it. Evaluations (greedy search on
  the suite's train and held-out programs) happen every `eval_every_steps` learner steps (default:
  the config's) and at the end; they are appended to workdir/learning_curve.csv and drawn to
  learning_curve.png.
  The work directory is locked for the whole run: one in use by another run is refused before
  anything in it is written.
  """
  max_learner_steps = max_learner_steps or config.max_learner_steps
  preflight(config, workdir, max_learner_steps)
  with WorkDirLock(os.path.abspath(workdir), print_fn):
    # Another config's run, or one already at max_learner_steps, is refused before anything is
    # lost or written.
    refuse_finished(workdir, check_workdir(config, workdir), max_learner_steps)
    with _native_stderr_to(WorkDir(workdir).node_log("native")):
      return _train(
        config, workdir, max_learner_steps, max_seconds, eval_every_steps, print_fn, log_every_s
      )


def _train(
  config: Config,
  workdir: str,
  max_learner_steps: int | None,
  max_seconds: float | None,
  eval_every_steps: int | None,
  print_fn: Callable[[str], None] | None,
  log_every_s: float,
) -> TrainingResult:
  max_learner_steps = max_learner_steps or config.max_learner_steps
  eval_every_steps = eval_every_steps or config.eval_every_steps
  save_config(config, workdir)
  files = WorkDir(workdir)
  fitting = fit_run_proposer(config, workdir, print_fn or (lambda text: None), max_seconds)
  if max_seconds is not None:  # The proposer's fit is part of the run's time.
    max_seconds = max(1.0, max_seconds - fitting)
  networks = make_networks(config.network, config.game)
  train_specs = program_specs(config, "train")
  heldout_specs = program_specs(config, "heldout")

  # The learner restores its checkpoint and demonstrations before the replay server starts, so
  # an unusable one is refused in one line, before Reverb's server logs a word.
  port = portpicker.pick_unused_port()
  address = f"localhost:{port}"
  sampler = builder.make_sampler(address, config)
  learner = builder.make_learner(networks, config, sampler, files, training_specs(config))
  server = builder.make_replay_server(config, port=port)
  learner_logger = builder.make_logger(files, "learner", print_fn, log_every_s)
  curve = builder.make_evaluator(
    networks,
    config,
    files,
    {"train": train_specs, "heldout": heldout_specs},
    offer=learner.offer_demonstration,
  )
  actor_logger = builder.make_logger(files, "actor", print_fn, log_every_s)
  episodes = EpisodeStatistics(window=RECENT_EPISODES)
  stop = threading.Event()
  variables = builder.make_variable_client(learner, config.actor)
  actor = builder.make_actor(
    networks,
    config,
    reverb.Client(address),
    variables,
    config.seed,
    should_stop=stop.is_set,
    on_episode=episodes.add,
    offer=learner.offer_demonstration,
    offer_probe=learner.offer_probe,
  )
  clock = Stopwatch()
  failure: list[BaseException] = []

  def learner_loop() -> None:
    try:
      run_learner(learner, learner_logger, stop.is_set, max_learner_steps)
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
    with interrupt_sets(stop):
      while not stop.is_set():
        if max_seconds is not None and clock.elapsed > max_seconds:
          break
        if not step_actor(actor, stop.is_set):  # The learner finished and stopped replay.
          break
        if learner.num_steps >= next_eval:
          curve.evaluate(learner.get_variables(), learner.num_steps, clock.elapsed, stop.is_set)
          next_eval += eval_every_steps
        if time.monotonic() - last_log > log_every_s and episodes:
          actor_logger.write(
            {
              "actor_steps": actor.num_steps,
              "episodes": actor.num_episodes,
              "probes": actor.num_probes,
              "on_policy_probes": actor.num_on_policy_probes,
              **episodes.summary(),
            }
          )
          last_log = time.monotonic()
  finally:
    stop.set()
    # The actor's streams first: the learner thread stops the server, which waits on them.
    actor.close()
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
    learner.save()  # With what that evaluation offered as demonstrations.
  return TrainingResult(
    learner.num_steps,
    actor.num_steps,
    actor.num_episodes,
    clock.elapsed,
    curve.rows,
    curve.baseline_geomeans(),
    workdir,
  )
