"""The nodes of the Launchpad training program (system/distributed.py), one class per kind.

Each class is constructed inside its node (a process under local_mp, a thread under local_mt) from
picklable arguments: the Config, a `NodeContext`, and Launchpad handles that arrive dereferenced
(a `reverb.Client` for replay, Courier clients for the learner and the counter). Each `run()`
returns when the program stops (`lp.wait_for_stop`), after saving what its node owns.

Step counters, in the `counter` node:
  learner_steps            the learner's step number (equal to its checkpoint's after a resume)
  actor_moves              game moves played by all actors (each actor step is B moves)
  actor_episodes           finished games
  actor_<i>_moves          per actor: the launcher's summary uses them to see which actors are live
"""

from __future__ import annotations

import dataclasses
import json
import os
import signal
import sys
import threading
import time
from typing import Any, Callable, Optional

import launchpad as lp
import reverb
from acme.utils import counting

from malloczero.common.files import write_text
from malloczero.configs.config import Config
from malloczero.configs.workdir import WorkDir
from malloczero.system import guards


@dataclasses.dataclass(frozen=True)
class NodeContext:
  """What every node needs besides the Config: where the run lives and where its output goes."""

  workdir: str
  output_to_files: bool = False  # local_mp: stdout/stderr to workdir/nodes/<name>.log.
  own_process: bool = False  # local_mp: the node is alone in its process.
  tensorboard: bool = True
  # local_mp: the launcher, which each node process watches (and stops at its death).
  launcher: Optional[guards.ProcessId] = None

  @property
  def files(self) -> WorkDir:
    return WorkDir(self.workdir)


# local_mp: the launcher names each node process's work directory and group in its environment
# (system/distributed.py), and with `--node-output files` asks it to write to its log file; read
# when this module is imported.
NODE_WORKDIR_ENV = "MALLOCZERO_WORKDIR"
NODE_GROUP_ENV = "MALLOCZERO_NODE"
NODE_OUTPUT_ENV = "MALLOCZERO_NODE_OUTPUT"  # "files": the node's output goes to its log file.


def _output_to_log_from_the_start() -> None:
  """Sends a local_mp node process's output to its log file before any node code runs.

  Launchpad unpickles a node (importing this module), then dereferences its handles, which logs
  'Reverb client connecting to ...', and only then constructs the node, whose `start_node` would
  redirect its output: without this those first lines reach the launcher's console."""
  workdir, group = os.environ.get(NODE_WORKDIR_ENV), os.environ.get(NODE_GROUP_ENV)
  if os.environ.get(NODE_OUTPUT_ENV) != "files" or not workdir or not group:
    return
  argv = sys.argv
  task = next((argv[i + 1] for i, arg in enumerate(argv[:-1]) if arg == "--lp_task_id"), "0")
  name = f"{group}_{task}" if group == "actor" else group
  files = WorkDir(workdir)
  try:
    os.makedirs(files.nodes, exist_ok=True)
    log = os.open(files.node_log(name), os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
  except OSError:
    return  # start_node tries again, and reports a failure in the node's own way.
  sys.stdout.flush()
  sys.stderr.flush()
  os.dup2(log, 1)
  os.dup2(log, 2)
  os.close(log)


_output_to_log_from_the_start()


# Seconds between a stop request and killing the nodes that have not exited: the launcher's
# Launchpad flag, and each node process's own worker manager (see `_guard`).
TERMINATION_NOTICE_S = 30


def start_node(context: NodeContext, name: str) -> None:
  """Sends this process's output to its log file (local_mp) and quiets TensorFlow's C++ logs;
  under local_mp, holds the nodes' lock on the work directory and watches the launcher."""
  os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
  if context.own_process:
    # Launchpad starts local_mp nodes with --pdb_post_mortem: a node that raises would wait in pdb
    # for input on the console. With no input it exits instead, and the launcher notices.
    devnull = os.open(os.devnull, os.O_RDONLY)
    os.dup2(devnull, 0)
  if not context.output_to_files:
    _guard(context, name)
    return
  os.makedirs(context.files.nodes, exist_ok=True)
  log = open(context.files.node_log(name), "a", buffering=1, encoding="utf-8")
  sys.stdout.flush()
  sys.stderr.flush()
  os.dup2(log.fileno(), 1)
  os.dup2(log.fileno(), 2)
  sys.stdout = sys.stderr = log
  print(f"--- {name} started {time.strftime('%Y-%m-%d %H:%M:%S')} (pid {os.getpid()})")
  _guard(context, name)


def _guard(context: NodeContext, name: str) -> None:
  if context.own_process:
    try:  # The process name `ps -e`, `top` and `pgrep mz-` show (15 bytes at most).
      with open("/proc/self/comm", "w", encoding="ascii") as f:
        f.write(f"mz-{name}"[:15])
    except OSError:
      pass
  if context.own_process:
    # A node process's worker manager kills it this long after SIGTERM. It read Launchpad's
    # flag default (10 s, too short for a learner or replay checkpoint on a loaded machine)
    # before this node started; Launchpad 0.5.2 cannot pass node processes that flag.
    from launchpad.launch import worker_manager

    try:
      manager = worker_manager.get_worker_manager()
    except RuntimeError:  # Not started by Launchpad's process entry (a test calling a node).
      manager = None
    if manager is not None and manager._termination_notice_secs > 0:  # pylint: disable=protected-access
      manager._termination_notice_secs = TERMINATION_NOTICE_S  # pylint: disable=protected-access
  if context.own_process and context.launcher is not None:
    guards.hold_nodes_lock(context.files)
    guards.watch_launcher(context.launcher, name, say)


def stop_program() -> None:
  """`lp.stop()`, except that a local_mp node signals its launcher only through its verified
  watch (Launchpad's `lp.stop()` SIGTERMs a bare pid, which may have been reused); with the
  launcher gone, this node stops itself (its watch stops the others)."""
  watch = guards.launcher_watch()
  if watch is None:
    lp.stop()
  elif not watch.send(signal.SIGTERM):
    os.kill(os.getpid(), signal.SIGTERM)


def say(name: str, message: str) -> None:
  """One line of node news, on the node's output (the console or its log file)."""
  try:
    print(f"{name}: {message}", flush=True)
  except (BrokenPipeError, ValueError, OSError):  # The console pipe is gone at shutdown.
    pass


def node_logger(context: NodeContext, label: str, steps_key: str, time_delta: float = 0.0) -> Any:
  """The builder's logger, with TensorBoard events unless the context turns them off."""
  from malloczero.system.builder import make_logger

  return make_logger(
    context.files,
    label,
    tensorboard=context.tensorboard,
    steps_key=steps_key,
    time_delta=time_delta,
  )


def retry_until_answered(
  call: Callable[[], Any], name: str, what: str, timeout_s: float = 600.0, poll_s: float = 1.0
) -> Any:
  """`call()` until it succeeds: a node's server starts only once the node is built (the learner
  restores its checkpoint and waits for replay first), and client calls carry a timeout so that
  no node blocks forever on a peer that has stopped. Raises SystemExit on a program stop."""
  deadline = time.monotonic() + timeout_s
  while True:
    try:
      return call()
    except Exception as e:  # pylint: disable=broad-except
      if lp.wait_for_stop(poll_s):
        raise SystemExit(0) from None
      if time.monotonic() > deadline:
        raise RuntimeError(
          f"{name}: no answer from {what} within {timeout_s:.0f} s ({type(e).__name__}: {e})"
        ) from e


def wait_for_replay(client: reverb.Client, name: str, timeout_s: float = 600.0) -> None:
  """Blocks until the replay server answers (it may be restoring a checkpoint), or a stop."""
  retry_until_answered(
    lambda: client.server_info(timeout=2),
    name,
    f"the replay server at {client.server_address}",
    timeout_s,
    poll_s=0.5,
  )


# ------------------------------------------------------------------------------------------ replay


class ReplayNode(lp.ReverbNode):
  """Launchpad's ReverbNode that also checkpoints its tables at stop (it only does so periodically).

  Reverb restores the newest checkpoint under workdir/checkpoints/replay when the server starts,
  so a resumed run keeps its replay contents and its rate limiter's counts.
  """

  def __init__(self, config: Config, context: NodeContext):
    import functools

    from malloczero.system.builder import make_replay_tables

    super().__init__(functools.partial(make_replay_tables, config))
    self._config = config
    self._context = context

  def run(self) -> None:
    start_node(self._context, "replay")
    from malloczero.replay.tables import TABLE_NAME
    from malloczero.system.builder import make_replay_server

    directory = self._context.files.replay_checkpoints
    os.makedirs(directory, exist_ok=True)
    resumable = bool(os.listdir(directory))
    server = make_replay_server(
      self._config, lp.get_port_from_address(self._address.resolve()), checkpoint_dir=directory
    )
    client = server.localhost_client()
    size = client.server_info()[TABLE_NAME].current_size
    say(
      "replay",
      f"restored {size} items from {directory}" if resumable else "started with an empty table",
    )
    every_s = self._config.distributed.replay_checkpoint_every_s

    def checkpoint() -> None:
      started = time.monotonic()
      client.checkpoint()  # Reverb keeps the newest checkpoint and deletes older ones.
      say(
        "replay",
        f"checkpointed {client.server_info()[TABLE_NAME].current_size} items in "
        f"{time.monotonic() - started:.1f} s",
      )

    while not lp.wait_for_stop(every_s):
      checkpoint()
    checkpoint()
    server.stop()


# ----------------------------------------------------------------------------------------- counter


def read_counts(path: str) -> tuple[Optional[dict[str, float]], Optional[str]]:
  """(counts, None) from a counter.json; (None, None) when there is none; (None, why) when it
  cannot be used (unreadable, not JSON, not an object of numbers)."""
  try:
    with open(path, encoding="utf-8") as f:
      counts = json.load(f)
  except FileNotFoundError:
    return None, None
  except (OSError, UnicodeDecodeError, ValueError) as e:
    return None, f"{type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}"
  if not isinstance(counts, dict) or not all(
    isinstance(k, str) and isinstance(v, (int, float)) and not isinstance(v, bool)
    for k, v in counts.items()
  ):
    return None, "not a JSON object of counts"
  return counts, None


class PersistentCounter(counting.Counter):
  """Acme's Counter, saved to workdir/checkpoints/counter.json periodically and at stop."""

  def __init__(self, config: Config, context: NodeContext):
    start_node(context, "counter")
    super().__init__(time_delta=0.0)
    self._file = context.files.counter
    self._save_every_s = config.distributed.counter_save_every_s
    counts, problem = read_counts(self._file)
    if counts is not None:
      self.restore({"counts": counts, "cache": {}})
      say("counter", f"restored {self.get_counts()}")
    elif problem:
      # Only statistics are lost: the learner re-adds its checkpoint's step on start.
      say("counter", f"cannot read {self._file} ({problem}); counts start from 0")

  def write_file(self) -> None:
    os.makedirs(os.path.dirname(self._file), exist_ok=True)
    write_text(self._file, json.dumps(self.get_counts()))

  def run(self) -> None:
    while not lp.wait_for_stop(self._save_every_s):
      self.write_file()
    self.write_file()


def align_counter_file(files: WorkDir, learner_steps: int) -> None:
  """Sets counter.json's `learner_steps` to the learner checkpoint's step once the program stopped.

  At a stop the counter writes its file at once, while the learner may finish one more step and
  save it: the checkpoint is the truth (as when the learner resumes)."""
  counts, _ = read_counts(files.counter)
  if counts is None or counts.get("learner_steps") == learner_steps:
    return  # No usable counter file (the run never got that far): nothing to align.
  counts["learner_steps"] = learner_steps
  write_text(files.counter, json.dumps(counts))


class StepsLimiter:
  """Stops the program once the counter's `learner_steps` reaches `max_steps`.

  Acme's `lp_utils.StepsLimiter` polls every 10 s; this one polls every `poll_s` so that short
  runs (tests, benchmarks) end promptly, and it counts from the counter the learner keeps exact.
  """

  def __init__(
    self, counter: Any, max_steps: int, poll_s: float = 0.5, context: Optional[NodeContext] = None
  ):
    if context is not None:
      start_node(context, "limiter")
    self._counter = counter
    self._max_steps = max_steps
    self._poll_s = poll_s

  def run(self) -> None:
    while not lp.wait_for_stop(self._poll_s):
      try:
        steps = self._counter.get_counts().get("learner_steps", 0)
      except Exception:  # pylint: disable=broad-except  # The counter is starting or stopping.
        continue
      if steps >= self._max_steps:
        say("limiter", f"learner reached {int(steps)} of {self._max_steps} steps: stopping")
        stop_program()
        lp.wait_for_stop()
        return


# ----------------------------------------------------------------------------------------- learner


# After a stop, how long the learner's step in flight gets before the stop path saves without it.
LEARNER_STOP_GRACE_S = 0.5


def _leave_now() -> None:
  """Ends a node process that has saved what it owns, without Python's exit (which joins
  threads and runs destructors that may block on peers already gone)."""
  sys.stdout.flush()
  sys.stderr.flush()
  os._exit(0)


def prepare_run_in_node(config: Config, context: NodeContext) -> None:
  """What a local launcher writes into the work directory before it starts the nodes, written by
  the learner node where it is missing: a Vertex AI launch is submitted from a machine that need
  not mount the run's /gcs/ directory. Saves config.json (which `solve` and `evaluate` read beside
  the checkpoint) and fits the run's proposer (system/training.py `fit_run_proposer`, which the
  agent plays first and starts its guided search from). Under a local launch both are there
  already and this does nothing."""
  from malloczero.system.training import fit_run_proposer, save_config

  if not os.path.exists(context.files.config):
    save_config(config, context.workdir)
    say("learner", f"saved {context.files.config}")
  fit_run_proposer(config, context.workdir, lambda text: say("learner", text))


class LearnerNode:
  """Steps the MuZero learner on replay samples; serves its parameters to actors and evaluator.

  Checkpoints (parameters, optimiser state, step) go to workdir/checkpoints every
  `learner.checkpoint_every_s`, when it reaches `max_steps`, and at stop. It first writes what a
  local launcher would have written into the work directory (`prepare_run_in_node`).
  """

  def __init__(
    self, config: Config, context: NodeContext, replay: reverb.Client, counter: Any, max_steps: int
  ):
    start_node(context, "learner")
    prepare_run_in_node(config, context)
    from malloczero.actors.games import training_specs
    from malloczero.learner.networks import make_networks
    from malloczero.system.builder import make_learner, make_sampler

    self._config, self._context = config, context
    self._counter = counter
    self._max_steps = max_steps
    wait_for_replay(replay, "learner")
    self._sampler = make_sampler(replay.server_address, config)
    self._learner = make_learner(
      make_networks(config.network, config.game),
      config,
      self._sampler,
      context.files,
      training_specs(config),
    )
    if self._learner.num_steps:
      from malloczero.learner.checkpoint import params_digest

      say(
        "learner",
        f"resumed at step {self._learner.num_steps}, parameters "
        f"{params_digest(self._learner.get_variables())}",
      )
    else:
      say("learner", "starting from fresh parameters")

  def get_variables(self, names: Optional[list[str]] = None) -> Any:
    return self._learner.get_variables(names)

  def get_num_steps(self) -> int:
    return self._learner.num_steps

  def offer_demonstration(self, program: str, actions: list[int], episode_return: float) -> float:
    return self._learner.offer_demonstration(program, actions, episode_return)

  def offer_probe(self, observation: dict[str, Any], advantages: Any, msa_action: int) -> int:
    return self._learner.offer_probe(observation, advantages, msa_action)

  def run(self) -> None:
    from malloczero.system.loops import run_learner

    learner = self._learner
    counts = retry_until_answered(self._counter.get_counts, "learner", "the counter")
    # The counter's file and the learner's checkpoint are saved at different moments: the
    # checkpoint is the truth, so the counter is brought to its step.
    offset = learner.num_steps - counts.get("learner_steps", 0)
    if offset:
      self._counter.increment(learner_steps=offset)
    logger = node_logger(self._context, "learner", steps_key="learner_steps", time_delta=1.0)
    unreported = 0

    def count_step() -> None:
      nonlocal unreported
      unreported += 1
      try:
        self._counter.increment(learner_steps=unreported)
        unreported = 0
      except Exception:  # pylint: disable=broad-except  # Counter stopping: count it later.
        pass

    # Launchpad's stop. In its own process the steps run in another thread, which Launchpad's
    # `wait_for_stop` does not answer (only its node's thread): the main thread passes it on.
    stopping = threading.Event()
    own = self._context.own_process
    should_stop = stopping.is_set if own else lambda: lp.wait_for_stop(0)
    wait_for_stop = stopping.wait if own else lp.wait_for_stop

    def train() -> None:
      run_learner(learner, logger, should_stop, self._max_steps, count_step)
      if learner.num_steps >= self._max_steps:
        learner.save()
        say("learner", f"reached {learner.num_steps} steps; checkpoint saved, waiting for stop")
        wait_for_stop()

    def save() -> None:
      file = learner.save()
      say("learner", f"saved {file} at step {learner.num_steps}")
      logger.close()

    if not own:
      try:
        train()
      finally:  # Also when replay died under a sample: the parameters learnt so far are kept.
        save()
        self._sampler.close()
      return
    # Its own process: the steps run in a thread and this main thread waits for the stop,
    # because Python runs Launchpad's stop handler only in the main thread, and a sample that
    # the stopped actors no longer feed held a step for about 5 s (tiny config, 2 cores). The
    # state is read under the learner's lock, so it is saved from here whether or not the step
    # in flight has ended.
    failure: list[BaseException] = []

    def guarded() -> None:
      try:
        train()
      except BaseException as e:  # pylint: disable=broad-except  # Raised again below.
        failure.append(e)

    trainer = threading.Thread(target=guarded, name="learner-steps", daemon=True)
    trainer.start()
    while trainer.is_alive() and not lp.wait_for_stop(0.2):
      pass
    if lp.wait_for_stop(0):
      stopping.set()
    trainer.join(LEARNER_STOP_GRACE_S)
    save()
    if failure and not lp.wait_for_stop(0):
      raise failure[0]  # Replay died under a sample: the node fails, its parameters kept.
    # Everything this node owns is saved. Dropping a Reverb sampling stream whose server is
    # stopping can block process exit past Launchpad's grace period (seen once, after a
    # 50-minute run), and Launchpad then kills every process, so this one leaves now.
    _leave_now()


# ------------------------------------------------------------------------------------------- actor


class ActorNode:
  """Plays `actor.num_games` training programs at once with batched search, writes replay."""

  def __init__(
    self,
    config: Config,
    context: NodeContext,
    actor_id: int,
    replay: reverb.Client,
    learner: Any,
    counter: Any,
  ):
    self._name = f"actor_{actor_id}"
    start_node(context, self._name)
    self._config, self._context = config, context
    self._actor_id = actor_id
    self._replay, self._learner, self._counter = replay, learner, counter

  def run(self) -> None:
    from malloczero.learner.networks import make_networks
    from malloczero.system.builder import make_actor, make_variable_client
    from malloczero.system.loops import EpisodeStatistics, step_actor

    config = self._config
    seed = config.seed + 7919 * (self._actor_id + 1)
    wait_for_replay(self._replay, self._name)
    stop = lp.stop_event()
    episodes = EpisodeStatistics()
    variables = make_variable_client(self._learner, config.actor)
    actor = make_actor(
      make_networks(config.network, config.game),
      config,
      self._replay,
      variables,
      seed,
      should_stop=stop.is_set,
      on_episode=episodes.add,
      offer=self._learner.offer_demonstration,
      offer_probe=self._learner.offer_probe,
    )
    logger = node_logger(self._context, self._name, steps_key="actor_moves")
    retry_until_answered(variables.update_and_wait, self._name, "the learner")
    say(self._name, f"playing {actor.num_games} games of {actor.num_programs} programs")
    reported_moves = reported_episodes = reported_probes = 0
    last_report = time.monotonic()
    try:
      while not stop.is_set():
        if not step_actor(actor, stop.is_set):  # Replay stopped under a write at shutdown.
          break
        now = time.monotonic()
        if now - last_report >= config.distributed.actor_report_every_s:
          moves = actor.num_steps * actor.num_games
          try:
            self._counter.increment(
              **{
                "actor_moves": moves - reported_moves,
                "actor_episodes": actor.num_episodes - reported_episodes,
                "actor_probes": actor.num_probes - reported_probes,
                f"{self._name}_moves": moves - reported_moves,
              }
            )
          except Exception:  # pylint: disable=broad-except  # Counter busy or stopping: later.
            continue
          if episodes:
            logger.write(
              {
                "actor_moves": moves,
                "episodes": actor.num_episodes,
                "moves_per_s": (moves - reported_moves) / (now - last_report),
                # Steps written with msa's move as their target (`imitate_gains_only`).
                "departures_unlearned": actor.num_departures_unlearned,
                "offers": actor.num_offers,
                "probes": actor.num_probes,
                "on_policy_probes": actor.num_on_policy_probes,
                "probing_share": actor.probing_share,
                **episodes.summary(),
              }
            )
            episodes.clear()
          reported_moves, reported_episodes, last_report = moves, actor.num_episodes, now
          reported_probes = actor.num_probes
    finally:
      actor.close()
      variables.close()
      logger.close()
      say(
        self._name,
        f"stopped after {actor.num_steps * actor.num_games} moves "
        f"({actor.num_offers} games offered as demonstrations, {actor.num_probes} decisions "
        f"probed, {actor.num_on_policy_probes} of them on its policy's trajectory)",
      )
      if self._context.own_process and stop.is_set():
        # Nothing left to save. Python would join the offer threads at exit, and an offer in
        # flight to a learner that has already gone waits out its courier timeout (a 20 s exit
        # seen on 2 cores), so this process leaves now.
        _leave_now()


# --------------------------------------------------------------------------------------- evaluator


class EvaluatorNode:
  """Every `eval_every_steps` learner steps, plays the held-out programs greedily (evaluation
  search: more simulations, no noise; and the policy alone) with the latest parameters; appends
  to the learning curve (workdir/learning_curve.csv, .png) and logs both geomean speed-ups and
  their ratios to msa's."""

  def __init__(self, config: Config, context: NodeContext, learner: Any, counter: Any):
    start_node(context, "evaluator")
    self._config, self._context = config, context
    self._learner, self._counter = learner, counter

  def run(self) -> None:
    from malloczero.evaluation.learning_curve import evaluator_split
    from malloczero.learner.networks import make_networks
    from malloczero.system.builder import make_evaluator
    from malloczero.system.training import Stopwatch

    config = self._config
    split, specs = evaluator_split(config)
    networks = make_networks(config.network, config.game)
    curve = make_evaluator(
      networks, config, self._context.files, {split: specs}, offer=self._learner.offer_demonstration
    )
    msa = curve.baseline_geomean("msa", split)
    logger = node_logger(self._context, "evaluator", steps_key="learner_steps")
    clock = Stopwatch()
    done = {int(r["learner_steps"]) for r in curve.rows if r["split"] == split}
    every = config.eval_every_steps
    next_step = 0 if not done else (max(done) // every + 1) * every
    try:
      while not lp.wait_for_stop(1.0):
        try:
          steps = int(self._learner.get_num_steps())
          if steps < next_step:
            continue
          params, steps = self._learner.get_variables(["params", "steps"])
        except Exception:  # pylint: disable=broad-except  # Learner starting or stopping.
          continue
        (row,) = curve.evaluate(params, int(steps), clock.elapsed)
        logger.write(
          {
            "learner_steps": int(steps),
            "geomean_speedup": row["geomean_speedup"],
            "vs_msa": row["geomean_speedup"] / msa,
            "beats_msa": row["beats_msa"],
            "policy_geomean_speedup": row["policy_geomean_speedup"],
            "policy_vs_msa": row["policy_geomean_speedup"] / msa,
            "policy_beats_msa": row["policy_beats_msa"],
          }
        )
        say(
          "evaluator",
          f"step {int(steps)}: {split} geomean speed-up {row['geomean_speedup']:.3f} "
          f"(policy alone {row['policy_geomean_speedup']:.3f}, msa {msa:.3f}), at least msa on "
          f"{row['beats_msa']} (policy {row['policy_beats_msa']}) of {row['programs']}",
        )
        next_step = (int(steps) // every + 1) * every
    finally:
      logger.close()
