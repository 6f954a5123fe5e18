"""`malloczero validate WORKLOAD MAPPING`: checks a mapping independently; exit 0 if valid."""

from __future__ import annotations

import argparse

from malloczero.env.hardware import resolve_hardware
from malloczero.env.mapping import load_mapping
from malloczero.env.validator import validate_mapping
from malloczero.launch.flags import HARDWARE_CHOICES, add_capacity_flag, say_capacities
from malloczero.launch.hlo_input import REIMPORT_HELP, load_program


def add_parser(sub: argparse._SubParsersAction) -> None:
  p = sub.add_parser("validate", help="check a mapping independently; exit 0 if valid")
  p.add_argument(
    "workload",
    help="workload JSON (.json/.json.gz), MiniMalloc CSV or HLO text module (.hlo/.txt, "
    "imported on first use and cached)",
  )
  p.add_argument("mapping", help="MAP.json written by a solver")
  p.add_argument("--reimport", action="store_true", help=REIMPORT_HELP)
  p.add_argument(
    "--hardware", help=f"{HARDWARE_CHOICES}; default: the hardware recorded in the mapping"
  )
  add_capacity_flag(p)
  p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
  workload, _ = load_program(args.workload, args.reimport)
  mapping = load_mapping(args.mapping)
  hw = resolve_hardware(workload, args.hardware, args.capacity, fallback=mapping.hardware)
  say_capacities(args.capacity, hw)
  report = validate_mapping(workload, hw, mapping)
  print(
    f"valid: {report.num_allocations} allocations on '{hw.name}', estimated "
    f"{report.estimated_time_s * 1e3:.4g} ms vs {report.slow_only_time_s * 1e3:.4g} ms "
    f"all in slow memory (speed-up {report.speedup:.3f}x)"
  )
  return 0
