"""`malloczero evaluate`: baselines and checkpoints on a suite, with progress and console tables.

The evaluation itself is system/evaluation.py and its files system/report.py, which the final
report of a training run shares.
"""

from __future__ import annotations

import time
from typing import Callable, Sequence

from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
from rich.table import Table

from malloczero.env.programs.suites import Suite
from malloczero.system.evaluation import AgentUnderTest, SuiteEvaluation, evaluate_suite
from malloczero.system.report import cells, console_columns, quality_table, split_table


def run_evaluation(suite: Suite, solvers: Sequence[str], agents: Sequence[AgentUnderTest],
                   options: Callable[[str], dict], console: Console, batch_agents: bool = False,
                   seed: int = 0) -> SuiteEvaluation:
  """`evaluate_suite` with a progress bar: one unit per (program, solver or agent). Where the
  output is not a terminal (a log file), each finished unit is a line instead."""
  solver_count = len(set(solvers) | {"msa"})
  total = len(suite.entries) * (solver_count + len(agents))
  if not console.is_terminal:
    done, started = [0], time.monotonic()

    def log(description: str, advance: int) -> None:
      if advance:
        done[0] += advance
        console.print(f"[{done[0]}/{total}, {time.monotonic() - started:.0f} s] {description}",
                      highlight=False, soft_wrap=True)

    return evaluate_suite(suite, solvers, agents, options, log, batch_agents, seed)
  with Progress(TextColumn("[bold]{task.description}"), BarColumn(), MofNCompleteColumn(),
                TimeElapsedColumn(), console=console, transient=False) as progress:
    task = progress.add_task("evaluating", total=total)

    def report(description: str, advance: int) -> None:
      progress.update(task, description=description, advance=advance)

    return evaluate_suite(suite, solvers, agents, options, report, batch_agents, seed)


def _rich_table(title: str, header: list[str], body: list[list[str]], first_wide: int = 0) -> Table:
  table = Table(title=title)
  for i, column in enumerate(header):
    if i == 0:  # Never truncated: other columns wrap instead.
      table.add_column(column, no_wrap=True, min_width=first_wide)
    else:
      table.add_column(column, justify="left" if column in ("split", "solver", "CP-SAT")
                       else "right")
  for line in body:
    table.add_row(*line)
  return table


def print_tables(evaluation: SuiteEvaluation, console: Console, title: str) -> None:
  cols = console_columns(evaluation)
  longest = max((len(r.entry) for r in evaluation.rows), default=5)
  console.print(_rich_table(title, [h for h, _, _ in cols],
                            [cells(cols, r) for r in evaluation.rows], longest))
  console.print(_rich_table("summary per split (geomean speed-up over all-slow; wins / ties / "
                            "losses against msa)", *split_table(evaluation)))
  if len(evaluation.agents) > 1:
    console.print(_rich_table("checkpoints by quality", *quality_table(evaluation)))
