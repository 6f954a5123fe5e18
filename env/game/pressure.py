"""The memory pressure the msa game observes (`GameConfig.pressure_bins`): how full msa's own
complete mapping keeps each fast level, over the decision's segment and over the whole program.

A decision sees what is placed so far (the occupancy of its window) but not the buffers msa will
place after it that compete for the same memory: msa takes buffers in its sort order, not in
program order, so most of a window's final occupants are still to come when it is decided. msa's
complete mapping is known before the game starts (the game measures its time, env/game/game.py),
so its fill per op is the cheapest faithful picture of that competition. Shares of capacity over
equal stretches of ops keep the units independent of the program's size and the machine's.
"""

from __future__ import annotations

from typing import NamedTuple

import numpy as np

from malloczero.env.cost_model import Allocations


class MsaReference(NamedTuple):
  """What the msa game's msa pass measures, for another game of the same program and config:
  msa's program time (s), the moves of msa's own game and, when the observation shows the
  pressure, `fill_prefix` of msa's mapping (`[F, T + 1]`, else None)."""

  time: float
  moves: int
  fill_prefix: np.ndarray | None = None


def fill_prefix(
  allocations: Allocations, sizes: np.ndarray, capacities: np.ndarray, num_ops: int
) -> np.ndarray:
  """`[F, T + 1]` prefix sums over ops of each fast level's fill: entry `[l, i]` is the sum over
  ops `0..i-1` of the bytes `allocations` hold in level `l` at that op / the level's capacity.

  `allocations`: fast segments `[start, end)` in op indices (a start before op 0 counts from op
  0); `sizes`: `[buffers]` bytes; `capacities`: `[F]` bytes of the fast levels."""
  levels = len(capacities)
  change = np.zeros((levels, num_ops + 1))
  start = np.clip(allocations.start, 0, num_ops)
  end = np.clip(allocations.end, 0, num_ops)
  held = (end > start) & (allocations.level < levels)
  level = allocations.level[held]
  size = sizes[allocations.buffer[held]].astype(np.float64)
  np.add.at(change, (level, start[held]), size)
  np.add.at(change, (level, end[held]), -size)
  fill = np.cumsum(change[:, :num_ops], axis=1) / np.maximum(capacities, 1.0)[:, None]
  return np.concatenate([np.zeros((levels, 1)), np.cumsum(fill, axis=1)], axis=1)


def stretch_fill(prefix: np.ndarray, first: int, last: int, bins: int) -> np.ndarray:
  """`[F, bins]` the mean fill (a share of capacity) of each of `bins` equal stretches of ops
  `first..last` (inclusive; an op is a unit of the axis, so a stretch may cover part of one).

  `prefix`: `fill_prefix`'s `[F, T + 1]`."""
  edges = np.linspace(first, last + 1, bins + 1)
  # The prefix sums are exact at op boundaries and linear within an op (its fill is constant).
  whole = np.minimum(edges.astype(np.int64), prefix.shape[1] - 2)
  part = edges - whole
  at_edges = prefix[:, whole] * (1.0 - part) + prefix[:, whole + 1] * part
  return np.diff(at_edges, axis=1) / np.diff(edges)[None]


def segment_fill(prefix: np.ndarray, segment_start: int, use: int, bins: int) -> np.ndarray:
  """`[F, bins]` the fill over a decision's segment, ops `segment_start..use` (a start before
  op 0 counts from op 0), in `bins` equal stretches."""
  num_ops = prefix.shape[1] - 1
  first = min(max(segment_start, 0), num_ops - 1)
  return stretch_fill(prefix, first, min(max(use, first), num_ops - 1), bins)


def program_fill(prefix: np.ndarray, bins: int) -> np.ndarray:
  """`[F, bins]` the fill over the whole program in `bins` equal stretches."""
  return stretch_fill(prefix, 0, prefix.shape[1] - 2, bins)
