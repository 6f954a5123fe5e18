"""The learning curve: greedy evaluations of the learner's parameters over a training run (its
evaluation search and its policy alone) against the baselines, appended to the work directory's
learning_curve.csv and drawn beside it (files configs/workdir.py names)."""

from __future__ import annotations

import csv
import io
import logging
import os
from typing import Any, Callable, Optional, Sequence

import numpy as np

from malloczero.actors.actor import OfferFn
from malloczero.actors.games import GameSpec
from malloczero.actors.greedy_play import evaluate_params
from malloczero.common.files import write_text
from malloczero.configs.config import Config
from malloczero.configs.workdir import WorkDir
from malloczero.evaluation.baselines import BASELINES, baseline_speedups
from malloczero.evaluation.suite import geomean, wins_ties_losses
from malloczero.learner.networks import MuZeroNetworks

_log = logging.getLogger("malloczero.training")

# `geomean_speedup`, `mean_return` and `beats_msa` (at least msa's speed-up, ties included) are
# the greedy evaluation search's; the `policy_` columns the network's policy alone (no search, no
# msa prior), so that the curve shows what the network itself learnt apart from what search adds.
# Curves written before the policy columns existed have them empty.
CURVE_FIELDS = (
  "learner_steps",
  "elapsed_s",
  "split",
  "geomean_speedup",
  "mean_return",
  "beats_msa",
  "programs",
  "policy_geomean_speedup",
  "policy_beats_msa",
)


class LearningCurve:
  """Greedy evaluations of the agent over training (its evaluation search, and its policy
  alone), appended to learning_curve.csv and drawn."""

  def __init__(
    self,
    networks: MuZeroNetworks,
    config: Config,
    workdir: str,
    splits: dict[str, Sequence[GameSpec]],
    offer: Optional[OfferFn] = None,
  ):
    """`offer` (the learner's `offer_demonstration`) is given each training program's game: an
    evaluation can find a faster mapping than the actors have."""
    self._networks, self._config, self._workdir = networks, config, WorkDir(workdir)
    self._offer = offer
    self._splits = {k: list(v) for k, v in splits.items() if v}
    self.baselines = baseline_speedups(
      [s for v in self._splits.values() for s in v], workdir, config.seed
    )
    self.path = self._workdir.learning_curve_csv
    self.rows: list[dict[str, Any]] = []
    if os.path.exists(self.path):  # A resumed run continues its curve.
      with open(self.path, encoding="utf-8") as f:
        self.rows = [dict(r) for r in csv.DictReader(f)]
    self.latest: dict[str, list] = {}

  def evaluate(
    self,
    params: Any,
    learner_steps: int,
    elapsed_s: float,
    should_stop: Optional[Callable[[], bool]] = None,
  ) -> list[dict[str, Any]]:
    """Greedy play of every split's programs; the curve's new rows (written and drawn). With
    `should_stop`, a stop ends the play within a search call and adds no row (an evaluation
    cut short is no point of the curve)."""
    new_rows = []
    for split, specs in self._splits.items():
      results = evaluate_params(
        self._networks,
        params,
        self._config,
        specs,
        seed=self._config.seed,
        policy_alone=True,
        should_stop=should_stop,
      )
      if any(r.unfinished for r in results):
        return []
      self.latest[split] = results
      if self._offer is not None and split == "train":
        self._offer_results(results)
      msa = self.baselines["msa"]
      search = {r.program: r.greedy_speedup for r in results}
      policy = {r.program: r.policy_speedup for r in results}
      new_rows.append(
        {
          "learner_steps": learner_steps,
          "elapsed_s": round(elapsed_s, 1),
          "split": split,
          "geomean_speedup": geomean(list(search.values())),
          "mean_return": float(np.mean([r.episode_return for r in results])),
          "beats_msa": _at_least_msa(search, msa),
          "programs": len(results),
          "policy_geomean_speedup": geomean(list(policy.values())),
          "policy_beats_msa": _at_least_msa(policy, msa),
        }
      )
    self.rows.extend(new_rows)
    # Rewritten whole and atomically (a few rows per evaluation): a run killed mid-write keeps
    # the previous curve instead of a torn last line that would break the resume.
    text = io.StringIO()
    writer = csv.DictWriter(text, CURVE_FIELDS, extrasaction="ignore", lineterminator="\n")
    writer.writeheader()
    writer.writerows(self.rows)
    write_text(self.path, text.getvalue())
    self.plot()
    return new_rows

  def _offer_results(self, results: Sequence[Any]) -> None:
    for result in results:
      # A return is the time saved as a fraction of all-slow: 1 - 1 / speed-up.
      try:
        self._offer(result.program, list(result.actions), 1.0 - 1.0 / result.speedup)
      except Exception as e:  # pylint: disable=broad-except  # Learner busy or stopping.
        _log.warning("offering %s's evaluation as a demonstration failed: %s", result.program, e)

  def baseline_geomean(self, solver: str, split: str) -> float:
    return geomean([self.baselines[solver][s.name] for s in self._splits[split]])

  def baseline_geomeans(self) -> dict[str, dict[str, float]]:
    """{split: {baseline: geomean speed-up}}, baselines in BASELINES order."""
    return {
      split: {b: self.baseline_geomean(b, split) for b in BASELINES} for split in self._splits
    }

  def plot(self) -> str:
    from malloczero.evaluation.plots import plot_learning_curves

    path = self._workdir.learning_curve_png
    plot_learning_curves(
      {self._config.name: self._workdir.root},
      self.baseline_geomeans(),
      path,
      f"malloczero {self._config.name} on suite '{self._config.measured_suite}' (greedy "
      "evaluation search; hollow markers: the policy alone)",
    )
    return path


def evaluator_split(config: Config) -> tuple[str, list[GameSpec]]:
  """The split the distributed evaluator's curve follows and its programs: the held-out ones
  (the training ones with `distributed.heldout_only_evaluator` off, or in a run that has no
  held-out programs, as `train --workload`)."""
  from malloczero.actors.games import program_specs

  split = "heldout" if config.distributed.heldout_only_evaluator else "train"
  specs = program_specs(config, split)
  if not specs:
    split, specs = "train", program_specs(config, "train")
  return split, specs


def complete_learning_curve(
  config: Config,
  workdir: str,
  learner_steps: int,
  elapsed_s: Optional[float],
  print_fn: Callable[[str], None] = print,
) -> Optional[dict[str, Any]]:
  """Evaluates the checkpoint of a distributed run that stopped at `learner_steps` for its
  learning curve when the evaluator had not (the run stops at its step limit while the evaluator
  waits for that step or still plays an earlier one), so that the curve ends with the network the
  run ends with, as a single-process run's does; the new row, or None when the curve already
  ends there. `elapsed_s` None: the run's time is unknown (its launcher is gone), and the row
  takes the curve's latest time."""
  from malloczero.learner.checkpoint import load_params
  from malloczero.learner.networks import make_networks

  split, specs = evaluator_split(config)
  curve = LearningCurve(make_networks(config.network, config.game), config, workdir, {split: specs})
  evaluated = [int(r["learner_steps"]) for r in curve.rows if r["split"] == split]
  if evaluated and max(evaluated) >= learner_steps:
    return None
  print_fn(
    "the evaluator stopped "
    + (f"at step {max(evaluated)}" if evaluated else "before its first evaluation")
    + f": evaluating step {learner_steps} on the {split} programs for the learning curve"
  )
  params = load_params(WorkDir(workdir).checkpoints)
  if elapsed_s is None:
    elapsed_s = max((float(r["elapsed_s"]) for r in curve.rows), default=0.0)
  (row,) = curve.evaluate(params, learner_steps, elapsed_s)
  print_fn(
    f"  step {learner_steps}: {split} geomean speed-up {row['geomean_speedup']:.3f} (policy "
    f"alone {row['policy_geomean_speedup']:.3f}, msa {curve.baseline_geomean('msa', split):.3f})"
  )
  return row


def _at_least_msa(speedups: dict[str, float], msa: dict[str, float]) -> int:
  """How many programs' speed-ups are at least msa's: its wins and ties, as the evaluation
  counts them."""
  wins, ties, _ = wins_ties_losses([speedup / msa[p] for p, speedup in speedups.items()])
  return wins + ties
