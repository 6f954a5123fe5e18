"""The layout of mallocGame's observations: every feature by name, in order, in one place.

An observation is a dict of fixed-size float32 arrays (plus the legal mask), so that one network
serves every workload and every hardware with up to `max_fast_levels` fast levels:

  request       [F_REQ]       the current request: its static features, then its state now
  occupancy     [L, bins]     per fast level: fraction of each address bin taken during the window
  candidates    [K, F_CAND]   the K candidate placements, best fit first
  lookahead     [M, F_LOOK]   static features of the next M requests
  legal_actions [A] bool      action 0 is always legal

Feature axes are `FeatureLayout`s: named, ordered slices whose widths depend only on
`max_fast_levels` (per-level features are that wide, zero past the hardware's levels). The game
writes each feature by name (env/game/requests_game.py) and the sizes in `GameConfig` and the specs
below come
from the same layouts, so adding or moving a feature is one edit here.
"""

from __future__ import annotations

import dataclasses
import functools

import numpy as np


@dataclasses.dataclass(frozen=True)
class FeatureLayout:
  """Consecutive named features along the last axis of an observation part.

  `features` holds (name, width) pairs in array order.
  """

  features: tuple[tuple[str, int], ...]

  def __post_init__(self):
    names = [name for name, _ in self.features]
    if len(set(names)) != len(names):
      raise ValueError(f"duplicate feature names in {names}")

  @functools.cached_property
  def _starts(self) -> dict[str, int]:
    widths = [width for _, width in self.features]
    starts = np.concatenate([[0], np.cumsum(widths)[:-1]]).astype(int).tolist()
    return {name: start for (name, _), start in zip(self.features, starts)}

  @property
  def size(self) -> int:
    """Total width of the axis."""
    return sum(width for _, width in self.features)

  @property
  def names(self) -> tuple[str, ...]:
    return tuple(name for name, _ in self.features)

  @functools.cached_property
  def _widths(self) -> dict[str, int]:
    return dict(self.features)

  def width(self, name: str) -> int:
    return self._widths[name]

  def slice(self, name: str, width: int | None = None) -> slice:
    """The columns of feature `name`; only its first `width` of them when given (a per-level
    feature on hardware with fewer fast levels than the layout has room for)."""
    full = self.width(name)
    if width is not None and not 0 <= width <= full:
      raise ValueError(f"feature '{name}' is {full} wide, not {width}")
    start = self._starts[name]
    return slice(start, start + (full if width is None else width))

  def index(self, name: str) -> int:
    """The column of a feature one column wide."""
    if self.width(name) != 1:
      raise ValueError(f"feature '{name}' is {self.width(name)} columns wide; use slice()")
    return self._starts[name]


@dataclasses.dataclass(frozen=True)
class ObservationLayout:
  """The feature axes of the observation parts for hardware of up to `max_fast_levels` levels."""

  static: FeatureLayout  # Per request, fixed for the episode; inside request and lookahead.
  request: FeatureLayout
  candidate: FeatureLayout
  lookahead: FeatureLayout


@functools.lru_cache(maxsize=None)
def observation_layout(max_fast_levels: int) -> ObservationLayout:
  """The layouts of every observation part; `F` below is `max_fast_levels`."""
  levels = max_fast_levels
  static = FeatureLayout(
    (
      ("is_prefetch", 1),
      ("is_activation", 1),  # Not a prefetch: written in place by its producer.
      ("size_vs_capacity", levels),  # [F] size / level capacity, clipped at 2.
      ("start", 1),  # Window start / number of ops.
      ("end", 1),  # Window end / number of ops.
      ("duration", 1),  # Window length / number of ops.
      ("standalone_saving", levels),  # [F] saving from the all-slow state / largest such saving.
      ("exposed_copy_time", 1),  # Copy time left exposed, in the same unit, clipped at 10.
      ("log_size", 1),  # log2(bytes) / 32.
      ("position", 1),  # Request index / number of requests.
    )
  )
  request = FeatureLayout(
    (
      ("static", static.size),
      ("saving", levels),  # [F] saving now, given the placements so far.
      ("level_present", levels),  # [F] 1 for the levels this hardware has.
      ("program_time", 1),  # Program time so far / all-slow time.
      ("candidates_found", 1),  # Valid candidates / K.
    )
  )
  candidate = FeatureLayout(
    (
      ("valid", 1),
      ("level", levels),  # [F] one-hot of the candidate's fast level.
      ("offset", 1),  # Offset / level capacity.
      ("gap", 1),  # Free gap at the offset / level capacity.
      ("slack", 1),  # Gap left over by the request / level capacity.
      ("rank", 1),  # Best-fit rank within its level / K.
      ("saving", 1),  # Saving now at the candidate's level.
    )
  )
  lookahead = FeatureLayout(
    (
      ("valid", 1),
      ("static", static.size),
    )
  )
  return ObservationLayout(static, request, candidate, lookahead)


@functools.lru_cache(maxsize=None)
def msa_observation_layout(max_fast_levels: int) -> ObservationLayout:
  """The layouts of the msa game's observation parts (env/game/game.py); `F` is
  `max_fast_levels`. Positions are on the program's time axis / its length.

  request: the decision point (one `AllocateSegment` call of msa's loop): the buffer, the
    segment from the previous use (or the definition) to the use, what option 0 is, msa's own
    choice, and the program so far. candidates: one row per action after action 0 (slot 1:
    keep, then `K` prefetch starts per fast level, the picker's order). lookahead: the
    buffer's next `M` uses (`static` holds their features).
  """
  levels = max_fast_levels
  use = FeatureLayout(
    (
      ("position", 1),  # The use's op.
      ("distance", 1),  # From the current use.
      ("saving", levels),  # [F] msa's saving at the use / largest use saving.
    )
  )
  request = FeatureLayout(
    (
      ("is_activation", 1),
      ("size_vs_capacity", levels),  # [F] size / level capacity, clipped at 2.
      ("log_size", 1),  # log2(bytes) / 32.
      ("definition", 1),  # Definition op (0 for a parameter).
      ("last_use", 1),
      ("segment_start", 1),  # Previous use, or the definition.
      ("use", 1),
      ("segment_length", 1),
      ("use_index", 1),  # Uses before this one / uses of the buffer.
      ("num_uses", 1),  # log2(1 + uses) / 10.
      ("use_saving", levels),  # [F] msa's saving at this use / largest use saving.
      ("copy_time", 1),  # The buffer's copy time / largest use saving, clipped at 10.
      ("option0", 3),  # One-hot: default, evict, uncommit.
      ("msa_takes_option0", 1),  # msa's own choice is action 0.
      ("level_present", levels),  # [F] 1 for the levels this hardware has.
      ("program_time", 1),  # Program time so far / all-slow time.
      ("stall_share", 1),  # Copy stalls / program time so far.
      ("progress", 1),  # Buffers allocated / buffers msa allocates.
      ("options_found", 1),  # Legal actions / actions.
    )
  )
  candidate = FeatureLayout(
    (
      ("valid", 1),
      ("keep", 1),  # Slot 1: kept in fast memory without a copy.
      ("prefetch", 1),
      ("level", levels),  # [F] one-hot of the fast level.
      ("rank", 1),  # The prefetch start's rank in the picker's order / K.
      ("start", 1),  # First op it holds in fast memory.
      ("lead", 1),  # (use - start) / (use - segment_start + 1): copy's head start.
      ("hold", 1),  # Ops it reserves / program length.
      ("offset", 1),  # Chunk offset / level capacity.
      ("saving", 1),  # msa's saving estimate / largest use saving.
      ("hide_ratio", 1),  # All-slow op time before the use / copy time, clipped at 10.
      ("evicts", 1),  # An eviction copy is started first.
      ("msa_choice", 1),  # msa itself takes this slot.
    )
  )
  lookahead = FeatureLayout(
    (
      ("valid", 1),
      ("static", use.size),
    )
  )
  return ObservationLayout(use, request, candidate, lookahead)
