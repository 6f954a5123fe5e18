#!/usr/bin/env python
"""Compares two versions of the built-in suites' programs (a copy of env/programs/data made before
regenerating them, and the data as it is now): which programs changed (buffers, live ranges,
bytes, flops, weights; renamed ops alone do not count), and the baselines on every suite entry
whose program changed, before and after.

  cp -r env/programs/data /tmp/data-before && .venv/bin/python scripts/make_suites.py --force
  .venv/bin/python scripts/compare_suite_versions.py /tmp/data-before --out compare.json \\
      [--solvers msa,greedy,bestfit,pack,evo,evo-msa] [--time-limit 10]
"""

from __future__ import annotations

import argparse
import json
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import numpy as np  # noqa: E402

from malloczero.common.errors import MalloczeroError  # noqa: E402
from malloczero.env.hardware import PRESETS  # noqa: E402
from malloczero.env.programs.suites import DATA_DIR  # noqa: E402
from malloczero.env.programs.synthetic import contended  # noqa: E402
from malloczero.env.programs.user_suites import load_builtin_suites  # noqa: E402
from malloczero.env.solvers import solve  # noqa: E402
from malloczero.env.workload import Workload  # noqa: E402
from malloczero.env.workload_json import load_workload  # noqa: E402

TIMED = ("pack", "evo", "evo-msa", "cpsat")


def structure(w: Workload) -> tuple:
  """What a solver sees of a workload, op names left out."""
  a = w.arrays
  return (
    a.sizes.tolist(),
    a.live_start.tolist(),
    a.live_end.tolist(),
    a.incidence_op.tolist(),
    np.round(a.incidence_bytes).tolist(),
    np.round(a.flops).tolist(),
    [o.weight for o in w.ops],
    [o.loop_depth for o in w.ops],
  )


def summary(w: Workload) -> dict:
  return {"ops": w.num_ops, "buffers": w.num_buffers, "peak_live_bytes": w.peak_live_bytes}


def main() -> int:
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("before", help="a copy of env/programs/data before regenerating")
  parser.add_argument("--out", required=True, help="JSON file of the comparison")
  parser.add_argument("--solvers", default="msa,greedy,bestfit,pack,evo,evo-msa")
  parser.add_argument("--time-limit", type=float, default=10.0, help="for pack, evo, evo-msa")
  args = parser.parse_args()
  now_dir = DATA_DIR
  manifest = load_builtin_suites()
  programs = {}
  for name in sorted(manifest["programs"]):
    old_path = os.path.join(args.before, "workloads", f"{name}.json.gz")
    if not os.path.exists(old_path):
      programs[name] = {"status": "new"}
      continue
    old, new = (
      load_workload(old_path),
      load_workload(os.path.join(now_dir, "workloads", f"{name}.json.gz")),
    )
    changed = structure(old) != structure(new)
    renamed = [o.name for o in old.ops] != [o.name for o in new.ops]
    programs[name] = {
      "status": "changed" if changed else ("renamed" if renamed else "same"),
      "before": summary(old),
      "after": summary(new),
    }
    print(name, programs[name]["status"], flush=True)
  entries = []
  for suite, spec in manifest["suites"].items():
    for entry in spec["entries"]:
      if programs[entry["program"]]["status"] != "changed":
        continue
      row = {"suite": suite, "entry": entry["name"], "split": entry["split"]}
      for label, data in (("before", args.before), ("after", now_dir)):
        w = load_workload(os.path.join(data, "workloads", f"{entry['program']}.json.gz"))
        machine = contended(PRESETS[entry["hardware"]], w, entry["capacity_fraction"])
        for solver in args.solvers.split(","):
          options = {"time_limit_s": args.time_limit} if solver in TIMED else {}
          if solver == "evo":
            options["evaluations"] = 100_000
          try:
            row[f"{label}_{solver}"] = solve(w, machine, solver, **options).mapping.speedup
          except MalloczeroError as e:
            row[f"{label}_{solver}"] = f"refused: {e}"
      print(row, flush=True)
      entries.append(row)
  with open(args.out, "w", encoding="utf-8") as f:
    json.dump({"programs": programs, "entries": entries}, f, indent=1)
  print(f"wrote {args.out}: {sum(p['status'] == 'changed' for p in programs.values())} changed")
  return 0


if __name__ == "__main__":
  sys.exit(main())
