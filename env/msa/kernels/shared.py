"""What more than one of msa's kernel modules uses: the stable radix sort of a search's hits by
offset (the time index's searches and the live lists' unions both sort what they find), the
rounding of a chunk's end up to the heap's alignment, the unbounded top of the address space, and
the picker's elapsed time over an interval of a program with loops (env/msa/interval_picker.py's
`WhileNest`: the window, the start walk and the chunk search's no-copy bound all read it)."""

from __future__ import annotations

import numpy as np

from malloczero.env.kernel_cache import njit

INT64_MAX = np.iinfo(np.int64).max
_RADIX_BITS = 8  # `offset_order`'s radix digits: bytes (as many passes as 11 bits, fewer counts).
_RADIX = 1 << _RADIX_BITS
_INSERTION_SORT_MAX = 48  # `offset_order` sorts this many hits or fewer by insertion.


@njit
def align_up(value, alignment):
  return (value + alignment - 1) // alignment * alignment


@njit
def offset_order(hits, k, size):
  """The permutation `[k]` that sorts the first `k` hits (`hits` `[4, capacity]`: start, offset,
  used end, handle) by offset: a stable LSD radix sort of the offsets (numba's sorts cost
  several times as much on the thousands of chunks a search finds, and sorting was most of msa's
  time). Chunks at the same offset are put in handle order (the linear scan's) only for a
  request of no bytes: between two chunks at one offset the free range ends where the first one
  starts, so it holds at least one byte for neither order, and the reach after both is the
  same."""
  order = np.arange(k)
  if size <= 0:
    order = np.argsort(hits[3, :k])
  if 1 < k <= _INSERTION_SORT_MAX:
    # Few hits: a stable insertion sort, without the radix passes' fixed cost.
    for j in range(1, k):
      moving = order[j]
      key = hits[1, moving]
      i = j - 1
      while i >= 0 and hits[1, order[i]] > key:
        order[i + 1] = order[i]
        i -= 1
      order[i + 1] = moving
  elif k > 1:
    lowest = hits[1, 0]
    for j in range(k):
      lowest = min(lowest, hits[1, j])
    # Radix digits of the offsets above the lowest, without the low bits all of them share
    # (the alignment's).
    keys = np.empty(k, np.int64)
    common = 0
    for j in range(k):
      keys[j] = hits[1, order[j]] - lowest
      common |= keys[j]
    shift = 0
    while common != 0 and (common >> shift) & 1 == 0:
      shift += 1
    highest = 0
    for j in range(k):
      keys[j] >>= shift
      highest = max(highest, keys[j])
    other_keys = np.empty(k, np.int64)
    other_order = np.empty(k, np.int64)
    counts = np.empty(_RADIX, np.int64)
    digit_shift = 0
    while (highest >> digit_shift) > 0:
      counts[:] = 0
      for j in range(k):
        counts[(keys[j] >> digit_shift) & (_RADIX - 1)] += 1
      total = 0
      for d in range(_RADIX):
        total, counts[d] = total + counts[d], total
      for j in range(k):
        d = (keys[j] >> digit_shift) & (_RADIX - 1)
        other_keys[counts[d]] = keys[j]
        other_order[counts[d]] = order[j]
        counts[d] += 1
      keys, other_keys = other_keys, keys
      order, other_order = other_order, order
      digit_shift += _RADIX_BITS
  return order


@njit
def while_level(levels, time):
  """The while nest level of a start `time` (`levels`: a `WhileNest`'s), 0 at the program start
  (-1)."""
  return 0 if time < 0 else levels[0, time]


@njit
def min_while_level(levels, start, end):
  """XLA's `GetMinWhileNestLevel`: the smallest level of ops `start .. end` (closed, 0 <= start
  <= end), following the change chain (`levels[1]`) back from `end`: one link per level."""
  level = min(levels[0, start], levels[0, end])
  change = levels[1, end]
  while change >= start:
    level = min(level, levels[0, change])
    change = levels[1, change]
  return level


@njit
def nested_elapsed(prefix, nest, start, end):
  """`CostAnalysisPrefetchIntervalPicker.logical_interval_elapsed(start, end)` (start <= end) of
  a program with loops (`nest`: a `WhileNest`): the multiplied times strictly between, over W **
  the smallest level of ops `max(start, 0) .. end`; the same operations as the Python method."""
  if start == end:
    return 0.0
  level = min_while_level(nest.levels, max(start, 0), end)
  return (prefix[end] - prefix[start + 1]) / nest.divisors[level]
