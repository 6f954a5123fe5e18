"""The Launchpad program end to end: real local_mp launches of every node, faults, resume, and the
Vertex AI program built (not launched) for 64 actors."""

from __future__ import annotations

import csv
import dataclasses
import json
import os
import re
import signal
import subprocess
import sys
import threading
import time

import psutil
import pytest

from malloczero.common.errors import MalloczeroError
from malloczero.configs.config import get_config
from malloczero.env.mapping import load_mapping
from malloczero.env.programs.suites import get_suite
from malloczero.learner.checkpoint import checkpoint_steps, load_params, params_digest
from malloczero.system.distributed import build_program, check_workdir
from malloczero.system.monitor import node_name
from malloczero.system.nodes import NodeContext

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
RUN_TIMEOUT_S = 420
# Under pytest-xdist (`make test` runs 2 workers) these launches of a whole program run on one
# worker, one at a time: two programs of 7 node processes each would starve each other's nodes.
LAUNCHES_IN_TURN = pytest.mark.xdist_group("launchpad")


_LAUNCHES: list["_Launch"] = []


@pytest.fixture(autouse=True)
def _no_run_outlives_its_test():
  """A failing test must not leave a training program running (it would slow every later test)."""
  yield
  while _LAUNCHES:
    _LAUNCHES.pop().kill()


class _Launch:
  """`malloczero train --launch local_mp` in a subprocess, with every process it ever started."""

  def __init__(self, workdir, *args: str):
    _LAUNCHES.append(self)
    self.workdir = workdir
    self.process = subprocess.Popen(
      [
        sys.executable,
        "-m",
        "malloczero",
        "train",
        "--launch",
        "local_mp",
        "--config",
        "tiny",
        "--num-actors",
        "2",
        "--workdir",
        str(workdir),
        *args,
      ],
      cwd=REPO,
      stdout=subprocess.PIPE,
      stderr=subprocess.STDOUT,
      text=True,
    )
    self.seen: dict[int, psutil.Process] = {}
    self.lines: list[str] = []
    self._reader = threading.Thread(target=self._read, daemon=True)
    self._reader.start()

  def _read(self) -> None:
    for line in self.process.stdout:
      self.lines.append(line)

  def learner_steps(self) -> int:
    """The learner's step in the launcher's latest summary line ('learner N/MAX')."""
    for line in reversed(self.lines):
      match = re.search(r"\] learner (\d+)/", line)
      if match:
        return int(match.group(1))
    return 0

  def node_processes(self) -> dict[str, psutil.Process]:
    """Node name -> its Python process (the child of Launchpad's output decorator)."""
    nodes = {}
    try:
      children = psutil.Process(self.process.pid).children(recursive=True)
    except psutil.Error:
      return nodes
    for child in children:
      self.seen[child.pid] = child
      try:
        cmdline = child.cmdline()
      except psutil.Error:
        continue
      if len(cmdline) > 4 and cmdline[1].endswith("decorate_output"):
        for grandchild in child.children():
          try:  # A process that is exiting (a zombie) has no command line any more.
            if "process_entry" in " ".join(grandchild.cmdline()):
              nodes[node_name(cmdline[3])] = grandchild
          except psutil.Error:
            continue
    return nodes

  def wait_until(self, condition, what: str, timeout_s: float = RUN_TIMEOUT_S) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
      self.node_processes()
      if condition():
        return
      if self.process.poll() is not None:
        self._reader.join(timeout=10)
        pytest.fail(
          f"training exited ({self.process.returncode}) before {what}:\n"
          f"{''.join(self.lines)[-3000:]}"
        )
      time.sleep(0.5)
    self.process.kill()
    pytest.fail(f"timed out waiting for {what}")

  def finish(self) -> tuple[int, str]:
    self.process.wait(timeout=RUN_TIMEOUT_S)
    self._reader.join(timeout=30)
    return self.process.returncode, "".join(self.lines)

  def kill(self) -> None:
    self.node_processes()
    for process in [psutil.Process(self.process.pid)] if self.process.poll() is None else []:
      self.seen[process.pid] = process
    for process in self.seen.values():
      try:
        process.kill()
      except psutil.Error:
        pass
    self.process.wait(timeout=30)

  def orphans(self) -> list[str]:
    time.sleep(1.0)
    left = []
    for pid, process in self.seen.items():
      try:
        if process.is_running() and process.status() != psutil.STATUS_ZOMBIE:
          left.append(f"{pid}: {' '.join(process.cmdline())[:120]}")
      except psutil.Error:
        pass
    return left


@pytest.mark.slow
@LAUNCHES_IN_TURN
def test_local_mp_survives_a_killed_actor_and_a_launcher_stopped_in_its_final_evaluation(
  tmp_path,
):
  """actor_1 is killed and the learner steps on without it; Ctrl-C during the final evaluation
  stops the launcher (exit 130, no report); the same command then writes the finished run's
  report without starting a node, and does again after a SIGKILL in that evaluation."""
  workdir = tmp_path / "run"
  args = ("--max-steps", "200", "--set", "eval_every_steps=1000", "--set", "probes.share=0.3")
  finals = lambda run: any("final evaluation of step" in line for line in run.lines)  # noqa: E731

  # 1. A tiny run with 2 actors that also probe decisions for the learner; actor_1's process is
  # killed once the learner is stepping, and the launcher is interrupted in the final evaluation.
  run = _Launch(workdir, *args)
  run.wait_until(
    lambda: run.learner_steps() >= 1 and "actor_1" in run.node_processes(),
    "the learner stepping with both actors live",
  )
  killed_at = run.learner_steps()
  victim = run.node_processes()["actor_1"]
  victim.send_signal(signal.SIGKILL)
  victim.wait(timeout=30)
  run.wait_until(lambda: finals(run), "the final evaluation")
  run.process.send_signal(signal.SIGINT)
  code, output = run.finish()
  assert code == 130, output[-3000:]
  assert "malloczero: interrupted; resume with: malloczero train " in output, output[-3000:]
  assert not (workdir / "report.md").exists()
  assert run.orphans() == []
  assert "actor_1 exited; training continues with 1 of 2 actors" in output, output[-6000:]
  assert killed_at < 200
  checkpoint = workdir / "checkpoints" / "learner_state.npz"
  assert checkpoint_steps(str(checkpoint)) == 200  # The learner kept stepping without actor_1.
  # The evaluator (every 1,000 steps) never reached step 200: the launcher played it after the
  # nodes stopped, so the curve ends with the network the run ends with.
  curve = list(csv.DictReader((workdir / "learning_curve.csv").open()))
  assert [int(r["learner_steps"]) for r in curve][-1] == 200, curve
  assert curve[-1]["split"] == "heldout" and curve[-1]["policy_geomean_speedup"], curve
  assert "evaluating step 200 on the heldout programs for the learning curve" in output
  assert f"step 200: heldout geomean speed-up {float(curve[-1]['geomean_speedup']):.3f}" in output
  assert os.listdir(workdir / "checkpoints" / "replay"), "no replay checkpoint"
  # The actors' probes reached the learner over courier and were kept with its checkpoint.
  learner_rows = list(csv.DictReader((workdir / "logs" / "learner" / "logs.csv").open()))
  assert float(learner_rows[-1]["probes"]) > 0 and learner_rows[-1]["probe_policy_loss"]
  assert (workdir / "checkpoints" / "probes.npz").exists()
  assert re.search(r"games, [\d,]+ probes \| replay", output), output[-3000:]
  # The console, read through a pipe: launcher lines only (node output is in nodes/*.log), no
  # colour codes, no nan or negative rates, a named wait for replay, one line per stop countdown.
  assert "\x1b" not in output and "Reverb client connecting" not in output, output[:3000]
  summaries = [line for line in output.splitlines() if re.match(r"\[\s*\d+ s\] learner ", line)]
  assert summaries and not any("nan" in line for line in summaries), output[-3000:]
  assert not re.search(r"\(-[\d,.]+/s\)", output), output[-3000:]
  assert re.search(r"learner 0/200 \(waiting for replay: [\d,]+/200 items\)", output), output[:3000]
  assert "Waiting for workers to stop for" not in output

  # 2. The same command evaluates the finished run without starting a node; a SIGKILL in that
  # evaluation leaves no report either.
  run = _Launch(workdir, *args)
  run.wait_until(lambda: finals(run), "the final evaluation again")
  run.process.kill()
  run.process.wait()
  assert not (workdir / "report.md").exists()
  output = "".join(run.lines)
  assert (
    f"{workdir} finished at learner step 200 but has no report.md (its launcher stopped during "
    "the final evaluation): writing the final report"
  ) in output
  assert "launched local_mp" not in output

  # 3. Once more, and it writes the report.
  run = _Launch(workdir, *args)
  code, output = run.finish()
  assert code == 0, output[-3000:]
  assert "launched local_mp" not in output and "writing the final report" in output
  squeezed = lambda text: re.sub(r"\s+", "", text)  # Rich may wrap long lines anywhere.
  assert squeezed(
    f"the evaluation report (with report.json, report.csv and pictures): {workdir}/report.md"
  ) in squeezed(output)
  report = json.loads((workdir / "report.json").read_text())
  assert [agent["learner_steps"] for agent in report["agents"]] == [200]
  assert {r["entry"] for r in report["rows"]} == {e.name for e in get_suite("tiny").entries}
  for name in (
    "report.md",
    "report.json",
    "report.csv",
    "report_memory_map_worst.png",
    "learning_curve.csv",
    "config.json",
    "checkpoints/counter.json",
    "logs/learner/logs.csv",
    "logs/actor_0/logs.csv",
    "nodes/learner.log",
  ):
    assert (workdir / name).exists(), name
  assert list((workdir / "tensorboard" / "learner").iterdir()), "no TensorBoard events"

  # 4. A finished run (refused as one already past --max-steps is) or a run of another
  # configuration is refused before anything starts.
  finished = "is already at learner step 200 >= --max-steps 200"
  for flags, message in (
    (("--config", "small", "--suite", "tiny"), "holds a run of config"),
    (("--launch", "local_mp", "--config", "tiny", *args), finished),
  ):
    result = subprocess.run(
      [sys.executable, "-m", "malloczero", "train", *flags, "--workdir", str(workdir)],
      cwd=REPO,
      capture_output=True,
      text=True,
      timeout=120,
    )
    assert result.returncode == 1, result.stderr
    assert result.stderr.startswith("malloczero: error: ") and result.stderr.count("\n") == 1
    assert message in result.stderr, result.stderr


@pytest.mark.slow
def test_vertex_ai_program_builds_for_64_actors_and_its_resources_resolve(tmp_path):
  from malloczero.system.vertex import (
    VERTEX_MAX_WORKER_POOLS,
    stage_code,
    vertex_resources,
    worker_pools,
  )

  config = get_config("large")
  program = build_program(config, NodeContext(str(tmp_path)), num_actors=64, max_steps=1000)
  assert {k: len(v) for k, v in program.groups.items()} == {
    "replay": 1,
    "counter": 1,
    "learner": 1,
    "actor": 64,
    "evaluator": 1,
    "limiter": 1,
  }
  resources = vertex_resources(program, config)
  assert set(resources) == set(program.groups)
  assert resources["learner"].accelerator and resources["learner"].accelerator_count == 1
  assert resources["actor"].accelerator is None
  pools = worker_pools(program, resources)
  assert len(pools) <= VERTEX_MAX_WORKER_POOLS
  assert pools[0][1] == ["learner"] and pools[0][2] == 1  # Vertex AI: first pool, one replica.
  assert sum(replicas for _, _, replicas in pools) == 69
  assert resources["replay"].ram_gib >= 16
  requirements = stage_code(str(tmp_path / "image"))
  for package in (
    "acme",
    "malloczero",
    "malloczero/actors",
    "malloczero/env/programs",
    "malloczero/learner",
    "malloczero/replay",
    "malloczero/system",
  ):
    assert (tmp_path / "image" / package / "__init__.py").exists(), package
  assert (tmp_path / "image" / "malloczero/env/programs/data/suites/default.json").exists()
  with open(requirements, encoding="utf-8") as f:
    assert "dm-launchpad==0.5.2" in f.read()


def test_vertex_ai_launch_refuses_a_local_workdir():
  from malloczero.system.vertex import launch_vertex_ai

  with pytest.raises(MalloczeroError, match="/gcs/"):
    launch_vertex_ai(get_config("tiny"), "/tmp/run", num_actors=2)


def test_a_program_needs_an_actor(tmp_path):
  with pytest.raises(MalloczeroError, match="at least 1"):
    build_program(get_config("tiny"), NodeContext(str(tmp_path)), num_actors=0, max_steps=10)


def test_check_workdir_refuses_another_configuration(tmp_path):
  from malloczero.system.training import save_config

  save_config(get_config("tiny"), str(tmp_path))
  assert check_workdir(get_config("tiny"), str(tmp_path)) is None
  with pytest.raises(MalloczeroError, match="config 'tiny'"):
    check_workdir(get_config("small"), str(tmp_path))


def test_single_process_train_refuses_another_configuration_and_keeps_its_config(tmp_path):
  from malloczero.system.single_process import train_single_process
  from malloczero.system.training import save_config

  save_config(get_config("tiny"), str(tmp_path))
  before = (tmp_path / "config.json").read_text()
  tiny = get_config("tiny")
  # Another run's networks (tiny-sized, so that a trainer that failed to refuse ends quickly).
  other = dataclasses.replace(tiny, network=dataclasses.replace(tiny.network, hidden_dim=48))
  with pytest.raises(MalloczeroError, match="config 'tiny'"):
    train_single_process(other, str(tmp_path), max_learner_steps=1, max_seconds=1, print_fn=None)
  assert (tmp_path / "config.json").read_text() == before


@pytest.mark.slow
@LAUNCHES_IN_TURN
def test_local_mt_runs_every_node_as_a_thread_and_finishes(tmp_path):
  workdir = tmp_path / "mt"
  result = subprocess.run(
    [
      sys.executable,
      "-m",
      "malloczero",
      "train",
      "--launch",
      "local_mt",
      "--config",
      "tiny",
      "--num-actors",
      "2",
      "--max-steps",
      "100",
      "--set",
      "eval_every_steps=1000",
      "--workdir",
      str(workdir),
    ],
    cwd=REPO,
    capture_output=True,
    text=True,
    timeout=RUN_TIMEOUT_S,
  )
  assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
  assert "finished: learner steps 0 -> 100" in result.stdout
  assert checkpoint_steps(str(workdir / "checkpoints")) == 100
  assert (workdir / "report.json").exists()
  curve = list(csv.DictReader((workdir / "learning_curve.csv").open()))
  assert curve and int(curve[-1]["learner_steps"]) == 100, curve


@pytest.mark.slow
@LAUNCHES_IN_TURN
def test_local_mp_stops_cleanly_when_the_learner_dies(tmp_path):
  """A killed learner stops the whole program: exit 1, its last checkpoint intact, no orphans.
  With --node-output terminal through a pipe, node lines reach the console, uncoloured."""
  workdir = tmp_path / "run"
  # A checkpoint every 5 s (the tiny config's 30 s would be most of the test's time).
  args = ("--max-steps", "100000", "--set", "eval_every_steps=100000")
  args += ("--set", "learner.checkpoint_every_s=5")
  run = _Launch(workdir, *args, "--node-output", "terminal")
  # Wait for a periodic checkpoint and a mapping in best/, so that there is something to keep.
  checkpoint = workdir / "checkpoints" / "learner_state.npz"
  run.wait_until(
    lambda: (
      checkpoint.exists()
      and any((workdir / "best").glob("*.json"))
      and "learner_0" in run.node_processes()
    ),
    "a periodic learner checkpoint and a best mapping",
  )
  saved_step = checkpoint_steps(str(checkpoint))
  victim = run.node_processes()["learner_0"]
  victim.send_signal(signal.SIGKILL)
  code, output = run.finish()
  assert code == 1, output[-3000:]
  assert "failed: the learner node exited; stopping the program" in output
  assert re.search(r"^\[learner/0\] learner: ", output, re.MULTILINE), output[:3000]
  assert "\x1b" not in output, output[:3000]
  assert not (workdir / "nodes" / "learner.log").exists()
  assert checkpoint_steps(str(checkpoint)) >= saved_step > 0
  assert load_params(str(checkpoint))
  assert run.orphans() == []

  # Resumed from that checkpoint, whose demonstrations may be older than best/: no file in best/
  # is replaced by a slower mapping.
  best = {p.name: load_mapping(str(p)).estimated_time_s for p in (workdir / "best").glob("*.json")}
  assert best, "no mapping in best/ to keep"
  resumed = _Launch(workdir, *args)
  resumed.wait_until(lambda: resumed.learner_steps() >= saved_step + 5, "the resumed learner")
  resumed.process.send_signal(signal.SIGTERM)
  code, output = resumed.finish()
  assert code == 130, output[-3000:]
  for name, kept in best.items():
    assert load_mapping(str(workdir / "best" / name)).estimated_time_s <= kept, name


@pytest.mark.parametrize("text", ["[1, 2]", '{"learner": 3}', '{"name": "tiny", "learner": ['])
def test_check_workdir_refuses_a_corrupt_config_in_one_line(tmp_path, text):
  (tmp_path / "config.json").write_text(text)
  with pytest.raises(
    MalloczeroError, match="config.json (is unreadable|is not a run's config)"
  ) as info:
    check_workdir(get_config("tiny"), str(tmp_path))
  assert "\n" not in str(info.value)


def test_summary_line_names_the_replay_wait_and_has_no_nan_or_negative_rates():
  from malloczero.system.monitor import RunSample, summary_line

  first = RunSample(3.0, 0, 0, 0, 0, 0, 0, 2)
  line = summary_line(first, None, 400, 2, None, {}, min_replay_items=1000)
  assert "learner 0/400 (waiting for replay: 0/1,000 items)" in line
  assert "nan" not in line and "samples/insert" not in line
  filling = RunSample(6.0, 0, 640, 4, 640, 640, 0, 2)
  assert "(waiting for replay: 640/1,000 items)" in summary_line(
    filling, first, 400, 2, None, {}, min_replay_items=1000
  )
  ready = RunSample(9.0, 0, 1200, 8, 1200, 1200, 0, 2)
  assert "(starting: replay is ready" in summary_line(ready, filling, 400, 2, None, {}, 1000)
  stepping = RunSample(12.0, 30, 1500, 9, 1500, 1500, 960, 2)
  line = summary_line(stepping, ready, 400, 2, None, {}, 1000)
  assert "learner 30/400 (10.0/s)" in line and "samples/insert 3.20" in line
  # Counts that went backwards (a counter read while stopping) never show as negative rates.
  stopping = RunSample(15.0, 0, 0, 0, 0, 0, 0, 2)
  line = summary_line(stopping, stepping, 400, 2, None, {}, 1000)
  assert not re.search(r"-\d", line) and "nan" not in line
  # A resumed run at step 600 is not 'waiting' on a restored table and shows its step.
  resumed = RunSample(3.0, 600, 0, 0, 5000, 0, 0, 2)
  assert "learner 600/2000 (starting" in summary_line(resumed, None, 2000, 2, None, {}, 1000, 600)
  # The last evaluation: the search's and the policy's speed-ups, or the search's alone for a
  # curve written before it had the policy's column.
  evaluation = {"learner_steps": "1000", "split": "heldout", "geomean_speedup": "1.7"}
  msa = {"heldout": 1.682}
  line = summary_line(stepping, ready, 400, 2, dict(evaluation, policy_geomean_speedup="1.68"), msa)
  assert line.endswith(" | eval @1000 heldout 1.700x, policy 1.680x (msa 1.682x)")
  line = summary_line(stepping, ready, 400, 2, dict(evaluation, policy_geomean_speedup=""), msa)
  assert line.endswith(" | eval @1000 heldout 1.700x (msa 1.682x)")


def test_counter_file_is_aligned_with_the_checkpoint_step(tmp_path):
  from malloczero.configs.workdir import WorkDir
  from malloczero.system.nodes import align_counter_file

  files = WorkDir(str(tmp_path))
  align_counter_file(files, 7)  # No file yet: nothing is written.
  assert not os.path.exists(files.counter)
  os.makedirs(files.checkpoints)
  with open(files.counter, "w", encoding="utf-8") as f:
    json.dump({"learner_steps": 641, "actor_moves": 9000}, f)
  align_counter_file(files, 642)
  with open(files.counter, encoding="utf-8") as f:
    assert json.load(f) == {"learner_steps": 642, "actor_moves": 9000}


@pytest.mark.slow
@LAUNCHES_IN_TURN
def test_local_mp_holds_its_workdir_and_its_nodes_stop_when_the_launcher_is_killed(tmp_path):
  """A second train on a directory in use is refused; SIGKILL of the launcher stops every node
  (each saving what it owns) and the same command then resumes."""
  workdir = tmp_path / "run"
  args = ("--max-steps", "100000", "--set", "eval_every_steps=100000")
  run = _Launch(workdir, *args)
  run.wait_until(
    lambda: run.learner_steps() >= 1 and len(run.node_processes()) == 7,
    "the learner stepping with every node live",
  )
  config = (workdir / "config.json").read_text()

  # 1. A second run on the same directory is refused in one line naming the launcher's pid.
  second = subprocess.run(
    [
      sys.executable,
      "-m",
      "malloczero",
      "train",
      "--launch",
      "local_mp",
      "--config",
      "tiny",
      "--workdir",
      str(workdir),
      *args,
    ],
    cwd=REPO,
    capture_output=True,
    text=True,
    timeout=120,
  )
  assert second.returncode == 1, second.stdout[-2000:] + second.stderr[-2000:]
  assert second.stderr == (
    f"malloczero: error: {workdir} is in use by another training run (pid "
    f"{run.process.pid}); wait for it to end or stop it, or give another "
    "--workdir\n"
  )
  assert (workdir / "config.json").read_text() == config

  # Each node process names its run and node: environment and process name.
  nodes = run.node_processes()
  for name, process in nodes.items():
    assert process.environ()["MALLOCZERO_WORKDIR"] == str(workdir), name
    assert process.environ()["MALLOCZERO_NODE"] == name.rsplit("_", 1)[0], name
    # 'mz-replay' for replay_0, 'mz-actor_1' for actor_1.
    assert process.name().startswith("mz-") and name.startswith(process.name()[3:]), name
    # Each node starts from a program pickled in the work directory, not in /tmp.
    cmdline = process.cmdline()
    data_file = cmdline[cmdline.index("--data_file") + 1]
    assert data_file.startswith(str(workdir / "nodes" / "program") + os.sep), data_file

  # 2. SIGKILL of the launcher: every node stops by itself, saving what it owns.
  run.process.kill()
  run.process.wait()
  deadline = time.monotonic() + 120
  while run.orphans() and time.monotonic() < deadline:
    time.sleep(0.5)  # Not a busy loop: the nodes need the cores to save.
  assert run.orphans() == []
  learner_log = (workdir / "nodes" / "learner.log").read_text()
  assert f"the launcher (pid {run.process.pid}) is gone: stopping" in learner_log
  saved = re.findall(r"learner: saved \S+ at step (\d+)", learner_log)
  assert saved and int(saved[-1]) > 0, learner_log[-2000:]
  checkpoint = workdir / "checkpoints" / "learner_state.npz"
  assert checkpoint_steps(str(checkpoint)) == int(saved[-1])
  assert load_params(str(checkpoint))
  replay_log = (workdir / "nodes" / "replay.log").read_text()
  assert replay_log.rfind("replay: checkpointed") > replay_log.find("the launcher (pid")
  assert os.listdir(workdir / "checkpoints" / "replay")
  counts = json.loads((workdir / "checkpoints" / "counter.json").read_text())
  assert counts["learner_steps"] > 0
  # The killed launcher could not remove its pickled program; it is in the work directory.
  assert os.path.exists(data_file)
  saved_digest = params_digest(load_params(str(checkpoint)))
  # A corrupt counter.json costs the actor counts only, with a warning: the learner's step comes
  # from its checkpoint.
  (workdir / "checkpoints" / "counter.json").write_text('{"learner_steps": 1')

  # 3. The stale lock blocks nothing: the same command resumes, with the learner's parameters,
  # step and replay; SIGTERM to the launcher stops every node, the learner saving its step.
  run = _Launch(workdir, *args)
  run.wait_until(lambda: run.learner_steps() >= int(saved[-1]) + 10, "the resumed learner stepping")
  run.process.send_signal(signal.SIGTERM)
  code, output = run.finish()
  assert code == 130, output[-3000:]
  assert f"resuming {workdir} from learner step {saved[-1]} (with a replay checkpoint)" in output
  learner_log = (workdir / "nodes" / "learner.log").read_text()
  assert f"resumed at step {saved[-1]}, parameters {saved_digest}" in learner_log
  restored = re.findall(
    r"replay: restored (\d+) items", (workdir / "nodes" / "replay.log").read_text()
  )
  assert restored and int(restored[-1]) > 0
  # Right after the resume the summary shows the restored step, not 0.
  resumed = [int(m.group(1)) for m in re.finditer(r"\] learner (\d+)/100000", output)]
  assert resumed and min(resumed) >= int(saved[-1]), output[-3000:]
  assert f"warning: cannot read {workdir}/checkpoints/counter.json (JSONDecodeError: " in output, (
    output[:3000]
  )
  counter_log = (workdir / "nodes" / "counter.log").read_text()
  assert "counts start from 0" in counter_log, counter_log[-2000:]
  counts = json.loads((workdir / "checkpoints" / "counter.json").read_text())
  assert counts["learner_steps"] == checkpoint_steps(str(checkpoint)) > int(saved[-1])
  # The old run's program is gone, and this run's launcher removed its own when it exited.
  assert not os.path.exists(data_file)
  assert not [p for p in os.listdir(workdir / "nodes" / "program") if p.startswith("tmp")]
  assert run.orphans() == []


def test_a_dead_nodes_cause_is_its_logs_last_exception_line(tmp_path):
  from malloczero.system.monitor import node_exit_cause, node_log_path

  nodes = tmp_path / "nodes"
  nodes.mkdir()
  assert node_log_path(str(tmp_path), "learner_0") == str(nodes / "learner.log")
  assert node_log_path(str(tmp_path), "actor_3") == str(nodes / "actor_3.log")
  assert node_exit_cause(str(tmp_path), "learner_0") is None  # No log (terminal output).
  (nodes / "learner.log").write_text(
    'learner: step 10\nTraceback (most recent call last):\n  File "x.py", line 3, in f\n'
    "malloczero.common.errors.MalloczeroError: learner checkpoint 'c' is unusable: NaN\n"
    "exiting\n"
  )
  assert node_exit_cause(str(tmp_path), "learner_0") == (
    "malloczero.common.errors.MalloczeroError: learner checkpoint 'c' is unusable: NaN"
  )
  (nodes / "actor_3.log").write_text("acting\nkilled by \x1b[31msignal\x1b[0m 9\n" + "x" * 300)
  cause = node_exit_cause(str(tmp_path), "actor_3")
  assert cause.endswith("...") and len(cause) == 200 and "\x1b" not in cause


def test_the_learner_node_writes_the_config_and_fits_the_proposer_a_launcher_left_out(
  tmp_path, capsys
):
  """A Vertex AI launch starts its nodes without writing into the run's /gcs/ directory: the
  learner node saves config.json and fits the proposer there, and finds both on a resume (or
  after a local launcher wrote them) and leaves them as they are."""
  from malloczero.learner.proposer import Proposer
  from malloczero.system.nodes import prepare_run_in_node
  from malloczero.system.training import save_config

  config = get_config("tiny")
  context = NodeContext(str(tmp_path / "run"))
  prepare_run_in_node(config, context)
  files = context.files
  save_config(config, str(tmp_path / "launcher"))
  launchers = NodeContext(str(tmp_path / "launcher")).files.config
  with open(files.config) as node, open(launchers) as launcher:
    assert json.load(node) == json.load(launcher)
  proposer = Proposer.load(files.proposer)
  assert len(proposer.members) == config.proposer.members
  out = capsys.readouterr().out
  assert f"learner: saved {files.config}\n" in out
  assert f"learner: proposer: saved {files.proposer} in " in out

  stamps = [os.stat(path).st_mtime_ns for path in (files.config, files.proposer)]
  prepare_run_in_node(config, context)
  assert [os.stat(path).st_mtime_ns for path in (files.config, files.proposer)] == stamps
  assert capsys.readouterr().out == ""


def test_the_evaluator_writes_the_baselines_a_launcher_left_out(tmp_path):
  """Nor does a Vertex AI launcher write baselines.json: the evaluator node's learning curve
  computes the baselines of the run's programs into it, in a work directory no node may have
  made yet, and reads them back on a resume."""
  from malloczero.actors.games import program_specs
  from malloczero.evaluation.baselines import BASELINE_VERSIONS, BASELINES
  from malloczero.learner.networks import make_networks
  from malloczero.system.builder import make_evaluator

  config = get_config("tiny")
  files = NodeContext(str(tmp_path / "run")).files
  splits = {split: program_specs(config, split) for split in ("train", "heldout")}
  networks = make_networks(config.network, config.game)
  curve = make_evaluator(networks, config, files, splits)
  with open(files.baselines) as f:
    written = json.load(f)
  assert written.pop("versions") == BASELINE_VERSIONS and sorted(written) == sorted(BASELINES)
  names = sorted(s.name for specs in splits.values() for s in specs)
  assert all(sorted(written[b]) == names for b in BASELINES)
  assert all(v > 0 for b in BASELINES for v in written[b].values())
  assert curve.baselines == written
  stamp = os.stat(files.baselines).st_mtime_ns
  assert make_evaluator(networks, config, files, splits).baselines == written
  assert os.stat(files.baselines).st_mtime_ns == stamp
