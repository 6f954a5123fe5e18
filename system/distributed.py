"""The distributed training system: a Launchpad program, launched locally or on Vertex AI.

Nodes (system/nodes.py), wired with Launchpad handles:

  replay     ReplayNode (Launchpad's ReverbNode): the prioritised sequence table, checkpointed
  counter    PersistentCounter (Acme's Counter): learner steps, actor moves, per-actor moves
  learner    LearnerNode: samples replay, updates MuZero, serves parameters, checkpoints
  actor      N x ActorNode: batched Gumbel MuZero self-play into replay
  evaluator  EvaluatorNode: greedy play of the held-out programs every `eval_every_steps`
  limiter    StepsLimiter: stops the program when the learner reaches `max_steps`

`launch_training` launches the program (local_mt: threads in this process; local_mp: one process
per node, output to workdir/nodes/*.log or prefixed on the console), prints a summary line every
few seconds, watches the nodes, and writes the final evaluation report once the program stops.

Faults: under local_mp an actor that dies is reported and training goes on with the others;
if the learner, replay or counter dies the program is stopped (their checkpoints are on disk) and
the run ends with an error. Ctrl-C or SIGTERM stop every node, each saving what it owns; so does
the launcher's death, which each node process watches for (system/guards.py). The launcher holds
the work directory's lock for the whole run, and the node processes hold theirs until they exit.
"""

from __future__ import annotations

import atexit
import contextlib
import dataclasses
import functools
import os
import shutil
import subprocess
import sys
import tempfile
from typing import Any, Callable, Iterator, Optional

import launchpad as lp
import psutil

from malloczero.common.errors import MalloczeroError
from malloczero.common.signals import stop_on_signals
from malloczero.common.units import human_bytes
from malloczero.configs.config import Config
from malloczero.configs.workdir import WorkDir
from malloczero.evaluation.baselines import baseline_speedups
from malloczero.evaluation.learning_curve import complete_learning_curve
from malloczero.system.guards import ProcessId, WorkDirLock
from malloczero.system.monitor import Monitor, RunSample, final_counts, watch
from malloczero.system.nodes import (
  NODE_GROUP_ENV,
  NODE_OUTPUT_ENV,
  NODE_WORKDIR_ENV,
  TERMINATION_NOTICE_S,
  ActorNode,
  EvaluatorNode,
  LearnerNode,
  NodeContext,
  PersistentCounter,
  ReplayNode,
  StepsLimiter,
  align_counter_file,
  read_counts,
)
from malloczero.system.training import (
  check_workdir,
  fit_run_proposer,
  preflight,
  refuse_finished,
  report_missing,
  save_config,
)

LOCAL_LAUNCH_TYPES = ("local_mt", "local_mp")
# Courier calls' timeouts. A counter call is a few numbers; its callers retry or count later,
# and an actor's main thread waits one out when the counter stops first (a stop then takes that
# long), so it is short.
COUNTER_CALL_TIMEOUT_S = 2
LEARNER_CALL_TIMEOUT_S = 20


def build_program(
  config: Config, context: NodeContext, num_actors: int, max_steps: int
) -> lp.Program:
  """The Launchpad program with `num_actors` actor nodes (nothing is started)."""
  if num_actors < 1:
    raise MalloczeroError(f"--num-actors must be at least 1, got {num_actors}")
  program = lp.Program("malloczero")
  with program.group("replay"):
    replay = program.add_node(ReplayNode(config, context))
  with program.group("counter"):
    counter = program.add_node(lp.CourierNode(PersistentCounter, config, context))
  # Courier clients wait for a server to come up; the timeouts keep a node from blocking forever
  # on a peer that stopped first (at shutdown, or when it died).
  counter.set_client_kwargs(call_timeout=COUNTER_CALL_TIMEOUT_S)
  with program.group("learner"):
    learner = program.add_node(
      lp.CourierNode(LearnerNode, config, context, replay, counter, max_steps)
    )
  learner.set_client_kwargs(call_timeout=LEARNER_CALL_TIMEOUT_S)
  with program.group("actor"):
    for actor_id in range(num_actors):
      program.add_node(
        lp.CourierNode(ActorNode, config, context, actor_id, replay, learner, counter)
      )
  with program.group("evaluator"):
    program.add_node(lp.CourierNode(EvaluatorNode, config, context, learner, counter))
  with program.group("limiter"):
    program.add_node(lp.CourierNode(StepsLimiter, counter, max_steps, context=context))
  return program


# ------------------------------------------------------------------------------------------ resume


# ------------------------------------------------------------------------------------------ launch


@dataclasses.dataclass
class DistributedResult:
  status: str  # "finished", "time limit", "interrupted" or "failed"
  learner_steps: int
  start_step: int
  actor_moves: int
  episodes: int
  elapsed_s: float
  num_actors: int
  samples: list[RunSample]
  workdir: str
  report: Optional[dict[str, Any]] = None
  failure: Optional[str] = None  # Why, when the status is "failed".

  @property
  def ok(self) -> bool:
    return self.status in ("finished", "time limit")

  def describe(self) -> str:
    """'finished', 'failed: the learner node exited', ..."""
    return f"{self.status}: {self.failure}" if self.failure else self.status

  @property
  def reported_agent(self) -> Optional[dict[str, Any]]:
    """The final report's one agent entry (its `checkpoint` and `learner_steps`: the final
    checkpoint, or the one chosen on the training programs), or None without a report."""
    if self.report is None:
      return None
    (agent,) = self.report["agents"]
    return agent

  @property
  def exit_status(self) -> int:
    """The command's exit status: 0 when it stopped as asked, 130 interrupted, 1 failed."""
    return {"failed": 1, "interrupted": 130}.get(self.status, 0)

  def outputs(self) -> list[tuple[str, str]]:
    """(path, what) for each file and directory the run has left in its work directory."""
    files = WorkDir(self.workdir)
    found = [
      (files.report("md"), "the evaluation report (with report.json, report.csv and pictures)"),
      (files.learning_curve_png, "the learning curve"),
      (files.checkpoints, "checkpoints"),
      (files.logs, "CSV logs"),
      (files.tensorboard, "TensorBoard events"),
      (files.best, "the fastest mapping found per training program"),
    ]
    return [(path, what) for path, what in found if os.path.exists(path)]


def _say_the_stop_countdown_once(print_fn: Callable[[str], None]) -> None:
  """Launchpad counts down its grace period on one console line rewritten with '\\r' every second;
  on a pipe or in a file the countdown runs together into one long line. It is said once instead."""
  from launchpad.launch import worker_manager

  said = False

  def countdown_print(*args: Any, **kwargs: Any) -> None:
    nonlocal said
    if "Waiting for workers to stop for" in " ".join(map(str, args)):
      if not said:
        said = True
        print_fn(f"waiting up to {TERMINATION_NOTICE_S} s for the nodes to stop")
      return
    print(*args, **kwargs)

  worker_manager.print = countdown_print  # The module's own name for print: only its prints.


@contextlib.contextmanager
def _launch_files_in(directory: str) -> Iterator[None]:
  """Launchpad's pickled program goes to the work directory rather than /tmp.

  Launchpad removes its folder when the launcher exits; a killed launcher cannot, and its folder
  is then removed by the next run on the work directory (which holds the lock, so no node of the
  old run is still starting from it)."""
  shutil.rmtree(directory, ignore_errors=True)
  os.makedirs(directory)
  saved, tempfile.tempdir = tempfile.tempdir, directory
  try:
    yield
  finally:
    tempfile.tempdir = saved


# Launchpad's `decorate_output` script (launch/run_locally) without its ANSI colours: the same
# arguments (COLOUR TITLE COMMAND...), the same signal traps (the node, not this wrapper, handles
# them), one `[TITLE] ` prefix per line.
_PLAIN_DECORATE = """#! /bin/bash
trap '' EXIT
trap '' TERM
trap '' QUIT
trap '' INT
TITLE=${2:?line title expected}
exec "${@:3}" 2>&1 | awk -v prefix="[$TITLE] " '{print prefix $0; fflush()}'
"""


def _launch_in_current_terminal_plain(script: str, commands: Any) -> Any:
  """Launchpad's `launch_in_current_terminal`, with `script` as the output decorator."""
  from launchpad.launch import worker_manager

  manager = worker_manager.WorkerManager()
  atexit.register(manager.wait)
  for command in commands:
    process = subprocess.Popen(
      ["/bin/bash", script, "0", command.title, *command.command_as_list],
      env={**os.environ, **command.env_overrides},
    )
    manager.register_existing_process(command.title, process.pid)
  return manager


@contextlib.contextmanager
def _plain_node_output(plain: bool, directory: str) -> Iterator[None]:
  """Node lines on a console that is not a terminal (a pipe, a log file) carry no colour codes;
  the uncoloured decorator is written to `directory`."""
  from launchpad.launch.run_locally import run_locally

  key = run_locally.SEPARATE_TERMINAL_CURRENT_TERMINAL
  saved = run_locally._LOCAL_LAUNCHER_MAP[key]  # pylint: disable=protected-access
  if plain:
    script = os.path.join(directory, "decorate_output")
    with open(script, "w", encoding="utf-8") as f:
      f.write(_PLAIN_DECORATE)
    run_locally._LOCAL_LAUNCHER_MAP[key] = functools.partial(  # pylint: disable=protected-access
      _launch_in_current_terminal_plain, script
    )
  try:
    yield
  finally:
    run_locally._LOCAL_LAUNCHER_MAP[key] = saved  # pylint: disable=protected-access


def _local_resources(program: lp.Program, context: NodeContext) -> dict[str, Any]:
  """Each node process's environment, which names its run and node (`ps e`, /proc/PID/environ;
  the nodes also name themselves `mz-NODE`, system/nodes.py) and, with `--node-output files`,
  sends its output to its log file from its first line."""
  from launchpad.nodes.python.local_multi_processing import PythonProcess

  # Launchpad 0.5.2 cannot pass a node a flag of our own (its flag placeholders need a flag it
  # does not define), so the names travel in the environment.
  env = {"TF_CPP_MIN_LOG_LEVEL": "2", "PYTHONUNBUFFERED": "1", NODE_WORKDIR_ENV: context.workdir}
  if context.output_to_files:
    env[NODE_OUTPUT_ENV] = "files"
  return {label: PythonProcess(env={**env, NODE_GROUP_ENV: label}) for label in program.groups}


# Local actors beyond this many per CPU core only slow each other (each one searches flat out)
# and starve the learner; the machine would thrash before the first summary line.
ACTORS_PER_CORE = 2
# Resident memory of local_mp node processes, measured over a tiny-config run on 2 cores: each
# actor peaked at 577 MiB; replay, counter, learner, evaluator and limiter together at 2.6 GiB.
ACTOR_RESIDENT_BYTES = 640 << 20
OTHER_NODES_RESIDENT_BYTES = 3 << 30


def local_actor_limit(launch: str) -> tuple[int, str]:
  """The most actors this machine can run locally under `launch`, and why (cores, memory)."""
  try:
    cores = len(os.sched_getaffinity(0))
  except AttributeError:  # Not Linux.
    cores = os.cpu_count() or 1
  limit = ACTORS_PER_CORE * cores
  why = f"{cores} CPU core(s) run at most {limit} actors ({ACTORS_PER_CORE} per core)"
  if launch == "local_mp":  # One process per node; under local_mt they share this one.
    available = psutil.virtual_memory().available
    by_memory = max(0, (available - OTHER_NODES_RESIDENT_BYTES) // ACTOR_RESIDENT_BYTES)
    if by_memory < limit:
      limit = int(by_memory)
      why = (
        f"{human_bytes(available)} of available memory runs at most {limit} actors (about "
        f"{human_bytes(ACTOR_RESIDENT_BYTES)} each beside "
        f"{human_bytes(OTHER_NODES_RESIDENT_BYTES)} for the other nodes)"
      )
  return limit, why


def launch_training(
  config: Config,
  workdir: str,
  launch: str = "local_mp",
  num_actors: Optional[int] = None,
  max_steps: Optional[int] = None,
  max_seconds: Optional[float] = None,
  node_output: str = "files",
  final_report: bool = True,
  print_fn: Callable[[str], None] = print,
) -> DistributedResult:
  """Launches the program locally, watches it until it stops, and reports.

  A work directory that holds a run resumes it: the learner restores its checkpoint (parameters,
  optimiser state, step), Reverb its table, the counter its counts. The work directory is locked
  for the whole run (system/guards.py): a directory in use by another run is refused before
  anything in it is written.
  """
  preflight(config, workdir, max_steps or config.max_learner_steps, final_report)
  with WorkDirLock(os.path.abspath(workdir), print_fn):
    return _launch_training(
      config,
      workdir,
      launch,
      num_actors,
      max_steps,
      max_seconds,
      node_output,
      final_report,
      print_fn,
    )


def _launch_training(
  config: Config,
  workdir: str,
  launch: str,
  num_actors: Optional[int],
  max_steps: Optional[int],
  max_seconds: Optional[float],
  node_output: str,
  final_report: bool,
  print_fn: Callable[[str], None],
) -> DistributedResult:
  if launch not in LOCAL_LAUNCH_TYPES:
    raise MalloczeroError(
      f"launch_training runs local launches ({', '.join(LOCAL_LAUNCH_TYPES)}); got '{launch}'"
    )
  if node_output not in ("files", "terminal"):
    raise MalloczeroError(f"--node-output must be 'files' or 'terminal', got '{node_output}'")
  num_actors = num_actors or config.distributed.num_actors
  max_steps = max_steps or config.max_learner_steps
  workdir = os.path.abspath(workdir)
  files = WorkDir(workdir)
  start_step = check_workdir(config, workdir)
  if final_report and report_missing(config, workdir, start_step, max_steps):
    return _write_missing_report(config, workdir, start_step, num_actors, print_fn)
  refuse_finished(workdir, start_step, max_steps)
  if start_step is not None:
    replay_dir = files.replay_checkpoints
    has_replay = os.path.isdir(replay_dir) and bool(os.listdir(replay_dir))
    print_fn(
      f"resuming {workdir} from learner step {start_step} "
      f"({'with' if has_replay else 'without'} a replay checkpoint)"
    )
    _, problem = read_counts(files.counter)
    if problem:
      print_fn(
        f"warning: cannot read {files.counter} ({problem}): actor counts restart from 0; "
        "the learner resumes from its checkpoint"
      )
  save_config(config, workdir)
  msa = _msa_geomeans(config, workdir, print_fn)
  fitting = fit_run_proposer(config, workdir, print_fn, max_seconds)
  if max_seconds is not None:  # The proposer's fit is part of the run's time.
    max_seconds = max(1.0, max_seconds - fitting)

  context = NodeContext(
    workdir,
    output_to_files=(launch == "local_mp" and node_output == "files"),
    own_process=(launch == "local_mp"),
    launcher=ProcessId.current() if launch == "local_mp" else None,
  )
  program = build_program(config, context, num_actors, max_steps)
  from absl import flags

  if not flags.FLAGS.is_parsed():
    flags.FLAGS(["malloczero"], known_only=True)
  flags.FLAGS.lp_termination_notice_secs = TERMINATION_NOTICE_S
  _say_the_stop_countdown_once(print_fn)
  if launch == "local_mp":
    if context.output_to_files:
      print_fn(f"node output: {files.nodes}/<node>.log")
    with (
      _launch_files_in(files.launch_files),
      _plain_node_output(not sys.stdout.isatty(), files.launch_files),
    ):
      manager = lp.launch(
        program,
        launch_type=lp.LaunchType.LOCAL_MULTI_PROCESSING,
        terminal="current_terminal",
        local_resources=_local_resources(program, context),
      )
    # A node still running after the grace period is SIGKILLed; by default Launchpad then kills
    # this process too, which would lose the final report of a run whose checkpoints are saved.
    # Launchpad 0.5.2 has no flag for it.
    manager._kill_main_thread = False  # pylint: disable=protected-access
  else:
    manager = lp.launch(program, launch_type=lp.LaunchType.LOCAL_MULTI_THREADING)
  print_fn(
    f"launched {launch}: replay, counter, learner, {num_actors} actor(s), evaluator, "
    f"limiter; learner steps {start_step or 0} -> {max_steps}"
  )
  monitor = Monitor(program, launch, workdir, num_actors, start_step=start_step or 0)
  status, failure = watch(
    manager, monitor, config, launch, num_actors, max_steps, max_seconds, msa, print_fn
  )
  manager.wait(raise_error=False)
  # Launchpad's handlers stay installed after its nodes stop and would swallow Ctrl-C and
  # SIGTERM during the final evaluation: from here they stop this process as any command's do.
  stop_on_signals()
  from malloczero.learner.checkpoint import checkpoint_steps

  try:
    steps = checkpoint_steps(files.checkpoints)
  except MalloczeroError:
    steps = 0
  if steps:
    align_counter_file(files, steps)
  final = final_counts(workdir)
  if status == "running":
    status = "finished" if steps >= max_steps else "interrupted"
  result = DistributedResult(
    status,
    steps,
    start_step or 0,
    int(final.get("actor_moves", 0)),
    int(final.get("actor_episodes", 0)),
    monitor.elapsed,
    num_actors,
    monitor.samples,
    workdir,
    failure=failure,
  )
  print_fn(
    f"program stopped ({result.describe()}) at learner step {steps}; checkpoint in "
    f"{files.checkpoints}"
  )
  if final_report and result.ok and steps > 0:
    _report(config, result, monitor.elapsed, print_fn)
  return result


def _report(
  config: Config,
  result: DistributedResult,
  elapsed_s: Optional[float],
  print_fn: Callable[[str], None],
) -> None:
  """The learning curve's last point and, for a run on a suite, the final report
  (`result.report`). `elapsed_s` None: the run's time is unknown (`complete_learning_curve`)."""
  complete_learning_curve(config, result.workdir, result.learner_steps, elapsed_s, print_fn)
  if config.suite:
    from malloczero.evaluation.report import write_final_report

    result.report = write_final_report(config, result.workdir, print_fn)


def _write_missing_report(
  config: Config,
  workdir: str,
  steps: int,
  num_actors: int,
  print_fn: Callable[[str], None],
) -> DistributedResult:
  """A finished run whose launcher stopped during its final evaluation: the learning curve's
  last point and the final report, written now; no node is started."""
  files = WorkDir(workdir)
  print_fn(
    f"{workdir} finished at learner step {steps} but has no {os.path.basename(files.report('md'))}"
    " (its launcher stopped during the final evaluation): writing the final report"
  )
  final = final_counts(workdir)
  result = DistributedResult(
    "finished",
    steps,
    steps,
    int(final.get("actor_moves", 0)),
    int(final.get("actor_episodes", 0)),
    0.0,
    num_actors,
    [],
    workdir,
  )
  _report(config, result, None, print_fn)
  return result


def _msa_geomeans(
  config: Config, workdir: str, print_fn: Callable[[str], None]
) -> dict[str, float]:
  """Computes (and caches in the work directory) the baseline speed-ups of every program before
  the nodes need them; returns msa's geomean per split for the summary line."""
  from malloczero.actors.games import program_specs
  from malloczero.evaluation.suite import geomean

  specs = {split: program_specs(config, split) for split in ("train", "heldout")}
  if not os.path.exists(WorkDir(workdir).baselines):
    print_fn(
      f"computing baselines (msa, greedy, bestfit, random) on "
      f"{sum(map(len, specs.values()))} programs"
    )
  baselines = baseline_speedups(specs["train"] + specs["heldout"], workdir, config.seed)
  return {split: geomean([baselines["msa"][s.name] for s in v]) for split, v in specs.items() if v}
