"""Suite evaluation: baseline solvers and trained agents on every program of a suite.

The same code makes `malloczero evaluate` and the final report of a training run; the agent's
play is actors/greedy_play.py's, which the training program's evaluator node also uses for the
learning curve. Every mapping behind a row has passed the independent validator.

A `ProgramRow` is one program: per baseline solver and agent label a `SolverOutcome` (time,
speed-up over all-slow, solve time, ratio to msa, gap to CP-SAT's proven bound, an agent's greedy
speed-up), and CP-SAT's status and bound when it ran. A `SplitSummary` sums up the rows of a split.
Both are flattened into `{label}_{figure}` columns only for the files (`to_dict`), whose columns
and their order are the evaluation files' format.
"""

from __future__ import annotations

import dataclasses
import os
import time
from typing import Any, Callable, Optional, Sequence
from typing import Mapping as MappingType

import numpy as np

from malloczero.actors.agent import Agent, compile_agent, load_agent, play_with_agent
from malloczero.actors.games import GameSpec
from malloczero.common.errors import MalloczeroError
from malloczero.common.signals import raise_pending
from malloczero.configs.workdir import WorkDir
from malloczero.env.mapping import Mapping
from malloczero.env.programs.suites import SPLITS, Suite, SuiteEntry
from malloczero.env.solvers import SolveResult
from malloczero.evaluation.baseline_cache import BaselineCache

# Ratios within this of 1 count as ties with msa.
TIE_TOLERANCE = 1e-6

Progress = Callable[[str, int], None]  # (what is being done now, units finished since last call)


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
  search_seconds: float = 0.0  # Per program: the guided search after the attempts.
  time_limit: Optional[float] = None  # Per program, the whole solve (`play_with_agent`).
  guide: str = "priorities"  # The guided search's space (actors/agent.py `guided_search`).

  def describe(self) -> dict[str, Any]:
    return {
      "label": self.label,
      "checkpoint": self.agent.checkpoint,
      "learner_steps": self.agent.learner_steps,
      "simulations": self.simulations,
      "attempts": self.attempts,
      "guide": self.guide,
    }


def load_agents(
  checkpoints: Sequence[str],
  simulations: Optional[int] = None,
  attempts: int = 1,
  search_seconds: float = 0.0,
  time_limit: Optional[float] = None,
  guide: str = "priorities",
) -> list[AgentUnderTest]:
  """One agent per checkpoint. A single one is labelled `agent`; several are labelled by their
  run directory and learner step (`train-small@5000`) so tables can tell them apart."""
  agents = [load_agent(path) for path in checkpoints]
  if len(agents) == 1:
    labels = ["agent"]
  else:
    labels = [f"{_run_name(a.checkpoint)}@{a.learner_steps}" for a in agents]
    labels = [
      f"{label}#{i + 1}" if labels.count(label) > 1 else label for i, label in enumerate(labels)
    ]
  return [
    AgentUnderTest(
      label, a, a.test_time_simulations(simulations), attempts, search_seconds, time_limit, guide
    )
    for label, a in zip(labels, agents)
  ]


def run_directory(checkpoint_file: str) -> str:
  """The training work directory of `.../RUN/checkpoints/learner_state.npz`."""
  return WorkDir.of_checkpoint(checkpoint_file).root


def _run_name(checkpoint_file: str) -> str:
  return os.path.basename(run_directory(checkpoint_file))


@dataclasses.dataclass(frozen=True)
class SolverOutcome:
  """One baseline's or agent's validated mapping of one program, in the report's units."""

  time_ms: float  # Estimated program time.
  speedup: float  # All-slow time / time.
  solve_s: float  # An agent's excludes its one-off search compilation.
  vs_msa: float  # msa time / time: above 1 is faster than msa.
  gap: Optional[float] = None  # To CP-SAT's proven lower bound; only where CP-SAT ran.
  # Agents only: the network's own greedy trajectory (one attempt, msa's mapping not among the
  # candidates), so that learning is not hidden behind search and msa; and its policy's alone
  # (one attempt, no search either).
  greedy_speedup: Optional[float] = None
  policy_speedup: Optional[float] = None
  # Agents with a proposer (learner/proposer/): one decode of its proposal, no search and no msa.
  proposal_speedup: Optional[float] = None


@dataclasses.dataclass(frozen=True)
class CpsatBound:
  """What CP-SAT proved about one program."""

  status: str  # "optimal", "feasible", ...; "(msa-simple fallback)" when it found none.
  bound_ms: float  # Proven lower bound of CP-SAT's model, which has no copy
  # contention: not a bound on the simulated program time.


@dataclasses.dataclass(frozen=True)
class ProgramRow:
  """One program of the suite with every baseline's and agent's outcome."""

  entry: str
  split: str
  model: str
  hardware: str
  capacity_fraction: float
  fast_capacity_bytes: int
  ops: int
  buffers: int
  requests: int
  slow_only_ms: float
  outcomes: MappingType[str, SolverOutcome]  # Baselines (msa first), then agents, by label.
  cpsat: Optional[CpsatBound] = None

  def to_dict(self) -> dict[str, Any]:
    """The row as the evaluation files write it: flat `{label}_{figure}` columns."""
    row: dict[str, Any] = {
      "entry": self.entry,
      "split": self.split,
      "model": self.model,
      "hardware": self.hardware,
      "capacity_fraction": self.capacity_fraction,
      "fast_capacity_bytes": self.fast_capacity_bytes,
      "ops": self.ops,
      "buffers": self.buffers,
      "requests": self.requests,
      "slow_only_ms": self.slow_only_ms,
    }
    for label, outcome in self.outcomes.items():
      row[f"{label}_ms"] = outcome.time_ms
      row[f"{label}_speedup"] = outcome.speedup
      row[f"{label}_solve_s"] = outcome.solve_s
      if label == "cpsat" and self.cpsat is not None:
        row["cpsat_status"] = self.cpsat.status
        row["cpsat_bound_ms"] = self.cpsat.bound_ms
      if outcome.greedy_speedup is not None:
        row[f"{label}_greedy_speedup"] = outcome.greedy_speedup
      if outcome.policy_speedup is not None:
        row[f"{label}_policy_speedup"] = outcome.policy_speedup
      if outcome.proposal_speedup is not None:
        row[f"{label}_proposal_speedup"] = outcome.proposal_speedup
    for label, outcome in self.outcomes.items():
      row[f"{label}_vs_msa"] = outcome.vs_msa
      if outcome.gap is not None:
        row[f"{label}_gap"] = outcome.gap
    return row


@dataclasses.dataclass(frozen=True)
class SolverSummary:
  """One baseline or agent over the programs of a split; the figures against msa are None for
  msa itself."""

  geomean_speedup: float
  total_solve_s: float
  geomean_vs_msa: Optional[float] = None
  wins: Optional[int] = None  # Programs where it is faster than msa, beyond TIE_TOLERANCE.
  ties: Optional[int] = None
  losses: Optional[int] = None
  best_vs_msa: Optional[float] = None
  worst_vs_msa: Optional[float] = None
  mean_gap: Optional[float] = None  # Only where CP-SAT ran.
  # Agents only: their greedy play alone (SolverOutcome.greedy_speedup), geomean speed-up and
  # geomean ratio to msa; the same for their policy alone (SolverOutcome.policy_speedup), with
  # its wins / ties / losses against msa.
  geomean_greedy_speedup: Optional[float] = None
  greedy_vs_msa: Optional[float] = None
  geomean_policy_speedup: Optional[float] = None
  policy_vs_msa: Optional[float] = None
  policy_wins: Optional[int] = None
  policy_ties: Optional[int] = None
  policy_losses: Optional[int] = None
  # Agents with a proposer: its one decode alone (SolverOutcome.proposal_speedup), the same.
  geomean_proposal_speedup: Optional[float] = None
  proposal_vs_msa: Optional[float] = None
  proposal_wins: Optional[int] = None
  proposal_ties: Optional[int] = None
  proposal_losses: Optional[int] = None

  def record(self) -> str:
    """Its wins / ties / losses against msa, as the tables show them ("7/20/13")."""
    return f"{self.wins}/{self.ties}/{self.losses}"

  def policy_record(self) -> str:
    """`record` of an agent's policy alone."""
    return f"{self.policy_wins}/{self.policy_ties}/{self.policy_losses}"

  def proposal_record(self) -> str:
    """`record` of an agent's proposer alone."""
    return f"{self.proposal_wins}/{self.proposal_ties}/{self.proposal_losses}"


@dataclasses.dataclass(frozen=True)
class SplitSummary:
  """The programs of one split ("all", "train" or "heldout")."""

  entries: int
  solvers: MappingType[str, SolverSummary]  # By label, in column order.
  cpsat_optimal: Optional[int] = None  # Programs CP-SAT solved to optimality.

  def to_dict(self) -> dict[str, Any]:
    """The summary as the evaluation files write it: flat `{label}_{figure}` keys, where the
    figures are SolverSummary's field names, in its field order."""
    summary: dict[str, Any] = {"entries": self.entries}
    for label, figures in self.solvers.items():
      for field in dataclasses.fields(figures):
        value = getattr(figures, field.name)
        if value is not None:
          summary[f"{label}_{field.name}"] = value
    if self.cpsat_optimal is not None:
      summary["cpsat_optimal"] = self.cpsat_optimal
    return summary


@dataclasses.dataclass(frozen=True)
class SuiteEvaluation:
  suite: str
  solvers: list[str]  # Baseline solvers, msa first.
  agents: list[AgentUnderTest]
  rows: list[ProgramRow]  # One per program, in suite order.
  summary: dict[str, SplitSummary]  # {"all" | "train" | "heldout": figures}, non-empty splits.
  mappings: dict[tuple[str, str], Mapping]  # (program, solver or agent label): msa and agents.
  elapsed_s: float
  compile_s: dict[str, float]  # Per agent: one-off search compilation, not in solve times.
  specs: dict[str, GameSpec]  # The loaded programs, by entry name.

  @property
  def names(self) -> list[str]:
    """Every column group: baseline solvers, then agent labels."""
    return self.solvers + [a.label for a in self.agents]

  def to_json(self, title: str) -> dict[str, Any]:
    return {
      "title": title,
      "created": time.strftime("%Y-%m-%dT%H:%M:%S"),
      "suite": self.suite,
      "solvers": self.solvers,
      "agents": [
        {**a.describe(), "compile_s": round(self.compile_s[a.label], 2)} for a in self.agents
      ],
      "elapsed_s": round(self.elapsed_s, 1),
      "summary": {split: s.to_dict() for split, s in self.summary.items()},
      "rows": [row.to_dict() for row in self.rows],
    }


def evaluate_suite(
  suite: Suite,
  solvers: Sequence[str],
  agents: Sequence[AgentUnderTest] = (),
  options: Callable[[str], dict] = lambda solver: {},
  progress: Optional[Progress] = None,
  batch_agents: bool = False,
  seed: int = 0,
  cache: Optional[BaselineCache] = None,
) -> SuiteEvaluation:
  """Solves every entry with every solver and agent; msa is always run, as the reference.
  Baselines are solved through `cache` (evaluation/baseline_cache.py; by default nothing is kept).

  With `batch_agents` each agent plays all programs in one batch (far faster; its solve time per
  program is then the batch's time shared evenly), otherwise one program at a time. An agent's
  candidates include msa's mapping (actors/agent.py), the reference solved here, whose solve time
  counts in the agent's; its greedy play alone (`greedy_speedup`), its policy's alone
  (`policy_speedup`, no search) and its proposer's (`proposal_speedup`, one decode) are reported
  apart.
  """
  started = time.monotonic()
  solvers = ["msa"] + [s for s in solvers if s != "msa"]
  progress = progress or (lambda description, advance: None)
  cache = cache or BaselineCache()
  solved: list[dict[str, SolveResult]] = []  # Per program: label -> result.
  bounds: list[Optional[CpsatBound]] = []
  mappings: dict[tuple[str, str], Mapping] = {}
  specs = []
  for entry in suite.entries:
    workload, hardware = entry.load()
    specs.append(GameSpec(entry.name, workload, hardware))
    results, bound = {}, None
    for solver in solvers:
      raise_pending()  # A Ctrl-C lost in a weakref callback still stops the evaluation.
      progress(f"{entry.name}: {solver}", 0)
      results[solver] = result = cache.solve(workload, hardware, solver, **options(solver))
      if solver == "msa":
        mappings[(entry.name, "msa")] = result.mapping
      if solver == "cpsat":
        bound = CpsatBound(
          result.info["status"]
          + (" (msa-simple fallback)" if "fallback" in result.info else "")
          + " (uncontended bound)",
          result.info["bound_s"] * 1e3,
        )
      progress(f"{entry.name}: {solver}", 1)
    solved.append(results)
    bounds.append(bound)
  compile_s = {}
  for tested in agents:
    raise_pending()
    progress(f"{tested.label}: compiling the search", 0)
    compile_s[tested.label] = compile_agent(
      tested.agent, specs[0], tested.simulations, tested.attempts, len(specs) if batch_agents else 1
    )
    if batch_agents:
      progress(f"{tested.label}: all {len(specs)} programs in one batch", 0)
      played = play_with_agent(
        tested.agent,
        specs,
        tested.simulations,
        tested.attempts,
        seed,
        msa=[results["msa"] for results in solved],
        search_seconds=tested.search_seconds,
        time_limit=tested.time_limit,
        guide=tested.guide,
      )
      progress(f"{tested.label}: all {len(specs)} programs in one batch", len(specs))
    else:
      played = []
      for spec, results in zip(specs, solved):
        raise_pending()
        progress(f"{spec.name}: {tested.label}", 0)
        played += play_with_agent(
          tested.agent,
          [spec],
          tested.simulations,
          tested.attempts,
          seed,
          msa=[results["msa"]],
          search_seconds=tested.search_seconds,
          time_limit=tested.time_limit,
          guide=tested.guide,
        )
        progress(f"{spec.name}: {tested.label}", 1)
    for spec, results, result in zip(specs, solved, played):
      results[tested.label] = result
      mappings[(spec.name, tested.label)] = result.mapping
  labels = {a.label for a in agents}
  rows = [
    _program_row(entry, spec, results, bound, labels)
    for entry, spec, results, bound in zip(suite.entries, specs, solved, bounds)
  ]
  names = solvers + [a.label for a in agents]
  summary = {
    split: summarise([r for r in rows if split == "all" or r.split == split], names)
    for split in ("all",) + SPLITS
  }
  summary = {k: v for k, v in summary.items() if v.entries}
  return SuiteEvaluation(
    suite.name,
    solvers,
    list(agents),
    rows,
    summary,
    mappings,
    time.monotonic() - started,
    compile_s,
    {s.name: s for s in specs},
  )


def _program_row(
  entry: SuiteEntry,
  spec: GameSpec,
  results: dict[str, SolveResult],
  bound: Optional[CpsatBound],
  agents: set[str],
) -> ProgramRow:
  """`results` by label, baselines (msa first) then agents."""
  msa = results["msa"].mapping
  msa_ms = msa.estimated_time_s * 1e3
  outcomes = {}
  for label, result in results.items():
    time_ms = result.mapping.estimated_time_s * 1e3
    # Clamped: the bound is exact only up to CP-SAT's integer rounding (1e-9 of all-slow).
    gap = None if bound is None else max(0.0, 1 - bound.bound_ms / time_ms)
    outcomes[label] = SolverOutcome(
      time_ms,
      result.mapping.speedup,
      result.solve_time_s,
      msa_ms / time_ms,
      gap,
      result.info["greedy_speedup"] if label in agents else None,
      result.info["policy_speedup"] if label in agents else None,
      result.info.get("proposal_speedup") if label in agents else None,
    )
  return ProgramRow(
    entry.name,
    entry.split,
    entry.model,
    entry.hardware,
    entry.capacity_fraction,
    fast_capacity_bytes=spec.hardware.fast_capacity_bytes,
    ops=spec.workload.num_ops,
    buffers=spec.workload.num_buffers,
    requests=results["msa"].info["requests"],
    slow_only_ms=msa.slow_only_time_s * 1e3,
    outcomes=outcomes,
    cpsat=bound,
  )


def summarise(rows: Sequence[ProgramRow], names: Sequence[str]) -> SplitSummary:
  """Per solver or agent: geomean speed-up, geomean ratio to msa, wins / ties / losses against
  msa, best and worst ratio, total solve time."""
  if not rows:
    return SplitSummary(0, {})
  solvers = {}
  for name in names:
    outcomes = [r.outcomes[name] for r in rows]
    speedup = geomean([o.speedup for o in outcomes])
    solve_s = sum(o.solve_s for o in outcomes)
    if name == "msa":
      solvers[name] = SolverSummary(speedup, solve_s)
      continue
    ratios = [o.vs_msa for o in outcomes]
    greedy = _own_play([o.greedy_speedup for o in outcomes], rows)
    policy = _own_play([o.policy_speedup for o in outcomes], rows)
    proposal = _own_play([o.proposal_speedup for o in outcomes], rows)
    wins, ties, losses = wins_ties_losses(ratios)
    policy_wins, policy_ties, policy_losses = (None,) * 3 if policy is None else policy[2]
    proposal_record = (None,) * 3 if proposal is None else proposal[2]
    solvers[name] = SolverSummary(
      speedup,
      solve_s,
      geomean_vs_msa=geomean(ratios),
      wins=wins,
      ties=ties,
      losses=losses,
      best_vs_msa=max(ratios),
      worst_vs_msa=min(ratios),
      mean_gap=(sum(o.gap for o in outcomes) / len(rows) if outcomes[0].gap is not None else None),
      geomean_greedy_speedup=None if greedy is None else greedy[0],
      greedy_vs_msa=None if greedy is None else greedy[1],
      geomean_policy_speedup=None if policy is None else policy[0],
      policy_vs_msa=None if policy is None else policy[1],
      policy_wins=policy_wins,
      policy_ties=policy_ties,
      policy_losses=policy_losses,
      geomean_proposal_speedup=None if proposal is None else proposal[0],
      proposal_vs_msa=None if proposal is None else proposal[1],
      proposal_wins=proposal_record[0],
      proposal_ties=proposal_record[1],
      proposal_losses=proposal_record[2],
    )
  cpsat_optimal = (
    sum(r.cpsat.status == "optimal" for r in rows) if rows[0].cpsat is not None else None
  )
  return SplitSummary(len(rows), solvers, cpsat_optimal)


def _own_play(
  speedups: Sequence[Optional[float]], rows: Sequence[ProgramRow]
) -> Optional[tuple[float, float, tuple[int, int, int]]]:
  """An agent's own play (greedy, policy or proposer alone) over `rows`: geomean speed-up, geomean
  ratio to msa and wins / ties / losses against msa; None where it was not played."""
  if any(s is None for s in speedups):
    return None
  ratios = [s / r.outcomes["msa"].speedup for s, r in zip(speedups, rows)]
  return geomean(speedups), geomean(ratios), wins_ties_losses(ratios)


def wins_ties_losses(ratios: Sequence[float]) -> tuple[int, int, int]:
  """Programs faster than msa beyond TIE_TOLERANCE, within it, slower beyond it."""
  return (  # Python ints whatever the ratios' type: they go into JSON.
    sum(int(v > 1 + TIE_TOLERANCE) for v in ratios),
    sum(int(abs(v - 1) <= TIE_TOLERANCE) for v in ratios),
    sum(int(v < 1 - TIE_TOLERANCE) for v in ratios),
  )


def best_agent(evaluation: SuiteEvaluation) -> AgentUnderTest:
  """The agent with the highest geomean speed-up over the whole suite."""
  if not evaluation.agents:
    raise MalloczeroError("no agent was evaluated")
  overall = evaluation.summary["all"]
  return max(evaluation.agents, key=lambda a: overall.solvers[a.label].geomean_speedup)
