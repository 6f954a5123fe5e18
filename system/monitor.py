"""The launcher's watch over a running Launchpad program (system/distributed.py): what it samples
(counters, replay, live node processes), the summary line it prints, and how it decides that the
program stopped, failed or ran out of time."""

from __future__ import annotations

import csv
import dataclasses
import os
import re
import signal
import time
from typing import Any, Callable, Optional

import launchpad as lp
import psutil

from malloczero.configs.config import Config
from malloczero.configs.workdir import WorkDir
from malloczero.system.nodes import read_counts

# Nodes without which training cannot go on: the program is stopped when one of them dies.
ESSENTIAL_NODES = ("replay", "counter", "learner")
# How much of a dead node's log is read for its cause, and what an exception's line looks like
# (`ValueError: ...`, `malloczero.common.errors.MalloczeroError: ...`).
LOG_TAIL_BYTES = 64 << 10
_EXCEPTION_LINE = re.compile(r"^[A-Za-z_][\w.]*(Error|Exception|Exit|Interrupt)\b.*:")


@dataclasses.dataclass
class RunSample:
  """One look at the running program, taken by the launcher every summary period."""

  elapsed_s: float
  learner_steps: int
  actor_moves: int
  episodes: int
  replay_items: int
  inserts: int  # Items inserted into replay since the server started.
  samples: int  # Items sampled from replay since the server started.
  live_actors: int
  probes: int = 0  # Decisions the actors probed for the learner (learner/probes/).


def node_log_path(workdir: str, name: str) -> str:
  """Node `name`'s log (local_mp with output to files): actors' by their task (`actor_3`),
  the others' by their group (`learner_0` -> learner.log)."""
  group = name.rsplit("_", 1)[0]
  return WorkDir(workdir).node_log(name if group == "actor" else group)


def node_exit_cause(workdir: str, name: str) -> Optional[str]:
  """The line of node `name`'s log that says why it ended: its last exception line (Python's
  `SomeError: why`), else its last line, on one printable line; None without a log."""
  try:
    with open(node_log_path(workdir, name), "rb") as f:
      f.seek(0, os.SEEK_END)
      f.seek(max(0, f.tell() - LOG_TAIL_BYTES))
      tail = f.read().decode("utf-8", "replace")
  except OSError:
    return None
  lines = [line.strip() for line in tail.splitlines() if line.strip()]
  if not lines:
    return None
  errors = [line for line in lines if _EXCEPTION_LINE.match(line)]
  cause = "".join(c if c.isprintable() else " " for c in (errors or lines)[-1])
  return cause if len(cause) <= 200 else cause[:197] + "..."


class Monitor:
  """The launcher's view of a running program: counters, replay statistics, live nodes."""

  def __init__(
    self, program: lp.Program, launch: str, workdir: str, num_actors: int, start_step: int = 0
  ):
    import courier
    import reverb

    self._counter = courier.Client(
      program.groups["counter"][0].courier_address.resolve(), call_timeout=5
    )
    self._replay = reverb.Client(program.groups["replay"][0].reverb_address.resolve())
    self._launch = launch
    self._workdir = workdir
    self._num_actors = num_actors
    self._processes: dict[str, Any] = {}
    self.gone: set[str] = set()
    self.samples: list[RunSample] = []
    self.elapsed = 0.0
    # While the counter or replay is starting (or stopping) they do not answer: the last answers
    # stand in, so the summary shows neither zeros (negative rates) nor a resumed run at step 0.
    self.start_step = start_step
    self._last_counts: dict[str, float] = {}
    self._last_replay = (0, 0, 0)

  def log_path(self, name: str) -> str:
    return node_log_path(self._workdir, name)

  def exit_cause(self, name: str) -> Optional[str]:
    return node_exit_cause(self._workdir, name)

  def find_processes(self) -> None:
    """Node name (e.g. 'actor_1') -> process, from the launcher's children (local_mp)."""
    for child in psutil.Process().children(recursive=True):
      try:
        cmdline = child.cmdline()
      except psutil.Error:
        continue
      # Launchpad runs each node as: decorate_output COLOUR LABEL/INDEX python process_entry.py
      if len(cmdline) > 3 and cmdline[1].endswith("decorate_output"):
        self._processes[node_name(cmdline[3])] = child

  def newly_gone(self) -> list[str]:
    names = []
    for name, process in self._processes.items():
      if name in self.gone:
        continue
      try:
        alive = process.is_running() and process.status() != psutil.STATUS_ZOMBIE
      except psutil.Error:
        alive = False
      if not alive:
        self.gone.add(name)
        names.append(name)
    return names

  def counts(self) -> dict[str, float]:
    try:
      return dict(self._counter.get_counts())
    except Exception:  # pylint: disable=broad-except  # Starting or stopping.
      return {}

  def replay_stats(self) -> tuple[int, int, int]:
    from malloczero.replay.tables import TABLE_NAME

    try:
      info = self._replay.server_info(timeout=2)[TABLE_NAME]
    except Exception:  # pylint: disable=broad-except
      return 0, 0, 0
    limiter = info.rate_limiter_info
    return (
      int(info.current_size),
      int(limiter.insert_stats.completed),
      int(limiter.sample_stats.completed),
    )

  @property
  def num_found(self) -> int:
    return len(self._processes)

  def live_actors(self) -> int:
    if self._launch == "local_mp" and self._processes:
      return sum(1 for i in range(self._num_actors) if f"actor_{i}" not in self.gone)
    return self._num_actors

  def sample(self, elapsed_s: float) -> RunSample:
    counts = self.counts() or self._last_counts
    self._last_counts = counts
    replay = self.replay_stats()
    self._last_replay = replay = replay if any(replay) else self._last_replay
    items, inserts, samples = replay
    # Until the learner has told the counter its restored step, the checkpoint's step stands.
    learner_steps = max(int(counts.get("learner_steps", 0)), self.start_step)
    return RunSample(
      elapsed_s,
      learner_steps,
      int(counts.get("actor_moves", 0)),
      int(counts.get("actor_episodes", 0)),
      items,
      inserts,
      samples,
      self.live_actors(),
      int(counts.get("actor_probes", 0)),
    )

  def last_evaluation(self) -> Optional[dict[str, str]]:
    path = WorkDir(self._workdir).learning_curve_csv
    if not os.path.exists(path):
      return None
    with open(path, encoding="utf-8") as f:
      rows = list(csv.DictReader(f))
    return rows[-1] if rows else None


def node_name(title: str) -> str:
  """Launchpad's 'actor/1' -> 'actor_1' (the name in logs and messages)."""
  return title.replace("/", "_")


def summary_line(
  sample: RunSample,
  previous: Optional[RunSample],
  max_steps: int,
  num_actors: int,
  evaluation: Optional[dict[str, str]],
  msa: dict[str, float],
  min_replay_items: int = 0,
  start_step: int = 0,
) -> str:
  """One line per summary period; rates over the period, never negative, and no samples/insert
  before there is a period with inserts to divide by."""

  def rate(field: str) -> float:
    if previous is None or sample.elapsed_s <= previous.elapsed_s:
      return 0.0
    change = getattr(sample, field) - getattr(previous, field)
    return max(0.0, change / (sample.elapsed_s - previous.elapsed_s))

  learner = f"learner {sample.learner_steps}/{max_steps}"
  if sample.learner_steps <= start_step and sample.replay_items < min_replay_items:
    learner += f" (waiting for replay: {sample.replay_items:,}/{min_replay_items:,} items)"
  elif sample.learner_steps <= start_step and rate("learner_steps") == 0.0:
    learner += " (starting: replay is ready, the learner compiles its update)"
  else:
    learner += f" ({rate('learner_steps'):.1f}/s)"
  line = (
    f"[{sample.elapsed_s:5.0f} s] {learner} | actors {sample.live_actors}/{num_actors}: "
    f"{sample.actor_moves:,} moves ({rate('actor_moves'):,.0f}/s), "
    f"{sample.episodes} games"
    + (f", {sample.probes:,} probes" if sample.probes else "")
    + f" | replay {sample.replay_items:,} items"
  )
  if (
    previous is not None
    and sample.inserts > previous.inserts
    and sample.samples >= previous.samples
  ):
    line += (
      f", samples/insert "
      f"{(sample.samples - previous.samples) / (sample.inserts - previous.inserts):.2f}"
    )
  if evaluation is not None:
    split = evaluation["split"]
    policy = evaluation.get("policy_geomean_speedup")
    line += (
      f" | eval @{evaluation['learner_steps']} {split} "
      f"{float(evaluation['geomean_speedup']):.3f}x"
      + (f", policy {float(policy):.3f}x" if policy else "")
      + f" (msa {msa.get(split, float('nan')):.3f}x)"
    )
  return line


def stop_program() -> None:
  """What lp.stop() does from a node: SIGTERM to the launcher, whose worker manager handles it."""
  os.kill(os.getpid(), signal.SIGTERM)


def final_counts(workdir: str) -> dict[str, float]:
  counts, _ = read_counts(WorkDir(workdir).counter)
  return counts or {}


def watch(
  manager: Any,
  monitor: Monitor,
  config: Config,
  launch: str,
  num_actors: int,
  max_steps: int,
  max_seconds: Optional[float],
  msa: dict[str, float],
  print_fn: Callable[[str], None],
) -> tuple[str, Optional[str]]:
  """Prints a summary every few seconds until the program stops; returns why it stopped
  ('running' when it stopped by itself or by a signal) and, when it failed, the failure."""
  start = time.monotonic()
  status, failure = "running", None
  previous: Optional[RunSample] = None
  last_summary = start
  found_at = start + 3.0  # The node processes exist a moment after launch.
  stopping = False
  reached_at: Optional[float] = None
  while not manager.wait_for_stop(1.0):
    now = time.monotonic()
    monitor.elapsed = now - start
    if launch == "local_mp" and now >= found_at and found_at > 0:
      monitor.find_processes()
      found_at = 0.0 if monitor.num_found >= num_actors + 5 else now + 2.0
    if launch == "local_mt":
      try:
        manager.check_for_thread_worker_exception()
      except Exception as e:  # pylint: disable=broad-except
        status, failure = "failed", f"a node raised {type(e).__name__}: {e}"
        print_fn(f"failed: {failure}; stopping the program (checkpoints are kept)")
        stop_program()
        stopping = True
    for name in monitor.newly_gone():
      if stopping:
        continue
      if name.rsplit("_", 1)[0] in ESSENTIAL_NODES:
        status, failure = "failed", f"the {name.rsplit('_', 1)[0]} node exited"
        cause = monitor.exit_cause(name)
        if cause:
          failure += f" ({cause}; the rest in {monitor.log_path(name)})"
        print_fn(f"failed: {failure}; stopping the program (the last checkpoint is kept)")
        stop_program()
        stopping = True
      elif name.startswith("actor"):
        live = monitor.live_actors()
        print_fn(
          f"{name} exited; training continues with {live} of {num_actors} actors"
          if live
          else f"{name} exited; no actors left, the learner waits for data"
        )
      else:
        print_fn(f"{name} exited; training continues without it")
    if max_seconds is not None and monitor.elapsed > max_seconds and not stopping:
      status = "time limit"
      print_fn(f"time limit of {max_seconds:.0f} s reached: stopping the program")
      stop_program()
      stopping = True
    if now - last_summary >= config.distributed.summary_every_s and not stopping:
      # Not while stopping: the counter and replay go away and would read as zeros.
      sample = monitor.sample(monitor.elapsed)
      monitor.samples.append(sample)
      print_fn(
        summary_line(
          sample,
          previous,
          max_steps,
          num_actors,
          monitor.last_evaluation(),
          msa,
          config.replay.min_size_to_sample,
          monitor.start_step,
        )
      )
      previous, last_summary = sample, now
      if sample.learner_steps >= max_steps and reached_at is None:
        reached_at = now
    if reached_at is not None and now - reached_at > 15.0 and not stopping:
      # The limiter node stops the program at max_steps; this covers a limiter that died.
      stop_program()
      stopping = True
  monitor.elapsed = time.monotonic() - start
  return status, failure
