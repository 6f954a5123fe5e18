"""A thin variable client: pulls parameters from a variable source without blocking acting.

`acme.jax.variable_utils` cannot be imported with this JAX (it uses the removed `jax.xla`), so this
is the small part of it the actors need. A source is anything with `get_variables()` returning the
parameter tree: the learner in-process, or a Launchpad/Courier handle to it in a distributed run.
"""

from __future__ import annotations

import concurrent.futures
import logging
from typing import Any, Optional, Protocol

import jax

_log = logging.getLogger("malloczero.actors")


class VariableSource(Protocol):
  def get_variables(self) -> Any: ...


class VariableClient:
  """Every `update_period` calls of `update()`, fetches fresh parameters in a background thread.

  The fetched parameters are swapped in by a later `update()` call once the fetch has finished, so
  the actor never waits on the learner (except in `update_and_wait`). A background fetch that
  fails (the learner restarting, a dropped connection) keeps the current parameters: the error is
  kept in `last_error`, counted in `num_failures`, and the next due fetch tries again.
  """

  def __init__(self, source: VariableSource, update_period: int = 1, device_put: bool = True):
    self._source = source
    self._update_period = max(1, int(update_period))
    self._device_put = device_put
    self._executor = concurrent.futures.ThreadPoolExecutor(1, thread_name_prefix="variables")
    self._future: concurrent.futures.Future | None = None
    self._calls = 0
    self._params: Any = None
    self.num_updates = 0
    self.num_failures = 0
    self.last_error: Optional[BaseException] = None

  @property
  def params(self) -> Any:
    if self._params is None:
      self.update_and_wait()
    return self._params

  def update(self) -> None:
    """Non-blocking: starts a fetch when one is due, swaps in a finished one."""
    self._calls += 1
    if self._future is not None and self._future.done():
      future, self._future = self._future, None
      try:
        params = future.result()
      except (Exception, concurrent.futures.CancelledError) as e:  # pylint: disable=broad-except
        self.num_failures += 1
        self.last_error = e
        _log.warning(
          "parameter fetch failed, keeping the current parameters: %s: %s", type(e).__name__, e
        )
      else:
        self._swap(params)
    if self._future is None and self._calls >= self._update_period:
      self._calls = 0
      self._future = self._executor.submit(self._fetch)

  def update_and_wait(self) -> None:
    if self._future is not None:
      self._future.cancel()
      self._future = None
    self._swap(self._fetch())

  def _fetch(self) -> Any:
    params = self._source.get_variables()
    return jax.device_put(params) if self._device_put else params

  def _swap(self, params: Any) -> None:
    self._params = params
    self.num_updates += 1

  def close(self) -> None:
    self._executor.shutdown(wait=False, cancel_futures=True)
