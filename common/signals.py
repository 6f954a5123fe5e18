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
# The signals that stop a command (and a training run).
STOPPING_SIGNALS = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)


def _stop(signum: int, frame: object) -> None:
  del frame
  _pending.append(signum)
  raise signal_exception(signum)


def signal_exception(signum: int) -> BaseException:
  """What a stopping signal raises: KeyboardInterrupt for SIGINT, else `Terminated`."""
  return KeyboardInterrupt() if signum == signal.SIGINT else Terminated(signum)


def raise_pending() -> None:
  """Raises the first signal's exception again (`signal_exception`) if a signal arrived since
  the handlers were installed; long loops call it between their steps."""
  if _pending:
    raise signal_exception(_pending[0])


def forget_pending() -> None:
  """The signal was handled (the command line reported it)."""
  _pending.clear()


def stop_on_signals() -> None:
  """Installs the handlers of STOPPING_SIGNALS (also over a library's own, such as Launchpad's,
  which would swallow them); a no-op outside the main thread, where Python cannot."""
  if threading.current_thread() is not threading.main_thread():
    return
  for signum in STOPPING_SIGNALS:
    signal.signal(signum, _stop)
