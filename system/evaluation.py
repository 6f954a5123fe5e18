"""Suite evaluation: baseline solvers and trained agents on every program of a suite.

The same code makes `malloczero evaluate` and the final report of a training run; the agent's
play is actors/evaluator.py's, which the training program's evaluator node also uses for the
learning curve. Every mapping behind a row has passed the independent validator.

A row is one program: `{solver}_ms`, `{solver}_speedup` (over all-slow), `{solver}_solve_s`,
`{solver}_vs_msa` (msa time / solver time) for each baseline solver and each agent label; CP-SAT's
status, proven lower bound and gap; each agent's gap to that bound and its greedy trajectory's
speed-up.
"""

from __future__ import annotations

import dataclasses
import os
import time
from typing import Any, Callable, Optional, Sequence

import numpy as np

from malloczero.actors.agent import Agent, compile_agent, load_agent, play_with_agent
from malloczero.actors.games import GameSpec
from malloczero.env.errors import MalloczeroError
from malloczero.env.mapping import Mapping
from malloczero.env.solvers import SolveResult, solve
from malloczero.env.programs.suites import SPLITS, Suite, SuiteEntry

# Ratios within this of 1 count as ties with msa.
TIE_TOLERANCE = 1e-6

Progress = Callable[[str, int], None]   # (what is being done now, units finished since last call)


def geomean(values: Any) -> float:
  """Geometric mean, the summary of speed-ups across programs; nan for none."""
  values = list(values)
  return float(np.exp(np.mean(np.log(values)))) if values else float("nan")


@dataclasses.dataclass(frozen=True)
class AgentUnderTest:
  """A checkpoint to evaluate, its name in tables, and its test-time search."""
  label: str
  agent: Agent
  simulations: int
  attempts: int

  def describe(self) -> dict[str, Any]:
    return {"label": self.label, "checkpoint": self.agent.checkpoint,
            "learner_steps": self.agent.learner_steps, "simulations": self.simulations,
            "attempts": self.attempts}


def load_agents(checkpoints: Sequence[str], simulations: Optional[int] = None,
                attempts: int = 1) -> list[AgentUnderTest]:
  """One agent per checkpoint. A single one is labelled `agent`; several are labelled by their
  run directory and learner step (`train-small@5000`) so tables can tell them apart."""
  agents = [load_agent(path) for path in checkpoints]
  if len(agents) == 1:
    labels = ["agent"]
  else:
    labels = [f"{_run_name(a.checkpoint)}@{a.learner_steps}" for a in agents]
    labels = [f"{label}#{i + 1}" if labels.count(label) > 1 else label
              for i, label in enumerate(labels)]
  return [AgentUnderTest(label, a, simulations or a.default_simulations, attempts)
          for label, a in zip(labels, agents)]


def run_directory(checkpoint_file: str) -> str:
  """The training work directory of `.../RUN/checkpoints/learner_state.pkl`."""
  return os.path.dirname(os.path.dirname(os.path.abspath(checkpoint_file)))


def _run_name(checkpoint_file: str) -> str:
  return os.path.basename(run_directory(checkpoint_file))


@dataclasses.dataclass
class SuiteEvaluation:
  suite: str
  solvers: list[str]                 # Baseline solvers, msa first.
  agents: list[AgentUnderTest]
  rows: list[dict[str, Any]]         # One per program, in suite order.
  summary: dict[str, dict[str, Any]]   # {"all" | "train" | "heldout": figures}
  mappings: dict[tuple[str, str], Mapping]   # (program, solver or agent label): msa and agents.
  elapsed_s: float
  compile_s: dict[str, float]        # Per agent: one-off search compilation, not in solve times.
  specs: dict[str, GameSpec]         # The loaded programs, by entry name.

  @property
  def names(self) -> list[str]:
    """Every column group: baseline solvers, then agent labels."""
    return self.solvers + [a.label for a in self.agents]

  def to_json(self, title: str) -> dict[str, Any]:
    return {"title": title, "created": time.strftime("%Y-%m-%dT%H:%M:%S"), "suite": self.suite,
            "solvers": self.solvers,
            "agents": [{**a.describe(), "compile_s": round(self.compile_s[a.label], 2)}
                       for a in self.agents],
            "elapsed_s": round(self.elapsed_s, 1), "summary": self.summary, "rows": self.rows}


def evaluate_suite(suite: Suite, solvers: Sequence[str], agents: Sequence[AgentUnderTest] = (),
                   options: Callable[[str], dict] = lambda solver: {},
                   progress: Optional[Progress] = None, batch_agents: bool = False,
                   seed: int = 0) -> SuiteEvaluation:
  """Solves every entry with every solver and agent; msa is always run, as the reference.

  With `batch_agents` each agent plays all programs in one batch (far faster; its solve time per
  program is then the batch's time shared evenly), otherwise one program at a time.
  """
  started = time.monotonic()
  solvers = ["msa"] + [s for s in solvers if s != "msa"]
  progress = progress or (lambda description, advance: None)
  rows: list[dict[str, Any]] = []
  mappings: dict[tuple[str, str], Mapping] = {}
  specs = []
  for entry in suite.entries:
    workload, hardware = entry.load()
    specs.append(GameSpec(entry.name, workload, hardware))
    row = _describe(entry, workload, hardware)
    for solver in solvers:
      progress(f"{entry.name}: {solver}", 0)
      result = solve(workload, hardware, solver, **options(solver))
      _record(row, solver, result)
      if solver == "msa":
        mappings[(entry.name, "msa")] = result.mapping
      if solver == "cpsat":
        row["cpsat_status"] = result.info["status"] + (" (msa fallback)"
                                                       if "fallback" in result.info else "")
        row["cpsat_bound_ms"] = result.info["bound_s"] * 1e3
      progress(f"{entry.name}: {solver}", 1)
    rows.append(row)
  compile_s = {}
  for tested in agents:
    progress(f"{tested.label}: compiling the search", 0)
    compile_s[tested.label] = compile_agent(tested.agent, specs[0], tested.simulations,
                                            tested.attempts, len(specs) if batch_agents else 1)
    if batch_agents:
      progress(f"{tested.label}: all {len(specs)} programs in one batch", 0)
      results = play_with_agent(tested.agent, specs, tested.simulations, tested.attempts, seed)
      progress(f"{tested.label}: all {len(specs)} programs in one batch", len(specs))
    else:
      results = []
      for spec in specs:
        progress(f"{spec.name}: {tested.label}", 0)
        results += play_with_agent(tested.agent, [spec], tested.simulations, tested.attempts, seed)
        progress(f"{spec.name}: {tested.label}", 1)
    for row, result in zip(rows, results):
      _record(row, tested.label, result)
      row[f"{tested.label}_greedy_speedup"] = result.info["greedy_speedup"]
      mappings[(row["entry"], tested.label)] = result.mapping
  names = solvers + [a.label for a in agents]
  for row in rows:
    for name in names:
      row[f"{name}_vs_msa"] = row["msa_ms"] / row[f"{name}_ms"]
      if "cpsat_bound_ms" in row:
        # Clamped: the bound is exact only up to CP-SAT's integer rounding (1e-9 of all-slow).
        row[f"{name}_gap"] = max(0.0, 1 - row["cpsat_bound_ms"] / row[f"{name}_ms"])
  summary = {split: summarise([r for r in rows if split == "all" or r["split"] == split], names)
             for split in ("all",) + SPLITS}
  summary = {k: v for k, v in summary.items() if v["entries"]}
  return SuiteEvaluation(suite.name, solvers, list(agents), rows, summary, mappings,
                         time.monotonic() - started, compile_s, {s.name: s for s in specs})


def _describe(entry: SuiteEntry, workload, hardware) -> dict[str, Any]:
  return {"entry": entry.name, "split": entry.split, "model": entry.model,
          "hardware": entry.hardware, "capacity_fraction": entry.capacity_fraction,
          "fast_capacity_bytes": hardware.levels[0].capacity_bytes,
          "ops": workload.num_ops, "buffers": workload.num_buffers}


def _record(row: dict[str, Any], name: str, result: SolveResult) -> None:
  m = result.mapping
  row["requests"] = result.info["requests"]
  row["slow_only_ms"] = m.slow_only_time_s * 1e3
  row[f"{name}_ms"] = m.estimated_time_s * 1e3
  row[f"{name}_speedup"] = m.speedup
  row[f"{name}_solve_s"] = result.solve_time_s


def summarise(rows: list[dict[str, Any]], names: Sequence[str]) -> dict[str, Any]:
  """Per solver or agent: geomean speed-up, geomean ratio to msa, wins / ties / losses against
  msa, best and worst ratio, total solve time."""
  summary: dict[str, Any] = {"entries": len(rows)}
  if not rows:
    return summary
  for name in names:
    ratios = [r[f"{name}_vs_msa"] for r in rows]
    summary[f"{name}_geomean_speedup"] = geomean([r[f"{name}_speedup"] for r in rows])
    summary[f"{name}_total_solve_s"] = sum(r[f"{name}_solve_s"] for r in rows)
    if name == "msa":
      continue
    summary[f"{name}_geomean_vs_msa"] = geomean(ratios)
    summary[f"{name}_wins"] = sum(v > 1 + TIE_TOLERANCE for v in ratios)
    summary[f"{name}_ties"] = sum(abs(v - 1) <= TIE_TOLERANCE for v in ratios)
    summary[f"{name}_losses"] = sum(v < 1 - TIE_TOLERANCE for v in ratios)
    summary[f"{name}_best_vs_msa"] = max(ratios)
    summary[f"{name}_worst_vs_msa"] = min(ratios)
    if f"{name}_gap" in rows[0]:
      summary[f"{name}_mean_gap"] = sum(r[f"{name}_gap"] for r in rows) / len(rows)
  if "cpsat_status" in rows[0]:
    summary["cpsat_optimal"] = sum(r["cpsat_status"] == "optimal" for r in rows)
  return summary


def best_agent(evaluation: SuiteEvaluation) -> AgentUnderTest:
  """The agent with the highest geomean speed-up over the whole suite."""
  if not evaluation.agents:
    raise MalloczeroError("no agent was evaluated")
  overall = evaluation.summary["all"]
  return max(evaluation.agents, key=lambda a: overall[f"{a.label}_geomean_speedup"])
