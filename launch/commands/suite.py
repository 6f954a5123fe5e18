"""`malloczero suite list | show NAME|SUITE.json | make DIR`: the built-in suites of programs, and
suites made of a directory of the user's own programs (env/programs/user_suites.py)."""

from __future__ import annotations

import argparse
import json

from rich.table import Table

from malloczero.common.errors import MalloczeroError
from malloczero.common.units import human_bytes
from malloczero.env.hardware import describe_fast_levels
from malloczero.env.programs.suites import SPLITS
from malloczero.launch.flags import FlagError, console, positive_fractions, share

MAKE_FLAGS = ("hardware", "capacities", "heldout", "seed", "out", "suite_name")


def add_parser(sub: argparse._SubParsersAction) -> None:
  p = sub.add_parser(
    "suite",
    help="list the built-in suites, show one, or make a suite of a directory of programs",
    description="list: the built-in suites; show NAME|SUITE.json: every entry of one; make DIR: "
    "a suite of DIR's programs (.hlo/.txt HLO modules, .json/.json.gz workloads, .csv "
    "MiniMalloc problems) on each --hardware at each --capacities fraction of each program's "
    "peak, a --heldout share of the programs held out, written to --out for `train --suite` "
    "and `evaluate --suite`",
  )
  p.add_argument("action", choices=("list", "show", "make"))
  p.add_argument("name", nargs="?", help="show: a suite name or manifest; make: the directory")
  p.add_argument(
    "--hardware",
    help="make: machines, comma-separated presets or hardware JSON files (e.g. "
    "tpu-v4i-like,nnpi-like)",
  )
  p.add_argument(
    "--capacities",
    type=positive_fractions,
    help="make: fast capacities as fractions of each program's peak live bytes (default 0.1,0.25)",
  )
  p.add_argument(
    "--heldout",
    type=share,
    help="make: share of the programs held out for evaluation (default 0.25)",
  )
  p.add_argument("--seed", type=int, help="make: seed of the held-out draw (default 0)")
  p.add_argument("--out", help="make: the manifest to write (SUITE.json)")
  p.add_argument(
    "--name", dest="suite_name", help="make: the suite's name (default: --out's file name)"
  )
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
  from malloczero.env.programs.suites import get_suite
  from malloczero.env.requests import build_requests

  suite = get_suite(name)
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
      human_bytes(workload.peak_live_bytes),
    )
  return table


def _make(args: argparse.Namespace) -> int:
  from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

  from malloczero.common.files import check_output_file, write_text
  from malloczero.env.programs.user_suites import make_suite

  if not args.name:
    raise FlagError("'suite make' needs the directory of programs: malloczero suite make DIR ...")
  if not args.hardware:
    raise FlagError("'suite make' needs --hardware (e.g. tpu-v4i-like or tpu-v4i-like,nnpi-like)")
  if not args.out:
    raise FlagError("'suite make' needs --out SUITE.json, the manifest to write")
  if not args.out.endswith(".json"):
    raise FlagError(f"--out {args.out}: a suite manifest is a .json file")
  check_output_file(args.out)
  out = console(stderr=True)
  with Progress(
    TextColumn("[bold]{task.description}"),
    BarColumn(),
    MofNCompleteColumn(),
    TimeElapsedColumn(),
    console=out,
    transient=True,
    disable=not out.is_terminal,  # A log or a pipe gets the closing lines alone.
  ) as progress:
    task = progress.add_task("loading programs", total=None)

    def on_program(relative: str, i: int, n: int) -> None:
      progress.update(task, description=f"loading {relative}", completed=i, total=n)

    manifest = make_suite(
      args.name,
      [h for h in args.hardware.split(",") if h],
      args.capacities or [0.1, 0.25],
      0.25 if args.heldout is None else args.heldout,
      args.out,
      seed=args.seed or 0,
      name=args.suite_name,
      on_program=on_program,
    )
  write_text(args.out, json.dumps(manifest, indent=1, sort_keys=True) + "\n")
  entries = manifest["entries"]
  held = sorted({e["program"] for e in entries if e["split"] == "heldout"})
  print(
    f"wrote {args.out}: suite '{manifest['name']}', {len(manifest['programs'])} programs, "
    f"{len(entries)} entries ({sum(e['split'] == 'train' for e in entries)} train, "
    f"{len(entries) - sum(e['split'] == 'train' for e in entries)} held out: "
    f"{', '.join(held) or 'none'})"
  )
  print(
    f"  train on it: malloczero train --suite {args.out}; evaluate: malloczero evaluate "
    f"--suite {args.out} --split heldout --checkpoint RUN_DIR"
  )
  return 0


def run(args: argparse.Namespace) -> int:
  given = [f for f in MAKE_FLAGS if getattr(args, f) is not None]
  if args.action != "make" and given:
    flags = ", ".join("--" + ("name" if f == "suite_name" else f) for f in given)
    raise FlagError(f"{flags}: for 'suite make' only")
  if args.action == "make":
    return _make(args)
  if args.action == "show" and not args.name:
    raise MalloczeroError("'suite show' needs a suite name (see 'malloczero suite list')")
  console().print(_list_table() if args.action == "list" else _show_table(args.name))
  return 0
