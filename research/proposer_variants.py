"""Changes to the proposer's play aimed at its worst entries, measured and not adopted
(docs/results/README.md, "The proposer's worst entries").

The proposer's one decode loses most where a few requests decide a program: `realistic`'s
ResNet101 training step at 10% (0.934x msa from run 1's fit) and `foreign`'s GRU inference step
(0.43x from some fits, 1.007x from others: whether two of a weight's requests reach a chance of
0.5). Two kinds of change are measured here, each on the corpus out of model (`crossval`'s fits,
saved by `chances`) and on the evaluation suites:

* Decodes of the same chances (`decode`): a buffer's overlapping requests are rivals, of which
  `Placement` places one, and a chance per request splits the buffer's between them.
  `rivals by chance` gives each buffer's likeliest request the earliest of the buffer's places in
  msa's order (the tie-break of `proposal_genome`); `rival group sum` proposes a rival group's
  likeliest request where the group's chances sum to at least `PROPOSE_AT`.
* A second network over the first's chances (`stack`, stacking with out-of-fold inputs: Wolpert,
  "Stacked Generalization", Neural Networks 5, 1992): each request's features plus what the
  first network expects placed over its window (`expected_demand_features`), fitted to the same
  labels with the first network's chances from fits that had not seen the program's model.

  .venv/bin/python scripts/proposer_variants.py chances --seed 1 --out cv1.npz
  .venv/bin/python scripts/proposer_variants.py decode --chances cv1.npz --out corpus1.csv
  .venv/bin/python scripts/priority_proposer.py fit --seed 1 --steps 3000 --out p1.npz
  .venv/bin/python scripts/proposer_variants.py decode --params p1.npz --suite foreign --out f1.csv
  .venv/bin/python scripts/proposer_variants.py stack --chances cv1.npz --params p1.npz \\
      --seed 1 --out stacked1
"""

from __future__ import annotations

import argparse
import csv
import os
import sys
import types
from typing import Callable, Optional, Sequence

import numpy as np

from malloczero.common.errors import MalloczeroError
from malloczero.configs.config import ProposerConfig
from malloczero.env.cost_model import CostModel
from malloczero.env.placement import Placement
from malloczero.env.requests import Requests
from malloczero.env.solvers.evo import decode
from malloczero.learner.proposer import (
  BUILTIN_LABELS,
  Labels,
  Proposer,
  fit,
  proposal_genome,
  request_features,
  requests_of,
)
from malloczero.learner.proposer.features import request_saving, window_demand
from malloczero.learner.proposer.network import PROPOSE_AT
from malloczero.research.priority_proposer import out_of_model_chances

# `expected_demand_features`' columns.
EXPECTED_DEMAND = (
  "expected placed bytes over the window, mean, over fast capacity",
  "the same, peak",
  "log10 of the mean",
  "log10 of the peak",
  "the mean less the request's own expected bytes",
  "the chances of the buffer's other requests, summed",
  "rank of the chance in the program",
  "logit of the chance",
)


def rival_groups(requests: Requests) -> np.ndarray:
  """`[R]` a group number per request: a buffer's requests linked by overlapping windows (of
  which `Placement` places at most one at a time)."""
  order = np.lexsort((requests.start, requests.buffer))
  buffer, start, end = requests.buffer[order], requests.start[order], requests.end[order]
  # Sorted by start within a buffer, a request opens a group where it starts at or after the
  # furthest end of the buffer's requests before it.
  reach = np.empty(len(order), np.int64)
  for k in range(len(order)):
    same = k > 0 and buffer[k] == buffer[k - 1]
    reach[k] = max(reach[k - 1], end[k]) if same else end[k]
  opens = np.ones(len(order), bool)
  opens[1:] = (buffer[1:] != buffer[:-1]) | (start[1:] >= reach[:-1])
  groups = np.empty(len(order), np.int64)
  groups[order] = np.cumsum(opens) - 1
  return groups


def rivals_by_chance(chance: np.ndarray, requests: Requests) -> np.ndarray:
  """`[R]` the proposal's genome with each buffer's requests dealt the buffer's places in msa's
  order, likeliest first (the proposed and their bands as in `proposal_genome`)."""
  index = np.arange(len(chance))
  # Request i takes msa's place place[i]: proposal_genome's tie-break follows the array order.
  place = np.empty(len(chance), np.int64)
  place[np.lexsort((index, -chance, requests.buffer))] = np.lexsort((index, requests.buffer))
  in_place_order = np.empty(len(chance))
  in_place_order[place] = chance
  return proposal_genome(in_place_order)[place]


def rival_group_chance(chance: np.ndarray, requests: Requests) -> np.ndarray:
  """`[R]` the chances with each rival group's likeliest request raised to the group's summed
  chance (below 1) where that reaches `PROPOSE_AT` and its own does not."""
  groups = rival_groups(requests)
  total = np.bincount(groups, weights=chance)[groups]
  index = np.arange(len(chance))
  ranked = np.lexsort((index, -chance, groups))
  first = np.ones(len(ranked), bool)
  first[1:] = groups[ranked][1:] != groups[ranked][:-1]
  likeliest = np.zeros(len(chance), bool)
  likeliest[ranked[first]] = True
  raised = likeliest & (total >= PROPOSE_AT) & (chance < PROPOSE_AT)
  out = chance.astype(float)
  out[raised] = np.minimum(total[raised], 0.999)
  return out


# Each decode of the same `[R]` chances: the proposal and the two rival rules.
GENOMES: dict[str, Callable[[np.ndarray, Requests], np.ndarray]] = {
  "proposal": lambda chance, requests: proposal_genome(chance),
  "rivals by chance": rivals_by_chance,
  "rival group sum": lambda chance, requests: proposal_genome(rival_group_chance(chance, requests)),
}


def expected_demand_features(
  model: CostModel, requests: Requests, chance: np.ndarray
) -> np.ndarray:
  """`[R, len(EXPECTED_DEMAND)]` what a network's `[R]` chances expect placed over each request's
  window, in units of the fast capacity as `request_features`' demand is (with every chance 1,
  the first two columns are its mean and peak demand)."""
  capacity = float(model.hardware.fast_capacity_bytes)
  expected = chance * requests.size * ~requests.reshaped
  mean, peak = window_demand(model, requests, expected)
  per_buffer = np.bincount(requests.buffer, weights=chance, minlength=len(model.workload.buffers))
  rank = np.argsort(np.argsort(-chance, kind="stable"), kind="stable") / max(1, len(chance))
  clipped = np.clip(chance, 1e-4, 1 - 1e-4)
  columns = (
    mean,
    peak,
    np.log10(mean + 1e-6),
    np.log10(peak + 1e-6),
    mean - expected / capacity,
    per_buffer[requests.buffer] - chance,
    rank,
    np.log(clipped / (1 - clipped)),
  )
  return np.stack(columns, 1).astype(np.float32)


def _speedups(workload, hardware, chances: Callable[[CostModel, Requests], dict[str, np.ndarray]]):
  """Per decode named by `chances`' keys and `GENOMES`' rules, its speed-up over msa."""
  from malloczero.env.solvers import solve

  model, requests = requests_of(workload, hardware)
  msa = float(solve(workload, hardware, "msa").mapping.speedup)
  placement = Placement(model, requests)
  row = {}
  for source, chance in chances(model, requests).items():
    for rule, genome in GENOMES.items():
      key = rule if source == "" else f"{source}: {rule}"
      row[key] = model.slow_only_time / decode(placement, genome(chance, requests)) / msa
  return row


def _saved_chances(path: str) -> tuple[list[str], list[np.ndarray]]:
  try:
    with np.load(path, allow_pickle=False) as saved:
      entries = [str(e) for e in saved["entries"]]
      return entries, [saved[f"chance{k}"] for k in range(len(entries))]
  except (OSError, ValueError, KeyError) as e:
    raise MalloczeroError(f"cannot read the chances '{path}' ({e})".replace("\n", " ")) from None


def _chances(args) -> int:
  labels = Labels.load(args.labels)
  fits = types.SimpleNamespace(
    folds=args.folds, seed=args.seed, steps=args.steps, members=args.members,
    saving_weight=ProposerConfig.saving_weight,
  )  # fmt: skip
  chances, _, _ = out_of_model_chances(labels, fits)
  saved = {f"chance{k}": c for k, c in enumerate(chances)}
  tmp = args.out + ".tmp.npz"
  np.savez(tmp, entries=np.array(labels.entries, dtype=str), **saved)
  os.replace(tmp, args.out)  # Whole or not at all.
  print(f"saved the chances of {len(chances)} programs to {args.out}")
  return 0


def _entries(args):
  from malloczero.env.programs.suites import get_suite

  if args.chances:
    by_name = {entry.name: entry for entry in get_suite(args.labels_suite).entries}
    entries, chances = _saved_chances(args.chances)
    missing = [name for name in entries if name not in by_name]
    if missing:
      raise MalloczeroError(f"the chances name '{missing[0]}', which '{args.labels_suite}' lacks")
    return [(by_name[name], chance) for name, chance in zip(entries, chances)]
  return [(entry, None) for entry in get_suite(args.suite).split(args.split).entries]


def _write(rows: list[dict], out: Optional[str]) -> None:
  from malloczero.evaluation.suite import geomean

  if not rows:
    raise MalloczeroError("no programs to decode")
  print(f"{len(rows)} programs, one decode each, x msa (geomean, worst, entries below 0.97):")
  for key in list(rows[0])[1:]:
    ratio = np.array([r[key] for r in rows])
    print(f"  {key:40s} {geomean(ratio):.4f}  {ratio.min():.3f}  {int((ratio < 0.97).sum())}")
  if out:
    with open(out, "w", newline="") as f:
      writer = csv.DictWriter(f, fieldnames=list(rows[0]))
      writer.writeheader()
      writer.writerows(rows)


def _decode(args) -> int:
  proposer = Proposer.load(args.params) if args.params else None
  rows = []
  for entry, saved in _entries(args):
    workload, hardware = entry.load()

    def chances(model, requests, saved=saved, name=entry.name):
      if saved is not None:
        if len(saved) != len(requests):
          raise MalloczeroError(f"the chances of '{name}' are not of its {len(requests)} requests")
        return {"": saved}
      return {"": proposer.placed_chance(request_features(model, requests))}

    rows.append({"entry": entry.name, **_speedups(workload, hardware, chances)})
  _write(rows, args.out)
  return 0


def stacked_programs(labels: Labels, chances: Sequence[np.ndarray]) -> list[dict[str, np.ndarray]]:
  """`fit`'s input for the second network: each labelled program's features beside
  `expected_demand_features` of its out-of-model `chances`."""
  from malloczero.env.programs.suites import get_suite

  by_name = {entry.name: entry for entry in get_suite(labels.suite).entries}
  programs = []
  for row, name in enumerate(labels.entries):
    model, requests = requests_of(*by_name[name].load())
    if len(chances[row]) != len(requests):
      raise MalloczeroError(f"the chances of '{name}' are not of its {len(requests)} requests")
    features = request_features(model, requests)
    context = expected_demand_features(model, requests, chances[row])
    programs.append(
      {
        "features": np.concatenate([features, context], 1),
        "saving": request_saving(requests),
        "placed": labels.placed[row],
      }
    )
  return programs


def _stack(args) -> int:
  from malloczero.env.programs.suites import get_suite

  labels = Labels.load(args.labels)
  entries, chances = _saved_chances(args.chances)
  if tuple(entries) != labels.entries:
    raise MalloczeroError(f"the chances '{args.chances}' are not of the labels' programs")
  second = fit(stacked_programs(labels, chances), seed=args.seed, steps=args.steps)
  second.save(args.out + "-second.npz")
  first = Proposer.load(args.params)
  for suite, split in args.suites:
    rows = []
    for entry in get_suite(suite).split(split).entries:

      def chances_of(model, requests):
        features = request_features(model, requests)
        chance = first.placed_chance(features)
        context = expected_demand_features(model, requests, chance)
        stacked = second.placed_chance(np.concatenate([features, context], 1))
        return {"first": chance, "second": stacked}

      rows.append({"entry": entry.name, **_speedups(*entry.load(), chances_of)})
    print(f"{suite} {split}:")
    _write(rows, f"{args.out}-{suite}.csv")
  return 0


def _suite_splits(text: str) -> list[tuple[str, str]]:
  pairs = [item.partition(":") for item in text.split(",")]
  if any(not suite or split not in ("train", "heldout", "all") for suite, _, split in pairs):
    raise argparse.ArgumentTypeError("expected SUITE:SPLIT,... with splits train, heldout or all")
  return [(suite, split) for suite, _, split in pairs]


def main(argv: Optional[Sequence[str]] = None) -> int:
  """The command (`scripts/proposer_variants.py`): `chances`, `decode` or `stack`; returns the
  exit status."""
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  commands = parser.add_subparsers(dest="command", required=True)
  chances = commands.add_parser("chances", help="crossval's out-of-model chances, saved")
  decode_ = commands.add_parser("decode", help="each decode rule of a proposer's or saved chances")
  stack = commands.add_parser("stack", help="a second network over the first's chances")
  for command in (chances, stack):
    command.add_argument("--labels", default=BUILTIN_LABELS, help="the labels' .npz")
    command.add_argument("--seed", type=int, default=0)
    command.add_argument("--steps", type=int, default=ProposerConfig.steps)
  chances.add_argument("--folds", type=int, default=4)
  chances.add_argument("--members", type=int, default=ProposerConfig.members)
  chances.add_argument("--out", required=True, help="the chances' .npz")
  source = decode_.add_mutually_exclusive_group(required=True)
  source.add_argument("--params", help="a proposer's .npz, decoded on --suite")
  source.add_argument("--chances", help="`chances`' .npz, decoded on its programs")
  decode_.add_argument("--suite", default="realistic")
  decode_.add_argument("--split", default="all", choices=("train", "heldout", "all"))
  decode_.add_argument("--labels-suite", default="corpus", help="the suite the chances are of")
  decode_.add_argument("--out", help="write one CSV row per program here")
  stack.add_argument("--chances", required=True, help="`chances`' .npz of --labels")
  stack.add_argument("--params", required=True, help="the first network: a fit to all labels")
  stack.add_argument(
    "--suites",
    type=_suite_splits,
    default=_suite_splits("foreign:all,default:heldout,realistic:all"),
    help="SUITE:SPLIT,... its play is decoded on",
  )
  stack.add_argument("--out", required=True, help="a path prefix for the fit and the CSVs")
  args = parser.parse_args(argv)
  if getattr(args, "steps", 1) < 1:
    parser.error("--steps must be positive")
  run = {"chances": _chances, "decode": _decode, "stack": _stack}[args.command]
  try:
    return run(args)
  except (MalloczeroError, ValueError, OSError, KeyError) as e:
    print(f"error: {e}", file=sys.stderr)
    return 2
