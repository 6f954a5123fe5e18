"""`malloczero suite list | show NAME`: the built-in suites of programs."""

from __future__ import annotations

import argparse

from rich.table import Table

from malloczero.common.errors import MalloczeroError
from malloczero.common.units import human_bytes
from malloczero.env.hardware import describe_fast_levels
from malloczero.env.programs.suites import SPLITS
from malloczero.launch.flags import console


def add_parser(sub: argparse._SubParsersAction) -> None:
  p = sub.add_parser("suite", help="list the built-in suites or show one")
  p.add_argument("action", choices=("list", "show"))
  p.add_argument("name", nargs="?", help="suite to show")
  p.set_defaults(func=run)


def _list_table() -> Table:
  from malloczero.env.programs.suites import get_suite, suite_names

  table = Table(title="built-in suites")
  for col in ("suite", "entries", *SPLITS, "programs", "description"):
    table.add_column(col)
  for name in suite_names():
    suite = get_suite(name)
    table.add_row(
      name,
      str(len(suite.entries)),
      *(str(sum(e.split == split for e in suite.entries)) for split in SPLITS),
      str(len({e.program for e in suite.entries})),
      suite.description,
    )
  return table


def _show_table(name: str) -> Table:
  from malloczero.env.cost_model import CostModel
  from malloczero.env.programs.suites import get_suite, program_summaries
  from malloczero.env.requests import build_requests

  suite = get_suite(name)
  programs = program_summaries()
  table = Table(title=f"suite '{suite.name}': {suite.description}")
  for col in (
    "entry",
    "split",
    "hardware",
    "fast capacity",
    "ops",
    "buffers",
    "requests",
    "peak live",
  ):
    table.add_column(col, justify="left" if col in ("entry", "split", "hardware") else "right")
  for entry in suite.entries:
    workload, hw = entry.load()
    requests = len(build_requests(CostModel(workload, hw)))
    table.add_row(
      entry.name,
      entry.split,
      entry.hardware,
      f"{describe_fast_levels(hw)} ({entry.capacity_fraction:.0%})",
      str(workload.num_ops),
      str(workload.num_buffers),
      str(requests),
      human_bytes(programs[entry.program]["peak_live_bytes"]),
    )
  return table


def run(args: argparse.Namespace) -> int:
  if args.action == "show" and not args.name:
    raise MalloczeroError("'suite show' needs a suite name (see 'malloczero suite list')")
  console().print(_list_table() if args.action == "list" else _show_table(args.name))
  return 0
