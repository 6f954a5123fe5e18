"""The jitted (numba) kernel of the msa game's observation (env/game/game.py's `MsaGame`): the
whole observation of a decision in one call, from its options' table, the buffer's static row and
uses, and each fast level's chunk heap.

Why one kernel: the game observes after every step (at least 10,000 steps a second, `malloczero
bench`), and as numpy expressions and several kernel calls an observation cost mostly numpy's and
numba's per-call overhead on arrays of a few to a few hundred entries. Loaded on first use
(`lazy_module` in game.py), so that `import malloczero` does not load numba; compiled with
env/kernel_cache.py's `njit` on a machine's first use and read from the cache beside this file
after that. A group of arguments travels as one plain tuple in the order of a named tuple of
game.py (`ObservationArrays`, `DecisionArrays`, `CandidateFrame`, `BufferArrays`) or chunks.py
(`TimeIndex`, `Chunks`), of at most four arrays each (env/msa/kernels/__init__.py says why).

Every feature is computed with the floating-point operations, in the order, of the numpy code
it replaced (float64, then stored as float32), so the observations are the same bit for bit;
a level's occupancy sums its chunks in the order they were committed, as its scan did.
"""

from __future__ import annotations

import numpy as np

from malloczero.env.game.game import (
  OBSERVED_COLUMNS,
  OPTION_FIELDS,
  BufferArrays,
  CandidateFrame,
  DecisionArrays,
  ObservationArrays,
)
from malloczero.env.kernel_cache import njit
from malloczero.env.msa.chunks import Chunks, TimeIndex
from malloczero.env.msa.kernels.chunk_index import collect

# Where each feature's column is in `CandidateFrame.columns` (game.py's `OBSERVED_COLUMNS`).
_COLUMN = {name: i for i, name in enumerate(OBSERVED_COLUMNS)}
VALID, KEEP, FETCH, RANK = (_COLUMN[n] for n in ("valid", "keep", "prefetch", "rank"))
START, LEAD, HOLD, OFFSET = (_COLUMN[n] for n in ("start", "lead", "hold", "offset"))
SAVING, HIDE_RATIO, EVICTS = (_COLUMN[n] for n in ("saving", "hide_ratio", "evicts"))
MSA_CHOICE, LEVEL = _COLUMN["msa_choice"], _COLUMN["level"]
SEGMENT_START, USE, SEGMENT_LENGTH = (
  _COLUMN[n] for n in ("segment_start", "use", "segment_length")
)
USE_INDEX, USE_SAVING, OPTION0 = (_COLUMN[n] for n in ("use_index", "use_saving", "option0"))
MSA_TAKES_OPTION0, PROGRAM_TIME = _COLUMN["msa_takes_option0"], _COLUMN["program_time"]
STALL_SHARE, PROGRESS, OPTIONS_FOUND = (
  _COLUMN[n] for n in ("stall_share", "progress", "options_found")
)
LOOK_VALID, LOOK_POSITION = _COLUMN["look_valid"], _COLUMN["look_position"]
LOOK_DISTANCE, LOOK_SAVING = _COLUMN["look_distance"], _COLUMN["look_saving"]
# The fields of an option after option 0, a row of `DecisionArrays.options` (`OPTION_FIELDS`).
_FIELD = {name: i for i, name in enumerate(OPTION_FIELDS)}
IS_PREFETCH, OPTION_LEVEL, OPTION_START = (_FIELD[n] for n in ("is_prefetch", "level", "start"))
OPTION_END, OPTION_OFFSET = _FIELD["end"], _FIELD["offset"]
OPTION_EVICTS, OPTION_SAVING = _FIELD["evicts"], _FIELD["saving"]


# Heaps of more chunks than this are read through their time index; smaller ones in one pass
# over every chunk, which costs less than the index's walk over its length classes.
SCAN_LIMIT = 4096


@njit
def occupancy(out, index, chunks, hits, first_op, last_op, capacity):
  """Fills `out` [bins] (zeros, float64) with the fraction of each address bin of a level taken
  by its chunks live at some op of `[first_op, last_op]` (`chunks`: a `Chunks`' fields), summed
  in handle order (chunks may overlap in time only where they do not in address, so the
  fractions add up). A heap of more than `SCAN_LIMIT` chunks is read through its time index
  (`index`: a `TimeIndex`' fields, `hits`: the heap's search scratch), a smaller one in one pass
  (its index and scratch are then not read)."""
  c = Chunks(*chunks)
  rects, alive = c.rects, c.alive
  # One array either way (an array from either of two sources cost the loop below ten times).
  handles = np.empty(c.count, np.int64)
  found = 0
  if c.count > SCAN_LIMIT:
    found = collect(TimeIndex(*index), first_op, last_op + 1, hits)
    for j in range(found):
      handles[j] = hits[3, j]
    handles[:found].sort()
  else:
    for i in range(c.count):
      if alive[i] and rects[0, i] <= last_op and rects[1, i] > first_op:
        handles[found] = i
        found += 1
  bins = len(out)
  width = capacity / bins
  for j in range(found):
    i = handles[j]
    low = rects[2, i] / width
    high = (rects[2, i] + rects[3, i]) / width
    b = int(low)
    while b < bins and b < high:
      covered = min(high, b + 1.0) - max(low, float(b))
      if covered > 0:
        out[b] += covered
      b += 1
  for b in range(bins):
    if out[b] > 1.0:
      out[b] = 1.0


@njit
def _slots(options, max_starts, slots):
  """`msa.decision.option_slots` of the options after option 0 (`options`' rows), into
  `slots[1:]`: keep -> 1, the k-th prefetch start into level f -> 2 + f * max_starts + k."""
  ranks = np.zeros(8, np.int64)
  slots[0] = 0
  for i in range(options.shape[0]):
    if options[i, IS_PREFETCH] == 0.0:
      slots[i + 1] = 1
    else:
      level = int(options[i, OPTION_LEVEL])
      slots[i + 1] = 2 + level * max_starts + ranks[level]
      ranks[level] += 1


@njit
def observe(
  out,
  decision,
  frame,
  buffer,
  index0,
  chunks0,
  hits0,
  index1,
  chunks1,
  hits1,
  num_fast,
  buffer_key,
  use,
  segment_start,
  option0,
  msa_choice,
  copy_time,
  program_time,
  stall_share,
  progress,
):
  """Writes a decision's observation into `out` (an `ObservationArrays`' fields, zeros) and its
  legal mask and slot-to-option map into `decision` (a `DecisionArrays`' fields); returns the
  slot msa takes. `frame`: a `CandidateFrame`'s fields; `buffer`: a `BufferArrays`'; per fast
  level its heap's time index, chunks and search scratch (level 1's are level 0's again on a
  machine with one fast level); `buffer_key`: the buffer's first incidence key (buffer x
  stride); `option0`: option 0's kind (default, evict, uncommit); `program_time`, `stall_share`
  and `progress`: the request's features of the program so far."""
  o, d, f, b = (
    ObservationArrays(*out),
    DecisionArrays(*decision),
    CandidateFrame(*frame),
    (BufferArrays(*buffer)),
  )
  request, candidates, lookahead = o.request, o.candidates, o.lookahead
  options, legal, option_index = d.options, d.legal, d.option_index
  positions, last_op, columns, scale = f.positions, f.last_op, f.columns, f.saving_scale
  num_options = options.shape[0] + 1
  slots = np.empty(num_options, np.int64)
  _slots(options, f.num_starts, slots)
  for i in range(num_options):
    legal[slots[i]] = True
    option_index[slots[i]] = i
  msa_action = slots[msa_choice]
  incidence = np.searchsorted(b.incidence_key, buffer_key + use)
  uses = b.uses
  k = np.searchsorted(uses, use)

  # The request: the buffer's static row, then the decision and the program so far.
  for j in range(len(request)):
    request[j] = b.static[j]
  use_position = positions[min(use, last_op) + 1]
  start_position = positions[min(segment_start, last_op) + 1]
  request[columns[SEGMENT_START]] = start_position
  request[columns[USE]] = use_position
  request[columns[SEGMENT_LENGTH]] = use_position - start_position
  request[columns[USE_INDEX]] = k / max(len(uses), 1)
  for level in range(num_fast):
    request[columns[USE_SAVING] + level] = b.use_reduction[level, incidence] / scale
  request[columns[OPTION0] + option0] = 1.0
  request[columns[MSA_TAKES_OPTION0]] = 1.0 if msa_action == 0 else 0.0
  request[columns[PROGRAM_TIME]] = program_time
  request[columns[STALL_SHARE]] = stall_share
  request[columns[PROGRESS]] = progress
  request[columns[OPTIONS_FOUND]] = num_options / len(legal)

  # The candidates: a row per option after option 0, at its slot - 1.
  valid, keep, fetch, rank = columns[VALID], columns[KEEP], columns[FETCH], columns[RANK]
  window = max(use - segment_start + 1, 1)
  for i in range(num_options - 1):
    r = slots[i + 1] - 1
    level = int(options[i, OPTION_LEVEL])
    start, end = int(options[i, OPTION_START]), int(options[i, OPTION_END])
    candidates[r, valid] = 1.0
    candidates[r, columns[LEVEL] + level] = 1.0
    s = positions[start + 1]
    candidates[r, columns[START]] = s
    candidates[r, columns[HOLD]] = positions[min(end, last_op) + 1] - s
    candidates[r, columns[OFFSET]] = options[i, OPTION_OFFSET] / f.capacity[level]
    candidates[r, columns[SAVING]] = options[i, OPTION_SAVING] / scale
    if options[i, IS_PREFETCH] != 0.0:
      candidates[r, fetch] = 1.0
      candidates[r, rank] = ((r - 1) % f.num_starts) / f.num_starts
      hidden = f.slow_op_prefix[use] - f.slow_op_prefix[max(start, 0)]
      candidates[r, columns[HIDE_RATIO]] = min(hidden / max(copy_time, 1e-30), 10.0)
      candidates[r, columns[LEAD]] = (use - start) / window
      candidates[r, columns[EVICTS]] = 1.0 if options[i, OPTION_EVICTS] != 0.0 else 0.0
    else:
      candidates[r, keep] = 1.0
  if msa_choice:
    candidates[msa_action - 1, columns[MSA_CHOICE]] = 1.0

  # Each fast level's occupancy over the segment.
  bins = o.occupancy.shape[1]
  first_op = max(segment_start, 0)
  for level in range(num_fast):
    row = np.zeros(bins)
    if level == 0:
      occupancy(row, index0, chunks0, hits0, first_op, use, f.capacity[level])
    else:
      occupancy(row, index1, chunks1, hits1, first_op, use, f.capacity[level])
    for j in range(bins):
      o.occupancy[level, j] = row[j]

  # The buffer's next uses.
  following = min(len(uses) - k - 1, lookahead.shape[0])
  for i in range(following):
    op = uses[k + 1 + i]
    first = np.searchsorted(b.incidence_key, buffer_key + op)
    position = positions[min(op, last_op) + 1]
    lookahead[i, columns[LOOK_VALID]] = 1.0
    lookahead[i, columns[LOOK_POSITION]] = position
    lookahead[i, columns[LOOK_DISTANCE]] = position - use_position
    for level in range(num_fast):
      lookahead[i, columns[LOOK_SAVING] + level] = b.use_reduction[level, first] / scale
  return msa_action
