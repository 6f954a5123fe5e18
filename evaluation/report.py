"""Evaluation reports: Markdown, CSV, JSON and pictures of a `SuiteEvaluation`.

`write_report` serves `malloczero evaluate`; `write_final_report` is the end of a training run: the
run's checkpoint on every program of its suite beside msa, greedy, bestfit and random, written as
workdir/report.{md,json,csv} with its pictures.
"""

from __future__ import annotations

import csv
import json
import os
import re
from typing import Any, Callable, Optional

from malloczero.common.files import atomic_write, write_text
from malloczero.configs.config import Config
from malloczero.configs.workdir import REPORT_STEM, WorkDir
from malloczero.env.game import return_speedup
from malloczero.env.programs.suites import SPLITS, get_suite
from malloczero.evaluation.baselines import BASELINES
from malloczero.evaluation.suite import (
  TIE_TOLERANCE,
  ProgramRow,
  SuiteEvaluation,
  best_agent,
  evaluate_suite,
  load_agents,
  run_directory,
)

Formatter = Callable[[Any], str]
# (header, the value in a row or None where it has none, its formatter) of a per-program table.
Column = tuple[str, Callable[[ProgramRow], Any], Formatter]


def _ms(v: float) -> str:
  return f"{v * 1e3:.4g} us" if v < 0.1 else f"{v:.4g} ms"


def _x(v: float) -> str:
  return f"{v:.3f}x"


def _or_dash(v: Optional[float]) -> str:
  return "-" if v is None else _x(v)


def _percent(v: float) -> str:
  return f"{100 * v:.2f}%"


def _outcome(label: str, figure: str) -> Callable[[ProgramRow], Any]:
  return lambda row: getattr(row.outcomes[label], figure)


def _has_bound(evaluation: SuiteEvaluation) -> bool:
  return any(r.cpsat is not None for r in evaluation.rows)


def cells(cols: list[Column], row: ProgramRow) -> list[str]:
  """A row of a per-program table: each column's value formatted, blank where there is none."""
  values = [value(row) for _, value, _ in cols]
  return ["" if v is None else fmt(v) for v, (_, _, fmt) in zip(values, cols)]


def columns(evaluation: SuiteEvaluation) -> list[Column]:
  """The per-program table of the Markdown report."""
  cols: list[Column] = [
    ("program", lambda r: r.entry, str),
    ("split", lambda r: r.split, str),
    ("requests", lambda r: r.requests, str),
    ("all-slow", lambda r: r.slow_only_ms, _ms),
  ]
  has_bound = _has_bound(evaluation)
  agents = {a.label for a in evaluation.agents}
  for name in evaluation.names:
    cols.append((f"{name} time", _outcome(name, "time_ms"), _ms))
    if name != "msa":
      cols.append((f"{name} vs msa", _outcome(name, "vs_msa"), _x))
    if name in agents:  # The networks' own play (greedy search; policy, proposer alone).
      cols.append((f"{name} greedy", _outcome(name, "greedy_speedup"), _x))
      cols.append((f"{name} policy", _outcome(name, "policy_speedup"), _x))
      if _has_proposal(evaluation, name):
        cols.append((f"{name} proposer", _outcome(name, "proposal_speedup"), _x))
    if has_bound and name in agents:
      cols.append((f"{name} gap", _outcome(name, "gap"), _percent))
  if has_bound:
    cpsat = lambda figure: lambda r: None if r.cpsat is None else getattr(r.cpsat, figure)
    cols += [
      ("CP-SAT", cpsat("status"), str),
      ("bound", cpsat("bound_ms"), _ms),
      ("CP-SAT gap", _outcome("cpsat", "gap"), _percent),
    ]
  cols += [
    (f"{name} s", _outcome(name, "solve_s"), lambda v: f"{v:.2f}") for name in evaluation.names
  ]
  return cols


def console_columns(evaluation: SuiteEvaluation) -> list[Column]:
  """A narrower per-program table for the terminal: speed-ups only, and the agents' details."""
  agents = [a.label for a in evaluation.agents]
  has_bound = _has_bound(evaluation)
  cols: list[Column] = [
    ("program", lambda r: r.entry, str),
    ("split", lambda r: r.split, str),
    ("requests", lambda r: r.requests, str),
  ]
  cols += [(name, _outcome(name, "speedup"), _x) for name in evaluation.names]
  cols += [(f"{name} vs msa", _outcome(name, "vs_msa"), _x) for name in agents]
  cols += [(f"{name} greedy", _outcome(name, "greedy_speedup"), _x) for name in agents]
  cols += [(f"{name} policy", _outcome(name, "policy_speedup"), _x) for name in agents]
  cols += [
    (f"{name} proposer", _outcome(name, "proposal_speedup"), _x)
    for name in agents
    if _has_proposal(evaluation, name)
  ]
  if has_bound:
    cols += [
      ("CP-SAT", lambda r: None if r.cpsat is None else r.cpsat.status, lambda v: v.split(" ")[0])
    ]
    cols += [(f"{name} gap", _outcome(name, "gap"), _percent) for name in agents]
  cols += [(f"{name} s", _outcome(name, "solve_s"), lambda v: f"{v:.2f}") for name in agents]
  return cols


def _own_play_cells(
  geomean_speedup: Optional[float], vs_msa: Optional[float], record: Callable[[], str]
) -> list[str]:
  """An agent's own play (policy or proposer alone) as the split table's three cells."""
  if geomean_speedup is None:
    return ["-", "-", "-"]
  return [_x(geomean_speedup), _x(vs_msa), record()]


def _has_proposal(evaluation: SuiteEvaluation, label: str) -> bool:
  """Whether the agent `label` played a proposer on some program."""
  return any(r.outcomes[label].proposal_speedup is not None for r in evaluation.rows)


def split_table(evaluation: SuiteEvaluation) -> tuple[list[str], list[list[str]]]:
  """Per split and solver: geomean speed-up, vs msa, wins / ties / losses, an agent's greedy play
  alone (speed-up and vs msa), its policy's alone and its proposer's alone (each also wins /
  ties / losses), total solve time."""
  header = [
    "split",
    "solver",
    "programs",
    "geomean speed-up",
    "vs msa",
    "wins/ties/losses",
    "best vs msa",
    "worst vs msa",
    "greedy speed-up",
    "greedy vs msa",
    "policy speed-up",
    "policy vs msa",
    "policy W/T/L",
    "proposer speed-up",
    "proposer vs msa",
    "proposer W/T/L",
    "solve s",
  ]
  body = []
  for split, s in evaluation.summary.items():
    for name in evaluation.names:
      figures = s.solvers[name]
      if name == "msa":
        versus = ["1.000x", "-", "-", "-"]
      else:
        versus = [
          _x(figures.geomean_vs_msa),
          figures.record(),
          _x(figures.best_vs_msa),
          _x(figures.worst_vs_msa),
        ]
      greedy = (
        ["-", "-"]
        if figures.geomean_greedy_speedup is None
        else [_x(figures.geomean_greedy_speedup), _x(figures.greedy_vs_msa)]
      )
      policy = _own_play_cells(
        figures.geomean_policy_speedup, figures.policy_vs_msa, figures.policy_record
      )
      proposal = _own_play_cells(
        figures.geomean_proposal_speedup, figures.proposal_vs_msa, figures.proposal_record
      )
      body.append(
        [
          split,
          name,
          str(s.entries),
          _x(figures.geomean_speedup),
          *versus,
          *greedy,
          *policy,
          *proposal,
          f"{figures.total_solve_s:.1f}",
        ]
      )
  return header, body


def quality_table(evaluation: SuiteEvaluation) -> tuple[list[str], list[list[str]]]:
  """Checkpoint by quality: one row per agent, best first."""
  splits = [s for s in SPLITS if s in evaluation.summary]
  header = ["checkpoint", "learner steps", "simulations", "attempts"]
  for split in splits:
    header += [
      f"{split} speed-up",
      f"{split} vs msa",
      f"{split} W/T/L",
      f"{split} greedy",
      f"{split} policy",
      f"{split} proposer",
    ]
  header += ["mean solve s"]
  body = []
  overall = evaluation.summary["all"]
  for a in sorted(evaluation.agents, key=lambda a: -overall.solvers[a.label].geomean_speedup):
    line = [a.label, str(a.agent.learner_steps), str(a.simulations), str(a.attempts)]
    for split in splits:
      figures = evaluation.summary[split].solvers[a.label]
      line += [
        _x(figures.geomean_speedup),
        _x(figures.geomean_vs_msa),
        figures.record(),
        _x(figures.geomean_greedy_speedup),
        _x(figures.geomean_policy_speedup),
        _or_dash(figures.geomean_proposal_speedup),
      ]
    line.append(f"{overall.solvers[a.label].total_solve_s / overall.entries:.2f}")
    body.append(line)
  return header, body


def _markdown_table(header: list[str], body: list[list[str]]) -> list[str]:
  return [
    "| " + " | ".join(header) + " |",
    "|" + "---|" * len(header),
    *("| " + " | ".join(line) + " |" for line in body),
  ]


def write_report(
  evaluation: SuiteEvaluation,
  out_dir: str,
  title: str,
  stem: str = "evaluation",
  picture_prefix: str = "",
  learning_curves: bool = True,
) -> list[str]:
  """Writes `{stem}.md/.csv/.json` and the pictures into out_dir; returns the paths written."""
  os.makedirs(out_dir, exist_ok=True)
  report = lambda extension: WorkDir(out_dir).report(extension, stem)
  written = [_write_csv(evaluation, report("csv"))]
  write_text(report("json"), json.dumps(evaluation.to_json(title), indent=1))
  written.append(report("json"))
  written += _write_agent_mappings(evaluation, out_dir)
  pictures = _draw_pictures(evaluation, out_dir, picture_prefix, title, learning_curves)
  write_text(report("md"), markdown(evaluation, title, pictures))
  return [report("md")] + written + [os.path.join(out_dir, p) for _, p in pictures]


def markdown(evaluation: SuiteEvaluation, title: str, pictures: list[tuple[str, str]] = ()) -> str:
  lines = [f"# {title}", ""]
  if evaluation.agents:
    lines += [
      "Agents: each checkpoint's networks with MCTS at test time; per program the fastest "
      "of `attempts` trajectories (the first greedy, the rest sampled with Gumbel noise) "
      "and msa's own mapping is kept, so an agent never loses to msa; msa's solve time "
      "is in the agent's. `greedy` is the network's own greedy trajectory alone (one "
      "attempt with the search, msa's mapping not a candidate) and `policy` its policy's "
      "alone (the argmax of its prior at every move, no search): what it learned, apart "
      "from msa and, for `policy`, from search too; the policy's trajectory is one more "
      "attempt of the agent. Every mapping has passed the independent validator.",
      "",
      *_markdown_table(
        ["label", "checkpoint", "learner steps", "simulations", "attempts", "compile s"],
        [
          [
            a.label,
            f"`{a.agent.checkpoint}`",
            str(a.agent.learner_steps),
            str(a.simulations),
            str(a.attempts),
            f"{evaluation.compile_s[a.label]:.1f}",
          ]
          for a in evaluation.agents
        ],
      ),
      "",
      "Solve times exclude the one-off compilation of each agent's search (`compile s`).",
      "",
    ]
  lines += [
    "## Summary per split",
    "",
    "Speed-ups are over all-slow (geometric means); `vs msa` is the geometric mean of "
    "msa time / solver time per program; wins / ties / losses are against msa; the gap "
    "is to CP-SAT's proven lower bound.",
    "",
    *_markdown_table(*split_table(evaluation)),
    "",
  ]
  if len(evaluation.agents) > 1:
    lines += ["## Checkpoints by quality", "", *_markdown_table(*quality_table(evaluation)), ""]
  if evaluation.agents:
    agent = best_agent(evaluation).label
    versus = lambda r: r.outcomes[agent].vs_msa
    losses = sorted((r for r in evaluation.rows if versus(r) < 1 - TIE_TOLERANCE), key=versus)
    lines += [
      f"## Programs where `{agent}` loses to msa ({len(losses)} of {len(evaluation.rows)})",
      "",
    ]
    lines += (
      _markdown_table(
        ["program", "split", f"{agent}", "msa", f"{agent} vs msa"],
        [
          [
            r.entry,
            r.split,
            _x(r.outcomes[agent].speedup),
            _x(r.outcomes["msa"].speedup),
            _x(versus(r)),
          ]
          for r in losses
        ],
      )
      if losses
      else ["None."]
    )
    lines.append("")
  cols = columns(evaluation)
  lines += [
    "## Per program",
    "",
    *_markdown_table([h for h, _, _ in cols], [cells(cols, r) for r in evaluation.rows]),
    "",
  ]
  if pictures:
    lines += ["## Pictures", ""] + [f"![{caption}]({name})" for caption, name in pictures]
  return "\n".join(lines) + "\n"


def mapping_file(out_dir: str, label: str, program: str) -> str:
  """Where `write_report` puts an agent's validated mapping of one program."""
  safe = lambda text: re.sub(r"[^A-Za-z0-9._-]+", "_", text)
  return os.path.join(WorkDir(out_dir).mappings, safe(label), f"{safe(program)}.json")


def _write_agent_mappings(evaluation: SuiteEvaluation, out_dir: str) -> list[str]:
  """Each agent's mapping of each program, for `malloczero validate` or a compiler to use."""
  for agent in evaluation.agents:
    for row in evaluation.rows:
      path = mapping_file(out_dir, agent.label, row.entry)
      os.makedirs(os.path.dirname(path), exist_ok=True)
      evaluation.mappings[(row.entry, agent.label)].save(path)
  return [WorkDir(out_dir).mappings] if evaluation.agents else []


def _write_csv(evaluation: SuiteEvaluation, path: str) -> str:
  rows = [r.to_dict() for r in evaluation.rows]
  keys = list(dict.fromkeys(k for r in rows for k in r))
  with atomic_write(path, "w", newline="") as f:
    writer = csv.DictWriter(f, fieldnames=keys)
    writer.writeheader()
    writer.writerows(rows)
  return path


def _draw_pictures(
  evaluation: SuiteEvaluation, out_dir: str, prefix: str, title: str, learning_curves: bool
) -> list[tuple[str, str]]:
  """(caption, file name) of each picture drawn."""
  from malloczero.evaluation.plots import (
    plot_learning_curves,
    plot_memory_maps,
    plot_ratio_bars,
    plot_speedups,
  )

  pictures = []
  name = f"{prefix}speedups.png"
  plot_speedups(evaluation.rows, evaluation.names, os.path.join(out_dir, name), title)
  pictures.append(("speed-up of every solver on every program", name))
  if not evaluation.agents:
    return pictures
  agent = best_agent(evaluation).label
  name = f"{prefix}{'agent' if len(evaluation.agents) == 1 else 'best_agent'}_vs_msa.png"
  plot_ratio_bars(
    evaluation.rows,
    agent,
    os.path.join(out_dir, name),
    f"{agent} against msa per program (above 1: the agent's mapping is faster)",
  )
  pictures.append((f"{agent} vs msa per program", name))
  ranked = sorted(evaluation.rows, key=lambda r: r.outcomes[agent].vs_msa)
  for which, row in (("best", ranked[-1]), ("worst", ranked[0])):
    spec = evaluation.specs[row.entry]
    name = f"{prefix}memory_map_{which}.png"
    plot_memory_maps(
      spec.workload,
      spec.hardware,
      [evaluation.mappings[(row.entry, agent)], evaluation.mappings[(row.entry, "msa")]],
      os.path.join(out_dir, name),
      f"{row.entry}: {agent}'s {which} program against msa ({row.outcomes[agent].vs_msa:.3f}x msa)",
    )
    pictures.append((f"memory maps of the {which} program, {agent} beside msa", name))
  if learning_curves:
    workdirs = {a.label: run_directory(a.agent.checkpoint) for a in evaluation.agents}
    references = {
      split: {
        s: evaluation.summary[split].solvers[s].geomean_speedup
        for s in ("msa", "bestfit")
        if s in evaluation.summary[split].solvers
      }
      for split in SPLITS
      if split in evaluation.summary
    }
    name = f"{prefix}learning_curve.png"
    if plot_learning_curves(
      workdirs,
      references,
      os.path.join(out_dir, name),
      f"learning curves of the evaluated runs (suite '{evaluation.suite}')",
    ):
      pictures.append(("learning curve from the runs' logs", name))
  return pictures


def write_final_report(
  config: Config, workdir: str, print_fn: Callable[[str], None] = print
) -> dict[str, Any]:
  """Evaluates workdir's checkpoint (the one chosen on training programs, with
  `config.select_checkpoints` above 1: evaluation/selection.py) on every program of the run's suite;
  returns the report."""
  from malloczero.evaluation.selection import select_checkpoint

  agent = load_agents(
    [select_checkpoint(config, workdir, print_fn)],
    simulations=config.search.eval_num_simulations,
    attempts=1,
    search_seconds=config.final_search_seconds,
  )[0]
  suite = get_suite(config.measured_suite)
  print_fn(
    f"final evaluation of step {agent.agent.learner_steps} on {len(suite.entries)} "
    f"programs ({agent.simulations} simulations, greedy, no noise, msa's mapping one more "
    f"attempt, then {config.final_search_seconds:g} s of guided search over {agent.guide}) "
    f"beside {', '.join(BASELINES)}"
  )
  evaluation = evaluate_suite(
    suite, BASELINES, [agent], _random_seed(config.seed), batch_agents=True, seed=config.seed
  )
  title = (
    f"Final evaluation: config `{config.name}`, suite `{suite.name}`, learner step "
    f"{agent.agent.learner_steps}"
  )
  write_report(
    evaluation,
    workdir,
    title,
    stem=REPORT_STEM,
    picture_prefix=f"{REPORT_STEM}_",
    learning_curves=False,
  )
  for split in SPLITS:
    s = evaluation.summary.get(split)
    if s:
      figures = s.solvers["agent"]
      print_fn(
        f"  {split}: agent {figures.geomean_speedup:.3f}x (greedy alone "
        f"{figures.geomean_greedy_speedup:.3f}x, {figures.greedy_vs_msa:.3f}x msa; policy alone "
        f"{figures.geomean_policy_speedup:.3f}x, {figures.policy_vs_msa:.4f}x msa, W/T/L "
        f"{figures.policy_record()}"
        + (
          ""
          if figures.geomean_proposal_speedup is None
          else f"; proposer alone {figures.proposal_vs_msa:.4f}x msa, W/T/L "
          f"{figures.proposal_record()}"
        )
        + "), "
        + ", ".join(f"{b} {s.solvers[b].geomean_speedup:.3f}x" for b in BASELINES)
        + f"; vs msa {figures.geomean_vs_msa:.3f}x (wins {figures.wins}, ties "
        f"{figures.ties}, losses {figures.losses} of {s.entries})"
      )
  print_fn(f"wrote {WorkDir(workdir).report('md')} (with report.json, report.csv and pictures)")
  return evaluation.to_json(title)


def _random_seed(seed: int) -> Callable[[str], dict]:
  return lambda solver: {"seed": seed} if solver == "random" else {}


def summary_rows(
  report: dict[str, Any], label: str = "agent", baselines: Optional[tuple[str, ...]] = None
) -> list[list[str]]:
  """Console table of a final report: per split, the agent's geomean, its greedy play's alone, its
  policy's alone and its proposer's alone ("-" without one), the baselines' geomeans, the agent's
  ratio to msa and W/T/L.

  `report` is the report's JSON (`write_final_report`'s result), so it reads the files' flat keys.
  """
  baselines = baselines or tuple(s for s in report["solvers"])
  body = []
  for split in SPLITS:
    s = report["summary"].get(split)
    if s:
      body.append(
        [
          split,
          str(s["entries"]),
          _x(s[f"{label}_geomean_speedup"]),
          _x(s[f"{label}_geomean_greedy_speedup"]),
          _x(s[f"{label}_geomean_policy_speedup"]),
          _or_dash(s.get(f"{label}_geomean_proposal_speedup")),
          *(_x(s[f"{b}_geomean_speedup"]) for b in baselines),
          _x(s[f"{label}_geomean_vs_msa"]),
          f"{s[f'{label}_wins']}/{s[f'{label}_ties']}/{s[f'{label}_losses']}",
        ]
      )
  return body


# Solvers a `train --workload` run's best mapping is compared with, and evo's time budget there
# (the default suite's baselines were measured with --time-limit 10).
PROGRAM_BASELINES = ("msa", "bestfit", "evo")
PROGRAM_EVO_SECONDS = 10.0


def write_program_report(
  config: Config, workdir: str, print_fn: Callable[[str], None] = print
) -> dict[str, Any]:
  """For each workload file of the run (`train --workload`): the best mapping it found (the
  learner's demonstration, in workdir/best/) against msa, bestfit and evo on that program; one
  line each, and workdir/program_report.json."""
  from malloczero.actors.games import GameSpec
  from malloczero.env.solvers import solve
  from malloczero.env.workload_json import load_workload
  from malloczero.learner.demonstrations import DEMONSTRATIONS_FILENAME

  files = WorkDir(workdir)
  try:
    with open(os.path.join(files.checkpoints, DEMONSTRATIONS_FILENAME), encoding="utf-8") as f:
      found = {d["program"]: d for d in json.load(f)}
  except (OSError, ValueError):
    found = {}
  report: dict[str, Any] = {"programs": []}
  for program in config.programs:
    spec = GameSpec(program.name, load_workload(program.workload), program.hardware)
    speedups = {}
    for solver in PROGRAM_BASELINES:
      options = (
        {"time_limit_s": PROGRAM_EVO_SECONDS, "seed": config.seed} if solver == "evo" else {}
      )
      speedups[solver] = solve(spec.workload, spec.hardware, solver, **options).speedup
    best = found.get(program.name)
    improved = best is not None and best["source"] != "msa"
    agent = (
      return_speedup(config.game, best["episode_return"], speedups["msa"])
      if improved
      else speedups["msa"]
    )
    mapping = files.best_mapping(program.name) if improved else None
    report["programs"].append(
      {
        "program": program.name,
        "best_found": agent,
        "found_by": "agent" if improved else "msa (not improved on)",
        "mapping": mapping,
        **speedups,
      }
    )
    print_fn(
      f"{program.name}: best mapping found {agent:.3f}x ("
      + ", ".join(f"{s} {v:.3f}x" for s, v in speedups.items())
      + f"): {agent / speedups['msa']:.3f}x msa, {agent / speedups['bestfit']:.3f}x "
      f"bestfit, {agent / speedups['evo']:.3f}x evo"
      + (f"; {mapping} (and .png)" if mapping else "; the agent found nothing faster than msa")
    )
  write_text(os.path.join(workdir, "program_report.json"), json.dumps(report, indent=1))
  return report
