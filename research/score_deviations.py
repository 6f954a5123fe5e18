"""Scores checkpoints' networks against the exact advantages of deviations from msa
(research/deviation_scores.py), per split of a suite: one table row per checkpoint and split.

  .venv/bin/python scripts/score_deviations.py --checkpoint runs/a runs/b --suite default
  .venv/bin/python scripts/score_deviations.py --checkpoint runs/a --decisions 4 --untrained
  .venv/bin/python scripts/score_deviations.py --checkpoint runs/c --load probed.npz
  .venv/bin/python scripts/score_deviations.py --checkpoint runs/f --trajectory runs/f --save on.npz

The exact advantages cost one msa pass per legal move probed and are computed once for all the
checkpoints, which must share a game config (`--save` keeps them for later runs: `--load`).
`--untrained` adds a row for freshly initialised networks of the first checkpoint's configs
(what chance looks like with these scores).
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from collections.abc import Sequence


def main(argv: Sequence[str] | None = None) -> int:
  """The command (`scripts/score_deviations.py`): parses `argv` (default: sys.argv), prints the
  table; returns the exit status."""
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("--checkpoint", nargs="+", required=True, help="training work directories")
  parser.add_argument("--suite", default="default")
  parser.add_argument("--split", default="all", choices=("train", "heldout", "all"))
  parser.add_argument("--decisions", type=int, default=12, help="decisions probed per program")
  parser.add_argument("--min-gap", type=float, default=None, help="advantage gap that is ranked")
  parser.add_argument("--seed", type=int, default=0)
  parser.add_argument(
    "--max-buffers",
    type=int,
    metavar="N",
    help="probe only programs of at most N buffers (a probe runs msa once per legal move)",
  )
  parser.add_argument("--untrained", action="store_true", help="add untrained networks' row")
  parser.add_argument("--out", help="write the rows as JSON here")
  parser.add_argument("--save", help="write the probed decisions here (.npz)")
  parser.add_argument("--load", help="score the decisions of an earlier --save instead")
  parser.add_argument(
    "--trajectory",
    metavar="CHECKPOINT",
    help="probe along this network's own trajectory (its policy alone) instead of msa's",
  )
  args = parser.parse_args(argv)
  if args.decisions < 1:
    parser.error("--decisions must be at least 1")
  if args.max_buffers is not None and args.max_buffers < 1:
    parser.error("--max-buffers must be at least 1")

  import jax

  from malloczero.actors.agent import load_agent
  from malloczero.actors.games import suite_games
  from malloczero.common.errors import MalloczeroError
  from malloczero.learner.probes import greedy_policies
  from malloczero.research import deviation_scores as probe

  min_gap = probe.DEFAULT_MIN_GAP if args.min_gap is None else args.min_gap
  try:
    agents = [load_agent(path) for path in args.checkpoint]
    splits = ("train", "heldout") if args.split == "all" else (args.split,)
    # Loaded decisions carry their observations: the programs are needed only to probe.
    specs = {} if args.load else {split: suite_games(args.suite, split) for split in splits}
    if args.max_buffers is not None:
      specs = {
        split: [s for s in entries if len(s.workload.buffers) <= args.max_buffers]
        for split, entries in specs.items()
      }
  except MalloczeroError as e:
    print(f"error: {e}", file=sys.stderr)
    return 2
  game = agents[0].game
  if any(agent.game != game for agent in agents):
    print("error: the checkpoints were trained with different game configs", file=sys.stderr)
    return 2

  if args.load:
    try:
      loaded = probe.load_probed(args.load)
    except (OSError, ValueError, KeyError) as e:
      print(f"error: cannot read probed decisions from {args.load}: {e}", file=sys.stderr)
      return 2
    probed = {split: [p for p in loaded if p.split == split] for split in splits}
  else:
    policy = None
    if args.trajectory:
      try:
        guide = load_agent(args.trajectory)
      except MalloczeroError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
      if guide.game != game:
        print("error: --trajectory's network plays another game config", file=sys.stderr)
        return 2
      policy = greedy_policies(guide.networks)(guide.params)
    probed = probe_suite(probe, specs, game, args.decisions, args.seed, policy)
  missing = [split for split in splits if not probed[split]]
  if missing:
    print(f"error: no decisions probed in the {' or '.join(missing)} split", file=sys.stderr)
    return 2
  if args.save:
    probe.save_probed(args.save, [p for split in splits for p in probed[split]])

  scorers = [(agent.checkpoint, agent.networks, agent.params) for agent in agents]
  if args.untrained:
    networks = agents[0].networks
    first = probed[splits[0]][0].observation
    params = networks.init(jax.random.PRNGKey(args.seed), {k: v[None] for k, v in first.items()})
    scorers.append(("untrained", networks, params))
  rows = []
  for label, networks, params in scorers:
    for split in splits:
      prior, q = probe.network_scores(networks, params, probed[split])
      summary = probe.summarise(probed[split], prior, q, min_gap)
      rows.append({"checkpoint": label, "split": split, **summary})

  columns = (
    "decisions gainful best_gain gain_is_option0 pairs deviation_pairs "
    "prior_is_msa prior_pairwise prior_pairwise_deviations prior_finds_gain prior_pick_gain "
    "prior_pick_elsewhere model_is_msa model_pairwise model_pairwise_deviations "
    "model_finds_gain model_pick_gain model_pick_elsewhere model_error advantage_abs"
  ).split()
  print("| checkpoint | split | " + " | ".join(columns) + " |")
  print("|---|---|" + "---|" * len(columns))
  for row in rows:
    cells = [f"{row[c]:.4g}" if isinstance(row[c], float) else str(row[c]) for c in columns]
    print(f"| {row['checkpoint']} | {row['split']} | " + " | ".join(cells) + " |")
  if args.out:
    with open(args.out, "w", encoding="utf-8") as f:
      json.dump({"min_gap": min_gap, "seed": args.seed, "rows": rows}, f, indent=1)
  return 0


def probe_suite(probe, specs, game, decisions, seed, policy=None):
  """{split: decisions probed} along msa's trajectories (or `policy`'s), with progress on
  stderr."""
  probed = {}
  started = time.perf_counter()
  for split, split_specs in specs.items():
    probed[split] = []
    for i, spec in enumerate(split_specs, 1):
      if policy is None:
        probed[split] += probe.probe_program(spec, split, game, decisions, seed)
      else:
        probed[split] += probe.probe_policy_trajectory(spec, split, game, decisions, policy, seed)
      print(
        f"  {split} {i}/{len(split_specs)} {spec.name}: {len(probed[split])} decisions "
        f"({time.perf_counter() - started:.0f} s)",
        file=sys.stderr,
      )
  return probed
