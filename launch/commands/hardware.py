"""`malloczero hardware list | show NAME`: the machines a program can be mapped for.

`list` shows every preset with its levels, bandwidths, compute peak, copy bandwidth, alignment and
where its figures come from; `show` prints one as a hardware JSON file, the starting point for a
machine no preset describes (`--hardware FILE.json`).
"""

from __future__ import annotations

import argparse
import json

from rich.table import Table

from malloczero.common.errors import MalloczeroError
from malloczero.common.units import human_bytes
from malloczero.env.hardware import (
  MAX_CAPACITY_BYTES,
  NOT_MACHINES,
  PRESET_SOURCES,
  PRESETS,
  Hardware,
  load_hardware,
)
from malloczero.launch.flags import console


def add_parser(sub: argparse._SubParsersAction) -> None:
  p = sub.add_parser(
    "hardware",
    help="list the hardware presets (levels, bandwidths, peak, sources) or print one as JSON",
  )
  p.add_argument("action", choices=("list", "show"))
  p.add_argument(
    "name",
    nargs="?",
    help="show: a preset (or a hardware JSON file, checked), printed as a hardware JSON file",
  )
  p.set_defaults(func=run)


def rate(value: float, unit: str) -> str:
  """'614 GB/s', '2.46 TB/s', '2.25 PFLOP/s': SI prefixes, as vendors quote them."""
  for prefix, scale in (("P", 1e15), ("T", 1e12), ("G", 1e9), ("M", 1e6), ("k", 1e3)):
    if value >= scale:
      return f"{value / scale:.3g} {prefix}{unit}"
  return f"{value:.3g} {unit}"


def describe_levels(hw: Hardware) -> str:
  """'CMEM 128.00 MiB @ 2.46 TB/s, HBM 8.00 GiB @ 614 GB/s'."""

  def size(capacity: int) -> str:
    return "2**62 B" if capacity == MAX_CAPACITY_BYTES else human_bytes(capacity)

  return ", ".join(
    f"{lv.name} {size(lv.capacity_bytes)} @ {rate(lv.bandwidth_bytes_per_s, 'B/s')}"
    for lv in hw.levels
  )


def _list_table() -> Table:
  table = Table(title="hardware presets (fast levels first; the last is the slow default memory)")
  for column in ("preset", "levels", "peak", "copy bw", "alignment"):
    table.add_column(column, justify="right" if column == "alignment" else "left")
  for name, hw in PRESETS.items():
    table.add_row(
      name,
      describe_levels(hw),
      "(ops have no flops)" if name in NOT_MACHINES else rate(hw.peak_flops_per_s, "FLOP/s"),
      rate(hw.copy_bandwidth_bytes_per_s, "B/s"),
      f"{hw.alignment_bytes} B",
    )
  return table


def run(args: argparse.Namespace) -> int:
  out = console()
  if args.action == "show":
    if not args.name:
      raise MalloczeroError("'hardware show' needs a preset name (see 'malloczero hardware list')")
    print(json.dumps(load_hardware(args.name).to_dict(), indent=2))
    return 0
  if args.name:
    raise MalloczeroError("'hardware list' takes no name (use 'hardware show NAME')")
  out.print(_list_table())
  out.print("sources:")
  for name in PRESETS:
    out.print(f"  {name}: {PRESET_SOURCES[name]}", soft_wrap=True)
  out.print(
    "Another machine: 'malloczero hardware show NAME > my.json', edit it (README, 'Hardware "
    "files') and pass --hardware my.json",
    soft_wrap=True,
  )
  return 0
