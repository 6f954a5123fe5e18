"""The variable client: acting never waits for the parameter source, survives its failures and
fetches on its update period."""

import threading
import time

import numpy as np

from malloczero.actors.variable_client import VariableClient


class BlockingSource:
  """The first fetch returns at once; later ones wait until the test releases them."""

  def __init__(self):
    self.release = threading.Event()
    self.started = threading.Event()
    self.finished = threading.Event()
    self.fail = False
    self.calls = 0

  def get_variables(self):
    self.calls += 1
    if self.calls == 1:
      return {"version": np.int32(1)}
    self.started.set()
    assert self.release.wait(30), "the test never released the fetch"
    self.finished.set()
    if self.fail:
      raise RuntimeError("fetch failed")
    return {"version": np.int32(self.calls)}


def _update_until(client, predicate, timeout_s=10.0):
  deadline = time.monotonic() + timeout_s
  while not predicate():
    assert time.monotonic() < deadline, "the fetched parameters never arrived"
    client.update()
    time.sleep(0.01)


def test_variable_client_update_never_waits_for_the_source():
  source = BlockingSource()
  client = VariableClient(source, update_period=1, device_put=False)
  try:
    assert int(client.params["version"]) == 1  # The first access waits for parameters.
    client.update()  # Starts a fetch that blocks in the source...
    assert source.started.wait(10)
    assert not source.finished.is_set()  # ...and update() returned while it still does.
    for _ in range(5):
      client.update()  # Acting goes on with the old parameters.
      assert int(client.params["version"]) == 1
    assert client.num_updates == 1
    source.release.set()
    _update_until(client, lambda: int(client.params["version"]) == 2)
    assert client.num_updates == 2 and client.num_failures == 0 and client.last_error is None
  finally:
    source.release.set()
    client.close()


def test_variable_client_survives_a_failing_source():
  source = BlockingSource()
  source.fail = True
  source.release.set()
  client = VariableClient(source, update_period=1, device_put=False)
  try:
    assert int(client.params["version"]) == 1
    _update_until(client, lambda: client.num_failures >= 3)
    assert int(client.params["version"]) == 1  # Failed fetches keep the old parameters.
    assert isinstance(client.last_error, RuntimeError)
    assert client.num_updates == 1
    source.fail = False  # The source recovers: fetches resume.
    _update_until(client, lambda: int(client.params["version"]) > 1)
    assert client.num_updates == 2
  finally:
    client.close()


def test_variable_client_fetches_every_update_period_calls():
  class Counting:
    calls = 0

    def get_variables(self):
      Counting.calls += 1
      return Counting.calls

  client = VariableClient(Counting(), update_period=4, device_put=False)
  try:
    assert client.params == 1
    for _ in range(3):
      client.update()
    time.sleep(0.05)
    assert Counting.calls == 1  # Not due yet.
    _update_until(client, lambda: client.params == 2)
  finally:
    client.close()
