"""How much of a search's gain over msa survives the trip back into XLA as msa's own overrides.

For every entry of a suite: evo-msa (the evolution over msa's own decisions, env/solvers/evo_msa.py)
searches for `--time-limit` seconds; its mapping is exported as XLA's `PreferredPrefetchOverrides`
and `MsaSortOrderOverrides` (env/msa/export_overrides.py), written as text files, and msa is run
again reading them back (`sort_order_overrides`, `preferred_prefetch_overrides`), as XLA would.
Each row: msa's time, the mapping's and the round trip's speed-up over msa, the share of the
mapping's gain the round trip keeps, the search's deviations from msa by kind (a use left in
default memory or evicted, kept, prefetched from another start), the overrides written, and the
uses whose service differs from msa's in a way the overrides cannot express.

  .venv/bin/python scripts/xla_round_trip.py --suite default --time-limit 5 --out docs/results/xla
"""

from __future__ import annotations

import argparse
import csv
import json
import math
import os
import sys
import tempfile
import time
from collections.abc import Sequence

# Within this share of the mapping's speed-up over msa, the round trip reproduces it.
REPRODUCED = 0.01


def deviation_kinds(deviations: Sequence[Sequence[int]], max_prefetch_starts: int) -> dict:
  """evo-msa's deviations ([buffer, use, slot] rows) counted by what the slot does."""
  kinds = {"default or evict": 0, "keep": 0, "prefetch start": 0}
  for _, _, slot in deviations:
    kinds["default or evict" if slot == 0 else "keep" if slot == 1 else "prefetch start"] += 1
  del max_prefetch_starts  # Every prefetch slot, of any level and start, is one kind here.
  return kinds


def round_trip(entry, time_limit: float, seed: int, directory: str) -> dict:
  """One entry's row (the module docstring)."""
  from malloczero.env.cost_model import CostModel
  from malloczero.env.msa.algorithm import MsaAlgorithm, MsaOptions
  from malloczero.env.msa.decision import DEFAULT_PREFETCH_STARTS
  from malloczero.env.msa.export_overrides import export_overrides, override_files
  from malloczero.env.solvers.evo_msa import evo_msa

  workload, hardware = entry.load()
  model = CostModel(workload, hardware)
  msa = MsaAlgorithm(workload, hardware)
  msa_allocations = msa.run()
  msa_time = model.evaluate(msa_allocations).total_time_s
  started = time.perf_counter()
  mapping, info = evo_msa(model, time_limit_s=time_limit, seed=seed)
  found = mapping.to_arrays(workload)
  found_time = model.evaluate(found).total_time_s
  exported = export_overrides(workload, found, msa_allocations)
  files = override_files(os.path.join(directory, entry.name.replace("/", "_")))
  exported.write(files)
  options = MsaOptions(
    preferred_prefetch_overrides=files["preferred_prefetch"],
    sort_order_overrides=files["sort_order"],
  )
  back = MsaAlgorithm(workload, hardware, options).run()
  back_time = model.evaluate(back).total_time_s
  found_gain, back_gain = msa_time / found_time, msa_time / back_time
  kept = (back_gain - 1) / (found_gain - 1) if found_gain > 1 + 1e-12 else math.nan
  return {
    "entry": entry.name,
    "buffers": workload.num_buffers,
    "msa_ms": msa_time * 1e3,
    "mapping_vs_msa": found_gain,
    "round_trip_vs_msa": back_gain,
    "kept": kept,
    "reproduced": abs(back_gain - found_gain) <= REPRODUCED * found_gain,
    "deviations": len(info["deviations"]),
    **{
      f"deviations_{k}": v
      for k, v in deviation_kinds(info["deviations"], DEFAULT_PREFETCH_STARTS).items()
    },
    "overrides_prefetch": exported.prefetches,
    "not_expressible": dict(exported.not_expressible),
    "seconds": time.perf_counter() - started,
  }


def markdown(rows: list[dict]) -> str:
  """The table, and a summary line."""
  lines = [
    "| entry | buffers | mapping x msa | round trip x msa | kept | within 1% | deviations "
    "(default/keep/start) | prefetch overrides | uses not expressible |",
    "|---|---:|---:|---:|---:|---|---|---:|---|",
  ]
  for r in rows:
    missed = ", ".join(f"{n} {k}" for k, n in sorted(r["not_expressible"].items())) or "-"
    kept = "-" if math.isnan(r["kept"]) else f"{r['kept']:.2f}"
    lines.append(
      f"| {r['entry']} | {r['buffers']:,} | {r['mapping_vs_msa']:.4f} | "
      f"{r['round_trip_vs_msa']:.4f} | {kept} | {'yes' if r['reproduced'] else 'no'} | "
      f"{r['deviations']} ({r['deviations_default or evict']}/{r['deviations_keep']}/"
      f"{r['deviations_prefetch start']}) | {r['overrides_prefetch']} | {missed} |"
    )
  gm = lambda xs: math.exp(sum(map(math.log, xs)) / len(xs))  # noqa: E731
  gained = [r for r in rows if r["mapping_vs_msa"] > 1 + 1e-9]
  lines.append("")
  lines.append(
    f"{len(rows)} entries: mapping {gm([r['mapping_vs_msa'] for r in rows]):.4f}x msa, round "
    f"trip {gm([r['round_trip_vs_msa'] for r in rows]):.4f}x (geomean); the round trip is within "
    f"1% of the mapping on {sum(r['reproduced'] for r in rows)} of {len(rows)}; of the "
    f"{len(gained)} where the mapping beats msa, within 1% on "
    f"{sum(r['reproduced'] for r in gained)}, at least msa on "
    f"{sum(r['round_trip_vs_msa'] >= 1 - 1e-9 for r in gained)}."
  )
  return "\n".join(lines) + "\n"


def main(argv: Sequence[str] | None = None) -> int:
  """The command (`scripts/xla_round_trip.py`); returns the exit status."""
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("--suite", default="default")
  parser.add_argument("--split", default="all", choices=("all", "train", "heldout"))
  parser.add_argument("--time-limit", type=float, default=5.0, help="evo-msa's seconds per entry")
  parser.add_argument("--seed", type=int, default=0)
  parser.add_argument("--limit", type=int, help="the first N entries only")
  parser.add_argument("--out", help="directory for round_trip.{csv,json,md} and the overrides")
  args = parser.parse_args(argv)

  from malloczero.common.errors import MalloczeroError
  from malloczero.env.programs.suites import get_suite

  try:
    entries = get_suite(args.suite).split(args.split).entries[: args.limit]
  except MalloczeroError as e:
    print(f"error: {e}", file=sys.stderr)
    return 2
  out = args.out or tempfile.mkdtemp(prefix="xla-round-trip-")
  overrides = os.path.join(out, "overrides")
  os.makedirs(overrides, exist_ok=True)
  rows = []
  for i, entry in enumerate(entries, 1):
    rows.append(round_trip(entry, args.time_limit, args.seed, overrides))
    r = rows[-1]
    print(
      f"[{i}/{len(entries)}] {entry.name}: mapping {r['mapping_vs_msa']:.4f}x msa, round trip "
      f"{r['round_trip_vs_msa']:.4f}x ({r['seconds']:.0f} s)",
      file=sys.stderr,
      flush=True,
    )
  table = markdown(rows)
  print(table)
  with open(os.path.join(out, "round_trip.md"), "w", encoding="utf-8") as f:
    f.write(table)
  with open(os.path.join(out, "round_trip.json"), "w", encoding="utf-8") as f:
    json.dump({"suite": args.suite, "time_limit_s": args.time_limit, "rows": rows}, f, indent=1)
  with open(os.path.join(out, "round_trip.csv"), "w", newline="", encoding="utf-8") as f:
    writer = csv.DictWriter(f, fieldnames=[k for k in rows[0] if k != "not_expressible"])
    writer.writeheader()
    writer.writerows([{k: v for k, v in r.items() if k != "not_expressible"} for r in rows])
  print(f"wrote {out}/round_trip.{{md,json,csv}}", file=sys.stderr)
  return 0
