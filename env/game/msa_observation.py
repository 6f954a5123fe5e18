"""What the msa game's observation kernel (observation_kernels.py) reads and writes, as
env/game/game.py's `MsaGame` passes it: the feature columns it writes, the layout of a decision's
options, and the named tuples whose fields travel as plain tuples (env/msa/kernels/__init__.py
says why). Apart from game.py so that each module holds one concept; the kernel's cache stamp
covers this file (env/kernel_cache.py).
"""

from __future__ import annotations

from typing import NamedTuple

import numpy as np

from malloczero.env.game.config import GameConfig

# The feature columns the observation kernel writes, by part; `OBSERVED_COLUMNS` is the order
# `ObservationFrame.ints` holds them in (observation_kernels.py names its constants from it). A
# feature several columns wide is named by its first.
CANDIDATE_COLUMNS = (
  "valid",
  "keep",
  "prefetch",
  "rank",
  "start",
  "lead",
  "hold",
  "offset",
  "saving",
  "hide_ratio",
  "evicts",
  "msa_choice",
  "level",
)
REQUEST_COLUMNS = (
  "segment_start",
  "use",
  "segment_length",
  "use_index",
  "use_saving",
  "option0",
  "msa_takes_option0",
  "program_time",
  "stall_share",
  "progress",
  "options_found",
)
LOOKAHEAD_COLUMNS = ("look_valid", "look_position", "look_distance", "look_saving")
OBSERVED_COLUMNS = CANDIDATE_COLUMNS + REQUEST_COLUMNS + LOOKAHEAD_COLUMNS
# An option after option 0 as a row of `DecisionArrays.options` (float64; the integers exact).
OPTION_FIELDS = ("is_prefetch", "level", "start", "end", "offset", "evicts", "saving")


class ObservationArrays(NamedTuple):
  """The observation's float32 parts, as `observation_kernels.observe` writes them."""

  request: np.ndarray  # [Q]
  candidates: np.ndarray  # [C, F_C]
  occupancy: np.ndarray  # [F, bins]
  lookahead: np.ndarray  # [M, F_M]


class DecisionArrays(NamedTuple):
  """A decision as `observation_kernels.observe` reads it (its options after option 0, a row
  each of `OPTION_FIELDS`) and what it writes of the actions: the legal mask and each slot's
  option."""

  options: np.ndarray  # [n - 1, len(OPTION_FIELDS)] float64
  legal: np.ndarray  # [A] bool
  option_index: np.ndarray  # [A] int64


class ObservationFrame(NamedTuple):
  """What an observation is measured against, the same all episode, in two arrays (a kernel's
  arguments cost most of a small one's call, each array a share): `values`, float64, the ops'
  positions on the time axis `[T + 1]` (op -1 first), the slow time's prefix sums `[T + 1]`,
  the fast levels' capacities, the saving scale; `ints`, int64, at `FRAME_*` the last op, the
  prefetch starts per level and where each part of `values` starts, then the feature columns
  (`OBSERVED_COLUMNS`' order)."""

  values: np.ndarray
  ints: np.ndarray


# `ObservationFrame.ints`' entries.
FRAME_LAST_OP, FRAME_NUM_STARTS, FRAME_SLOW_PREFIX, FRAME_CAPACITY, FRAME_SCALE, FRAME_COLUMNS = (
  range(6)
)


class BinLists(NamedTuple):
  """A fast level's chunks filed by the address bins they cover, for the occupancy of long
  windows (`observation_kernels.mirror` files them, in handle order): per bin and entry the
  chunk's start, end and handle, its fraction of the bin; per bin its entries; the chunks filed
  so far (`[1]`)."""

  rows: np.ndarray  # [bins, room, 3] int64
  covered: np.ndarray  # [bins, room] float64
  counts: np.ndarray  # [bins] int64
  synced: np.ndarray  # [1] int64


class BufferArrays(NamedTuple):
  """What an observation reads of the program and the decision's buffer: the incidence keys
  (buffer x stride + op, sorted), msa's saving at each incidence per fast level, the buffer's
  use ops (sorted, the definition excluded) and its static request row."""

  incidence_key: np.ndarray  # [E]
  use_reduction: np.ndarray  # [F, E]
  uses: np.ndarray  # [U]
  static: np.ndarray  # [Q] float32


def observed_columns(config: GameConfig) -> np.ndarray:
  """`[len(OBSERVED_COLUMNS)]` where each feature the observation kernel writes sits
  (env/game/observation.py's msa layout; a feature several columns wide by its first)."""
  layout = config.layout
  request, candidate, look = layout.request, layout.candidate, layout.lookahead
  static = look.slice("static").start
  where = {name: candidate.slice(name).start for name in CANDIDATE_COLUMNS}
  where.update({name: request.slice(name).start for name in REQUEST_COLUMNS})
  where["look_valid"] = look.index("valid")
  for name in ("position", "distance", "saving"):
    where[f"look_{name}"] = static + layout.static.slice(name).start
  return np.array([where[name] for name in OBSERVED_COLUMNS], np.int64)
