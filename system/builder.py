"""The builder: turns the Config into the parts of a training run.

As in Acme, the distributed program (system/nodes.py) and the single-process trainer
(system/single_process.py) only call this module to make their parts, so both wire the same
replay table, sampler, learner, actor and loggers; they differ only in where each part runs and
how the parts reach each other (in-process objects, or Launchpad handles). The loops that drive
the parts are in system/loops.py.
"""

from __future__ import annotations

import csv
import functools
import io
import threading
from typing import Any, Callable, Optional, Sequence

import reverb
from acme.utils import loggers

from malloczero.actors.actor import BatchedActor, EpisodeResult, OfferFn, OfferProbeFn
from malloczero.actors.games import GamePool, GameSpec, demonstration_specs, training_specs
from malloczero.actors.search import make_search_fn
from malloczero.actors.variable_client import VariableClient, VariableSource
from malloczero.common.files import write_text
from malloczero.configs.config import ActorConfig, Config
from malloczero.configs.workdir import WorkDir
from malloczero.evaluation.best_mappings import write_best_mapping
from malloczero.evaluation.learning_curve import LearningCurve
from malloczero.learner.demonstrations import Demonstrations
from malloczero.learner.learner import MuZeroLearner
from malloczero.learner.networks import MuZeroNetworks
from malloczero.learner.probes import Prober, ProbeStore
from malloczero.learner.reanalyse import SearchFn
from malloczero.replay import Sampler, SequenceWriter, make_table

# How long one learner sample may wait on the replay's rate limiter before the learner re-checks
# for a stop. Stopping an in-process server does not wake a sample blocked in the dataset (it reads
# the table directly, not over gRPC), so without a bound a learner waiting for inserts would never
# return, and joining it would hang the trainer (e.g. on max_seconds, or when the actor fails).
SAMPLE_TIMEOUT_MS = 1000


def make_replay_tables(config: Config) -> list[reverb.Table]:
  return [make_table(config)]


def make_replay_server(
  config: Config, port: Optional[int] = None, checkpoint_dir: Optional[str] = None
) -> reverb.Server:
  """A Reverb server holding the replay table (`port=None` picks a free port). With a
  `checkpoint_dir`, it restores the newest checkpoint there and `checkpoint()` writes to it."""
  checkpointer = (
    reverb.checkpointers.DefaultCheckpointer(checkpoint_dir) if checkpoint_dir is not None else None
  )
  return reverb.Server(tables=make_replay_tables(config), port=port, checkpointer=checkpointer)


def make_sampler(replay_address: str, config: Config) -> Sampler:
  return Sampler(replay_address, config, rate_limiter_timeout_ms=SAMPLE_TIMEOUT_MS)


def make_demonstrations(
  config: Config, specs: Sequence[GameSpec], workdir: Optional[WorkDir] = None
) -> Optional[Demonstrations]:
  """The best-trajectory store of the training programs `specs` (those of them that
  `learner.demonstration_programs` keeps: `demonstration_specs`), or None when the config mixes
  no demonstrations into batches. With a work directory, each program's best mapping so far is
  kept in its `best/` folder."""
  if not config.learner.demonstration_batch:
    return None
  on_improve = functools.partial(write_best_mapping, workdir.best) if workdir is not None else None
  return Demonstrations(
    demonstration_specs(config, specs),
    config.game,
    config.learner.sequence_length,
    seed=config.seed,
    on_improve=on_improve,
    departure_share=config.learner.demonstration_departures,
    unroll_steps=config.learner.unroll_steps,
  )


def make_reanalyse_search(networks: MuZeroNetworks, config: Config) -> Optional[SearchFn]:
  """The search the learner reanalyses with (the actors' training search, unjitted: the learner
  jits it in its own step), or None with reanalyse off."""
  if not config.learner.reanalyse_batch:
    return None
  return make_search_fn(networks, config.search, evaluation=False, jit=False)


def make_probe_store(config: Config) -> Optional[ProbeStore]:
  """The learner's store of probed decisions, or None with probes off."""
  if not config.probes.share:
    return None
  return ProbeStore(config.game, config.probes.capacity, seed=config.seed)


def make_learner(
  networks: MuZeroNetworks,
  config: Config,
  sampler: Sampler,
  workdir: WorkDir,
  train_specs: Sequence[GameSpec] = (),
) -> MuZeroLearner:
  """The learner on the sampler's batches; it resumes from the work directory's checkpoint.
  With demonstrations on, those of the training programs `train_specs` come back with the
  checkpoint, and msa's own play is added (in a background thread) for every program that has
  none yet.

  Raises MalloczeroError, before anything runs, when that checkpoint is unusable."""
  demonstrations = make_demonstrations(config, train_specs, workdir)
  learner = MuZeroLearner(
    networks,
    config,
    sample_fn=sampler.sample,
    update_priorities_fn=sampler.update_priorities,
    seed=config.seed,
    checkpoint_dir=workdir.checkpoints,
    demonstrations=demonstrations,
    candidates_dir=workdir.candidates,
    reanalyse_search=make_reanalyse_search(networks, config),
    probes=make_probe_store(config),
  )
  if demonstrations is not None:
    # In the background: replaying msa on every program takes tens of seconds, and the actors
    # wait for the learner's parameters; batches have no demonstrations until the first is in.
    threading.Thread(
      target=demonstrations.add_heuristic, name="demonstrations", daemon=True
    ).start()
  return learner


def make_variable_client(source: VariableSource, config: ActorConfig) -> VariableClient:
  return VariableClient(source, config.variable_update_period)


def make_actor(
  networks: MuZeroNetworks,
  config: Config,
  replay: reverb.Client,
  variables: VariableClient,
  seed: int,
  should_stop: Callable[[], bool],
  on_episode: Callable[[EpisodeResult], None],
  offer: Optional[OfferFn] = None,
  offer_probe: Optional[OfferProbeFn] = None,
) -> BatchedActor:
  """The batched self-play actor on the suite's train programs, writing into replay; a replay
  write blocked by the rate limiter gives up once `should_stop()`. With `offer` (the learner's
  `offer_demonstration`), games faster than the best known are offered as demonstrations; with
  probes on and `offer_probe` (the learner's), it probes decisions of the same programs for the
  learner (learner/probes/)."""
  pool = GamePool(
    training_specs(config),
    config.game,
    config.actor.num_games,
    seed=seed,
    cached_games=config.actor.cached_games,
  )
  writer = SequenceWriter(replay, config, config.actor.num_games, should_stop=should_stop)
  return BatchedActor(
    networks,
    config,
    pool,
    variables,
    writer,
    seed=seed,
    on_episode=on_episode,
    offer=offer if config.learner.demonstration_batch else None,
    prober=(
      Prober(
        pool.specs,
        config.game,
        seed=seed + 1,
        on_policy=config.probes.on_policy,
        per_rollout=config.probes.on_policy_per_rollout,
        cached_games=config.actor.cached_games,
      )
      if config.probes.share
      else None
    ),
    offer_probe=offer_probe if config.probes.share else None,
  )


def make_evaluator(
  networks: MuZeroNetworks,
  config: Config,
  workdir: WorkDir,
  splits: dict[str, Sequence[GameSpec]],
  offer: Optional[OfferFn] = None,
) -> LearningCurve:
  """Greedy evaluation of the learner's parameters on each split's programs (the evaluation search:
  more simulations, no noise), appended to the work directory's learning curve beside the
  baselines' speed-ups (computed once, cached in `workdir.baselines`). With `offer` (the
  learner's `offer_demonstration`), the games of the training programs are offered as
  demonstrations."""
  return LearningCurve(
    networks,
    config,
    workdir.root,
    splits,
    offer=offer if config.learner.demonstration_batch else None,
  )


class ResumableCSVLogger(loggers.CSVLogger):
  """Acme's CSV logger (one row per write, the columns fixed at the first write), for a log that a
  resumed run appends to: its rows follow the columns of the file's header, and fields the header
  lacks (a setting turned on at the resume, such as `--set learner.reanalyse_fraction`) become
  new columns, the file rewritten once with them (earlier rows blank there). Acme's own logger
  writes such rows under the old header, every column after a new one shifted."""

  def write(self, data: loggers.LoggingData) -> None:
    # pylint: disable=protected-access  # Acme's writer is made at the first write; made here.
    if self._writer is None and self._file_owner and self._file.tell() > 0:
      self._writer = self._appending_writer(sorted(data.keys()))
    super().write(data)

  def _appending_writer(self, keys: list[str]) -> csv.DictWriter:
    path = self._file.name
    self._file.close()
    with open(path, encoding="utf-8", newline="") as f:
      reader = csv.DictReader(f)
      fields, rows = list(reader.fieldnames or []), list(reader)
    added = [k for k in keys if k not in fields]
    if added:
      fields += added
      text = io.StringIO()
      writer = csv.DictWriter(text, fields, restval="")
      writer.writeheader()
      writer.writerows(rows)
      write_text(path, text.getvalue())
    self._file = open(path, "a", encoding="utf-8")  # pylint: disable=consider-using-with
    return csv.DictWriter(self._file, fieldnames=fields, extrasaction="ignore", restval="")


def make_logger(
  workdir: WorkDir,
  label: str,
  print_fn: Optional[Callable[[str], None]] = None,
  print_every_s: float = 0.0,
  tensorboard: bool = False,
  steps_key: Optional[str] = None,
  time_delta: float = 0.0,
) -> loggers.Logger:
  """Acme's logger for one part of a run: CSV rows in `workdir.log_csv(label)`; with `print_fn`,
  console lines at most every `print_every_s`; with `tensorboard`, events stepped by `steps_key`.
  A `time_delta` drops rows written sooner than that after the last one."""
  targets: list[loggers.Logger] = [ResumableCSVLogger(workdir.root, label=label, add_uid=False)]
  if print_fn is not None:
    targets.append(loggers.TerminalLogger(label=label, print_fn=print_fn, time_delta=print_every_s))
  if tensorboard:
    from acme.utils.loggers.tf_summary import TFSummaryLogger

    targets.append(
      TFSummaryLogger(workdir.tensorboard_events(label), label=label, steps_key=steps_key)
    )

  def serialize(data: Any) -> Any:
    if steps_key in data:  # A TensorBoard step is an integer (the learner counts in floats).
      data = dict(data, **{steps_key: int(data[steps_key])})
    return loggers.to_numpy(data)

  logger = loggers.Dispatcher(targets, serialize_fn=serialize)
  return loggers.TimeFilter(logger, time_delta) if time_delta > 0 else logger
