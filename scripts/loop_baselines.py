#!/usr/bin/env python
"""Baselines on the built-in suites' entries whose programs have loops (an op with `loop_depth`
above 0), with msa twice: as it is (XLA's loop rules, docs/msa.md "Loops") and on the same
program with every `loop_depth` cleared (msa without the loop rules: every op at its whole weight,
no while multiplier, prefetches from any depth). Prints a markdown table and writes JSON.

  .venv/bin/python scripts/loop_baselines.py --out loops.json [--time-limit 10]
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from malloczero.env.programs.suites import get_suite, suite_names  # noqa: E402
from malloczero.env.solvers import solve  # noqa: E402
from malloczero.env.workload import Workload  # noqa: E402

SOLVERS = ("msa", "msa-no-loop-rules", "evo-msa", "greedy", "bestfit", "evo")


def without_loop_depths(workload: Workload) -> Workload:
  return dataclasses.replace(
    workload, ops=tuple(dataclasses.replace(op, loop_depth=0) for op in workload.ops)
  )


def main() -> int:
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("--out", required=True, help="JSON file of the rows")
  parser.add_argument("--time-limit", type=float, default=10.0, help="for evo and evo-msa")
  args = parser.parse_args()
  rows = []
  for suite in suite_names():
    for entry in get_suite(suite).entries:
      workload, machine = entry.load()
      if not any(op.loop_depth for op in workload.ops):
        continue
      row: dict = {"suite": suite, "entry": entry.name}
      for solver in SOLVERS:
        options = {"time_limit_s": args.time_limit} if solver in ("evo", "evo-msa") else {}
        program = workload
        if solver == "msa-no-loop-rules":
          program, solver_name = without_loop_depths(workload), "msa"
        else:
          solver_name = solver
        started = time.perf_counter()
        row[solver] = solve(program, machine, solver_name, **options).mapping.speedup
        row[f"{solver}_s"] = time.perf_counter() - started
      print(json.dumps(row), file=sys.stderr, flush=True)
      rows.append(row)
  with open(args.out, "w", encoding="utf-8") as f:
    json.dump(rows, f, indent=1)
  print("| entry | " + " | ".join(SOLVERS) + " |")
  print("|---|" + "---|" * len(SOLVERS))
  for row in rows:
    print(f"| `{row['entry']}` | " + " | ".join(f"{row[s]:.3f}" for s in SOLVERS) + " |")
  return 0


if __name__ == "__main__":
  sys.exit(main())
