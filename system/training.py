"""What every training launch shares: its config saved in the work directory, the checks that a
work directory can be resumed (or is finished), and the stopwatch. The learning curve and the
baselines it compares against are the evaluation package's (evaluation/learning_curve.py,
evaluation/baselines.py).
"""

from __future__ import annotations

import dataclasses
import json
import math
import os
import time
from typing import Any, Callable, Optional

from malloczero.common.errors import MalloczeroError
from malloczero.common.files import write_text
from malloczero.configs.config import Config, ProposerConfig
from malloczero.configs.workdir import WorkDir


def save_config(config: Config, workdir: str) -> None:
  os.makedirs(workdir, exist_ok=True)
  write_text(WorkDir(workdir).config, json.dumps(dataclasses.asdict(config), indent=1))


def _comparable(config_dict: dict[str, Any]) -> dict[str, Any]:
  """The parts of a config that a checkpoint depends on (networks, game, replay items), and the
  suite its learning curve and demonstrations are of."""
  learner = config_dict.get("learner", {})
  return {
    "network": config_dict.get("network"),
    "game": config_dict.get("game"),
    "suite": config_dict.get("suite"),
    # The learning curve's points are of the report suite's programs.
    "report_suite": config_dict.get("report_suite", ""),
    "programs": config_dict.get("programs", []),
    "capacity_variants": config_dict.get("capacity_variants", []),
    "sequence": (learner.get("unroll_steps"), learner.get("td_steps")),
  }


def check_workdir(config: Config, workdir: str) -> Optional[int]:
  """The learner step a work directory resumes from (None for a new run).

  Raises MalloczeroError when the directory holds a run of another configuration or an unreadable
  checkpoint, before anything is started."""
  from malloczero.learner.checkpoint import checkpoint_steps, refuse_legacy

  files = WorkDir(workdir)
  saved = files.config
  if os.path.exists(saved):
    try:
      with open(saved, encoding="utf-8") as f:
        previous = json.load(f)
    except (OSError, ValueError) as e:
      raise MalloczeroError(f"{saved} is unreadable ({e}); use another --workdir") from e
    if not isinstance(previous, dict) or not isinstance(previous.get("learner", {}), dict):
      raise MalloczeroError(
        f"{saved} is not a run's config (a JSON object with a 'learner' "
        "object); use another --workdir"
      )
    # Through JSON, as config.json went: tuples come back as lists.
    current = json.loads(json.dumps(dataclasses.asdict(config)))
    if _comparable(previous) != _comparable(current):
      raise MalloczeroError(
        f"{workdir} holds a run of config '{previous.get('name')}' on suite "
        f"'{previous.get('suite')}' with other networks, game settings, report suite, "
        "--workload programs or capacity variants; resume it with the same --config, --suite, "
        "--set report_suite, --set capacity_variants and --workload (--hardware, --capacity), "
        "or use another --workdir"
      )
  if os.path.isdir(files.checkpoints) and os.path.exists(files.learner_state):
    return checkpoint_steps(files.checkpoints)
  if os.path.isdir(files.checkpoints):
    refuse_legacy(files.checkpoints)  # Never a fresh start over an unconverted older run.
  return None


def preflight(config: Config, workdir: str, max_steps: int, final_report: bool = False) -> None:
  """What a run would refuse, checked before its work directory is locked (so before any file in
  it, its locks included, is written): a suite or report suite with no train split, another
  configuration's or an unreadable run in the directory, a run already at `max_steps` (unless
  `final_report` and its report is missing: `report_missing`), and for a resumed run the
  learner checkpoint (every array, NaN refused), the demonstrations and the replay checkpoint it
  will load. Read-only; the launch checks again under the lock."""
  if config.suite:
    from malloczero.env.programs.suites import get_suite

    suite = get_suite(config.suite)
    suite.split("train")
    if suite.training_only and not config.report_suite:
      raise MalloczeroError(
        f"suite '{config.suite}' is for training only: it holds no held-out programs to report "
        "on; name the suite to report on with --set report_suite=default"
      )
  if config.report_suite:
    from malloczero.env.programs.suites import get_suite

    reported = get_suite(config.report_suite)
    reported.split("train")
    reported.split("heldout")
  if not os.path.isdir(workdir):
    return
  start_step = check_workdir(config, workdir)
  if not (final_report and report_missing(config, workdir, start_step, max_steps)):
    refuse_finished(workdir, start_step, max_steps)
  if start_step is None:
    return
  # What the resumed nodes will load, read now: damage found by a node 30 s into the launch
  # surfaces only as "the learner node exited".
  from malloczero.learner.checkpoint import load_params
  from malloczero.learner.demonstrations import read_demonstrations
  from malloczero.replay.checkpoints import check_replay_checkpoint

  files = WorkDir(workdir)
  load_params(files.learner_state)
  read_demonstrations(files.checkpoints)
  check_replay_checkpoint(files.replay_checkpoints)


def refuse_finished(workdir: str, start_step: Optional[int], max_steps: int) -> None:
  """A run already at `max_steps` is refused rather than trained again and saved over, in every
  launch mode."""
  if start_step is not None and start_step >= max_steps:
    raise MalloczeroError(
      f"{workdir} is already at learner step {start_step} >= --max-steps "
      f"{max_steps}; raise --max-steps to train further, or give a new "
      "--workdir for a fresh run"
    )


def report_missing(config: Config, workdir: str, start_step: Optional[int], max_steps: int) -> bool:
  """Whether `workdir` holds a run on a suite that reached `max_steps` but has no final report:
  its launcher stopped during the final evaluation (Ctrl-C, SIGTERM, SIGKILL). `train` then
  writes the report rather than refusing the finished run."""
  return (
    bool(config.suite)
    and start_step is not None
    and start_step >= max_steps
    and not os.path.exists(WorkDir(workdir).report("md"))
  )


# The share of a run's time limit the proposer's fit and tuning may take: the tuning stops
# there, so that the msa game's learner trains on a machine slower than the one `tune_steps` was
# sized on.
PROPOSER_SHARE = 0.9


def fit_run_proposer(
  config: Config,
  workdir: str,
  print_fn: Callable[[str], None],
  max_seconds: Optional[float] = None,
) -> float:
  """Fits the run's proposer (`config.proposer`, learner/proposer/) to its labels, tunes it, and
  saves it as WORKDIR/checkpoints/proposer.npz, once: a resumed run keeps the one it has, and
  `steps` 0 fits none. With the run's `max_seconds`, the tuning stops at `PROPOSER_SHARE` of it.
  Returns the seconds it took, which the run's time limit includes."""
  settings, files = config.proposer, WorkDir(workdir)
  if not settings.steps or os.path.exists(files.proposer):
    return 0.0
  from malloczero.learner.proposer import BUILTIN_LABELS, Labels, fit, labelled_programs

  clock = Stopwatch()
  labels = Labels.load(settings.labels or BUILTIN_LABELS)
  total = min(settings.max_programs or len(labels.entries), len(labels.entries))
  print_fn(f"proposer: building the features of {total} labelled programs of '{labels.suite}'")

  def built(done: int, total: int) -> None:
    if done % 100 == 0:
      print_fn(f"proposer: {done}/{total} programs ({clock.elapsed:.0f} s)")

  programs = labelled_programs(
    labels, settings.max_programs, config.seed, progress=built, placements=settings.tune_steps > 0
  )
  requests = sum(len(p["placed"]) for p in programs)
  total_steps = settings.steps * settings.members
  print_fn(
    f"proposer: fitting {settings.members} network(s) to {requests:,} requests, "
    f"{settings.steps} steps each"
  )
  proposer = fit(
    programs,
    seed=config.seed,
    steps=settings.steps,
    batch=settings.batch_size,
    learning_rate=settings.learning_rate,
    members=settings.members,
    saving_weight=settings.saving_weight,
    progress=lambda step, loss: print_fn(
      f"proposer: step {step}/{total_steps}, loss {loss:.4f} ({clock.elapsed:.0f} s)"
    ),
  )
  if settings.tune_steps:
    deadline = None if max_seconds is None else clock.start + PROPOSER_SHARE * max_seconds
    proposer = tune_run_proposer(
      proposer, programs, settings, config.seed, clock, print_fn, deadline=deadline
    )
  os.makedirs(files.checkpoints, exist_ok=True)
  proposer.save(files.proposer)
  print_fn(f"proposer: saved {files.proposer} in {clock.elapsed:.0f} s")
  return clock.elapsed


def tune_run_proposer(
  proposer: Any,
  programs: list[dict],
  settings: ProposerConfig,
  seed: int,
  clock: "Stopwatch",
  print_fn: Callable[[str], None],
  deadline: Optional[float] = None,
) -> Any:
  """The fitted `proposer` tuned (learner/proposer/tuning.py) for `settings.tune_steps` steps on
  the labelled `programs` (with their placements), or fewer where the `deadline` stops it; its
  progress printed every 10 steps."""
  from malloczero.learner.proposer.tuning import TuningSettings, tune, tuning_targets

  tuning = TuningSettings(
    steps=settings.tune_steps, pairs=settings.tune_pairs, batch=settings.tune_batch
  )
  print_fn(
    f"proposer: tuning its last layers on one decode's speed over msa, {tuning.steps} steps of "
    f"{2 * tuning.pairs} perturbations x {min(tuning.batch, len(programs))} programs"
  )

  made = [0]

  def tuned(step: int, _, fitness: float) -> None:
    made[0] = step
    if step % 10 == 0 or step == tuning.steps:
      print_fn(
        f"proposer: tuning step {step}/{tuning.steps}, perturbations' geomean "
        f"{math.exp(fitness):.4f}x msa ({clock.elapsed:.0f} s)"
      )

  targets = tuning_targets(proposer, programs)
  # Nothing else runs yet: every core decodes.
  workers = os.cpu_count() or 1
  proposer = tune(
    proposer, targets, tuning, seed=seed, progress=tuned, workers=workers, deadline=deadline
  )
  if made[0] < tuning.steps:
    print_fn(
      f"proposer: tuning stopped after {made[0]} of {tuning.steps} steps, at "
      f"{PROPOSER_SHARE:.0%} of the run's time limit"
    )
  return proposer


class Stopwatch:
  def __init__(self):
    self.start = time.monotonic()

  @property
  def elapsed(self) -> float:
    return time.monotonic() - self.start
