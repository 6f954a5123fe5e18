#!/usr/bin/env python
"""How far evo's request space reaches toward msa's mapping: for each entry of a suite's split,
one decode (evo's decoder, env/solvers/evo.py) of the genomes that decode toward msa's mapping,
in the requests without the split of activations and with it (`split_activations`: any
overlap, and `WHOLE_KEPT`), with late prefetches too (`late_prefetches`: the best of all of
`mapping_genomes`), and with weights' spans and cuts too (`reshaped_groups`: evo's requests). A
decode below msa is mapping that evo's search starts from, and that the agent's guided search
starts from when the network plays msa. Writes JSON rows and prints x msa per column (geomean,
worst entry, entries below 0.97).

  .venv/bin/python scripts/msa_genome_decodes.py --suite realistic --out genomes.json
"""

from __future__ import annotations

import argparse
import json
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import numpy as np  # noqa: E402

from malloczero.common.errors import MalloczeroError  # noqa: E402
from malloczero.common.files import write_text  # noqa: E402
from malloczero.env.cost_model import CostModel  # noqa: E402
from malloczero.env.placement import Placement  # noqa: E402
from malloczero.env.programs.suites import get_suite  # noqa: E402
from malloczero.env.requests import build_requests  # noqa: E402
from malloczero.env.solvers import get_solver, solve  # noqa: E402
from malloczero.env.solvers.evo import (  # noqa: E402
  WHOLE_KEPT,
  decode,
  mapping_genomes,
  mapping_priorities,
)

COLUMNS = (
  "whole ranges",
  "split, any overlap",
  "split, whole kept",
  "split, better of two",
  "split and late prefetches, best of the genomes",
  "split, late prefetches, spans and cuts, best of evo's genomes",
)


def measure(suite: str, split: str) -> list[dict]:
  """One row per entry: msa's speed-up over all-slow and each column's (one decode each)."""
  rows = []
  for entry in get_suite(suite).split(split).entries:
    workload, hardware = entry.load()
    model = CostModel(workload, hardware)
    msa = solve(workload, hardware, "msa").mapping
    row = {"entry": entry.name, "msa": msa.speedup}

    def speedup(requests, genome) -> float:
      return model.slow_only_time / decode(Placement(model, requests), genome)

    whole_ranges = build_requests(model)
    split = build_requests(model, split_activations=True)
    late = build_requests(model, split_activations=True, late_prefetches=True)
    requests = get_solver("evo").requests(model)
    whole = speedup(whole_ranges, mapping_priorities(whole_ranges, msa, workload))
    loose = speedup(split, mapping_priorities(split, msa, workload))
    strict = speedup(split, mapping_priorities(split, msa, workload, whole_kept=WHOLE_KEPT))
    best = [max(speedup(r, g) for g in mapping_genomes(r, msa, workload)) for r in (late, requests)]
    row.update(zip(COLUMNS, (whole, loose, strict, max(loose, strict), *best)))
    row["evicting requests"] = int(np.sum(requests.evict_start >= 0))
    row["late prefetch requests"] = len(late) - len(split)
    row["span and cut requests"] = int(requests.reshaped.sum())
    print(entry.name, " ".join(f"{row[c] / row['msa']:.3f}" for c in COLUMNS), flush=True)
    rows.append(row)
  return rows


def table(rows: list[dict]) -> str:
  lines = ["| one decode of msa's genome | x msa (geomean) | worst entry | entries < 0.97 |"]
  lines.append("|---|---:|---:|---:|")
  for column in COLUMNS:
    ratio = np.array([r[column] / r["msa"] for r in rows])
    geomean = float(np.exp(np.mean(np.log(ratio))))
    lines.append(f"| {column} | {geomean:.3f} | {ratio.min():.3f} | {int(np.sum(ratio < 0.97))} |")
  return "\n".join(lines)


def main() -> int:
  parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
  parser.add_argument("--suite", default="realistic")
  parser.add_argument("--split", default="all")
  parser.add_argument("--out", help="JSON file for the rows")
  args = parser.parse_args()
  try:
    rows = measure(args.suite, args.split)
  except MalloczeroError as e:
    print(f"error: {e}", file=sys.stderr)
    return 2
  if not rows:
    print(f"error: suite {args.suite!r} split {args.split!r} has no entries", file=sys.stderr)
    return 2
  print(f"{len(rows)} entries\n" + table(rows))
  if args.out:
    write_text(args.out, json.dumps(rows, indent=1) + "\n")
  return 0


if __name__ == "__main__":
  sys.exit(main())
