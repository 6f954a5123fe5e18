"""Built games kept for reuse, with a bound: a training corpus's games do not all fit in memory."""

from __future__ import annotations

import collections
from typing import Callable, Hashable

import dm_env


class BuiltGames:
  """Games built on demand and kept for reuse, at most `capacity` (0: no bound), the least
  recently used dropped first: building one computes its program's requests and cost model, far
  more work than a reset, and a corpus's games do not all fit in memory."""

  def __init__(self, capacity: int = 0):
    self._capacity = capacity
    self._games: collections.OrderedDict = collections.OrderedDict()
    self.num_built = 0

  def __len__(self) -> int:
    return len(self._games)

  def get(self, key: Hashable, build: Callable[[], dm_env.Environment]) -> dm_env.Environment:
    if key in self._games:
      self._games.move_to_end(key)
      return self._games[key]
    game = build()
    self.num_built += 1
    self._games[key] = game
    if self._capacity and len(self._games) > self._capacity:
      self._games.popitem(last=False)
    return game
