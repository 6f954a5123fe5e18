"""A network that proposes evo's request priorities, decoded once: the network's own play in
evo's request space.

REGAL (Paliwal et al., "Reinforced Genetic Algorithm Learning for Optimizing Computation
Graphs", ICLR 2020, section 3) lets a network propose per-node parameters that a heuristic
decodes, and refines around the proposals with a genetic algorithm; EGRL seeds its evolutionary
population with its policy's proposals. Here a small MLP sees one of evo's requests at a time
(`request_features`: its size, saving, window and the memory demand over it, in units that do not
grow with the program, and nothing of msa's mapping) and predicts whether evo's best mapping
places it. The labels come from the search itself (`collect`: evo seeded with msa's mapping,
`--seconds` per program, on the training corpus), as expert iteration's apprentice learns from
its expert (Anthony et al., "Thinking Fast and Slow with Deep Learning and Tree Search", NeurIPS
2017). Its play is one decode of the genome it proposes (`proposal_genome`: the requests it
expects placed first, each group in msa's buffer order), no search and no msa mapping.

Why: the msa game's network, fitted to exact one-move advantages, plays msa on programs it did
not train on (docs/results/README.md, "What limits the network's own play"); evo's decode, given
msa's mapping as priorities, already beats msa's own mapping on large programs ("evo's decode,
jitted"). What the network adds over that decoder is measured against the decoder's other inputs:
msa's mapping (`mapping_genomes`) and the greedy's saving-per-byte order.

  .venv/bin/python scripts/priority_proposer.py collect --suite corpus --out data/corpus
  .venv/bin/python scripts/priority_proposer.py labels --data data/corpus --out labels.npz
  # The next round of expert iteration: the search seeded with the fitted proposer's proposal.
  .venv/bin/python scripts/priority_proposer.py collect --suite corpus --proposer p1.npz \
      --better-than labels.npz --out data/round2
  .venv/bin/python scripts/priority_proposer.py fit --labels labels.npz --seed 1 --out p1.npz
  .venv/bin/python scripts/priority_proposer.py decode --params p1.npz --suite realistic
  .venv/bin/python scripts/priority_proposer.py search --params p1.npz --suite realistic
  # make train's fit out of model: each model's programs decoded by a fit to the other models'.
  .venv/bin/python scripts/priority_proposer.py crossval --folds 4 --seed 1 --out cv1.csv
"""

from __future__ import annotations

import argparse
import csv
import glob
import os
import sys
import time
from typing import Optional, Sequence

import numpy as np

from malloczero.common.errors import MalloczeroError
from malloczero.configs.config import ProposerConfig
from malloczero.env.placement import Placement
from malloczero.env.solvers.evo import decode, evo, greedy_priorities, mapping_genomes
from malloczero.learner.proposer import (
  BUILTIN_LABELS,
  Labels,
  Proposer,
  TuningSettings,
  auc,
  fit,
  label_program,
  labelled_programs,
  labels_of,
  neighbour_genomes,
  proposal_genome,
  propose,
  request_features,
  requests_of,
  tune,
  tuning_targets,
)


def decode_once(
  workload, hardware, proposer: Proposer
) -> tuple[dict[str, float], Placement, np.ndarray]:
  """One decode each of the network's proposal and of the decoder's other inputs (msa's mapping
  as priorities, the better of `mapping_genomes`; the greedy's saving-per-byte order), as speed-ups
  over all-slow; msa's own mapping's too. The placement holds the proposal's mapping; with the
  network's `[R]` chances."""
  from malloczero.env.solvers import solve

  model, requests = requests_of(workload, hardware)
  msa = solve(workload, hardware, "msa").mapping
  placement = Placement(model, requests)
  slow = model.slow_only_time
  result = {"msa": msa.speedup}
  result["msa_genome"] = max(
    slow / decode(placement, g) for g in mapping_genomes(requests, msa, workload)
  )
  result["greedy_order"] = slow / decode(placement, greedy_priorities(requests))
  started = time.perf_counter()
  chance = proposer.placed_chance(request_features(model, requests))
  result["proposer"] = slow / decode(placement, proposal_genome(chance))
  result["proposer_s"] = time.perf_counter() - started
  return result, placement, chance


def search_from_proposal(
  workload, hardware, proposer: Proposer, seconds: float, seed: int = 0
) -> dict[str, float]:
  """evo at `seconds` seeded with msa's mapping (`msa_seeded`: the guided search without a
  network, scripts/guided_search_without_network.py) and with the network's proposal first, then
  msa's mapping (`proposer_seeded`), as speed-ups over all-slow, with each one's decodes and
  seconds. Each search's time includes building its requests (and the proposal), as a baseline's
  time limit includes building its model; msa's solve is outside both."""
  from malloczero.env.solvers import solve

  msa = solve(workload, hardware, "msa").mapping
  result: dict[str, float] = {"msa": msa.speedup}
  for arm in ("msa_seeded", "proposer_seeded"):
    started = time.perf_counter()
    model, requests = requests_of(workload, hardware)
    initial = mapping_genomes(requests, msa, workload)
    if arm == "proposer_seeded":
      initial.insert(0, propose(proposer, model, requests))
    placement = Placement(model, requests)
    info = evo(
      placement,
      evaluations=10**9,
      time_limit_s=max(0.0, seconds - (time.perf_counter() - started)),
      seed=seed,
      initial=initial,
      initial_first=True,
      grace_s=0.0,
    )
    result[arm] = model.slow_only_time / placement.total_time
    result[f"{arm}_decodes"] = info["evaluations"]
    result[f"{arm}_s"] = time.perf_counter() - started
  return result


def _entries(suite: str, split: str):
  from malloczero.env.programs.suites import get_suite

  return get_suite(suite).split(split).entries


def _file_of(directory: str, name: str) -> str:
  return os.path.join(directory, name.replace("/", "_") + ".npz")


def _collect(args) -> int:
  proposer = None if args.proposer is None else Proposer.load(args.proposer)
  base = None if args.better_than is None else Labels.load(args.better_than)
  os.makedirs(args.out, exist_ok=True)
  entries = _entries(args.suite, args.split)
  for k, entry in enumerate(entries):
    path = _file_of(args.out, entry.name)
    if k % args.shards != args.shard or os.path.exists(path):
      continue
    workload, hardware = entry.load()
    started = time.perf_counter()
    _, requests = requests_of(workload, hardware)
    if not max(1, args.min_requests) <= len(requests) <= args.max_requests:
      print(f"{entry.name}: skipped ({len(requests)} requests)", flush=True)
      continue
    data = label_program(workload, hardware, args.seconds, args.seed, proposer)
    if base is not None:
      keep_the_better(data, base, entry.name)
    tmp = path + ".tmp.npz"
    np.savez(tmp, entry=np.str_(entry.name), **data)
    os.replace(tmp, path)  # A killed run leaves no half-written program.
    print(
      f"{entry.name}: {len(requests)} requests, {data['placed'].mean():.3f} placed, evo "
      f"{data['evo'] / data['msa']:.4f}x msa in {data['evaluations']} decodes"
      f"{'' if base is None else ' (the earlier label)' if data['kept'] else ' (a new label)'}, "
      f"{time.perf_counter() - started:.1f} s",
      flush=True,
    )
  return 0


def keep_the_better(data: dict[str, np.ndarray], base: Labels, name: str) -> None:
  """An expert-iteration round never loses a label: where `base`'s label of `name` decodes at
  least as fast as the new search's best mapping, `data` takes `base`'s flags and speed-up
  (`kept` says which)."""
  if name not in base.entries:
    data["kept"] = np.bool_(False)
    return
  row = base.entries.index(name)
  if base.fingerprints[row] != str(data["fingerprint"]):
    raise MalloczeroError(f"--better-than's label of '{name}' is of other requests (stale)")
  data["kept"] = np.bool_(float(base.evo[row]) >= float(data["evo"]))
  if data["kept"]:
    data["placed"], data["evo"] = base.placed[row], np.float64(base.evo[row])


def load_collected(directory: str) -> list[tuple[str, dict[str, np.ndarray]]]:
  """The programs `collect` wrote to `directory`, by entry name, in the suite's order of names."""
  programs = []
  for path in sorted(glob.glob(os.path.join(directory, "*.npz"))):
    with np.load(path, allow_pickle=False) as saved:
      programs.append((str(saved["entry"]), {k: saved[k] for k in saved.files}))
  return programs


def _labels(args) -> int:
  programs = load_collected(args.data)
  if not programs:
    raise ValueError(f"no collected programs in {args.data} (run `collect` first)")
  labels = labels_of(args.suite, programs, args.seconds)
  if args.add_to:
    labels = merged_labels(Labels.load(args.add_to), labels)
  labels.save(args.out)
  print(
    f"{len(labels.entries)} programs ({sum(len(p) for p in labels.placed)} requests) of suite "
    f"'{args.suite}': evo {float(np.exp(np.log(labels.evo / labels.msa).mean())):.4f}x msa "
    f"(geomean); saved {args.out}",
    flush=True,
  )
  return 0


def merged_labels(earlier: Labels, added: Labels) -> Labels:
  """`earlier`'s programs, then `added`'s: both of one suite and one search time, no program in
  both (a program labelled again is collected into a fresh labels file instead)."""
  if (earlier.suite, earlier.seconds) != (added.suite, added.seconds):
    raise MalloczeroError(
      f"cannot add labels of suite '{added.suite}' at {added.seconds:g} s to labels of suite "
      f"'{earlier.suite}' at {earlier.seconds:g} s"
    )
  both = sorted(set(earlier.entries) & set(added.entries))
  if both:
    more = f" and {len(both) - 1} more" if len(both) > 1 else ""
    raise MalloczeroError(f"'{both[0]}'{more} labelled in both")
  return Labels(
    suite=earlier.suite,
    entries=earlier.entries + added.entries,
    placed=earlier.placed + added.placed,
    fingerprints=earlier.fingerprints + added.fingerprints,
    msa=np.concatenate([earlier.msa, added.msa]),
    evo=np.concatenate([earlier.evo, added.evo]),
    seconds=earlier.seconds,
  )


def _fitted(programs: list[dict], args) -> Proposer:
  """`fit` with the command's --seed, --steps, --members and --saving-weight; then, with
  --tune-steps, the tuning (learner/proposer/tuning.py) on the same programs, which then need
  their placements (`labelled_programs(..., placements=True)`)."""
  proposer = fit(
    programs,
    seed=args.seed,
    steps=args.steps,
    members=args.members,
    saving_weight=args.saving_weight,
  )
  steps = getattr(args, "tune_steps", 0)
  if not steps:
    return proposer
  started = time.perf_counter()

  def tuned(step: int, _, fitness: float) -> None:
    if step % 25 == 0 or step == steps:
      print(
        f"  tuning step {step}/{steps}: perturbations' geomean {np.exp(fitness):.4f}x msa "
        f"({time.perf_counter() - started:.0f} s)",
        flush=True,
      )

  targets = tuning_targets(proposer, programs)
  settings = TuningSettings(steps=steps, pairs=args.tune_pairs, batch=args.tune_batch)
  workers = os.cpu_count() or 1
  return tune(proposer, targets, settings, seed=args.seed, progress=tuned, workers=workers)


def _fit(args) -> int:
  started = time.perf_counter()
  programs = labelled_programs(
    Labels.load(args.labels), args.max_programs, args.seed, placements=args.tune_steps > 0
  )
  proposer = _fitted(programs, args)
  proposer.save(args.out)
  scores = [auc(p["placed"], proposer.placed_chance(p["features"])) for p in programs]
  print(
    f"fitted to {len(programs)} programs ({sum(len(p['placed']) for p in programs)} requests) "
    f"in {time.perf_counter() - started:.0f} s; training AUC {np.nanmean(scores):.3f}; "
    f"saved {args.out}",
    flush=True,
  )
  return 0


def _decode(args) -> int:
  from malloczero.env.validator import validate_mapping
  from malloczero.evaluation.suite import geomean

  proposer = Proposer.load(args.params)
  rows = []
  for entry in _entries(args.suite, args.split):
    workload, hardware = entry.load()
    result, placement, _ = decode_once(workload, hardware, proposer)
    validate_mapping(workload, hardware, placement.mapping("proposer"))
    rows.append({"entry": entry.name, **result})
    print(
      f"{entry.name}: x msa proposer {result['proposer'] / result['msa']:.4f}, msa's mapping "
      f"decoded {result['msa_genome'] / result['msa']:.4f}, greedy order "
      f"{result['greedy_order'] / result['msa']:.4f}",
      flush=True,
    )
  print(f"{args.suite} {args.split}, {len(rows)} programs, one decode each, x msa:")
  for key in ("proposer", "msa_genome", "greedy_order"):
    ratio = np.array([r[key] / r["msa"] for r in rows])
    print(
      f"  {key:13s} {geomean(ratio):.4f}  W/T/L {int((ratio > 1.0005).sum())}/"
      f"{int((abs(ratio - 1) <= 5e-4).sum())}/{int((ratio < 0.9995).sum())}  worst "
      f"{ratio.min():.3f}"
    )
  if args.out:
    _write_csv(args.out, rows)
  return 0


def _search(args) -> int:
  from malloczero.evaluation.suite import geomean

  proposer = Proposer.load(args.params)
  rows = []
  for entry in _entries(args.suite, args.split):
    workload, hardware = entry.load()
    rows.append(
      {
        "entry": entry.name,
        **search_from_proposal(workload, hardware, proposer, args.seconds, args.seed),
      }
    )
    r = rows[-1]
    print(
      f"{entry.name}: x msa seeded with msa's mapping {r['msa_seeded'] / r['msa']:.4f}, with the "
      f"proposal {r['proposer_seeded'] / r['msa']:.4f}, {r['proposer_seeded_s']:.2f} s",
      flush=True,
    )
  gain = np.array([r["proposer_seeded"] / r["msa_seeded"] for r in rows])
  print(
    f"{args.suite} {args.split}, {len(rows)} programs, evo at {args.seconds:g} s, x msa: seeded "
    f"with msa's mapping {geomean([r['msa_seeded'] / r['msa'] for r in rows]):.4f}, with the "
    f"proposal {geomean([r['proposer_seeded'] / r['msa'] for r in rows]):.4f} "
    f"({100 * (geomean(gain) - 1):+.2f}%, better/worse {int((gain > 1.0005).sum())}/"
    f"{int((gain < 1 / 1.0005).sum())})"
  )
  if args.out:
    _write_csv(args.out, rows)
  return 0


def model_folds(models: Sequence[str], folds: int) -> dict[str, int]:
  """Each model's fold in [0, folds): the models in a fixed shuffled order, dealt round. A fold
  holds whole models, so no fit sees any program of a model whose programs it is judged on."""
  names = sorted(set(models))
  if not 2 <= folds <= len(names):
    raise MalloczeroError(f"--folds must be from 2 to the labels' {len(names)} models, not {folds}")
  order = np.random.default_rng(0).permutation(len(names))
  return {names[k]: i % folds for i, k in enumerate(order)}


def out_of_model_chances(
  labels: Labels, args
) -> tuple[list[np.ndarray], list[str], dict[str, int]]:
  """Each labelled program's `[R]` chances from a fit (`--seed`, `--steps`, `--members`,
  `--saving-weight`) to the other `--folds` folds of models (`model_folds`): `make train`'s fit
  as it meets a model it has not seen. With each program's model and each model's fold."""
  from malloczero.env.programs.suites import get_suite

  by_name = {entry.name: entry for entry in get_suite(labels.suite).entries}
  # A label of a program the suite lacks is refused here.
  programs = labelled_programs(labels, placements=getattr(args, "tune_steps", 0) > 0)
  models = [by_name[name].model for name in labels.entries]
  fold_of = model_folds(models, args.folds)
  print(f"{len(programs)} programs of {len(fold_of)} models in {args.folds} folds", flush=True)
  chances: list[np.ndarray] = [np.empty(0)] * len(programs)
  for fold in range(args.folds):
    rest = [p for p, m in zip(programs, models) if fold_of[m] != fold]
    proposer = _fitted(rest, args)
    for row, model in enumerate(models):
      if fold_of[model] == fold:
        chances[row] = proposer.placed_chance(programs[row]["features"])
    print(f"fold {fold + 1}/{args.folds}: fitted to {len(rest)} programs", flush=True)
  return chances, models, fold_of


def _genome_name(at: float, order: str) -> str:
  return f"{at:.1f} {order}"


def _crossval(args) -> int:
  from malloczero.env.programs.suites import get_suite
  from malloczero.env.solvers import solve
  from malloczero.evaluation.suite import geomean
  from malloczero.learner.proposer.network import NEIGHBOURS, PROPOSE_AT

  labels = Labels.load(args.labels)
  chances, models, fold_of = out_of_model_chances(labels, args)
  by_name = {entry.name: entry for entry in get_suite(labels.suite).entries}
  proposal = _genome_name(PROPOSE_AT, "bands")
  neighbours = [_genome_name(*n) for n in NEIGHBOURS]
  rows = []
  for row, name in enumerate(labels.entries):
    workload, hardware = by_name[name].load()
    model, requests = requests_of(workload, hardware)
    slow, msa, placement = model.slow_only_time, float(labels.msa[row]), Placement(model, requests)
    speedup = lambda genome: slow / decode(placement, genome) / msa
    result = {"entry": name, "model": models[row], "fold": fold_of[models[row]]}
    result["labels"] = float(labels.evo[row]) / msa
    result["labels' flags"] = speedup(proposal_genome(labels.placed[row].astype(float)))
    mapping = solve(workload, hardware, "msa").mapping
    result["msa's mapping"] = max(speedup(g) for g in mapping_genomes(requests, mapping, workload))
    result[proposal] = speedup(proposal_genome(chances[row]))
    for key, genome in zip(neighbours, neighbour_genomes(chances[row])):
      result[key] = speedup(genome)
    result["the proposal and its neighbours"] = max(result[k] for k in [proposal, *neighbours])
    result["with msa's mapping"] = max(
      result["the proposal and its neighbours"], result["msa's mapping"]
    )
    rows.append(result)
  print(f"{len(rows)} programs, one decode each, x msa (geomean; worst):")
  for key in list(rows[0])[3:]:
    ratio = np.array([r[key] for r in rows])
    print(f"  {key:32s} {geomean(ratio):.4f}  {ratio.min():.3f}")
  if args.out:
    _write_csv(args.out, rows)
  return 0


def _write_csv(path: str, rows: list[dict]) -> None:
  with open(path, "w", newline="") as f:
    writer = csv.DictWriter(f, fieldnames=list(rows[0]))
    writer.writeheader()
    writer.writerows(rows)


def _tune_argument(parser: argparse.ArgumentParser) -> None:
  parser.add_argument(
    "--tune-steps",
    type=int,
    default=0,
    help="then tune the fit's last layers on one decode's speed over msa, this many "
    "evolution-strategies steps (learner/proposer/tuning.py; 0: none)",
  )
  parser.add_argument(
    "--tune-pairs", type=int, default=TuningSettings.pairs, help="perturbation pairs per step"
  )
  parser.add_argument(
    "--tune-batch", type=int, default=TuningSettings.batch, help="programs per perturbation"
  )


def main(argv: Optional[Sequence[str]] = None) -> int:
  """The command (`scripts/priority_proposer.py`): `collect`, `labels`, `fit`, `decode`,
  `search` or `crossval`; returns the exit status."""
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  commands = parser.add_subparsers(dest="command", required=True)
  collect = commands.add_parser("collect", help="features and evo's placed flags per program")
  collect.add_argument("--suite", default="corpus")
  collect.add_argument("--split", default="all", choices=("train", "heldout", "all"))
  collect.add_argument("--seconds", type=float, default=4.0, help="evo's time per program")
  collect.add_argument("--max-requests", type=int, default=12000)
  collect.add_argument("--min-requests", type=int, default=1, help="skip smaller programs")
  collect.add_argument("--seed", type=int, default=0)
  collect.add_argument("--shard", type=int, default=0)
  collect.add_argument("--shards", type=int, default=1)
  collect.add_argument(
    "--proposer", help="a proposer's .npz: its proposal starts evo's population (the next round)"
  )
  collect.add_argument(
    "--better-than", help="a labels .npz whose label of a program is kept where it is as fast"
  )
  collect.add_argument("--out", required=True, help="a directory: one .npz per program")
  labels = commands.add_parser("labels", help="pack collected programs into one labels file")
  labels.add_argument("--data", required=True, help="collect's directory")
  labels.add_argument("--suite", default="corpus", help="the suite collect labelled")
  labels.add_argument("--seconds", type=float, default=4.0, help="collect's --seconds")
  labels.add_argument(
    "--add-to", help="a labels .npz of the same suite and --seconds whose programs come first"
  )
  labels.add_argument("--out", required=True, help=f"the labels' .npz (built in: {BUILTIN_LABELS})")
  fit_ = commands.add_parser("fit", help="fit the proposer to a labels file")
  fit_.add_argument("--labels", default=BUILTIN_LABELS, help="the labels' .npz (default built in)")
  fit_.add_argument("--max-programs", type=int, default=0, help="fit this many (0: all)")
  fit_.add_argument("--seed", type=int, default=0)
  fit_.add_argument("--steps", type=int, default=6000, help="Adam steps of each member")
  fit_.add_argument(
    "--members", type=int, default=ProposerConfig.members, help="networks, each its own seed"
  )
  fit_.add_argument(
    "--saving-weight",
    type=float,
    default=ProposerConfig.saving_weight,
    help="share of each program's weight given to its requests by their saving",
  )
  _tune_argument(fit_)
  fit_.add_argument("--out", required=True, help="the proposer's .npz")
  decode_ = commands.add_parser("decode", help="one decode of the proposal per program")
  decode_.add_argument("--params", required=True)
  decode_.add_argument("--suite", default="realistic")
  decode_.add_argument("--split", default="all", choices=("train", "heldout", "all"))
  decode_.add_argument("--out", help="write one CSV row per program here")
  search = commands.add_parser(
    "search", help="evo at a time limit seeded with the proposal, against seeded with msa's"
  )
  search.add_argument("--params", required=True)
  search.add_argument("--suite", default="realistic")
  search.add_argument("--split", default="all", choices=("train", "heldout", "all"))
  search.add_argument("--seconds", type=float, default=10.0)
  search.add_argument("--seed", type=int, default=0)
  search.add_argument("--out", help="write one CSV row per program here")
  crossval = commands.add_parser(
    "crossval",
    help="make train's fit out of model: each fold of models decoded by a fit to the others",
  )
  crossval.add_argument("--labels", default=BUILTIN_LABELS, help="the labels' .npz")
  crossval.add_argument("--folds", type=int, default=4, help="folds of the labels' models")
  crossval.add_argument("--seed", type=int, default=0, help="the fits' seed")
  crossval.add_argument(
    "--steps", type=int, default=ProposerConfig.steps, help="Adam steps of each member"
  )
  crossval.add_argument("--members", type=int, default=ProposerConfig.members)
  crossval.add_argument("--saving-weight", type=float, default=ProposerConfig.saving_weight)
  _tune_argument(crossval)
  crossval.add_argument("--out", help="write one CSV row per program here")
  args = parser.parse_args(argv)
  if args.command == "collect" and (args.seconds <= 0 or not 0 <= args.shard < args.shards):
    parser.error("--seconds must be positive and 0 <= --shard < --shards")
  if args.command == "collect" and args.min_requests > args.max_requests:
    parser.error("--min-requests must be at most --max-requests")
  if args.command == "search" and args.seconds <= 0:
    parser.error("--seconds must be positive")
  if args.command == "crossval" and args.steps < 1:
    parser.error("--steps must be positive")
  if args.command == "fit" and (args.steps < 1 or args.max_programs < 0):
    parser.error("--steps must be positive and --max-programs at least 0")
  if args.command in ("fit", "crossval") and (
    args.tune_steps < 0 or args.tune_pairs < 1 or args.tune_batch < 1
  ):
    parser.error("--tune-steps must be at least 0, --tune-pairs and --tune-batch positive")

  run = {
    "collect": _collect,
    "labels": _labels,
    "fit": _fit,
    "decode": _decode,
    "search": _search,
    "crossval": _crossval,
  }[args.command]
  try:
    return run(args)
  except (MalloczeroError, ValueError, OSError, KeyError) as e:
    print(f"error: {e}", file=sys.stderr)
    return 2
