"""How a command stops on a signal: Ctrl-C raises KeyboardInterrupt and SIGTERM or SIGHUP raise
`Terminated` in the main thread, so that outputs are written whole or not at all
(common/files.py) and the command line exits with one line (launch/cli.py)."""

from __future__ import annotations

import signal
import threading


class Terminated(BaseException):
  """SIGTERM or SIGHUP, raised in the main thread so that a command stops as Ctrl-C stops it."""

  def __init__(self, signum: int = signal.SIGTERM):
    super().__init__(signum)
    self.signum = signum


def _terminate(signum: int, frame: object) -> None:
  raise Terminated(signum)


def stop_on_signals(interrupt: bool = True) -> None:
  """Installs the handlers (SIGINT too with `interrupt`: after a library's own handler, such as
  Launchpad's, which would swallow it); a no-op outside the main thread, where Python cannot."""
  if threading.current_thread() is not threading.main_thread():
    return
  if interrupt:
    signal.signal(signal.SIGINT, signal.default_int_handler)
  signal.signal(signal.SIGTERM, _terminate)
  signal.signal(signal.SIGHUP, _terminate)
