"""The work-directory lock and the node processes' watch on their launcher (system/guards.py)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

import pytest

from malloczero.common.errors import MalloczeroError
from malloczero.configs.workdir import WorkDir
from malloczero.system.guards import (
  LauncherWatch,
  ProcessId,
  WorkDirLock,
  hold_nodes_lock,
  lock_holders,
)

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
# A process that takes a lock (or, with "nodes", the nodes' shared lock), says so, and sleeps.
HOLDER = """
import sys, time
from malloczero.configs.workdir import WorkDir
from malloczero.system.guards import WorkDirLock, hold_nodes_lock
if sys.argv[2] == "nodes":
  hold_nodes_lock(WorkDir(sys.argv[1]))
else:
  lock = WorkDirLock(sys.argv[1])
print("locked", flush=True)
time.sleep(600)
"""


def _holder(workdir, kind: str = "launcher") -> subprocess.Popen:
  process = subprocess.Popen(
    [sys.executable, "-c", HOLDER, str(workdir), kind], cwd=REPO, stdout=subprocess.PIPE, text=True
  )
  assert process.stdout.readline() == "locked\n"
  return process


def test_a_second_lock_is_refused_naming_the_holder_and_taken_after_release(tmp_path):
  first = WorkDirLock(str(tmp_path))
  assert (tmp_path / "train.lock").read_text() == f"{os.getpid()}\n"
  with pytest.raises(
    MalloczeroError,
    match=rf"in use by another training run \(pid "
    rf"{os.getpid()}\)",
  ) as refused:
    WorkDirLock(str(tmp_path))
  assert "\n" not in str(refused.value)
  first.release()
  with WorkDirLock(str(tmp_path)):
    pass


def test_the_lock_of_a_killed_process_blocks_nothing(tmp_path):
  holder = _holder(tmp_path)
  with pytest.raises(MalloczeroError, match=rf"\(pid {holder.pid}\)"):
    WorkDirLock(str(tmp_path))
  holder.kill()
  holder.wait()
  assert (tmp_path / "train.lock").read_text() == f"{holder.pid}\n"  # Left behind, stale.
  with WorkDirLock(str(tmp_path)):
    assert (tmp_path / "train.lock").read_text() == f"{os.getpid()}\n"


@pytest.mark.slow  # Integration-sized: subprocesses, compiles or every solver.
def test_a_launcher_waits_for_node_processes_then_refuses_naming_them(tmp_path):
  nodes = _holder(tmp_path, "nodes")
  assert lock_holders(WorkDir(str(tmp_path)).nodes_lock) == [nodes.pid]
  said = []
  try:
    with pytest.raises(
      MalloczeroError,
      match=rf"node processes of an earlier run on {tmp_path} "
      rf"\(pids {nodes.pid}\) are still running",
    ):
      WorkDirLock(str(tmp_path), said.append, wait_for_nodes_s=1.0)
    assert said == [
      f"waiting up to 1 s for the node processes of a stopped run (pids "
      f"{nodes.pid}) to save and exit"
    ]
    assert lock_holders(WorkDir(str(tmp_path)).lock) == []  # The refused launcher let go.
  finally:
    nodes.kill()
    nodes.wait()
  with WorkDirLock(str(tmp_path), wait_for_nodes_s=0.0):
    hold_nodes_lock(WorkDir(str(tmp_path)))  # This run's nodes get their shared lock.


def test_a_process_keeps_its_identity_when_the_wall_clock_moves_its_create_time(monkeypatch):
  """psutil's `create_time` is the kernel's boot time (from the wall clock) plus the start
  ticks; a stepped clock moves it. The start mark must not move with it."""
  import psutil

  me = ProcessId.current()
  shift = [0.0]
  real = psutil.Process.create_time
  monkeypatch.setattr(psutil.Process, "create_time", lambda self: real(self) + shift[0])
  for shift[0] in (1.0, -1.0):
    assert me.is_running() and ProcessId.of(os.getpid()) == me
  child = subprocess.Popen([sys.executable, "-c", "pass"])
  child.wait()
  assert not ProcessId(child.pid, me.started).is_running()
  with pytest.raises(psutil.NoSuchProcess):
    ProcessId.of(child.pid)


def test_the_launcher_watch_never_signals_another_process(tmp_path):
  child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"])
  try:
    launcher = ProcessId.of(child.pid)
    watch = LauncherWatch(launcher)
    assert watch.is_alive() and watch.send(0)
    # The same pid with another start time is a later process: it is neither alive nor signalled.
    reused = LauncherWatch(ProcessId(child.pid, launcher.started - 1.0))
    assert not reused.is_alive() and not reused.send(signal.SIGKILL)
    assert child.poll() is None
    ended = []
    watch.on_exit(lambda: ended.append(True))
    child.kill()
    child.wait()
    deadline = time.monotonic() + 10
    while not ended and time.monotonic() < deadline:
      time.sleep(0.05)
    assert ended and not watch.is_alive() and not watch.send(signal.SIGTERM)
  finally:
    child.kill()
    child.wait()


@pytest.mark.parametrize(
  "launch",
  [
    pytest.param("single", marks=pytest.mark.slow),  # Loads JAX.
    "local_mt",
    "local_mp",
  ],
)
def test_train_refuses_a_work_directory_in_use_before_writing_anything(tmp_path, capsys, launch):
  from malloczero.launch.cli import main

  holder = _holder(tmp_path)
  try:
    code = main(["train", "--launch", launch, "--config", "tiny", "--workdir", str(tmp_path)])
  finally:
    holder.kill()
    holder.wait()
  err = capsys.readouterr().err
  assert code == 1
  assert err == (
    f"malloczero: error: {tmp_path} is in use by another training run (pid "
    f"{holder.pid}); wait for it to end or stop it, or give another --workdir\n"
  )
  assert sorted(os.listdir(tmp_path)) == ["nodes.lock", "train.lock"]


# A node process as Launchpad's process entry starts one (a worker manager registered in its
# thread, then the node), whose save after a stop request takes longer than Launchpad's default
# grace period of 10 s.
SLOW_SAVER = """
import sys, time
from absl import flags
import launchpad as lp
from launchpad.launch import worker_manager
from malloczero.system.nodes import NodeContext, start_node
flags.FLAGS(["node"])
worker_manager.WorkerManager(register_in_thread=True)
start_node(NodeContext(sys.argv[1], own_process=True), "slow")
print("ready", flush=True)
lp.wait_for_stop()
time.sleep(14)
print("saved", flush=True)
"""


@pytest.mark.slow
def test_a_node_process_gets_the_launchers_grace_period_to_save(tmp_path):
  from malloczero.system.nodes import TERMINATION_NOTICE_S

  assert TERMINATION_NOTICE_S > 14 + 5
  node = subprocess.Popen(
    [sys.executable, "-c", SLOW_SAVER, str(tmp_path)],
    cwd=REPO,
    stdout=subprocess.PIPE,
    stderr=subprocess.DEVNULL,
    text=True,
  )
  try:
    assert node.stdout.readline() == "ready\n"
    node.send_signal(signal.SIGTERM)
    out, _ = node.communicate(timeout=120)
  finally:
    node.kill()
  # Launchpad's default would have killed it (SIGKILL) at 10 s, before it saved.
  assert "saved" in out, (node.returncode, out)
