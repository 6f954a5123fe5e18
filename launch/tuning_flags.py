"""`train`'s flags that override one field of the preset's config (the game, learner, search or
actor section), declared once as a table so that the flag, its help (with the default preset's
value) and the override stay together."""

from __future__ import annotations

import argparse
import dataclasses
from typing import Any, Callable

from malloczero.configs.config import Config
from malloczero.env.game.config import REWARDS
from malloczero.launch.flags import (
  FlagError,
  fraction,
  non_negative_float,
  non_negative_int,
  on_off,
  positive_int,
  probability,
)


@dataclasses.dataclass(frozen=True)
class TuningFlag:
  flag: str  # "--skip-below"
  section: str  # The Config section it overrides: "game", "learner", "search", "actor", "probes".
  field: str  # The field of that section.
  help: str  # Ends with the default, which `add_tuning_flags` appends.
  type: Callable[[str], Any] | None = None
  metavar: str | None = None
  choices: tuple[str, ...] | None = None

  @property
  def dest(self) -> str:
    return self.flag.lstrip("-").replace("-", "_")


TUNING_FLAGS = (
  TuningFlag(
    "--reward",
    "game",
    "reward",
    "advantage: a game returns the fraction of msa's time it saves (0 for msa's play); time: "
    "each move its time saved over the all-slow time (the first reward, for comparison)",
    choices=REWARDS,
  ),
  TuningFlag(
    "--segment-moves",
    "actor",
    "segment_moves",
    "actors play short games: this many moves from a random point of msa's game, msa the "
    "rest (0: whole programs)",
    non_negative_int,
    "N",
  ),
  TuningFlag(
    "--imitate-gains-only",
    "actor",
    "imitate_gains_only",
    "on: a game no faster than msa's mapping teaches msa's move wherever it left it, so the "
    "policy learns departures from msa only from games that beat msa",
    on_off,
    "{on,off}",
  ),
  TuningFlag(
    "--skip-below",
    "game",
    "skip_below",
    "the game plays msa's own choice at decisions whose best option saves less than this "
    "fraction of the all-slow time",
    fraction,
    "FRACTION",
  ),
  TuningFlag(
    "--demonstrations",
    "learner",
    "demonstration_fraction",
    "share of each learner batch drawn from the best known game per training program, msa's "
    "own at first (0 turns them off)",
    fraction,
    "FRACTION",
  ),
  TuningFlag(
    "--demonstration-departures",
    "learner",
    "demonstration_departures",
    "share of demonstration windows placed on a step where the demonstration leaves msa's move "
    "(the rest start uniformly)",
    probability,
    "FRACTION",
  ),
  TuningFlag(
    "--reanalyse",
    "learner",
    "reanalyse_fraction",
    "share of the items sampled from replay whose policy targets the learner searches again "
    "with its current parameters (MuZero Reanalyse; self-imitation targets and demonstrations "
    "keep theirs)",
    probability,
    "FRACTION",
  ),
  TuningFlag(
    "--probes",
    "probes",
    "share",
    "share of each actor's time spent probing decisions of msa's game (every legal move played "
    "once, msa the rest), whose exact advantages over msa the learner fits the policy to (0 "
    "turns probes off)",
    fraction,
    "SHARE",
  ),
  TuningFlag(
    "--probes-on-policy",
    "probes",
    "on_policy",
    "share of the probes drawn along the network's own trajectory (its policy alone from the "
    "program's start) rather than msa's, with --probes",
    probability,
    "SHARE",
  ),
  TuningFlag(
    "--probe-batch",
    "probes",
    "batch",
    "probed decisions the learner fits beside each batch, with --probes",
    positive_int,
    "N",
  ),
  TuningFlag(
    "--probe-msa-margin",
    "probes",
    "msa_margin",
    "added to msa's move's advantage in the probes' policy targets: the policy leaves msa's "
    "move only where another gains more than this (in fractions of msa's time), with --probes",
    non_negative_float,
    "MARGIN",
  ),
  TuningFlag(
    "--policy-loss-weight",
    "learner",
    "policy_loss_weight",
    "weight of the policy's fit to replay's and demonstrations' targets (with --probes, 0 "
    "leaves the policy to the probes' exact advantages)",
    non_negative_float,
    "WEIGHT",
  ),
  TuningFlag(
    "--lr-decay-steps",
    "learner",
    "decay_steps",
    "learner steps after the warm-up over which the learning rate falls (cosine) to a tenth of "
    "its peak, where it stays",
    positive_int,
    "N",
  ),
  TuningFlag(
    "--q-spread-floor",
    "search",
    "q_spread_floor",
    "the search rescales a node's Q-values by at least this spread, in return units",
    non_negative_float,
    "RETURN",
  ),
  TuningFlag(
    "--eval-q-spread-floor",
    "search",
    "eval_q_spread_floor",
    "the same floor for evaluation searches (greedy play: the learning curve, the final report, "
    "the agent solver's first attempt)",
    non_negative_float,
    "RETURN",
  ),
  TuningFlag(
    "--eval-msa-prior",
    "search",
    "eval_msa_prior_logit",
    "evaluation searches add this to the root prior's logit of msa's own move (0 leaves the "
    "prior to the network)",
    non_negative_float,
    "LOGIT",
  ),
)


def _shown(default: Any) -> str:
  if isinstance(default, bool):
    return "on" if default else "off"
  return f"{default:g}" if isinstance(default, float) else str(default)


def add_tuning_flags(parser: argparse.ArgumentParser, defaults: Config) -> None:
  for f in TUNING_FLAGS:
    default = getattr(getattr(defaults, f.section), f.field)
    parser.add_argument(
      f.flag,
      dest=f.dest,
      type=f.type,
      metavar=f.metavar,
      choices=f.choices,
      help=f"{f.help} (default: the config's, {_shown(default)})",
    )


def apply_tuning_flags(config: Config, args: argparse.Namespace) -> Config:
  """The config with the flags given; flags that contradict each other or the preset are a
  `FlagError` (exit 2)."""
  overrides: dict[str, dict[str, Any]] = {}
  for f in TUNING_FLAGS:
    value = getattr(args, f.dest)
    if value is not None:
      overrides.setdefault(f.section, {})[f.field] = value
  try:
    return dataclasses.replace(
      config,
      **{s: dataclasses.replace(getattr(config, s), **v) for s, v in overrides.items()},
    )
  except ValueError as e:
    raise FlagError(str(e)) from None
