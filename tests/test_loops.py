"""The loops both launches share: Ctrl-C during training is never lost."""

import gc
import os
import signal
import threading

import pytest

from malloczero.system.loops import interrupt_sets


def _interrupt_inside_a_gc_callback() -> None:
  """Sends SIGINT from inside a garbage-collection callback, as JAX's runs during training; the
  signal's Python handler then runs inside the callback, where a raised KeyboardInterrupt would be
  printed as "ignored" and dropped."""
  sent = []

  def callback(phase, info):
    del info
    if phase == "start" and not sent:
      sent.append(True)
      os.kill(os.getpid(), signal.SIGINT)
      for _ in range(1000):  # Bytecodes for the pending handler to run on.
        pass

  gc.callbacks.append(callback)
  try:
    gc.collect()
  finally:
    gc.callbacks.remove(callback)
  assert sent


def test_ctrl_c_inside_a_gc_callback_stops_the_loop_and_raises_after_it():
  stop = threading.Event()
  before = signal.getsignal(signal.SIGINT)
  with pytest.raises(KeyboardInterrupt):
    with interrupt_sets(stop):
      _interrupt_inside_a_gc_callback()
      assert stop.is_set()  # Set at once; the block goes on to save what it owns.
  assert signal.getsignal(signal.SIGINT) is before  # Whatever handler was there is back.


def test_a_second_ctrl_c_raises_at_once():
  stop = threading.Event()
  with pytest.raises(KeyboardInterrupt):
    with interrupt_sets(stop):
      os.kill(os.getpid(), signal.SIGINT)
      for _ in range(1000):
        pass
      assert stop.is_set()
      os.kill(os.getpid(), signal.SIGINT)
      for _ in range(10**6):  # The handler raises here, on the second signal.
        pass
      pytest.fail("the second Ctrl-C did not raise")


def test_without_ctrl_c_the_block_ends_normally():
  stop = threading.Event()
  with interrupt_sets(stop):
    pass
  assert not stop.is_set()
