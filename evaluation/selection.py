"""Checkpoint selection on training programs only.

Greedy play drifts between evaluations of one run: on the default suite a run's held-out curve
alternates between msa's geomean and a program's 1.49x gain from one evaluation to the next
(docs/results/archive.md 3.1). The final evaluation therefore reports, among the last few
checkpoints the learner kept (`Config.select_checkpoints`, one every `eval_every_steps`), the one
whose greedy play is fastest on the *training* programs. Held-out programs never take part in the
choice, so the held-out figures stay an honest test.
"""

from __future__ import annotations

import json
import os
import time
from typing import Any, Callable

from malloczero.actors.agent import load_agent
from malloczero.actors.games import program_specs
from malloczero.actors.greedy_play import play_programs, with_simulations
from malloczero.common.files import write_text
from malloczero.configs.config import Config
from malloczero.configs.workdir import WorkDir
from malloczero.evaluation.baselines import baseline_speedups
from malloczero.evaluation.suite import geomean
from malloczero.learner.checkpoint import (
  candidate_checkpoints,
  check_params_fit,
  checkpoint_steps,
  load_params,
)

__all__ = ["select_checkpoint"]


def select_checkpoint(config: Config, workdir: str, print_fn: Callable[[str], None] = print) -> str:
  """The checkpoint file the final evaluation should report: the run's final checkpoint and the
  newest `config.select_checkpoints - 1` kept before it, each played greedily once (the
  evaluation search, `config.search.eval_num_simulations` simulations) on the training
  programs; the highest geomean speed-up wins, ties going to the latest. Writes what it measured
  to `workdir/candidates/selection.json`. With selection off, or nothing kept, the final
  checkpoint."""
  files = WorkDir(workdir)
  final = files.learner_state
  final_steps = checkpoint_steps(final)
  kept = [(s, f) for s, f in candidate_checkpoints(files.candidates) if s < final_steps]
  kept = kept[-(config.select_checkpoints - 1) :] if config.select_checkpoints > 1 else []
  specs = program_specs(config, "train")
  if not kept or not specs:
    return final
  msa = geomean(baseline_speedups(specs, workdir, config.seed)["msa"][s.name] for s in specs)
  # One run's checkpoints share its networks and search settings: built once, the evaluation
  # search compiles once (a fresh `make_networks` per checkpoint would compile it again).
  agent = load_agent(final)
  search = with_simulations(agent.search, config.search.eval_num_simulations)
  rows: list[dict[str, Any]] = []
  for steps, file in [*kept, (final_steps, final)]:
    start = time.perf_counter()
    params = agent.params if file == final else load_params(file)
    check_params_fit(agent.networks, params, file)
    results = play_programs(agent.networks, params, search, agent.game, specs, seed=config.seed)
    speedup = geomean(r.greedy_speedup for r in results)
    rows.append(
      {
        "learner_steps": steps,
        "checkpoint": file,
        "train_greedy_geomean": speedup,
        "vs_msa": speedup / msa,
        "seconds": round(time.perf_counter() - start, 1),
      }
    )
  # max() keeps the first of equals, so scanning newest first gives ties to the latest.
  chosen = max(reversed(rows), key=lambda r: r["train_greedy_geomean"])
  write_text(
    files.selection,
    json.dumps(
      {
        "selected_steps": chosen["learner_steps"],
        "selected_checkpoint": chosen["checkpoint"],
        "split": "train",
        "programs": len(specs),
        "msa_geomean": msa,
        "candidates": rows,
      },
      indent=1,
    ),
  )
  print_fn(
    f"checkpoint selection on the {len(specs)} training programs (greedy play; msa "
    f"{msa:.3f}x): "
    + ", ".join(f"step {r['learner_steps']} {r['train_greedy_geomean']:.3f}x" for r in rows)
    + f" -> step {chosen['learner_steps']} ({os.path.relpath(chosen['checkpoint'], workdir)})"
  )
  return chosen["checkpoint"]
