"""The console tables of `evaluate` and `train` (rich)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Optional, Protocol

from rich.console import Console
from rich.table import Table

if TYPE_CHECKING:  # They load the agent stack: imported where the tables are made.
  from malloczero.configs.config import Config
  from malloczero.evaluation.suite import SuiteEvaluation


class TrainingResult(Protocol):
  """What the learning-curve table reads of a single-process run's result
  (system/single_process.py `TrainingResult`)."""

  curve: list[dict[str, Any]]
  baselines: dict[str, dict[str, float]]  # {split: {baseline: geomean speed-up}}


class DistributedResult(Protocol):
  """What the final-evaluation table reads of a distributed run's result
  (system/distributed.py `DistributedResult`)."""

  learner_steps: int
  report: Optional[dict[str, Any]]

  @property
  def reported_agent(self) -> Optional[dict[str, Any]]: ...


def _rich_table(title: str, header: list[str], body: list[list[str]], first_wide: int = 0) -> Table:
  table = Table(title=title)
  for i, column in enumerate(header):
    if i == 0:  # Never truncated: other columns wrap instead.
      table.add_column(column, no_wrap=True, min_width=first_wide)
    else:
      table.add_column(
        column, justify="left" if column in ("split", "solver", "CP-SAT") else "right"
      )
  for line in body:
    table.add_row(*line)
  return table


def print_evaluation_tables(evaluation: SuiteEvaluation, console: Console, title: str) -> None:
  from malloczero.evaluation.report import cells, console_columns, quality_table, split_table

  cols = console_columns(evaluation)
  longest = max((len(r.entry) for r in evaluation.rows), default=5)
  console.print(
    _rich_table(title, [h for h, _, _ in cols], [cells(cols, r) for r in evaluation.rows], longest)
  )
  console.print(
    _rich_table(
      "summary per split (geomean speed-up over all-slow; wins / ties / losses against msa)",
      *split_table(evaluation),
    )
  )
  if len(evaluation.agents) > 1:
    console.print(_rich_table("checkpoints by quality", *quality_table(evaluation)))


def learning_curve_table(result: TrainingResult, config: Config) -> Table:
  """A single-process run's greedy evaluations against the baselines (system/single_process.py)."""
  table = Table(
    title=f"learning curve (greedy search, {config.search.eval_num_simulations} "
    "simulations, and the policy alone): geomean speed-up over all-slow; at least msa on"
  )
  baselines = list(next(iter(result.baselines.values())))
  columns = ("learner steps", "elapsed", "split", "muzero", "policy", *baselines)
  for column in (*columns, "muzero >= msa", "policy >= msa"):
    table.add_column(column, justify="left" if column == "split" else "right")
  for row in result.curve:
    split, programs = row["split"], row["programs"]
    policy = row.get("policy_geomean_speedup")  # Empty in curves written before it.
    table.add_row(
      str(row["learner_steps"]),
      f"{float(row['elapsed_s']):.0f} s",
      split,
      f"{float(row['geomean_speedup']):.3f}x",
      f"{float(policy):.3f}x" if policy else "-",
      *(f"{result.baselines[split][b]:.3f}x" for b in baselines),
      f"{row['beats_msa']}/{programs}",
      f"{row['policy_beats_msa']}/{programs}" if policy else "-",
    )
  return table


def final_evaluation_table(result: DistributedResult) -> Table:
  """A distributed run's final evaluation per split (system/distributed.py `DistributedResult`)."""
  from malloczero.evaluation.baselines import BASELINES
  from malloczero.evaluation.report import summary_rows

  reported = result.reported_agent["learner_steps"]
  chosen = "" if reported == result.learner_steps else " (chosen on the training programs)"
  table = Table(
    title=f"final evaluation at learner step {reported}{chosen}: geomean speed-up over all-slow"
  )
  for column in (
    "split",
    "programs",
    "agent",
    "agent greedy",
    "agent policy",
    "agent proposer",
    *BASELINES,
    "agent vs msa",
    "wins/ties/losses",
  ):
    table.add_column(column, justify="left" if column == "split" else "right")
  for line in summary_rows(result.report, baselines=BASELINES):
    table.add_row(*line)
  return table
