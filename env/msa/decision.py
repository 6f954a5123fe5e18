"""msa's decision points and their options, and the fixed slots the msa game encodes them in.

One decision is one `AllocateSegment` call of XLA's allocation loop (openxla/xla
`xla/service/memory_space_assignment/algorithm.cc`; the loop is algorithm.py, its steps
allocate_segment.py): the outcomes it can give a segment (`MsaOption`: option 0 allocates
nothing new, then keep, then the prefetch starts per fast level) and the one msa takes
(docs/msa.md, "The loop as a decision process").
"""

from __future__ import annotations

import dataclasses

import numpy as np

OPTION_KINDS = ("default", "evict", "uncommit", "keep", "prefetch")
# Prefetch options offered per fast level at one decision point: the picker's first starts that
# pass every check (msa itself takes the first). A bound keeps the action space small and
# fixed-size for the game; 4 covers the preferred start and its nearest neighbours.
DEFAULT_PREFETCH_STARTS = 4


@dataclasses.dataclass(frozen=True)
class MsaOption:
  """One outcome msa's `AllocateSegment` can give a segment, with what an observation needs.

  kind: "default" (the use reads default memory, no new copy), "evict" (the value, held only in
    fast memory, is copied out; the use reads default memory), "uncommit" (an eviction is needed
    and refused: the whole buffer goes back to default memory, XLA's `kFailRequiresUncommit`,
    and its remaining uses are no longer steps), "keep" (fast memory without a copy: the
    previous allocation extended to the use, or an activation produced in place), "prefetch"
    (a copy from default memory into `level`, after an eviction when `evicts`).
  level: the fast level the value is held in (-1: none; "evict": the level copied out of).
  start, end: the op range `[start, end)` this option newly holds in fast memory (a prefetch's
    copy runs from the boundary before `start` to the use; "keep" may reserve past the use,
    as `FindBestChunkCandidates` extends it); "evict": the copy's ops `[start, end)`, the
    chunk held until it is done; both -1 when nothing is allocated.
  offset, size: the chunk in bytes (-1, 0 when nothing is allocated).
  saving: msa's own estimate of the seconds saved (`use_elapsed_reduction` of the cost
    analysis at `level`) at the use, plus the definition when the value is produced in place.
  evicts: an eviction copy is started first (the fast copy is the value's only one).
  """

  kind: str
  level: int = -1
  start: int = -1
  end: int = -1
  offset: int = -1
  size: int = 0
  saving: float = 0.0
  evicts: bool = False
  # What `choose` applies; not part of the description.
  plan: tuple = dataclasses.field(default=(), repr=False, compare=False)


_new_object = object.__new__


def prefetch_option(
  level: int, start: int, end: int, offset: int, size: int, saving: float, evicts: bool, plan: tuple
) -> MsaOption:
  """`MsaOption("prefetch", ...)`, the same object (equal, hashed and shown alike), made without
  the frozen dataclass's `__init__`, which sets each field through `object.__setattr__` (1.3 us
  an option; the msa game's decisions plan up to four prefetch starts per fast level)."""
  option = _new_object(MsaOption)
  option.__dict__.update(
    kind="prefetch",
    level=level,
    start=start,
    end=end,
    offset=offset,
    size=size,
    saving=saving,
    evicts=evicts,
    plan=plan,
  )
  return option


@dataclasses.dataclass(frozen=True)
class MsaDecision:
  """One decision point of msa's loop: one `AllocateSegment` call (a use's segment, from the
  previous use or the definition), or the definition alone of a value nothing reads.

  buffer: the buffer being allocated; use: the op the segment serves (the definition op for a
  value nothing reads); segment_start: the previous use, or the definition (-1 for a
  parameter); options: what msa weighs there, option 0 always the one that allocates nothing
  new ("default", "evict" or "uncommit"); msa_choice: the index msa itself takes.
  """

  buffer: int
  use: int
  segment_start: int
  options: tuple[MsaOption, ...]
  msa_choice: int


def option_slots(options: tuple[MsaOption, ...], max_prefetch_starts: int) -> np.ndarray:
  """`[n]` the fixed slot of each option of a decision, the msa game's action
  (env/game/game.py): option 0 -> 0, keep -> 1, the k-th prefetch start into fast level f ->
  `2 + f * max_prefetch_starts + k`."""
  slots = np.zeros(len(options), np.int64)
  rank = {}
  for i, option in enumerate(options):
    if i == 0:
      continue
    if option.kind == "keep":
      slots[i] = 1
      continue
    k = rank.get(option.level, 0)
    rank[option.level] = k + 1
    slots[i] = 2 + option.level * max_prefetch_starts + k
  return slots


def worth_deciding(options: tuple[MsaOption, ...], threshold_s: float) -> bool:
  """Whether a decision offers a choice whose best option msa estimates to save at least
  `threshold_s` seconds (the msa game's `skip_below`; 0: any choice at all)."""
  return len(options) > 1 and (threshold_s <= 0 or max(o.saving for o in options) >= threshold_s)
