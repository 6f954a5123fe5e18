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

from malloczero.configs.config import Config
from malloczero.env.programs.suites import SPLITS, get_suite
from malloczero.system.evaluation import (TIE_TOLERANCE, SuiteEvaluation, best_agent,
                                          evaluate_suite, load_agents, run_directory)
from malloczero.system.training import BASELINES

Formatter = Callable[[Any], str]


def _ms(v: float) -> str:
  return f"{v * 1e3:.4g} us" if v < 0.1 else f"{v:.4g} ms"


def _x(v: float) -> str:
  return f"{v:.3f}x"


def _percent(v: float) -> str:
  return f"{100 * v:.2f}%"


def columns(evaluation: SuiteEvaluation) -> list[tuple[str, str, Formatter]]:
  """(row key, header, formatter) of the per-program table."""
  cols: list[tuple[str, str, Formatter]] = [
      ("entry", "program", str), ("split", "split", str), ("requests", "requests", str),
      ("slow_only_ms", "all-slow", _ms)]
  has_bound = any("cpsat_bound_ms" in r for r in evaluation.rows)
  agents = {a.label for a in evaluation.agents}
  for name in evaluation.names:
    cols.append((f"{name}_ms", f"{name} time", _ms))
    if name != "msa":
      cols.append((f"{name}_vs_msa", f"{name} vs msa", _x))
    if has_bound and name in agents:
      cols.append((f"{name}_gap", f"{name} gap", _percent))
  if has_bound:
    cols += [("cpsat_status", "CP-SAT", str), ("cpsat_bound_ms", "bound", _ms),
             ("cpsat_gap", "CP-SAT gap", _percent)]
  cols += [(f"{name}_solve_s", f"{name} s", lambda v: f"{v:.2f}") for name in evaluation.names]
  return cols


def console_columns(evaluation: SuiteEvaluation) -> list[tuple[str, str, Formatter]]:
  """A narrower per-program table for the terminal: speed-ups only, and the agents' details."""
  agents = [a.label for a in evaluation.agents]
  has_bound = any("cpsat_bound_ms" in r for r in evaluation.rows)
  cols: list[tuple[str, str, Formatter]] = [("entry", "program", str), ("split", "split", str),
                                            ("requests", "requests", str)]
  cols += [(f"{name}_speedup", name, _x) for name in evaluation.names]
  cols += [(f"{name}_vs_msa", f"{name} vs msa", _x) for name in agents]
  if has_bound:
    cols += [("cpsat_status", "CP-SAT", lambda v: v.split(" ")[0])]
    cols += [(f"{name}_gap", f"{name} gap", _percent) for name in agents]
  cols += [(f"{name}_solve_s", f"{name} s", lambda v: f"{v:.2f}") for name in agents]
  return cols


def split_table(evaluation: SuiteEvaluation) -> tuple[list[str], list[list[str]]]:
  """Per split and solver: geomean speed-up, vs msa, wins / ties / losses, total solve time."""
  header = ["split", "solver", "programs", "geomean speed-up", "vs msa", "wins/ties/losses",
            "best vs msa", "worst vs msa", "solve s"]
  body = []
  for split, s in evaluation.summary.items():
    for name in evaluation.names:
      if name == "msa":
        versus = ["1.000x", "-", "-", "-"]
      else:
        versus = [_x(s[f"{name}_geomean_vs_msa"]),
                  f"{s[f'{name}_wins']}/{s[f'{name}_ties']}/{s[f'{name}_losses']}",
                  _x(s[f"{name}_best_vs_msa"]), _x(s[f"{name}_worst_vs_msa"])]
      body.append([split, name, str(s["entries"]), _x(s[f"{name}_geomean_speedup"]), *versus,
                   f"{s[f'{name}_total_solve_s']:.1f}"])
  return header, body


def quality_table(evaluation: SuiteEvaluation) -> tuple[list[str], list[list[str]]]:
  """Checkpoint by quality: one row per agent, best first."""
  splits = [s for s in SPLITS if s in evaluation.summary]
  header = ["checkpoint", "learner steps", "simulations", "attempts"]
  for split in splits:
    header += [f"{split} speed-up", f"{split} vs msa", f"{split} W/T/L"]
  header += ["mean solve s"]
  body = []
  overall = evaluation.summary["all"]
  for a in sorted(evaluation.agents, key=lambda a: -overall[f"{a.label}_geomean_speedup"]):
    line = [a.label, str(a.agent.learner_steps), str(a.simulations), str(a.attempts)]
    for split in splits:
      s = evaluation.summary[split]
      line += [_x(s[f"{a.label}_geomean_speedup"]), _x(s[f"{a.label}_geomean_vs_msa"]),
               f"{s[f'{a.label}_wins']}/{s[f'{a.label}_ties']}/{s[f'{a.label}_losses']}"]
    line.append(f"{overall[f'{a.label}_total_solve_s'] / overall['entries']:.2f}")
    body.append(line)
  return header, body


def _markdown_table(header: list[str], body: list[list[str]]) -> list[str]:
  return ["| " + " | ".join(header) + " |", "|" + "---|" * len(header),
          *("| " + " | ".join(line) + " |" for line in body)]


def write_report(evaluation: SuiteEvaluation, out_dir: str, title: str, stem: str = "evaluation",
                 picture_prefix: str = "", learning_curves: bool = True) -> list[str]:
  """Writes `{stem}.md/.csv/.json` and the pictures into out_dir; returns the paths written."""
  os.makedirs(out_dir, exist_ok=True)
  path = lambda name: os.path.join(out_dir, name)
  written = [_write_csv(evaluation, path(f"{stem}.csv"))]
  with open(path(f"{stem}.json"), "w", encoding="utf-8") as f:
    json.dump(evaluation.to_json(title), f, indent=1)
  written.append(path(f"{stem}.json"))
  written += _write_agent_mappings(evaluation, out_dir)
  pictures = _draw_pictures(evaluation, out_dir, picture_prefix, title, learning_curves)
  with open(path(f"{stem}.md"), "w", encoding="utf-8") as f:
    f.write(markdown(evaluation, title, pictures))
  return [path(f"{stem}.md")] + written + [path(p) for _, p in pictures]


def markdown(evaluation: SuiteEvaluation, title: str,
             pictures: list[tuple[str, str]] = ()) -> str:
  lines = [f"# {title}", ""]
  if evaluation.agents:
    lines += ["Agents: each checkpoint's networks with MCTS at test time; per program the fastest "
              "of `attempts` trajectories (the first greedy, the rest sampled with Gumbel noise) "
              "is kept. Every mapping has passed the independent validator.", "",
              *_markdown_table(["label", "checkpoint", "learner steps", "simulations",
                                "attempts", "compile s"],
                               [[a.label, f"`{a.agent.checkpoint}`", str(a.agent.learner_steps),
                                 str(a.simulations), str(a.attempts),
                                 f"{evaluation.compile_s[a.label]:.1f}"]
                                for a in evaluation.agents]),
              "", "Solve times exclude the one-off compilation of each agent's search "
              "(`compile s`).", ""]
  lines += ["## Summary per split", "",
            "Speed-ups are over all-slow (geometric means); `vs msa` is the geometric mean of "
            "msa time / solver time per program; wins / ties / losses are against msa; the gap "
            "is to CP-SAT's proven lower bound.", "",
            *_markdown_table(*split_table(evaluation)), ""]
  if len(evaluation.agents) > 1:
    lines += ["## Checkpoints by quality", "", *_markdown_table(*quality_table(evaluation)), ""]
  if evaluation.agents:
    agent = best_agent(evaluation).label
    losses = sorted((r for r in evaluation.rows if r[f"{agent}_vs_msa"] < 1 - TIE_TOLERANCE),
                    key=lambda r: r[f"{agent}_vs_msa"])
    lines += [f"## Programs where `{agent}` loses to msa ({len(losses)} of "
              f"{len(evaluation.rows)})", ""]
    lines += _markdown_table(
        ["program", "split", f"{agent}", "msa", f"{agent} vs msa"],
        [[r["entry"], r["split"], _x(r[f"{agent}_speedup"]), _x(r["msa_speedup"]),
          _x(r[f"{agent}_vs_msa"])] for r in losses]) if losses else ["None."]
    lines.append("")
  cols = columns(evaluation)
  lines += ["## Per program", "",
            *_markdown_table([h for _, h, _ in cols],
                             [[fmt(r[k]) if k in r else "" for k, _, fmt in cols]
                              for r in evaluation.rows]), ""]
  if pictures:
    lines += ["## Pictures", ""] + [f"![{caption}]({name})" for caption, name in pictures]
  return "\n".join(lines) + "\n"


def mapping_file(out_dir: str, label: str, program: str) -> str:
  """Where `write_report` puts an agent's validated mapping of one program."""
  safe = lambda text: re.sub(r"[^A-Za-z0-9._-]+", "_", text)
  return os.path.join(out_dir, "mappings", safe(label), f"{safe(program)}.json")


def _write_agent_mappings(evaluation: SuiteEvaluation, out_dir: str) -> list[str]:
  """Each agent's mapping of each program, for `malloczero validate` or a compiler to use."""
  for agent in evaluation.agents:
    for row in evaluation.rows:
      path = mapping_file(out_dir, agent.label, row["entry"])
      os.makedirs(os.path.dirname(path), exist_ok=True)
      evaluation.mappings[(row["entry"], agent.label)].save(path)
  return [os.path.join(out_dir, "mappings")] if evaluation.agents else []


def _write_csv(evaluation: SuiteEvaluation, path: str) -> str:
  keys = list(dict.fromkeys(k for r in evaluation.rows for k in r))
  with open(path, "w", newline="", encoding="utf-8") as f:
    writer = csv.DictWriter(f, fieldnames=keys)
    writer.writeheader()
    writer.writerows(evaluation.rows)
  return path


def _draw_pictures(evaluation: SuiteEvaluation, out_dir: str, prefix: str, title: str,
                   learning_curves: bool) -> list[tuple[str, str]]:
  """(caption, file name) of each picture drawn."""
  from malloczero.system.plots import (plot_learning_curves, plot_memory_maps, plot_ratio_bars,
                            plot_speedups)
  pictures = []
  name = f"{prefix}speedups.png"
  plot_speedups(evaluation.rows, evaluation.names, os.path.join(out_dir, name), title)
  pictures.append(("speed-up of every solver on every program", name))
  if not evaluation.agents:
    return pictures
  agent = best_agent(evaluation).label
  name = f"{prefix}{'agent' if len(evaluation.agents) == 1 else 'best_agent'}_vs_msa.png"
  plot_ratio_bars(evaluation.rows, agent, os.path.join(out_dir, name),
                  f"{agent} against msa per program (above 1: the agent's mapping is faster)")
  pictures.append((f"{agent} vs msa per program", name))
  ranked = sorted(evaluation.rows, key=lambda r: r[f"{agent}_vs_msa"])
  for which, row in (("best", ranked[-1]), ("worst", ranked[0])):
    spec = evaluation.specs[row["entry"]]
    name = f"{prefix}memory_map_{which}.png"
    plot_memory_maps(spec.workload, spec.hardware, [evaluation.mappings[(row["entry"], agent)],
                                          evaluation.mappings[(row["entry"], "msa")]],
                     os.path.join(out_dir, name),
                     f"{row['entry']}: {agent}'s {which} program against msa "
                     f"({row[f'{agent}_vs_msa']:.3f}x msa)")
    pictures.append((f"memory maps of the {which} program, {agent} beside msa", name))
  if learning_curves:
    workdirs = {a.label: run_directory(a.agent.checkpoint) for a in evaluation.agents}
    references = {split: {s: evaluation.summary[split][f"{s}_geomean_speedup"]
                          for s in ("msa", "bestfit") if f"{s}_geomean_speedup" in
                          evaluation.summary[split]}
                  for split in SPLITS if split in evaluation.summary}
    name = f"{prefix}learning_curve.png"
    if plot_learning_curves(workdirs, references, os.path.join(out_dir, name),
                            f"learning curves of the evaluated runs (suite '{evaluation.suite}')"):
      pictures.append(("learning curve from the runs' logs", name))
  return pictures


def write_final_report(config: Config, workdir: str,
                       print_fn: Callable[[str], None] = print) -> dict[str, Any]:
  """Evaluates workdir's checkpoint on every program of the run's suite; returns the report."""
  agent = load_agents([workdir], simulations=config.search.eval_num_simulations, attempts=1)[0]
  suite = get_suite(config.suite)
  print_fn(f"final evaluation of step {agent.agent.learner_steps} on {len(suite.entries)} "
           f"programs ({agent.simulations} simulations, greedy, no noise) beside "
           f"{', '.join(BASELINES)}")
  evaluation = evaluate_suite(suite, BASELINES, [agent], _random_seed(config.seed),
                              batch_agents=True, seed=config.seed)
  title = (f"Final evaluation: config `{config.name}`, suite `{config.suite}`, learner step "
           f"{agent.agent.learner_steps}")
  write_report(evaluation, workdir, title, stem="report", picture_prefix="report_",
               learning_curves=False)
  for split in SPLITS:
    s = evaluation.summary.get(split)
    if s:
      print_fn(f"  {split}: agent {s['agent_geomean_speedup']:.3f}x, "
               + ", ".join(f"{b} {s[f'{b}_geomean_speedup']:.3f}x" for b in BASELINES)
               + f"; vs msa {s['agent_geomean_vs_msa']:.3f}x (wins {s['agent_wins']}, ties "
               f"{s['agent_ties']}, losses {s['agent_losses']} of {s['entries']})")
  print_fn(f"wrote {os.path.join(workdir, 'report.md')} (with report.json, report.csv and "
           "pictures)")
  return evaluation.to_json(title)


def _random_seed(seed: int) -> Callable[[str], dict]:
  return lambda solver: {"seed": seed} if solver == "random" else {}


def summary_rows(report: dict[str, Any], label: str = "agent",
                 baselines: Optional[tuple[str, ...]] = None) -> list[list[str]]:
  """Console table of a final report: per split, the agent and baselines' geomeans and W/T/L."""
  baselines = baselines or tuple(s for s in report["solvers"])
  body = []
  for split in SPLITS:
    s = report["summary"].get(split)
    if s:
      body.append([split, str(s["entries"]), _x(s[f"{label}_geomean_speedup"]),
                   *(_x(s[f"{b}_geomean_speedup"]) for b in baselines),
                   _x(s[f"{label}_geomean_vs_msa"]),
                   f"{s[f'{label}_wins']}/{s[f'{label}_ties']}/{s[f'{label}_losses']}"])
  return body
