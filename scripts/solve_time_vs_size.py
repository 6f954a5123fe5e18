#!/usr/bin/env python
"""Measures solve time against program size: msa, evo and the agent at a time limit on programs
of 100 to 20,000 buffers (the corpus's and `realistic`'s, one entry per size band), each solve
timed as a user waits for it (the agent's includes msa and its games' builds; its search is
compiled first, outside the timing, as `evaluate` does; msa is timed on its second solve, after
its kernels' compilation). Writes a CSV and a plot.

  .venv/bin/python scripts/solve_time_vs_size.py --checkpoint runs/s1 --time-limit 10 \\
      --out docs/results/scale/solve-time-vs-size
"""

from __future__ import annotations

import argparse
import csv
import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from malloczero.actors.agent import compile_agent, load_agent, solve_with_agent  # noqa: E402
from malloczero.actors.games import GameSpec  # noqa: E402
from malloczero.env.programs.suites import get_suite  # noqa: E402
from malloczero.env.solvers import solve  # noqa: E402

# Size bands (buffers): the entry nearest each band's centre in log scale is measured.
BANDS = (100, 300, 1_000, 2_000, 3_500, 6_000, 10_000, 15_000, 20_000)


def pick_entries(hardware: str, fraction: float) -> list:
  """One entry per band from `corpus` and `realistic` on `hardware` at `fraction` of peak."""
  entries = [
    e
    for suite in ("corpus", "realistic")
    for e in get_suite(suite).split("all").entries
    if e.hardware == hardware and abs(e.capacity_fraction - fraction) < 1e-9
  ]
  sizes = {e.name: e.load()[0].num_buffers for e in entries}
  chosen = []
  for band in BANDS:
    best = min(entries, key=lambda e: abs(sizes[e.name] - band) / band)
    if best not in chosen:
      chosen.append(best)
  return sorted(chosen, key=lambda e: sizes[e.name])


def main() -> int:
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("--checkpoint", required=True)
  parser.add_argument("--time-limit", type=float, default=10.0)
  parser.add_argument("--hardware", default="tpu-v4i-like")
  parser.add_argument("--fraction", type=float, default=0.25)
  parser.add_argument("--out", required=True, help="path prefix: writes PREFIX.csv, PREFIX.png")
  args = parser.parse_args()
  agent = load_agent(args.checkpoint)
  rows = []
  for entry in pick_entries(args.hardware, args.fraction):
    workload, hardware = entry.load()
    spec = GameSpec(entry.name, workload, hardware)
    # msa's first solve at a new size pays its kernels' compilation: timed the second time.
    solve(workload, hardware, "msa")
    msa = solve(workload, hardware, "msa")
    evo = solve(workload, hardware, "evo", time_limit_s=args.time_limit, evaluations=100_000)
    compile_agent(agent, spec, simulations=32, attempts=1)
    started = time.perf_counter()
    result = solve_with_agent(
      agent, workload, hardware, simulations=32, attempts=1, time_limit=args.time_limit
    )
    wall = time.perf_counter() - started
    row = {
      "entry": entry.name,
      "buffers": workload.num_buffers,
      "msa_s": round(msa.solve_time_s, 3),
      "evo_s": round(evo.solve_time_s, 3),
      "agent_s": round(result.solve_time_s, 3),
      "agent_wall_s": round(wall, 3),
      "evo_vs_msa": round(msa.mapping.estimated_time_s / evo.mapping.estimated_time_s, 4),
      "agent_vs_msa": round(msa.mapping.estimated_time_s / result.mapping.estimated_time_s, 4),
      "network_played": result.info.get("policy_speedup") is not None,
    }
    print(row, flush=True)
    rows.append(row)
  os.makedirs(os.path.dirname(os.path.abspath(args.out)), exist_ok=True)
  with open(args.out + ".csv", "w", newline="") as f:
    writer = csv.DictWriter(f, fieldnames=list(rows[0]))
    writer.writeheader()
    writer.writerows(rows)
  import matplotlib

  matplotlib.use("Agg")
  import matplotlib.pyplot as plt

  fig, ax = plt.subplots(figsize=(7, 4))
  sizes = [r["buffers"] for r in rows]
  for key, label in (("agent_wall_s", "agent (wall)"), ("evo_s", "evo"), ("msa_s", "msa")):
    ax.plot(sizes, [r[key] for r in rows], marker="o", label=label)
  ax.axhline(args.time_limit, color="grey", linestyle="--", linewidth=1, label="time limit")
  ax.set_xscale("log")
  ax.set_yscale("log")
  ax.set_xlabel("buffers")
  ax.set_ylabel("solve time, s")
  ax.set_title(f"solve time against size ({args.hardware}, {args.fraction:g} of peak)")
  ax.legend()
  fig.tight_layout()
  fig.savefig(args.out + ".png", dpi=120)
  print(f"wrote {args.out}.csv and {args.out}.png")
  return 0


if __name__ == "__main__":
  sys.exit(main())
