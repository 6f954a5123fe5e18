"""The jitted (numba) kernel of the msa game's observation (env/game/game.py's `MsaGame`): the
whole observation of a decision in one call, from its options' table, the buffer's static row and
uses, and each fast level's chunk heap.

Why one kernel: the game observes after every step (at least 10,000 steps a second, `malloczero
bench`), and as numpy expressions and several kernel calls an observation cost mostly numpy's and
numba's per-call overhead on arrays of a few to a few hundred entries. Loaded on first use
(`lazy_module` in game.py), so that `import malloczero` does not load numba; compiled with
env/kernel_cache.py's `njit` on a machine's first use and read from the cache beside this file
after that. A group of arguments travels as one plain tuple in the order of a named tuple of
msa_observation.py (`ObservationArrays`, `DecisionArrays`, `ObservationFrame`, `BufferArrays`,
`BinLists`) or chunks.py (`TimeIndex`, `Chunks`), of at most four arrays each
(env/msa/kernels/__init__.py says why).

Every feature is computed with the floating-point operations, in the order, of the numpy code
it replaced (float64, then stored as float32), so the observations are the same bit for bit;
a level's occupancy sums its chunks in the order they were committed, as its scan did.
"""

from __future__ import annotations

import numpy as np

from malloczero.env.game.msa_observation import (
  FRAME_CAPACITY,
  FRAME_COLUMNS,
  FRAME_LAST_OP,
  FRAME_NUM_STARTS,
  FRAME_SCALE,
  FRAME_SLOW_PREFIX,
  OBSERVED_COLUMNS,
  OPTION_FIELDS,
  BufferArrays,
  DecisionArrays,
  ObservationArrays,
)
from malloczero.env.kernel_cache import njit
from malloczero.env.msa.chunks import Chunks, TimeIndex
from malloczero.env.msa.kernels.chunk_index import (
  POOL_END,
  POOL_HANDLE,
  POOL_START,
  _index_class,
  _index_classes,
)

# Where each feature's column is among the frame's columns (`OBSERVED_COLUMNS`' order).
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


# Heaps of more chunks than this are read through their time index or the bins' lists; smaller
# ones in one pass over every chunk, which costs less than the index's walk over its classes.
SCAN_LIMIT = 4096
# A window of at least `LONG_WINDOW` ops where the time index finds more live chunks than
# `COLLECT_LIMIT` is read from the bins' lists (most of its bins fill up); any other window of
# a large heap through the index. A short window never fills a bin (chunks live at one op do
# not overlap), so every bin of it would be read to the end of its list.
COLLECT_LIMIT = 2048
LONG_WINDOW = 256


@njit
def _bins(offset, size, width):
  """The address bins `[low, high)` as fractions of a bin that a chunk covers."""
  return offset / width, (offset + size) / width


@njit
def mirror(lists, chunks, width):
  """Files each chunk committed since the last call (`chunks`: a `Chunks`' fields) that is still
  alive in the list of every bin it covers, with its fraction of the bin (`lists`: a
  `BinLists`' fields); False when a list it needs is full (the caller grows them and calls
  again: the chunks filed so far stay filed)."""
  rows, covered, counts, synced = lists
  c = Chunks(*chunks)
  rects, alive = c.rects, c.alive
  bins, room = rows.shape[0], rows.shape[1]
  for i in range(synced[0], c.count):
    if alive[i]:
      low, high = _bins(rects[2, i], rects[3, i], width)
      b = int(low)
      while b < bins and b < high:
        if min(high, b + 1.0) - max(low, float(b)) > 0 and counts[b] == room:
          return False
        b += 1
      b = int(low)
      while b < bins and b < high:
        part = min(high, b + 1.0) - max(low, float(b))
        if part > 0:
          j = counts[b]
          rows[b, j, 0], rows[b, j, 1], rows[b, j, 2] = rects[0, i], rects[1, i], i
          covered[b, j] = part
          counts[b] = j + 1
        b += 1
    synced[0] = i + 1
  return True


@njit
def _collect_at_most(index, start, end, handles, limit):
  """The handles of the chunks live at some op of `[start, end)`, as `chunk_index.collect`
  walks the time index (`index`: a `TimeIndex`' fields), into `handles`; how many, or -1 when
  there are more than `limit` (the walk stops there)."""
  index = TimeIndex(*index)
  ptr, fill, pool, span = index.buckets[0], index.buckets[1], index.pool, index.span
  last_key = min(max(end - 1, 0), span - 1)
  classes = _index_classes(span)
  k = 0
  for c in range(classes):
    first_key = 0 if c == classes - 1 else max(start + 2 - (2 << c), 0)
    if first_key > last_key:
      continue
    base, shift = _index_class(span, c)
    for bucket in range(base + (first_key >> shift), base + (last_key >> shift) + 1):
      for row in range(ptr[bucket], ptr[bucket] + fill[bucket]):
        if pool[row, POOL_START] < end and start < pool[row, POOL_END]:
          if k == limit:
            return -1
          handles[k] = pool[row, POOL_HANDLE]
          k += 1
  return k


@njit
def occupancy(out, index, chunks, hits, lists, first_op, last_op, capacity, limits):
  """Fills `out` [bins] (zeros, float64) with the fraction of each address bin of a level taken
  by its chunks live at some op of `[first_op, last_op]` (`chunks`: a `Chunks`' fields), summed
  in handle order and clipped at 1 (chunks may overlap in time only where they do not in
  address, so the fractions add up).

  `limits`: (`SCAN_LIMIT`, `COLLECT_LIMIT`), or others in tests. A heap of up to the first is
  read in one pass, in handle order (`index`, `hits` and `lists` are then not read). A larger
  one through its time index (`index`: a `TimeIndex`' fields, `hits`: the heap's search
  scratch), which finds the live chunks in no particular order; they are put back in handle
  order to be summed. A window of at least `LONG_WINDOW` ops with more live chunks than the
  second (up to the whole program) is read from the bins' lists instead (`lists`: a
  `BinLists`' fields, `mirror`ed up to date), each in handle order until its sum passes 1,
  which it then stays above."""
  c = Chunks(*chunks)
  rects, alive = c.rects, c.alive
  bins = len(out)
  width = capacity / bins
  scan_limit, collect_limit = limits
  if c.count <= scan_limit:
    every = np.ones(0, np.bool_)
    for i in range(c.count):
      if alive[i] and rects[0, i] <= last_op and rects[1, i] > first_op:
        _add_chunk(out, rects[2, i], rects[3, i], width, every)
  else:
    limit = collect_limit if last_op - first_op + 1 >= LONG_WINDOW else c.count
    found = _collect_at_most(index, first_op, last_op + 1, hits[3], limit)
    if found < 0:
      _from_lists(out, lists, alive, first_op, last_op)
    else:
      _from_hits(out, hits[3], found, rects, width)
  for b in range(bins):
    if out[b] > 1.0:
      out[b] = 1.0


@njit
def _from_lists(out, lists, alive, first_op, last_op):
  """`occupancy` of a long window, bin by bin from the bins' lists (in handle order)."""
  rows, covered, counts, _ = lists
  for b in range(len(out)):
    total = 0.0
    for j in range(counts[b]):
      if rows[b, j, 0] <= last_op and rows[b, j, 1] > first_op and alive[rows[b, j, 2]]:
        total += covered[b, j]
        if total > 1.0:
          break
    out[b] = total


@njit
def _from_hits(out, found_handles, found, rects, width):
  """`occupancy` of the `found` live chunks the time index found (their handles in no order):
  marked in a bitmap over the handles and read back in handle order (cheaper than sorting the
  thousands a window of a large heap finds)."""
  marks = np.zeros(len(rects[0]) // 64 + 1, np.uint64)
  for j in range(found):
    i = found_handles[j]
    marks[i >> 6] |= np.uint64(1) << np.uint64(i & 63)
  every = np.ones(0, np.bool_)
  for word in range(len(marks)):
    bits = marks[word]
    while bits:
      low_bit = bits & (~bits + np.uint64(1))
      i = word * 64 + _bit_index(low_bit)
      _add_chunk(out, rects[2, i], rects[3, i], width, every)
      bits ^= low_bit


@njit
def _bit_index(bit):
  """The position of the single set bit of `bit` (a uint64)."""
  k = 0
  if bit >> np.uint64(32):
    k += 32
    bit >>= np.uint64(32)
  if bit >> np.uint64(16):
    k += 16
    bit >>= np.uint64(16)
  if bit >> np.uint64(8):
    k += 8
    bit >>= np.uint64(8)
  if bit >> np.uint64(4):
    k += 4
    bit >>= np.uint64(4)
  if bit >> np.uint64(2):
    k += 2
    bit >>= np.uint64(2)
  if bit >> np.uint64(1):
    k += 1
  return k


@njit
def _add_chunk(out, offset, size, width, only):
  """Adds a chunk's fraction of each bin it covers to `out` (the bins `only` marks, when it
  marks any)."""
  low, high = _bins(offset, size, width)
  bins = len(out)
  b = int(low)
  while b < bins and b < high:
    covered = min(high, b + 1.0) - max(low, float(b))
    if covered > 0 and (len(only) == 0 or only[b]):
      out[b] += covered
    b += 1


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
def _scanned(out, chunks, first_op, last_op, capacity):
  """`occupancy` of a small heap (`chunks`: its rects, alive mask and count) into the float32 row
  `out`: one pass over every chunk, in handle order, in float64."""
  rects, alive, count = chunks
  row = np.zeros(len(out))
  width = capacity / len(out)
  every = np.ones(0, np.bool_)
  for i in range(count):
    if alive[i] and rects[0, i] <= last_op and rects[1, i] > first_op:
      _add_chunk(row, rects[2, i], rects[3, i], width, every)
  for b in range(len(out)):
    out[b] = min(row[b], 1.0)


@njit
def observe(
  out,
  decision,
  frame,
  buffer,
  heap0,
  heap1,
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
  slot msa takes. `frame`: an `ObservationFrame`'s fields; `buffer`: a `BufferArrays`'; per
  fast level up to two its heap's chunks (rects, alive mask and count; a count below 0: the
  level's occupancy is the caller's, `occupancy`'s for a large heap); `buffer_key`: the
  buffer's first incidence key (buffer x stride); `option0`: option 0's kind (default, evict,
  uncommit); `program_time`, `stall_share` and `progress`: the request's features of the
  program so far."""
  o, d, b = ObservationArrays(*out), DecisionArrays(*decision), BufferArrays(*buffer)
  values, ints = frame
  request, candidates, lookahead = o.request, o.candidates, o.lookahead
  options, legal, option_index = d.options, d.legal, d.option_index
  last_op, num_starts = ints[FRAME_LAST_OP], ints[FRAME_NUM_STARTS]
  positions = values[: ints[FRAME_SLOW_PREFIX]]
  slow_op_prefix = values[ints[FRAME_SLOW_PREFIX] : ints[FRAME_CAPACITY]]
  capacity = values[ints[FRAME_CAPACITY] : ints[FRAME_SCALE]]
  scale = values[ints[FRAME_SCALE]]
  columns = ints[FRAME_COLUMNS:]
  num_options = options.shape[0] + 1
  slots = np.empty(num_options, np.int64)
  _slots(options, num_starts, slots)
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
    candidates[r, columns[OFFSET]] = options[i, OPTION_OFFSET] / capacity[level]
    candidates[r, columns[SAVING]] = options[i, OPTION_SAVING] / scale
    if options[i, IS_PREFETCH] != 0.0:
      candidates[r, fetch] = 1.0
      candidates[r, rank] = ((r - 1) % num_starts) / num_starts
      hidden = slow_op_prefix[use] - slow_op_prefix[max(start, 0)]
      candidates[r, columns[HIDE_RATIO]] = min(hidden / max(copy_time, 1e-30), 10.0)
      candidates[r, columns[LEAD]] = (use - start) / window
      candidates[r, columns[EVICTS]] = 1.0 if options[i, OPTION_EVICTS] != 0.0 else 0.0
    else:
      candidates[r, keep] = 1.0
  if msa_choice:
    candidates[msa_action - 1, columns[MSA_CHOICE]] = 1.0

  # Each fast level's occupancy over the segment (a small heap's; a large one's is the caller's).
  first_op = max(segment_start, 0)
  if num_fast > 0 and heap0[2] >= 0:
    _scanned(o.occupancy[0], heap0, first_op, use, capacity[0])
  if num_fast > 1 and heap1[2] >= 0:
    _scanned(o.occupancy[1], heap1, first_op, use, capacity[1])

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
