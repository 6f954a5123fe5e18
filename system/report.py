"""The final evaluation report of a training run: the checkpoint's greedy play on every program of
the suite, beside the baselines, as workdir/report.md and workdir/report.json."""

from __future__ import annotations

import json
import os
import time
from typing import Any, Callable

from actors.evaluator import evaluate_params
from actors.games import suite_games
from configs.config import Config
from env.mapping import geomean
from learner.learner import CHECKPOINT_FILENAME, checkpoint_steps, load_params
from learner.networks import make_networks
from system.training import BASELINES, baseline_speedups

# Ratios within this of 1 count as ties with msa.
TIE_TOLERANCE = 1e-6


def write_final_report(config: Config, workdir: str,
                       print_fn: Callable[[str], None] = print) -> dict[str, Any]:
  """Evaluates workdir/checkpoints on the suite's train and held-out programs; returns the report."""
  checkpoint = os.path.join(workdir, "checkpoints", CHECKPOINT_FILENAME)
  steps = checkpoint_steps(checkpoint)
  params = load_params(checkpoint)
  networks = make_networks(config.network, config.game)
  splits = {s: suite_games(config.suite, s) for s in ("train", "heldout")}
  splits = {k: v for k, v in splits.items() if v}
  baselines = baseline_speedups([s for v in splits.values() for s in v], workdir, config.seed)
  print_fn(f"final evaluation of step {steps} on {sum(map(len, splits.values()))} programs "
           f"({config.search.eval_num_simulations} simulations, no noise)")
  started = time.monotonic()
  rows, summary = [], {}
  for split, specs in splits.items():
    results = evaluate_params(networks, params, config, specs, seed=config.seed)
    ratios = []
    for result in results:
      row = {"program": result.program, "split": split, "muzero": result.speedup}
      row.update({b: baselines[b][result.program] for b in BASELINES})
      row["muzero_vs_msa"] = result.speedup / row["msa"]
      ratios.append(row["muzero_vs_msa"])
      rows.append(row)
    summary[split] = {
        "programs": len(results),
        "muzero": geomean([r.speedup for r in results]),
        **{b: geomean([baselines[b][r.program] for r in results]) for b in BASELINES},
        "muzero_vs_msa": geomean(ratios),
        "wins": sum(r > 1 + TIE_TOLERANCE for r in ratios),
        "ties": sum(abs(r - 1) <= TIE_TOLERANCE for r in ratios),
        "losses": sum(r < 1 - TIE_TOLERANCE for r in ratios)}
  report = {"learner_steps": steps, "config": config.name, "suite": config.suite,
            "evaluation_simulations": config.search.eval_num_simulations,
            "created": time.strftime("%Y-%m-%dT%H:%M:%S"),
            "evaluation_s": round(time.monotonic() - started, 1),
            "summary": summary, "programs": rows}
  with open(os.path.join(workdir, "report.json"), "w", encoding="utf-8") as f:
    json.dump(report, f, indent=1)
  with open(os.path.join(workdir, "report.md"), "w", encoding="utf-8") as f:
    f.write(_markdown(report))
  for split, s in summary.items():
    print_fn(f"  {split}: muzero {s['muzero']:.3f}x, msa {s['msa']:.3f}x, greedy "
             f"{s['greedy']:.3f}x, bestfit {s['bestfit']:.3f}x; vs msa {s['muzero_vs_msa']:.3f}x "
             f"(wins {s['wins']}, ties {s['ties']}, losses {s['losses']} of {s['programs']})")
  print_fn(f"wrote {os.path.join(workdir, 'report.md')} and report.json")
  return report


def _markdown(report: dict[str, Any]) -> str:
  columns = ["muzero", *BASELINES]
  lines = [f"# Final evaluation: config `{report['config']}`, suite `{report['suite']}`, "
           f"learner step {report['learner_steps']}", "",
           f"Greedy play with {report['evaluation_simulations']} simulations per move, no noise. "
           "Speed-ups are over all-slow; geometric means per split.", "",
           "| split | programs | " + " | ".join(columns) + " | muzero vs msa | wins | ties | losses |",
           "|---|---|" + "---|" * (len(columns) + 4)]
  for split, s in report["summary"].items():
    lines.append(f"| {split} | {s['programs']} | " + " | ".join(f"{s[c]:.3f}" for c in columns)
                 + f" | {s['muzero_vs_msa']:.3f} | {s['wins']} | {s['ties']} | {s['losses']} |")
  lines += ["", "| program | split | " + " | ".join(columns) + " | muzero vs msa |",
            "|---|---|" + "---|" * (len(columns) + 1)]
  for r in sorted(report["programs"], key=lambda r: (r["split"], r["muzero_vs_msa"])):
    lines.append(f"| {r['program']} | {r['split']} | " + " | ".join(f"{r[c]:.3f}" for c in columns)
                 + f" | {r['muzero_vs_msa']:.3f} |")
  return "\n".join(lines) + "\n"
