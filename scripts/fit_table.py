#!/usr/bin/env python
"""Tabulates `scripts/fit_deviations.py --out` files: one row per fit setting, its seeds together.

A file's setting is its name without the `-sSEED.json` ending (`small-n1000-s2.json` is seed 2 of
`small-n1000`). Per setting, over its seeds (mean, then each seed): the training decisions' and
the held-out decisions' excess loss over the targets' own entropy (the KL left to fit; on held-out
decisions both at the last report and at the report where it was least), the share of the
held-out gainful decisions whose argmax gains, how the held-out deviations are ranked, and the
one-move value: the mean exact advantage of the argmax over all held-out decisions (msa's move
is 0), in 1e-4 of msa's time.

  .venv/bin/python scripts/fit_table.py fits/*.json
"""

from __future__ import annotations

import argparse
import collections
import json
import os
import sys
from collections.abc import Sequence
from typing import Any


def one_move_value(row: dict[str, Any]) -> float:
  """The mean advantage of the prior's argmax over all of a row's decisions."""
  gainful, decisions = row["gainful"], row["decisions"]
  return (
    gainful * row["prior_pick_gain"] + (decisions - gainful) * row["prior_pick_elsewhere"]
  ) / decisions


def summarise_fit(rows: Sequence[dict[str, Any]]) -> dict[str, float]:
  """One fit's report rows (fit_deviations' `rows`) -> its figures."""
  train = [r for r in rows if r["split"] == "train"]
  heldout = [r for r in rows if r["split"] == "heldout"]
  if not train or not heldout:
    raise ValueError("rows of both splits are needed")
  excess = [r["loss"] - r["floor"] for r in heldout]
  least = min(range(len(heldout)), key=excess.__getitem__)
  return {
    "train_decisions": train[-1]["decisions"],
    "train_kl": train[-1]["loss"] - train[-1]["floor"],
    "train_finds_gain": train[-1]["prior_finds_gain"],
    "heldout_kl": excess[-1],
    "heldout_kl_least": excess[least],
    "heldout_kl_least_step": heldout[least]["step"],
    "heldout_finds_gain": heldout[-1]["prior_finds_gain"],
    "heldout_deviations_ranked": heldout[-1]["prior_pairwise_deviations"],
    "heldout_value_1e4": one_move_value(heldout[-1]) * 1e4,
  }


def table(files: Sequence[str]) -> str:
  """The markdown table of `files`' fits, settings sorted by name."""
  settings: dict[str, list[dict[str, float]]] = collections.defaultdict(list)
  for path in files:
    with open(path, encoding="utf-8") as f:
      rows = json.load(f)["rows"]
    name = os.path.basename(path).removesuffix(".json")
    setting = name.rsplit("-s", 1)[0] if "-s" in name else name
    settings[setting].append(summarise_fit(rows))

  def mean(fits, key):
    return sum(f[key] for f in fits) / len(fits)

  def each(fits, key, fmt):
    return " / ".join(format(f[key], fmt) for f in fits)

  lines = [
    "| setting | seeds | training decisions | training KL | training gains found | held-out KL, "
    "last (each seed) | held-out KL, least (at step) | held-out gains found (each seed) | "
    "held-out deviations ranked | held-out one-move value, 1e-4 (each seed) |",
    "|---|---|---|---|---|---|---|---|---|---|",
  ]
  # Settings by name, then by their training decisions (n250 before n1000).
  order = lambda item: (item[0].split("-n")[0], item[1][0]["train_decisions"], item[0])
  for setting, fits in sorted(settings.items(), key=order):
    steps = " / ".join(str(f["heldout_kl_least_step"]) for f in fits)
    lines.append(
      f"| {setting} | {len(fits)} | {fits[0]['train_decisions']:,} | {mean(fits, 'train_kl'):.3f} "
      f"| {mean(fits, 'train_finds_gain'):.2f} | {mean(fits, 'heldout_kl'):.3f} "
      f"({each(fits, 'heldout_kl', '.3f')}) | {mean(fits, 'heldout_kl_least'):.3f} ({steps}) | "
      f"{mean(fits, 'heldout_finds_gain'):.2f} ({each(fits, 'heldout_finds_gain', '.2f')}) | "
      f"{mean(fits, 'heldout_deviations_ranked'):.2f} | {mean(fits, 'heldout_value_1e4'):.1f} "
      f"({each(fits, 'heldout_value_1e4', '.1f')}) |"
    )
  return "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> int:
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("files", nargs="+", help="fit_deviations.py --out files")
  args = parser.parse_args(argv)
  try:
    print(table(args.files))
  except (OSError, ValueError, KeyError) as e:
    print(f"error: {e}".replace("\n", " "), file=sys.stderr)
    return 2
  return 0


if __name__ == "__main__":
  sys.exit(main())
