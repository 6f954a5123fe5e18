"""The files of a training run's work directory, named in one place.

Every part of the system (the learner's checkpoints, the agent that loads them, the nodes, the
launcher, the reports) reaches the work directory through `WorkDir`, so the layout below is the
only place its names are spelt. It lives beside the configs because every layer reads it:

  config.json                      the Config the run was started with
  train.lock                       held (flock) by the training launcher; holds its pid
  nodes.lock                       held shared by each local_mp node process while it runs
  checkpoints/learner_state.npz    parameters, optimiser state, step (restored on restart):
                                   arrays and JSON metadata, never a pickle
  checkpoints/replay/              Reverb's checkpoints of the replay table (distributed runs)
  checkpoints/counter.json         the counter node's counts (distributed runs)
  checkpoints/proposer.npz         the proposer (learner/proposer/), fitted before the run trains
  baselines.json                   msa / greedy / bestfit / random speed-ups of the programs, with
                                   each baseline's version (a changed baseline is recomputed)
  learning_curve.csv / .png        greedy evaluation of the agent against learner steps (its
                                   evaluation search, and its policy alone)
  logs/<label>/logs.csv            Acme CSV logs: learner, actor(s), evaluator
  tensorboard/<label>/             TensorBoard events (distributed runs)
  nodes/<name>.log                 each local_mp node's output
  report.{md,json,csv}, report_*.png, mappings/
                                   the final evaluation report and the agent's mappings
  best/<program>.json / .png       the fastest mapping found so far for each training program
                                   (the learner's demonstration of it), validated, and its
                                   memory map; rewritten whenever the run finds a faster one

A report directory (`malloczero evaluate --out`) holds the same report part under its own stem.
"""

from __future__ import annotations

import dataclasses
import os

CHECKPOINT_FILENAME = "learner_state.npz"
# The older checkpoint format (a pickle): refused when read, converted on request.
LEGACY_CHECKPOINT_FILENAME = "learner_state.pkl"
REPORT_STEM = "report"
PROPOSER_FILENAME = "proposer.npz"


@dataclasses.dataclass(frozen=True)
class WorkDir:
  """The paths of one work directory (nothing is created or read here)."""

  root: str

  @classmethod
  def of_checkpoint(cls, checkpoint_file: str) -> WorkDir:
    """The work directory of `.../RUN/checkpoints/learner_state.npz`."""
    return cls(os.path.dirname(os.path.dirname(os.path.abspath(checkpoint_file))))

  def _path(self, *parts: str) -> str:
    return os.path.join(self.root, *parts)

  @property
  def config(self) -> str:
    return self._path("config.json")

  @property
  def lock(self) -> str:
    """The launcher's exclusive lock: one training run per work directory."""
    return self._path("train.lock")

  @property
  def nodes_lock(self) -> str:
    """The node processes' shared lock: they may outlive a killed launcher while they save."""
    return self._path("nodes.lock")

  @property
  def checkpoints(self) -> str:
    return self._path("checkpoints")

  @property
  def learner_state(self) -> str:
    return os.path.join(self.checkpoints, CHECKPOINT_FILENAME)

  @property
  def candidates(self) -> str:
    """Checkpoints kept every `eval_every_steps` for the final evaluation's selection."""
    return self._path("candidates")

  @property
  def selection(self) -> str:
    """Which candidate the final evaluation chose, and each one's training-program geomean."""
    return os.path.join(self.candidates, "selection.json")

  @property
  def replay_checkpoints(self) -> str:
    return os.path.join(self.checkpoints, "replay")

  @property
  def proposer(self) -> str:
    """The proposer network fitted before the run trained (learner/proposer/)."""
    return os.path.join(self.checkpoints, PROPOSER_FILENAME)

  @property
  def counter(self) -> str:
    return os.path.join(self.checkpoints, "counter.json")

  @property
  def baselines(self) -> str:
    return self._path("baselines.json")

  @property
  def learning_curve_csv(self) -> str:
    return self._path("learning_curve.csv")

  @property
  def learning_curve_png(self) -> str:
    return self._path("learning_curve.png")

  @property
  def logs(self) -> str:
    return self._path("logs")

  def log_csv(self, label: str) -> str:
    """Where Acme's `CSVLogger(root, label=label, add_uid=False)` writes."""
    return os.path.join(self.logs, label, "logs.csv")

  @property
  def tensorboard(self) -> str:
    return self._path("tensorboard")

  def tensorboard_events(self, label: str) -> str:
    return os.path.join(self.tensorboard, label)

  @property
  def nodes(self) -> str:
    return self._path("nodes")

  def node_log(self, name: str) -> str:
    return os.path.join(self.nodes, f"{name}.log")

  @property
  def launch_files(self) -> str:
    """Where Launchpad writes the pickled program its node processes start from (instead of a
    folder in /tmp that a killed launcher would leave behind)."""
    return os.path.join(self.nodes, "program")

  def report(self, extension: str, stem: str = REPORT_STEM) -> str:
    """`report.md`, `.json` or `.csv` (or another stem's, e.g. `evaluation.md`)."""
    return self._path(f"{stem}.{extension}")

  @property
  def mappings(self) -> str:
    return self._path("mappings")

  @property
  def best(self) -> str:
    return self._path("best")

  def best_mapping(self, program: str, extension: str = "json") -> str:
    return os.path.join(self.best, f"{program}.{extension}")

  @property
  def evaluation(self) -> str:
    """Where the launcher suggests `malloczero evaluate --out` for this run."""
    return self._path("evaluation")
