#!/usr/bin/env python
"""The agent's guided search without the network, its ablation: for each entry of a suite's
split, msa, then the agent's search over priorities (actors/agent.py `guided_search`) seeded
with msa's mapping alone, for what msa leaves of the time limit (the network's play takes none).
The agent keeps the faster of msa's mapping and the search's, so this does too. Writes JSON rows
and prints x msa (geomean, W/T/L, worst entry, slowest solve); with `--against DIR` (an
`evaluate` output directory that has the agent), also the agent over it, per entry paired.

  .venv/bin/python scripts/guided_search_without_network.py --suite realistic --time-limit 10 \\
      --out ablation.json --against evals/realistic-s1
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import numpy as np  # noqa: E402

from malloczero.actors.agent import guided_search  # noqa: E402
from malloczero.actors.games import GameSpec  # noqa: E402
from malloczero.common.errors import MalloczeroError  # noqa: E402
from malloczero.common.files import write_text  # noqa: E402
from malloczero.env.programs.suites import get_suite  # noqa: E402
from malloczero.env.solvers import solve  # noqa: E402


def measure(suite: str, split: str, time_limit: float, seed: int) -> list[dict]:
  """One row per entry: msa's speed-up over all-slow and solve time (its second solve, as
  `evaluate` times it), and the search's, both within `time_limit`."""
  rows = []
  for entry in get_suite(suite).split(split).entries:
    workload, hardware = entry.load()
    solve(workload, hardware, "msa")  # Its kernels' loading is not its time (`evaluate`).
    msa = solve(workload, hardware, "msa")
    started = time.perf_counter()
    found, info = guided_search(
      GameSpec(entry.name, workload, hardware),
      None,
      time_limit - msa.solve_time_s,
      seed,
      msa=msa.mapping,
    )
    searched_s = time.perf_counter() - started
    row = {
      "entry": entry.name,
      "msa_speedup": msa.mapping.speedup,
      "search_speedup": max(found.speedup, msa.mapping.speedup),
      "solve_s": msa.solve_time_s + searched_s,
      "evaluations": info["evaluations"],
    }
    print(
      f"{entry.name} {row['search_speedup'] / row['msa_speedup']:.4f} "
      f"{row['solve_s']:.2f} s, {row['evaluations']} decodes",
      flush=True,
    )
    rows.append(row)
  return rows


def summary(rows: list[dict], against: str | None) -> str:
  ratio = np.array([r["search_speedup"] / r["msa_speedup"] for r in rows])
  wins, losses = int(np.sum(ratio > 1.0005)), int(np.sum(ratio < 0.9995))
  lines = [
    f"{len(rows)} entries: without the network x msa {np.exp(np.mean(np.log(ratio))):.4f} "
    f"(W/T/L {wins}/{len(rows) - wins - losses}/{losses}, worst {ratio.min():.3f}), slowest "
    f"{max(r['solve_s'] for r in rows):.2f} s"
  ]
  if against:
    with open(os.path.join(against, "evaluation.json"), encoding="utf-8") as f:
      agent = {r["entry"]: r["agent_speedup"] for r in json.load(f)["rows"]}
    missing = [r["entry"] for r in rows if r["entry"] not in agent]
    if missing:
      raise MalloczeroError(f"{against} has no agent row for {missing[0]}")
    paired = np.array([agent[r["entry"]] / r["search_speedup"] for r in rows])
    lines.append(
      f"the agent over it: {100 * (np.exp(np.mean(np.log(paired))) - 1):+.2f}% "
      f"(entries better {int(np.sum(paired > 1.0005))}, worse {int(np.sum(paired < 0.9995))})"
    )
  return "\n".join(lines)


def main() -> int:
  parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
  parser.add_argument("--suite", default="realistic")
  parser.add_argument("--split", default="all")
  parser.add_argument("--time-limit", type=float, default=10.0)
  parser.add_argument("--seed", type=int, default=0)
  parser.add_argument("--out", help="JSON file for the rows")
  parser.add_argument("--against", help="an `evaluate --out` directory with the agent's rows")
  args = parser.parse_args()
  try:
    if args.against and not os.path.exists(os.path.join(args.against, "evaluation.json")):
      raise MalloczeroError(f"{args.against} has no evaluation.json")
    rows = measure(args.suite, args.split, args.time_limit, args.seed)
    if not rows:
      raise MalloczeroError(f"suite {args.suite!r} split {args.split!r} has no entries")
    print(summary(rows, args.against))
  except (MalloczeroError, OSError, KeyError, ValueError) as e:
    print(f"error: {e}", file=sys.stderr)
    return 2
  if args.out:
    write_text(args.out, json.dumps(rows, indent=1) + "\n")
  return 0


if __name__ == "__main__":
  sys.exit(main())
