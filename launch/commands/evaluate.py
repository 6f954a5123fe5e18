"""`malloczero evaluate`: baselines and checkpoints on a suite, with progress and console tables.

The evaluation itself is evaluation/suite.py and its files evaluation/report.py, which the final
report of a training run shares. Baseline results are reused from the user's cache
(evaluation/baseline_cache.py) unless `--no-cache`.
"""

from __future__ import annotations

import argparse
import dataclasses
import time
from typing import TYPE_CHECKING, Callable, Sequence

from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

from malloczero.common.errors import MalloczeroError
from malloczero.common.files import check_output_dir
from malloczero.env.programs.suites import SPLITS
from malloczero.env.solvers.registry import BASELINES, SOLVERS
from malloczero.evaluation.console import print_evaluation_tables
from malloczero.launch.flags import (
  add_solver_flags,
  check_msa_options_used,
  console,
  positive_int,
  solver_options,
)
from malloczero.launch.solvers import AGENT, search_notice

if TYPE_CHECKING:  # The evaluation loads the whole agent stack: imported when the command runs.
  from malloczero.env.programs.suites import Suite
  from malloczero.evaluation.baseline_cache import BaselineCache
  from malloczero.evaluation.suite import AgentUnderTest, SuiteEvaluation


def add_parser(sub: argparse._SubParsersAction) -> None:
  p = sub.add_parser(
    "evaluate",
    help="run solvers and trained checkpoints on every entry of a "
    "suite; tables, CSV, JSON, Markdown and pictures",
  )
  p.add_argument(
    "--suite",
    required=True,
    help="suite name (see 'malloczero suite list') or a manifest made by 'suite make'",
  )
  p.add_argument(
    "--checkpoint",
    nargs="+",
    metavar="DIR",
    help="training work directories (or their checkpoints) to evaluate as agents; "
    "several give a checkpoint-by-quality table",
  )
  p.add_argument(
    "--solvers",
    default="msa,greedy,evo,cpsat",
    help="comma-separated baselines (default msa,greedy,evo,cpsat; msa always runs)",
  )
  p.add_argument(
    "--batch-agents",
    action="store_true",
    help="agents: play all programs in one batch (faster; per-program solve times "
    "are then shares of the batch)",
  )
  p.add_argument("--split", default="all", choices=("all",) + SPLITS)
  p.add_argument("--limit", type=positive_int, help="only the first N entries")
  p.add_argument("--out", default="evaluation", help="output directory (default ./evaluation)")
  p.add_argument(
    "--no-cache",
    dest="cache",
    action="store_false",
    help="solve every baseline again rather than reuse the results kept in the "
    "user's cache (~/.cache/malloczero/baselines) for the same program, hardware, "
    "solver version and options",
  )
  add_solver_flags(p, BASELINES.values())
  # The agents' flags are `solve --solver agent`'s; here --checkpoint takes several and --seed is
  # the baselines' flag, already added.
  add_solver_flags(p, [AGENT], skip=("checkpoint", "seed"))
  p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
  check_output_dir(args.out)  # First: before the imports, which load the whole agent stack.
  solvers = [s.strip() for s in args.solvers.split(",") if s.strip()]
  unknown = [s for s in solvers if s not in SOLVERS]
  if unknown or (not solvers and not args.checkpoint):
    raise MalloczeroError(
      f"unknown solver(s) {', '.join(unknown) or '(none given)'} in --solvers "
      f"(choose from {', '.join(SOLVERS)})"
    )
  check_msa_options_used(args, [BASELINES[s] for s in solvers + ["msa"]])
  # A --simulations of 0 (the policy alone) is a setting too: test for None, not falsiness.
  given = {
    "simulations": args.simulations is not None,
    "batch_agents": args.batch_agents,
    "agent_time_limit": args.agent_time_limit is not None,
    "guide_decisions": args.guide_decisions,
  }
  for flag, was_given in given.items():
    if was_given and not args.checkpoint:
      raise MalloczeroError(f"--{flag.replace('_', '-')} needs --checkpoint DIR")
  from malloczero.env.programs.suites import get_suite
  from malloczero.evaluation.baseline_cache import open_cache
  from malloczero.evaluation.report import write_report
  from malloczero.evaluation.suite import load_agents

  suite = get_suite(args.suite).split(args.split)
  if not suite.entries:  # E.g. the held-out split of `corpus`, a suite for training only.
    raise MalloczeroError(
      f"suite '{args.suite}' has no {args.split} entries; evaluate another split (--split all)"
    )
  if args.limit:
    suite = dataclasses.replace(suite, entries=suite.entries[: args.limit])
  # Checkpoints are loaded (and a bad one refused) before any solver runs.
  agents = load_agents(
    args.checkpoint or [],
    args.simulations,
    args.attempts,
    args.search_seconds,
    args.agent_time_limit,
    guide="decisions" if args.guide_decisions else "priorities",
  )
  for a in agents:
    search_notice(a.agent)
  out = console()
  for a in agents:
    out.print(
      f"{a.label}: {a.agent.checkpoint} (learner step {a.agent.learner_steps}), "
      f"{a.simulations} simulations, best of {a.attempts} trajectories per program"
      + (
        f", then guided search ({a.guide}) up to {a.time_limit:g} s per program in all"
        if a.time_limit is not None
        else f", then {a.search_seconds:g} s of guided search ({a.guide})"
        if a.search_seconds
        else ""
      )
    )
  title = f"malloczero evaluate: suite '{suite.name}' ({args.split}, {len(suite.entries)} entries)"
  cache = open_cache(args.cache)
  evaluation = run_evaluation(
    suite,
    solvers,
    agents,
    lambda s: solver_options(args, BASELINES[s]),
    out,
    batch_agents=args.batch_agents,
    seed=args.seed,
    cache=cache,
  )
  print_evaluation_tables(evaluation, out, title)
  if cache.directory is not None:
    out.print(
      f"baselines: {cache.reused} result(s) reused from {cache.directory} (their solve "
      f"times are those measured when solved), {cache.solved} solved; --no-cache "
      "solves them all again"
    )
  for path in write_report(evaluation, args.out, title):
    out.print(f"wrote {path}")
  return 0


def run_evaluation(
  suite: Suite,
  solvers: Sequence[str],
  agents: Sequence[AgentUnderTest],
  options: Callable[[str], dict],
  console: Console,
  batch_agents: bool = False,
  seed: int = 0,
  cache: BaselineCache | None = None,
) -> SuiteEvaluation:
  """`evaluate_suite` with a progress bar: one unit per (program, solver or agent). Where the
  output is not a terminal (a log file), each finished unit is a line instead."""
  from malloczero.evaluation.suite import evaluate_suite

  solver_count = len(set(solvers) | {"msa"})
  total = len(suite.entries) * (solver_count + len(agents))
  if not console.is_terminal:
    done, started = [0], time.monotonic()

    def log(description: str, advance: int) -> None:
      if advance:
        done[0] += advance
        console.print(
          f"[{done[0]}/{total}, {time.monotonic() - started:.0f} s] {description}",
          highlight=False,
          soft_wrap=True,
        )

    return evaluate_suite(suite, solvers, agents, options, log, batch_agents, seed, cache)
  with Progress(
    TextColumn("[bold]{task.description}"),
    BarColumn(),
    MofNCompleteColumn(),
    TimeElapsedColumn(),
    console=console,
    transient=False,
  ) as progress:
    task = progress.add_task("evaluating", total=total)

    def report(description: str, advance: int) -> None:
      progress.update(task, description=description, advance=advance)

    return evaluate_suite(suite, solvers, agents, options, report, batch_agents, seed, cache)
