"""How far can a policy fitted to exact one-move advantages play? The rollout oracle's whole games.

The policy learns from probes: at a decision, each legal move's exact advantage over msa's, msa
finishing the program (learner/probes/prober.py). The best any policy fitted to those targets can
do, everywhere it goes, is the *rollout policy* of msa (Bertsekas, "Rollout Algorithms for
Discrete Optimization", 2013, section 2: one-step lookahead with the base heuristic completing
each move, never worse than the base heuristic): at every decision of its own trajectory, it
plays the legal move with the best exact advantage given its own departures so far (msa's move
unless another beats it by more than `min_gain` of msa's time). Its whole-game time is the
ceiling of the probes' targets: a network that matched them at every state it reaches would play
exactly this.

Why: held-out network play stays near msa's (docs/results/README.md, "What limits the network's
own play"), and the data and the network's capacity were measured; this measures the targets.
The cost is one msa pass per legal move per decision, minutes per program of 1,000 buffers, so
`--max-decodes` keeps to the programs it can finish.

`--replay NPZ` plays the trajectories an earlier `--save` recorded from their recorded
advantages, no msa pass at all, in the game of `--checkpoint` with `--game FIELD=VALUE`
changed: the same decisions observed by another observation (e.g. `--game pressure_bins=8`), so
that `fit_deviations.py --game` can tell in seconds whether a feature makes the gainful ones
recognisable on programs it did not fit.

  .venv/bin/python scripts/rollout_oracle.py --suite default --split heldout --out oracle.csv
  .venv/bin/python scripts/rollout_oracle.py --suite default --split all --replay oracle.npz \
      --game pressure_bins=8 --save oracle-pressure.npz
"""

from __future__ import annotations

import argparse
import csv
import dataclasses
import sys
import time
from collections.abc import Mapping, Sequence

import numpy as np

from malloczero.env import Hardware, Workload
from malloczero.env.game import GameConfig, make_game
from malloczero.env.solvers.evo_msa import Genome
from malloczero.evaluation.suite import geomean
from malloczero.learner.probes import advantages_after
from malloczero.research.deviation_scores import ProbedDecision, load_probed, save_probed
from malloczero.research.fit_deviations import with_fields

# A departure must beat msa's move by more than this share of msa's time: below it, differences
# are the cost model's rounding, not a better mapping.
DEFAULT_MIN_GAIN = 1e-9


@dataclasses.dataclass(frozen=True)
class OraclePlay:
  """One program played by the rollout oracle."""

  program: str
  msa_time: float  # Seconds of msa's mapping (the cost model's).
  oracle_time: float  # Seconds of the oracle's.
  decisions: int  # Moves of its trajectory that offered more than one legal move.
  departures: int  # Of them, where it left msa's move.
  decodes: int  # msa passes spent (one per legal move other than msa's, per decision).
  seconds: float

  @property
  def speedup_over_msa(self) -> float:
    return self.msa_time / self.oracle_time


def play_rollout_oracle(
  workload: Workload,
  hardware: Hardware,
  config: GameConfig,
  program: str = "",
  min_gain: float = DEFAULT_MIN_GAIN,
  record: list[ProbedDecision] | None = None,
  split: str = "train",
  replay: Mapping[int, ProbedDecision] | None = None,
) -> tuple[OraclePlay, Genome]:
  """Plays the rollout oracle through one program of the msa game of `config`: (its play, its
  departures from msa {(buffer, use): slot}, whose decode is its mapping). With `record`, each of
  its decisions that offered a choice is appended to it with every legal move's exact advantage
  over msa's move there (the probes' kind, along the oracle's own trajectory, labelled `split`):
  the oracle computes them all anyway. With `replay` (a recording of this program by step, as
  `record` made it with the same `min_gain`), the advantages are the recording's and no msa pass
  is spent; ValueError (one line) where a decision is not the recording's, as when `config`
  changes the game's rules rather than its observation."""
  started = time.perf_counter()
  game = make_game(workload, hardware, dataclasses.replace(config, reward="advantage"))
  departures: Genome = {}
  decisions = decodes = 0
  timestep = game.reset()
  current = game.msa_time  # The trajectory's time if msa finishes from here.
  while not timestep.last():
    legal_mask = timestep.observation["legal_actions"]
    legal = np.flatnonzero(legal_mask)
    move = msa_move = game.msa_action
    if len(legal) > 1:
      decisions += 1
      if replay is None:
        decodes += len(legal) - 1
        advantages = advantages_after(game, departures, legal_mask, msa_move, with_msa=current)
      else:
        advantages = _recorded_advantages(replay, game.num_steps, legal_mask, msa_move, program)
      best = int(legal[np.argmax(advantages[legal])])
      gain = advantages[best] * game.msa_time
      if gain > current * min_gain:
        move = best
        departures[(game.decision.buffer, game.decision.use)] = move
        current -= gain
      if record is not None:
        observation = {k: np.asarray(v) for k, v in timestep.observation.items()}
        record.append(
          ProbedDecision(
            program, split, game.num_steps, msa_move, legal, advantages[legal], observation
          )
        )
    timestep = game.step(move)
  if replay is not None and decisions != len(replay):
    raise ValueError(
      f"{program}: {decisions} decisions played, {len(replay)} recorded: replay with the game "
      "and --min-gain it was recorded with"
    )
  play = OraclePlay(
    program,
    game.msa_time,
    game.total_time,
    decisions,
    len(departures),
    decodes,
    time.perf_counter() - started,
  )
  return play, departures


def _recorded_advantages(
  replay: Mapping[int, ProbedDecision],
  step: int,
  legal_mask: np.ndarray,
  msa_move: int,
  program: str,
) -> np.ndarray:
  """The recorded advantages `[A]` of the decision at `step` given its legal mask `[A]` (0 at
  moves not legal there), as `advantages_after` gives them."""
  recorded = replay.get(step)
  legal = np.flatnonzero(legal_mask).tolist()
  if recorded is None or list(recorded.actions) != legal or recorded.msa_action != msa_move:
    raise ValueError(
      f"{program}: decision {step} is not the recording's (its legal moves or msa's move "
      "differ): replay with the game and --min-gain it was recorded with"
    )
  advantages = np.zeros(legal_mask.shape, np.float64)
  advantages[recorded.actions] = recorded.advantages
  return advantages


def estimated_decodes(workload: Workload, hardware: Hardware, config: GameConfig) -> int:
  """The msa passes the oracle would spend on a program if it kept to msa's trajectory: the legal
  moves summed over msa's decisions that offer more than one (its own trajectory's differ
  little)."""
  game = make_game(workload, hardware, config)
  total = 0
  timestep = game.reset()
  while not timestep.last():
    legal = int(timestep.observation["legal_actions"].sum())
    total += legal if legal > 1 else 0
    timestep = game.step(game.msa_action)
  return total


def main(argv: Sequence[str] | None = None) -> int:
  """The command (`scripts/rollout_oracle.py`): parses `argv` (default: sys.argv), plays every
  program of the suite's split within `--max-decodes`, prints one line per program and the
  geometric mean; returns the exit status."""
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument(
    "--checkpoint", help="a training run whose game config to play (default: the `small` preset's)"
  )
  parser.add_argument("--suite", default="default")
  parser.add_argument("--split", default="heldout", choices=("train", "heldout", "all"))
  parser.add_argument(
    "--max-decodes",
    type=int,
    default=20000,
    metavar="N",
    help="skip programs whose msa trajectory offers more than N legal moves in all (the cost)",
  )
  parser.add_argument(
    "--min-gain",
    type=float,
    default=DEFAULT_MIN_GAIN,
    help="leave msa's move only for one that gains more than this share of the trajectory's "
    "time (the learner's probes.msa_margin is the same idea)",
  )
  parser.add_argument("--out", help="write one CSV row per program here")
  parser.add_argument(
    "--save",
    metavar="NPZ",
    help="write every decision of the oracle's trajectories with its moves' exact advantages "
    "(score_deviations --save's format: fit_deviations --probed reads it)",
  )
  parser.add_argument(
    "--replay",
    metavar="NPZ",
    help="play the trajectories an earlier --save recorded, from its advantages (no msa pass), "
    "for the programs it holds",
  )
  parser.add_argument(
    "--game",
    nargs="+",
    default=[],
    metavar="FIELD=VALUE",
    help="play the game of the checkpoint's config with these fields changed (with --replay: "
    "the recorded decisions under another observation, e.g. pressure_bins=8)",
  )
  args = parser.parse_args(argv)
  if args.max_decodes < 1 or args.min_gain < 0:
    parser.error("--max-decodes must be positive and --min-gain at least 0")

  from malloczero.actors.games import suite_games
  from malloczero.common.errors import MalloczeroError

  try:
    if args.checkpoint:
      from malloczero.actors.agent import load_agent

      config = load_agent(args.checkpoint).game
    else:
      from malloczero.configs.config import get_config

      config = get_config("small").game
    config = with_fields(config, args.game, "game")
    splits = ("train", "heldout") if args.split == "all" else (args.split,)
    specs = [(split, spec) for split in splits for spec in suite_games(args.suite, split)]
  except (MalloczeroError, ValueError) as e:
    print(f"error: {e}", file=sys.stderr)
    return 2
  replays: dict[str, dict[int, ProbedDecision]] = {}
  if args.replay:
    try:
      for decision in load_probed(args.replay):
        replays.setdefault(decision.program, {})[decision.step] = decision
    except (OSError, ValueError, KeyError) as e:
      print(f"error: cannot read recorded decisions from {args.replay}: {e}", file=sys.stderr)
      return 2
  rows, recorded = [], []
  for split, spec in specs:
    if args.replay and spec.name not in replays:
      print(f"{spec.name}: skipped (not in --replay)", flush=True)
      continue
    cost = 0 if args.replay else estimated_decodes(spec.workload, spec.hardware, config)
    if cost > args.max_decodes:
      print(f"{spec.name}: skipped ({cost} legal moves > --max-decodes)", flush=True)
      continue
    try:
      play, _ = play_rollout_oracle(
        spec.workload,
        spec.hardware,
        config,
        spec.name,
        args.min_gain,
        record=recorded if args.save else None,
        split=split,
        replay=replays.get(spec.name),
      )
    except ValueError as e:
      print(f"error: {e}", file=sys.stderr)
      return 2
    rows.append(play)
    print(
      f"{spec.name}: {play.speedup_over_msa:.4f}x msa, {play.departures} departures of "
      f"{play.decisions} decisions, {play.decodes} decodes, {play.seconds:.0f} s",
      flush=True,
    )
  if not rows:
    where = f"recorded in {args.replay}" if args.replay else "within --max-decodes"
    print(f"error: no program {where}", file=sys.stderr)
    return 2
  overall = geomean(p.speedup_over_msa for p in rows)
  print(f"rollout oracle: {overall:.4f}x msa over {len(rows)} of {len(specs)} programs")
  if args.save:
    save_probed(args.save, recorded)
    print(f"{len(recorded)} decisions: {args.save}")
  if args.out:
    with open(args.out, "w", newline="", encoding="utf-8") as f:
      writer = csv.writer(f)
      writer.writerow(
        [
          "suite",
          "entry",
          "msa_time",
          "oracle_time",
          "oracle_vs_msa",
          "decisions",
          "departures",
          "decodes",
          "seconds",
        ]
      )
      for p in rows:
        writer.writerow(
          [
            args.suite,
            p.program,
            p.msa_time,
            p.oracle_time,
            f"{p.speedup_over_msa:.6f}",
            p.decisions,
            p.departures,
            p.decodes,
            f"{p.seconds:.1f}",
          ]
        )
  return 0
