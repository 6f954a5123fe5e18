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


# The signals received, in order. Python drops an exception raised in a weakref callback or a
# `__del__` ("Exception ignored in ..."), and a signal handler runs wherever the main thread is,
# so a Ctrl-C can be lost that way (seen in the final evaluation of `train`): `raise_pending`
# raises it again at the next safe point.
_pending: list[int] = []


def _terminate(signum: int, frame: object) -> None:
  _pending.append(signum)
  raise Terminated(signum)


def _interrupt(signum: int, frame: object) -> None:
  _pending.append(signum)
  raise KeyboardInterrupt


def raise_pending() -> None:
  """Raises the first signal's exception again (KeyboardInterrupt or `Terminated`) if a signal
  arrived since the handlers were installed; long loops call it between their steps."""
  if not _pending:
    return
  signum = _pending[0]
  if signum == signal.SIGINT:
    raise KeyboardInterrupt
  raise Terminated(signum)


def forget_pending() -> None:
  """The signal was handled (the command line reported it)."""
  _pending.clear()


def stop_on_signals(interrupt: bool = True) -> None:
  """Installs the handlers (SIGINT too with `interrupt`: after a library's own handler, such as
  Launchpad's, which would swallow it); a no-op outside the main thread, where Python cannot."""
  if threading.current_thread() is not threading.main_thread():
    return
  if interrupt:
    signal.signal(signal.SIGINT, _interrupt)
  signal.signal(signal.SIGTERM, _terminate)
  signal.signal(signal.SIGHUP, _terminate)
