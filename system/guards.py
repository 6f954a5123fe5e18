"""One training run per work directory, and node processes that do not outlive their launcher.

The launcher (local_mp, local_mt or single) holds an exclusive flock on workdir/train.lock for the
whole run and writes its pid there: a second `train` on the directory is refused, naming that pid.
The OS drops a flock when its holder dies, so the lock file of a killed run blocks nothing.

Launchpad's local_mp starts each node as `decorate_output COLOUR LABEL python process_entry.py ...`:
the node's parent is that bash wrapper, which ignores SIGTERM and outlives a killed launcher, so a
parent-death signal (prctl PR_SET_PDEATHSIG) would never fire. Each node therefore watches the
launcher itself (`LauncherWatch`, through a pidfd: it names one process, never a later one that
reuses its pid) and stops, saving what it owns, once the launcher is gone. Until they exit, the
nodes hold workdir/nodes.lock shared, and a new launcher waits for them before it starts: two
runs' replay nodes would otherwise write (and delete) each other's checkpoints.
"""

from __future__ import annotations

import dataclasses
import fcntl
import os
import select
import signal
import threading
import time
from typing import Callable, Optional

from malloczero.common.errors import MalloczeroError
from malloczero.configs.workdir import WorkDir

# How long a new launcher waits for the node processes of a killed run to save and exit (each
# node gives itself Launchpad's default notice of 10 s after its stop before it kills itself).
NODES_WAIT_S = 60.0


def lock_holders(path: str) -> list[int]:
  """The pids holding a flock on `path`, from /proc/locks (empty where it cannot be read)."""
  try:
    st = os.stat(path)
    with open("/proc/locks", encoding="ascii") as f:
      lines = f.read().splitlines()
  except OSError:
    return []
  key = f"{os.major(st.st_dev):02x}:{os.minor(st.st_dev):02x}:{st.st_ino}"
  pids = set()
  for line in lines:
    fields = line.split()
    # "1: FLOCK  ADVISORY  WRITE 1234 00:2f:5678 0 EOF"; waiters are listed with "->".
    if len(fields) >= 6 and "->" not in fields and fields[1] == "FLOCK" and fields[5] == key:
      pids.add(int(fields[4]))
  return sorted(pids)


class WorkDirLock:
  """The launcher's exclusive lock on a work directory, held until `release()` or its death.

  Taken before anything in the directory is written; raises MalloczeroError (one line, naming
  the holder's pid) when another run holds it, or when node processes of a killed run are still
  saving after `wait_for_nodes_s`.
  """

  def __init__(
    self,
    workdir: str,
    print_fn: Optional[Callable[[str], None]] = None,
    wait_for_nodes_s: float = NODES_WAIT_S,
  ):
    files = WorkDir(workdir)
    try:
      os.makedirs(workdir, exist_ok=True)
      self._fd: Optional[int] = os.open(files.lock, os.O_RDWR | os.O_CREAT, 0o644)
    except OSError as e:
      raise MalloczeroError(f"cannot use {workdir} as a work directory: {e.strerror}") from e
    try:
      fcntl.flock(self._fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
      written = os.pread(self._fd, 32, 0).decode("ascii", "replace").strip()
      holder = (
        written if written.isdigit() else ", ".join(map(str, lock_holders(files.lock))) or "unknown"
      )
      self.release()
      raise MalloczeroError(
        f"{workdir} is in use by another training run (pid {holder}); wait "
        "for it to end or stop it, or give another --workdir"
      ) from None
    os.ftruncate(self._fd, 0)
    os.pwrite(self._fd, f"{os.getpid()}\n".encode("ascii"), 0)
    try:
      self._wait_for_nodes(files, wait_for_nodes_s, print_fn or (lambda text: None))
    except BaseException:
      self.release()
      raise

  def _wait_for_nodes(self, files: WorkDir, wait_s: float, print_fn: Callable[[str], None]) -> None:
    fd = os.open(files.nodes_lock, os.O_RDWR | os.O_CREAT, 0o644)
    try:
      deadline = time.monotonic() + wait_s
      announced = False
      while True:
        try:
          fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
          return  # Closing the file below releases it for this run's own nodes.
        except BlockingIOError:
          pids = ", ".join(map(str, lock_holders(files.nodes_lock))) or "unknown"
          if time.monotonic() >= deadline:
            raise MalloczeroError(
              f"node processes of an earlier run on {files.root} (pids {pids}) are still "
              "running; stop them, or give another --workdir"
            ) from None
          if not announced:
            print_fn(
              f"waiting up to {wait_s:.0f} s for the node processes of a stopped run "
              f"(pids {pids}) to save and exit"
            )
            announced = True
          time.sleep(0.5)
    finally:
      os.close(fd)

  def release(self) -> None:
    if self._fd is not None:
      os.close(self._fd)  # Drops the flock; the file stays (removing it would race a new run).
      self._fd = None

  def __enter__(self) -> WorkDirLock:
    return self

  def __exit__(self, *exc_info) -> None:
    self.release()


def hold_nodes_lock(files: WorkDir) -> int:
  """A node process's shared lock on workdir/nodes.lock, held until the process exits."""
  fd = os.open(files.nodes_lock, os.O_RDWR | os.O_CREAT, 0o644)
  fcntl.flock(fd, fcntl.LOCK_SH)  # A launcher holds it exclusively only for a moment.
  return fd


# ----------------------------------------------------------------------------------- the launcher


@dataclasses.dataclass(frozen=True)
class ProcessId:
  """A pid and its process's start mark (`start_mark`): together they name one process, not a
  later reuse."""

  pid: int
  started: float

  @classmethod
  def of(cls, pid: int) -> ProcessId:
    """The process `pid` now; raises `psutil.Error` when there is none."""
    return cls(pid, start_mark(pid))

  @classmethod
  def current(cls) -> ProcessId:
    return cls.of(os.getpid())

  def is_running(self) -> bool:
    import psutil

    try:
      return start_mark(self.pid) == self.started
    except psutil.Error:
      return False


def start_mark(pid: int) -> float:
  """When process `pid` started, in a unit that never moves: on Linux its start in clock ticks
  after boot (/proc/PID/stat, field 22). psutil's `create_time` adds the boot time, which the
  kernel derives from the wall clock; a stepped clock moves it by a second, and every node then
  took its running launcher for gone. Elsewhere, `create_time`. Raises `psutil.Error` when
  there is no such process."""
  import psutil

  try:
    with open(f"/proc/{pid}/stat", "rb") as f:
      stat = f.read()
  except FileNotFoundError:
    if os.path.isdir("/proc/self"):
      raise psutil.NoSuchProcess(pid) from None
    return psutil.Process(pid).create_time()
  except OSError:
    return psutil.Process(pid).create_time()
  # The command name (field 2) may hold spaces and parentheses: count fields after its last ")".
  return float(stat[stat.rindex(b")") + 2 :].split()[19])


class LauncherWatch:
  """The launcher of this node process: whether it is alive, waiting for its end, signalling it.

  Uses a pidfd where the kernel has them (Linux 5.3+): opened while the pid still has the
  launcher's start time, it refers to the launcher alone, so a signal through it can never reach
  a process that reused the pid. Elsewhere it compares start times, once a second.
  """

  def __init__(self, launcher: ProcessId):
    self.launcher = launcher
    self._fd: Optional[int] = None
    self._gone = False
    try:
      self._fd = os.pidfd_open(launcher.pid)
    except ProcessLookupError:
      self._gone = True
    except (AttributeError, OSError):  # No pidfds: start times only.
      pass
    if not launcher.is_running():
      self._gone = True

  def is_alive(self) -> bool:
    if self._gone:
      return False
    if self._fd is not None:
      readable, _, _ = select.select([self._fd], [], [], 0)  # A pidfd reads ready at exit.
      return not readable
    return self.launcher.is_running()

  def wait(self) -> None:
    """Blocks until the launcher has exited."""
    if self._gone:
      return
    if self._fd is not None:
      select.select([self._fd], [], [])
      return
    while self.launcher.is_running():
      time.sleep(1.0)

  def send(self, sig: int) -> bool:
    """Signals the launcher; False (and nothing signalled) when it is gone."""
    if not self.is_alive():
      return False
    try:
      if self._fd is not None:
        signal.pidfd_send_signal(self._fd, sig)
      else:
        os.kill(self.launcher.pid, sig)  # Start time checked just above.
      return True
    except ProcessLookupError:
      return False

  def on_exit(self, callback: Callable[[], None]) -> None:
    """Calls `callback` from a daemon thread once the launcher has exited."""

    def watch() -> None:
      self.wait()
      callback()

    threading.Thread(target=watch, name="launcher-watch", daemon=True).start()


_WATCH: Optional[LauncherWatch] = None


def watch_launcher(launcher: ProcessId, name: str, say: Callable[[str, str], None]) -> None:
  """In a local_mp node process: stops this node (as the launcher's SIGTERM would, so it saves
  what it owns) once the launcher is gone; exits at once if it is gone already."""
  global _WATCH
  watch = LauncherWatch(launcher)
  if not watch.is_alive():
    say(name, f"the launcher (pid {launcher.pid}) is gone: not starting")
    os._exit(1)  # Nothing was done, nothing to save.

  def stop() -> None:
    say(name, f"the launcher (pid {launcher.pid}) is gone: stopping, saving what this node owns")
    os.kill(os.getpid(), signal.SIGTERM)  # This process: Launchpad's node stop handler.

  watch.on_exit(stop)
  _WATCH = watch


def launcher_watch() -> Optional[LauncherWatch]:
  """This node process's watch on its launcher (None outside local_mp nodes)."""
  return _WATCH
