"""`malloczero solve WORKLOAD`: one program mapped by a baseline, the trained agent or the better
of both; the mapping is validated, written and drawn."""

from __future__ import annotations

import argparse
import os
from typing import Optional

from malloczero.common.errors import MalloczeroError
from malloczero.common.files import check_distinct_files, check_output_file
from malloczero.env.hardware import resolve_hardware
from malloczero.env.solvers.registry import Solver
from malloczero.launch.flags import (
  HARDWARE_CHOICES,
  add_capacity_flag,
  add_solver_flags,
  msa_options,
  say_capacities,
  solver_options,
)
from malloczero.launch.hlo_input import REIMPORT_HELP, load_program
from malloczero.launch.solvers import ALL_SOLVERS


def add_parser(sub: argparse._SubParsersAction) -> None:
  p = sub.add_parser(
    "solve",
    help="map one program with a baseline, the trained agent or the "
    "better of both; validates the mapping, writes MAP.json and its picture",
  )
  p.add_argument(
    "workload",
    help="workload JSON (.json/.json.gz), MiniMalloc CSV or HLO text module (.hlo/.txt, "
    "imported on first use and cached)",
  )
  p.add_argument("--reimport", action="store_true", help=REIMPORT_HELP)
  p.add_argument(
    "--hardware",
    help=f"{HARDWARE_CHOICES}; required for a workload JSON (a "
    "MiniMalloc CSV defaults to minimalloc)",
  )
  add_capacity_flag(p, help_suffix="; required for a MiniMalloc CSV without --hardware")
  p.add_argument(
    "--solver",
    default="msa",
    choices=tuple(ALL_SOLVERS),
    help="; ".join(f"{s.name}: {s.summary}" for s in ALL_SOLVERS.values()) + " (default msa)",
  )
  p.add_argument("--out", help="write the validated mapping here (JSON)")
  p.add_argument("--plot", help="draw the memory map here (.png, .svg, .pdf, ...)")
  p.add_argument(
    "--xla-overrides",
    metavar="FILE.textproto",
    help="write XLA's msa overrides that steer it toward the mapping found: "
    "FILE.preferred_prefetch.textproto (PreferredPrefetchOverrides) and "
    "FILE.sort_order.textproto (MsaSortOrderOverrides), keyed by the module's instruction names; "
    "msa reads them back with --msa-option preferred_prefetch_overrides=... and "
    "sort_order_overrides=...",
  )
  add_solver_flags(p, ALL_SOLVERS.values())
  p.set_defaults(func=run)


def solve_line(solver: Solver, result) -> str:
  """What a solve placed, its time against all-slow and how long it took."""
  m = result.mapping
  if solver.segments:  # A buffer may have several segments: kept, evicted, prefetched back.
    buffers = len({a["buffer"] for a in m.allocations})
    placed = f"{len(m.allocations)} segments of {buffers} buffers in fast memory"
  else:
    placed = f"{len(m.allocations)} of {result.info['requests']} requests placed"
  return (
    f"{solver.name}: {placed}; "
    f"estimated {m.estimated_time_s * 1e3:.4g} ms vs {m.slow_only_time_s * 1e3:.4g} ms "
    f"all-slow (speed-up {m.speedup:.3f}x) in {result.solve_time_s:.2f} s; validated"
  )


def _agent_lines(solver: Solver, result) -> None:
  """The agent's line says which attempt won and, apart, the best of the network's own
  trajectories, its greedy play alone and its policy's alone (no msa mapping among them), so that
  what the network learned is never hidden behind msa or search; the portfolio adds msa's line
  and which won."""
  info = result.info
  won = (
    info["best_attempt"] if isinstance(info["best_attempt"], str) else f"#{info['best_attempt']}"
  )
  guided = (
    f", guided search {info['guided_speedup']:.3f}x ({info['guided_evaluations']} mappings in "
    f"{info['guided_s']:.1f} s of its {info['guided_budget_s']:.1f} s)"
    if "guided_speedup" in info
    else ""
  )
  cut = f"; {info['cut_short']}" if "cut_short" in info else ""
  proposal = (
    f", proposer alone {info['proposal_speedup']:.3f}x"
    if info.get("proposal_speedup") is not None
    else ""
  )
  print(
    solve_line(ALL_SOLVERS["agent"], result) + f" (checkpoint step {info['learner_steps']}, "
    f"{info['simulations']} simulations, best of {len(info['attempt_speedups'])} trajectories, msa"
    f"{' and the guided search' if guided else ''}: {won}; search alone "
    f"{_played(info['search_speedup'])}, greedy alone {_played(info['greedy_speedup'])}, policy "
    f"alone {_played(info['policy_speedup'])}{proposal}{guided}{cut})"
  )
  if solver.name == "portfolio":
    baseline = info["msa"]
    print(solve_line(ALL_SOLVERS["msa"], baseline))
    loser = info["search_speedup"] if info["winner"] == "msa" else baseline.mapping.speedup
    print(
      f"portfolio: {info['winner']} wins ({result.mapping.speedup:.3f}x vs {_played(loser)}); "
      "its mapping is the portfolio's"
    )


def _played(speedup: Optional[float]) -> str:
  """A trajectory's speed-up, or that the time limit cut it."""
  return "unfinished" if speedup is None else f"{speedup:.3f}x"


def _baseline_details(solver: Solver, info: dict) -> str:
  if "note" in info and not info.get("requests"):  # Solved trivially: the solver did not run.
    return f"; solved trivially: {info['note']}"
  if "cut_short" in info:  # A one-pass heuristic stopped by its time limit.
    return f"; cut short by the time limit ({info['cut_short'].removeprefix('time limit: ')})"
  if solver.name == "cpsat":
    return (
      f"; CP-SAT {info['status']}, proven bound {info['bound_s'] * 1e3:.4g} ms"
      + (f" ({info['fallback']})" if "fallback" in info else "")
      + f" ({info['bound_note']})"
    )
  if solver.name == "pack":
    from malloczero.env.solvers.packing import describe

    return describe(info)
  return ""


def run(args: argparse.Namespace) -> int:
  solver = ALL_SOLVERS[args.solver]
  hardware_file = args.hardware if args.hardware and os.path.isfile(args.hardware) else None
  overrides = {}
  if args.xla_overrides:
    from malloczero.env.msa.export_overrides import override_files

    overrides = override_files(args.xla_overrides)
  outputs = [("--out", args.out), ("--plot", args.plot)]
  outputs += [("--xla-overrides", path) for path in overrides.values()]
  check_distinct_files(outputs, [args.workload, hardware_file])
  for path in overrides.values():
    check_output_file(path, "--xla-overrides")
  if args.out:
    check_output_file(args.out)
  if args.plot:
    from malloczero.evaluation.plots import check_picture_path

    check_picture_path(args.plot)
  if solver.kind == "agent" and not args.checkpoint:
    raise MalloczeroError(
      f"--solver {solver.name} needs --checkpoint DIR (a training work directory or its checkpoint)"
    )
  if solver.kind != "agent" and args.checkpoint:
    raise MalloczeroError(f"--checkpoint is for --solver agent or portfolio, not {solver.name}")
  workload, _ = load_program(args.workload, args.reimport)
  hw = resolve_hardware(workload, args.hardware, args.capacity)
  say_capacities(args.capacity, hw)
  if solver.kind == "agent":
    result = solver.run(workload, hw, **solver_options(args, solver))
    _agent_lines(solver, result)
  else:
    from malloczero.env.solvers import solve

    result = solve(workload, hw, solver.name, **solver_options(args, solver))
    print(solve_line(solver, result) + _baseline_details(solver, result.info))
  if args.out:
    result.mapping.save(args.out)
    print(f"wrote {args.out}")
  if args.plot:
    from malloczero.evaluation.plots import plot_memory_map

    plot_memory_map(workload, hw, result.mapping, args.plot)
    print(f"wrote {args.plot}")
  if overrides:
    write_overrides(workload, hw, result, overrides, msa_options(getattr(args, "msa_option", None)))
  return 0


def write_overrides(workload, hw, result, paths: dict[str, str], options: dict) -> None:
  """The mapping found as XLA's overrides against msa's own mapping (with the same
  `--msa-option`s), both files written, and what they cannot express."""
  from malloczero.env.msa.algorithm import MsaAlgorithm, MsaOptions
  from malloczero.env.msa.export_overrides import export_overrides

  msa = MsaAlgorithm(workload, hw, MsaOptions(**options))
  exported = export_overrides(
    workload,
    result.mapping.to_arrays(workload),
    msa.run(),
    deferred=result.info.get("deferred", ()),
    deferred_order=msa.allocation_order(),
  )
  header = (
    f"# XLA memory-space-assignment overrides for {workload.name}, exported by malloczero "
    f"from the {result.mapping.solver} mapping\n"
  )
  exported.write(paths, header)
  print(
    f"wrote {paths['preferred_prefetch']} ({exported.prefetches} preferred prefetch starts) and "
    f"{paths['sort_order']} ({exported.deferred} buffers allocated last)"
  )
  if exported.not_expressible:
    missed = ", ".join(f"{n} {kind}" for kind, n in sorted(exported.not_expressible.items()))
    print(f"  uses that differ from msa's and that XLA's overrides cannot express: {missed}")
