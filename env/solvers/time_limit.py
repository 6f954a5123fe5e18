"""The solvers' time limits: the one clock they read, and the rule that bounds a search made of
repeated decodes (`evo`, `evo-msa`).

A search under a limit runs its first decode whatever the limit, so that it has a mapping, and
then starts a decode only if it and the final decode of the best genome, each taking the longest
decode seen so far, still end before the deadline: the whole call, that final decode included,
stays within the limit.
"""

from __future__ import annotations

import time
from typing import Callable, TypeVar

# Every solver's clock; a test replaces it here (`now` looks it up on every call).
clock = time.perf_counter

Result = TypeVar("Result")


def now() -> float:
  """The solvers' clock, in seconds."""
  return clock()


class DecodeBudget:
  """A time limit (seconds from now; None: none) over a search's decodes."""

  def __init__(self, time_limit_s: float | None):
    self.deadline = None if time_limit_s is None else now() + float(time_limit_s)
    self.longest = 0.0  # The longest decode so far, in seconds.

  def decode(self, decode: Callable[..., Result], *args, **kwargs) -> Result:
    """`decode(*args, **kwargs)`, timed."""
    started = now()
    result = decode(*args, **kwargs)
    self.longest = max(self.longest, now() - started)
    return result

  def time_for_another(self) -> bool:
    """Whether another decode and, if it is not the best, the final decode of the best one
    still end before the deadline."""
    return self.deadline is None or now() + 2 * self.longest <= self.deadline
