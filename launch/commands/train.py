"""`malloczero train`: trains the MuZero agent; checkpoints, logs, the learning curve and a report
go to the work directory, which a second run with the same command resumes."""

from __future__ import annotations

import argparse
import dataclasses
import os
import sys

from malloczero.common.errors import MalloczeroError
from malloczero.common.files import check_output_dir
from malloczero.configs.config import PRESETS, get_config
from malloczero.env.hardware import resolve_hardware
from malloczero.evaluation.console import final_evaluation_table, learning_curve_table
from malloczero.launch.config_flags import add_config_flags, apply_overrides, describe_config
from malloczero.launch.flags import (
  HARDWARE_CHOICES,
  FlagError,
  add_capacity_flag,
  bounded,
  console,
  flushing_print,
  positive_float,
  say_capacities,
)
from malloczero.launch.hlo_input import REIMPORT_HELP, load_program

LAUNCHES = ("local_mp", "local_mt", "vertex_ai", "single")
MAX_TRAIN_SECONDS = 30 * 86_400.0
DEFAULT_CONFIG = "small"


def add_parser(sub: argparse._SubParsersAction) -> None:
  defaults = get_config(DEFAULT_CONFIG)  # The flags' help states the default preset's values.
  p = sub.add_parser("train", help="train the MuZero agent on a suite's train programs")
  p.add_argument(
    "--config",
    default=DEFAULT_CONFIG,
    choices=tuple(PRESETS),
    help=f"preset (default {DEFAULT_CONFIG}: minutes on a laptop; tiny: tests)",
  )
  p.add_argument(
    "--launch",
    default="local_mp",
    choices=LAUNCHES,
    help="local_mp: one process per node (default); local_mt: nodes as threads of "
    "this process; vertex_ai: Google Cloud (see README); single: one actor and the "
    "learner in this process, in-process Reverb",
  )
  p.add_argument(
    "--oversubscribe",
    action="store_true",
    help="local launches: start --num-actors actors even beyond what this machine's "
    "cores and memory can run",
  )
  p.add_argument(
    "--workload",
    help="optimise this program (workload file, or an HLO text module .hlo/.txt, imported on "
    "first use and cached): train on it (and on --suite's training programs if given); its "
    "fastest mapping so far is kept in WORKDIR/best/, and the last line compares it with msa, "
    "bestfit and evo",
  )
  p.add_argument("--reimport", action="store_true", help="with --workload: " + REIMPORT_HELP)
  p.add_argument("--hardware", help=f"with --workload: {HARDWARE_CHOICES}")
  add_capacity_flag(p, help_prefix="with --workload: ")
  p.add_argument(
    "--workdir",
    help="checkpoints, logs, the learning curve and the report "
    "(default runs/train-CONFIG); an existing one is resumed",
  )
  p.add_argument(
    "--max-seconds",
    type=bounded(positive_float, MAX_TRAIN_SECONDS),
    help="stop after this much wall time, at most 2,592,000 (30 days)",
  )
  p.add_argument(
    "--node-output",
    default="files",
    choices=("files", "terminal"),
    help="local_mp: node output to WORKDIR/nodes/*.log (default) or to this "
    "terminal, each line prefixed with its node",
  )
  add_config_flags(p, defaults)
  p.add_argument("--quiet", action="store_true", help="no periodic log lines")
  p.set_defaults(func=run)


def train_config(args: argparse.Namespace):
  """The preset with the flags' overrides, checked before anything starts."""
  config = apply_overrides(get_config(args.config), args.overrides)
  if args.workload:
    # The workload alone unless a suite is named too.
    suite_given = any(path == "suite" for path, _ in args.overrides or ())
    program = _program_file(args)
    try:
      config = dataclasses.replace(
        config, suite=config.suite if suite_given else "", programs=(program,)
      )
    except ValueError as e:
      raise FlagError(str(e)) from None
  elif args.hardware or args.capacity or args.reimport:
    raise MalloczeroError(
      "--hardware, --capacity and --reimport are for a --workload; give the workload file too"
    )
  if not config.suite and not config.programs:
    raise FlagError(
      "an empty suite trains on --workload's program alone: name a suite or a workload"
    )
  from malloczero.env.programs.suites import get_suite, is_suite_file

  # A user suite's manifest by its absolute path: the nodes and a resumed run find it from any
  # directory, and a run resumes only on the same file.
  suites = {
    field: os.path.abspath(getattr(config, field))
    for field in ("suite", "report_suite")
    if getattr(config, field) and is_suite_file(getattr(config, field))
  }
  config = dataclasses.replace(config, **suites) if suites else config
  for name in (config.suite, config.report_suite):
    if name:
      get_suite(name)  # A wrong suite name or a changed program fails here, before anything starts.
  return config


def _program_file(args: argparse.Namespace):
  """`train --workload FILE --hardware H --capacity B`: the program to optimise, loaded and
  checked here so that a bad file or an impossible capacity fails before anything starts."""
  from malloczero.configs.config import ProgramFile

  # An HLO module's workload is its import cache entry: the nodes load the program from a file.
  workload, path = load_program(args.workload, args.reimport, need_file=True)
  hw = resolve_hardware(workload, args.hardware, args.capacity)
  say_capacities(args.capacity, hw)  # resolve_hardware checked that the machine holds it.
  return ProgramFile(workload.name, os.path.abspath(path), hw)


def run(args: argparse.Namespace) -> int:
  config = train_config(args)
  if args.list_config:
    print(describe_config(config))
    return 0
  if config.programs and args.launch == "vertex_ai":
    raise MalloczeroError(
      "train --workload runs locally (--launch local_mp, local_mt or single): "
      "a cloud run's nodes cannot read this machine's workload file"
    )
  workdir = args.workdir or os.path.join("runs", f"train-{config.name}")
  if args.launch == "vertex_ai":  # Its work directory is a /gcs/ path, checked by the launcher.
    from malloczero.system.vertex import launch_vertex_ai

    launch_vertex_ai(
      config, workdir, config.distributed.num_actors, max_steps=config.max_learner_steps
    )
    return 0
  check_output_dir(workdir, "--workdir")
  if args.launch == "single":
    return _train_single(config, args, workdir)
  return _train_distributed(config, args, workdir)


def _train_single(config, args: argparse.Namespace, workdir: str) -> int:
  from malloczero.configs.workdir import WorkDir
  from malloczero.system.single_process import train_single_process

  out = console()
  out.print(
    f"malloczero train: config '{config.name}', suite '{config.suite}', single process "
    f"(in-process Reverb, 1 actor x {config.actor.num_games} games, 1 learner); "
    f"work directory {workdir}"
  )
  result = train_single_process(
    config,
    workdir,
    max_learner_steps=config.max_learner_steps,
    max_seconds=args.max_seconds,
    eval_every_steps=config.eval_every_steps,
    print_fn=None if args.quiet else flushing_print(out),
  )
  out.print(learning_curve_table(result, config))
  out.print(
    f"{result.learner_steps} learner steps, {result.actor_steps} actor steps, "
    f"{result.episodes} episodes in {result.elapsed_s:.0f} s"
  )
  files = WorkDir(workdir)
  for path in (files.learning_curve_png, files.learning_curve_csv, files.learner_state):
    out.print(f"wrote {path}")
  if config.programs and result.learner_steps > 0:
    from malloczero.evaluation.report import write_program_report

    write_program_report(config, workdir, flushing_print(out))
  return 0


def _train_distributed(config, args: argparse.Namespace, workdir: str) -> int:
  from malloczero.configs.workdir import WorkDir
  from malloczero.system.distributed import launch_training, local_actor_limit

  out = console()
  num_actors = config.distributed.num_actors
  limit, why = local_actor_limit(args.launch)
  if num_actors > limit and not args.oversubscribe:
    # Checked before anything is written or started: 1000 actors on 2 cores once spawned 642
    # processes before the first line was printed.
    print(
      f"malloczero: error: --num-actors {num_actors} is more than this machine can run: "
      f"{why}; pass --oversubscribe to start them anyway",
      file=sys.stderr,
    )
    return 2
  out.print(
    f"malloczero train: config '{config.name}', suite '{config.suite}', Launchpad "
    f"{args.launch} with {num_actors} actor(s) x {config.actor.num_games} games; "
    f"work directory {os.path.abspath(workdir)}"
  )
  print_fn = (lambda text: None) if args.quiet else flushing_print(out)
  result = launch_training(
    config,
    workdir,
    launch=args.launch,
    num_actors=num_actors,
    max_steps=config.max_learner_steps,
    max_seconds=args.max_seconds,
    node_output=args.node_output,
    print_fn=print_fn,
  )
  out.print(
    f"{result.describe()}: learner steps {result.start_step} -> {result.learner_steps}, "
    f"{result.actor_moves:,} actor moves, {result.episodes:,} games in "
    f"{result.elapsed_s:.0f} s"
  )
  if result.report is not None:
    out.print(final_evaluation_table(result))
  for path, what in result.outputs():
    out.print(f"  {what}: {path}")
  files = WorkDir(result.workdir)
  if result.report is not None:
    # The reported checkpoint: the final one, or the one chosen on the training programs.
    checkpoint = result.reported_agent["checkpoint"]
    reported = checkpoint if checkpoint != files.learner_state else result.workdir
    out.print(
      f"  compare with evo and CP-SAT too: malloczero evaluate --suite {config.measured_suite} "
      f"--checkpoint {reported} --out {files.evaluation}"
    )
  if config.programs and result.ok and result.learner_steps > 0:
    from malloczero.evaluation.report import write_program_report

    write_program_report(config, result.workdir, flushing_print(out))
  if result.status == "failed":
    print(
      f"malloczero: error: {result.describe()}; the last checkpoint is in {files.checkpoints}",
      file=sys.stderr,
    )
  elif result.status == "interrupted":
    print(
      f"malloczero: interrupted at learner step {result.learner_steps}; resume with: "
      f"{args.command_line}",
      file=sys.stderr,
    )
  return result.exit_status
