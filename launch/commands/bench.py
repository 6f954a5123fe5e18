"""`malloczero bench`: speed of the game, the cost model and the agent (launch/benchmarks.py)."""

from __future__ import annotations

import argparse

from malloczero.common.files import check_output_file
from malloczero.launch.flags import console


def add_parser(sub: argparse._SubParsersAction) -> None:
  p = sub.add_parser(
    "bench",
    help="measure game steps/s, cost-model evaluations/s, search moves/s and learner updates/s",
  )
  p.add_argument("--quick", action="store_true", help="short run (about a minute)")
  p.add_argument(
    "--no-agent",
    action="store_true",
    help="only the game and the cost model (skip search, acting and learner)",
  )
  p.add_argument(
    "--no-scale",
    action="store_true",
    help="skip the inputs at trace scale (a 200,000-row CSV, 100,000-buffer programs, a loop)",
  )
  p.add_argument("--out", help="write the results as JSON to this file")
  # bench measures compile times: it compiles, without the persistent compilation cache.
  p.set_defaults(func=run, compilation_cache=False)


def run(args: argparse.Namespace) -> int:
  from malloczero.launch.benchmarks import report_table, run_bench, write_report

  if args.out:
    check_output_file(args.out)
  what = (
    "the game and the cost model"
    + ("" if args.no_scale else ", msa at scale")
    + (
      ""
      if args.no_agent
      else ", search, acting and learner"
      + ("" if args.quick else ", the agent at scale, and local_mp runs with 1 and 2 actors")
    )
  )
  with console(stderr=True).status(f"benchmarking {what}..."):
    report = run_bench(quick=args.quick, agent=not args.no_agent, scale=not args.no_scale)
  table = report_table(report, "malloczero bench" + (" --quick" if args.quick else ""))
  console().print(table)  # Before the file: a failed write does not lose the figures.
  if args.out:
    write_report(report, args.out)
    print(f"wrote {args.out}")
  return 0
