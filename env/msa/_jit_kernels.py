"""Jitted (numba) kernels of msa's per-start checks: the chunk heap's best-fit search, the copy
resource's FIFO queue and check, the prefetch picker's window and start sequence, and the
prefetch loop over starts that combines them (`plan_prefetch_starts`).

Why: msa's decision process (`algorithm.py`, all options) runs these checks several times per
step, each over a few hundred ops or chunks; as numpy expressions their cost was mostly numpy's
per-call overhead (tens of small array operations per query), which kept the process near 2,800
decisions a second, under what the game needs (it now runs 15,000-22,000; docs/msa.md). Each
kernel computes exactly what the numpy code it replaces computes, with the same floating-point
operations in the same order (sequential cumulative sums, as `np.cumsum`; no fastmath), so that
no decision changes (tests/test_msa_parts.py checks them against XLA's cases and the picker's
against its numpy searches and iterator; the decision sequences were compared step by step
with the numpy code's).

Loaded on first use (`_jit.kernels()`), so that importing the solvers does not load numba;
compiled on the first use on a machine (about 5 s) and loaded from numba's cache beside this
file after that (`cache=True`, about 0.35 s with numba's import). The kernels take int64 /
float64 arrays and Python scalars only, as flat arguments: numba's dispatch types a tuple
argument element by element in Python, slower than the kernel runs.
"""

from __future__ import annotations

import numba
import numpy as np

_INT64_MAX = np.iinfo(np.int64).max
_RADIX_BITS = 8  # `_by_offset`'s radix digits: bytes (as many passes as 11 bits, fewer counts).
_RADIX = 1 << _RADIX_BITS
_INSERTION_SORT_MAX = 48  # `_offset_order` sorts this many hits or fewer by insertion.
_MIN_BUCKET_SHIFT = 6  # The time index's buckets span at least 64 ops.


@numba.njit(cache=True)
def _live_sorted(starts, ends, offsets, sizes, alive, count, start, end, alignment):
  """The chunks live at some op of `[start, end)`, sorted by offset (stable): their offsets and
  ends rounded up to the alignment (`ChunkHeap.free_chunks`' used ranges)."""
  k = 0
  hit = np.empty(count, np.int64)
  for i in range(count):
    if alive[i] and starts[i] < end and start < ends[i]:
      hit[k] = i
      k += 1
  used_start = np.empty(k, np.int64)
  for j in range(k):
    used_start[j] = offsets[hit[j]]
  order = np.argsort(used_start, kind="mergesort")
  sorted_start = np.empty(k, np.int64)
  used_end = np.empty(k, np.int64)
  for j in range(k):
    i = hit[order[j]]
    sorted_start[j] = offsets[i]
    used_end[j] = (offsets[i] + sizes[i] + alignment - 1) // alignment * alignment
  return sorted_start, used_end


# ------------------------------------------------------------------ the chunk heap's time index
# Each bucket's chunks sit together in `pool` `[P, POOL_WIDTH]` (rows `ptr[b]` .. `ptr[b] +
# size[b]`, room for `room[b]`), one row per chunk: start, end, offset, end rounded up to the
# alignment, handle. A search streams through them: the linked lists this replaced cost a
# dependent load per chunk, about 90 ns each once the heap outgrew the caches.
POOL_START, POOL_END, POOL_OFFSET, POOL_USED_END, POOL_HANDLE = 0, 1, 2, 3, 4
POOL_WIDTH = 5


@numba.njit(cache=True)
def _index_classes(span):
  """How many length classes a time index over `span` start times has: 0 .. log2(span)."""
  classes = 1
  while (span >> classes) > 0:
    classes += 1
  return classes


@numba.njit(cache=True)
def _index_class(span, c):
  """(first bucket, bucket width as a shift) of length class c: buckets of 2^c ops, but not
  narrower than 2^_MIN_BUCKET_SHIFT (a short chunk's bucket would hold about one chunk, and a
  long search would read one bucket per op, each from another place in the pool)."""
  first = 0
  for j in range(c):
    first += max(span >> max(j, _MIN_BUCKET_SHIFT), 1)
  return first, max(c, _MIN_BUCKET_SHIFT)


@numba.njit(cache=True)
def _index_bucket(span, start, end):
  """The bucket of the time index (`ChunkHeap`) a chunk over `[start, end)` is filed under:
  its length class c (lengths in [2^c, 2^(c + 1)), measured from its start clamped to
  `[0, span)`; the last class takes every longer chunk too), then the bucket of its class that
  holds that start (`_index_class`)."""
  key = min(max(start, 0), span - 1)
  length = max(end - key, 1)
  c = 0
  while (length >> (c + 1)) > 0 and (span >> (c + 1)) > 0:
    c += 1
  first, shift = _index_class(span, c)
  return first + (key >> shift)


@numba.njit(cache=True)
def index_buckets(span):
  """How many buckets a time index over `span` start times has."""
  first, _ = _index_class(span, _index_classes(span))
  return first


@numba.njit(cache=True)
def index_add(ptr, size, room, pool, used, span, start, end, offset, used_end, handle):
  """Files a chunk in its bucket; False (and nothing changed) when `pool` has no room for the
  bucket to grow into (the caller grows it and asks again). A full bucket moves to the end of
  the pool's used rows (`used[0]`) with twice the room."""
  bucket = _index_bucket(span, start, end)
  if size[bucket] == room[bucket]:
    grown = max(4, 2 * room[bucket])
    if used[0] + grown > len(pool):
      return False
    first = used[0]
    for j in range(size[bucket]):
      for f in range(POOL_WIDTH):
        pool[first + j, f] = pool[ptr[bucket] + j, f]
    ptr[bucket], room[bucket] = first, grown
    used[0] += grown
  row = ptr[bucket] + size[bucket]
  pool[row, POOL_START], pool[row, POOL_END], pool[row, POOL_OFFSET] = start, end, offset
  pool[row, POOL_USED_END], pool[row, POOL_HANDLE] = used_end, handle
  size[bucket] += 1
  return True


@numba.njit(cache=True)
def index_build(
  ptr, size, room, pool, used, span, starts, ends, offsets, sizes, alive, count, alignment
):
  """Files every live chunk of the first `count` into an empty time index; False when `pool`
  is too small (`ChunkHeap` rebuilds the index when a chunk starts past its span or the pool
  is full)."""
  for i in range(count):
    if alive[i]:
      used_end = (offsets[i] + sizes[i] + alignment - 1) // alignment * alignment
      if not index_add(
        ptr, size, room, pool, used, span, starts[i], ends[i], offsets[i], used_end, i
      ):
        return False
  return True


@numba.njit(cache=True)
def index_remove(ptr, size, pool, span, start, end, handle):
  """Takes a chunk out of its bucket (the bucket's last row moves into its place)."""
  bucket = _index_bucket(span, start, end)
  last = ptr[bucket] + size[bucket] - 1
  for row in range(ptr[bucket], last + 1):
    if pool[row, POOL_HANDLE] == handle:
      for f in range(POOL_WIDTH):
        pool[row, f] = pool[last, f]
      size[bucket] -= 1
      return


@numba.njit(cache=True)
def _collect(ptr, size, pool, span, start, end, hits):
  """Writes the chunks live at some op of `[start, end)` to `hits` `[4, capacity]` (start,
  offset, used end, handle; in no particular order) and returns how many. A chunk of class c
  live after `start` starts after `start + 1 - 2^(c + 1)` and before `end`, so each class is
  read over those buckets only: a bucket head per 2^max(c, 6) ops, and chunks of the length of
  the ones that are live, most of which are (not a pass over every chunk; the classes shorter
  than the narrowest bucket read a few more that ended before `start`)."""
  last_key = min(max(end - 1, 0), span - 1)
  classes = _index_classes(span)
  k = 0
  for c in range(classes):
    first_key = 0 if c == classes - 1 else max(start + 2 - (2 << c), 0)
    if first_key > last_key:
      continue
    base, shift = _index_class(span, c)
    for bucket in range(base + (first_key >> shift), base + (last_key >> shift) + 1):
      for row in range(ptr[bucket], ptr[bucket] + size[bucket]):
        if pool[row, POOL_START] < end and start < pool[row, POOL_END]:
          hits[0, k] = pool[row, POOL_START]
          hits[1, k] = pool[row, POOL_OFFSET]
          hits[2, k] = pool[row, POOL_USED_END]
          hits[3, k] = pool[row, POOL_HANDLE]
          k += 1
  return k


@numba.njit(cache=True)
def _blocked(ptr, size, pool, span, start, end, request, offset):
  """Whether a chunk live at some op of `[start, end)` starts below `offset + request` and
  ends (aligned up) above `offset`: `_collect`'s walk, stopping at the first."""
  last_key = min(max(end - 1, 0), span - 1)
  classes = _index_classes(span)
  for c in range(classes):
    first_key = 0 if c == classes - 1 else max(start + 2 - (2 << c), 0)
    if first_key > last_key:
      continue
    base, shift = _index_class(span, c)
    for bucket in range(base + (first_key >> shift), base + (last_key >> shift) + 1):
      for row in range(ptr[bucket], ptr[bucket] + size[bucket]):
        if (
          pool[row, POOL_START] < end
          and start < pool[row, POOL_END]
          and pool[row, POOL_OFFSET] < offset + request
          and pool[row, POOL_USED_END] > offset
        ):
          return True
  return False


@numba.njit(cache=True)
def _offset_order(hits, k, size):
  """The permutation `[k]` that sorts the first `k` hits (`_collect`'s) by offset: a stable LSD
  radix sort of the offsets (numba's sorts cost several times as much on the thousands of
  chunks a search finds, and sorting was most of msa's time). Chunks at the same offset are put
  in handle order (the linear scan's) only for a request of no bytes: between two chunks at one
  offset the free range ends where the first one starts, so it holds at least one byte for
  neither order, and the reach after both is the same."""
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


@numba.njit(cache=True)
def _by_offset(hits, k, size, sorted_hits):
  """Writes the first `k` hits (`_collect`'s) to `sorted_hits` (start, offset, used end) sorted
  by offset (`_offset_order`)."""
  order = _offset_order(hits, k, size)
  for j in range(k):
    i = order[j]
    sorted_hits[0, j] = hits[0, i]
    sorted_hits[1, j] = hits[1, i]
    sorted_hits[2, j] = hits[2, i]


@numba.njit(cache=True)
def _fit_in(sorted_hits, k, end, size):
  """`_smallest_fit` over the first `k` offset-sorted hits that start before `end`: the start
  of the smallest free range between them that holds `size` bytes, the lowest on a tie (the
  top range is unbounded)."""
  best_start, best_length = -1, _INT64_MAX
  reach = 0
  for j in range(k):
    if sorted_hits[0, j] >= end:
      continue
    length = sorted_hits[1, j] - reach
    if length >= size and (
      best_start < 0 or length < best_length or (length == best_length and reach < best_start)
    ):
      best_start, best_length = reach, length
    if sorted_hits[2, j] > reach:
      reach = sorted_hits[2, j]
  length = _INT64_MAX - reach
  if length >= size and (
    best_start < 0 or length < best_length or (length == best_length and reach < best_start)
  ):
    best_start = reach
  return best_start


@numba.njit(cache=True)
def fits_at_indexed(ptr, size_, pool, span, start, end, size, offset):
  """`fits_at` through the time index. Over offset-sorted used ranges, `[offset, offset +
  size)` lies in a free range exactly when no live chunk starts below `offset + size` and ends
  (aligned up) above `offset` (every range before the first chunk at or above `offset + size`
  must end by `offset`), so no sort is needed (`offset` >= 0, as the caller checks)."""
  return not _blocked(ptr, size_, pool, span, start, end, size, offset)


@numba.njit(cache=True)
def _smallest_fit(used_start, used_end, size):
  """The start of the smallest free range between the offset-sorted used ranges that holds
  `size` bytes, the lowest on a tie (the top range is unbounded)."""
  best_start, best_length = -1, _INT64_MAX
  reach = 0
  for j in range(len(used_start) + 1):
    free_start = reach
    free_end = used_start[j] if j < len(used_start) else _INT64_MAX
    length = free_end - free_start
    if length >= size and (
      best_start < 0 or length < best_length or (length == best_length and free_start < best_start)
    ):
      best_start, best_length = free_start, length
    if j < len(used_start) and used_end[j] > reach:
      reach = used_end[j]
  return best_start


@numba.njit(cache=True)
def best_fit_indexed(
  h_ptr,
  h_size,
  h_pool,
  h_span,
  h_hits,
  h_sorted,
  h_lists,
  h_rows4,
  h_rows2,
  h_meta,
  h_starts,
  h_ends,
  h_offsets,
  h_sizes,
  h_alive,
  h_count,
  h_alignment,
  h_work,
  start,
  end,
  size,
):
  """`best_fit` through the time index and the live lists (`h_ptr` .. `h_work`:
  `ChunkHeap.search_state()`)."""
  offset = _live_fit(
    h_ptr,
    h_size,
    h_pool,
    h_span,
    h_hits,
    h_lists,
    h_rows4,
    h_rows2,
    h_meta,
    h_starts,
    h_ends,
    h_offsets,
    h_sizes,
    h_alive,
    h_count,
    h_alignment,
    h_work,
    start,
    end,
    size,
  )
  if offset != LIVE_FALLBACK:
    return offset
  k = _collect(h_ptr, h_size, h_pool, h_span, start, end, h_hits)
  _by_offset(h_hits, k, size, h_sorted)
  return _fit_in(h_sorted, k, end, size)


# ------------------------------------------------------------------ the chunk heap's live lists
# A search of `[start, end)` meets every chunk live there, a few thousand on programs of 100,000
# buffers, each collected from the time index and radix-sorted anew; reading them was its cost.
# Best fit reads only the union of their address ranges (the free ranges between its parts:
# for a request of at least one byte, ranges that touch leave no room between them), so these
# lists keep unions, sorted, up to date from the chunks committed since (handles grow):
# * per block of 2^LIVE_SHIFT ops (its edge `e` = its first op), the chunks that started before
#   `e` and are live across the whole block, as a union (`EDGE_UNION`), and those that started
#   before `e` and end inside it (`EDGE_ROWS`: offset, used end, end);
# * per block, the chunks that start in it (`STARTS`: start, end, offset, used end), filed as
#   they are committed;
# * per aligned run of 2^j blocks (level j), the union of the chunks that start in it
#   (`LEVEL_UNION`).
# A search starting in block b then reads b's edge union, the edge rows still live, the chunks
# that started in b (and in the block holding its end) and the level unions that tile the
# blocks between: a few hundred intervals where it met thousands of chunks.
# `lists` `[L, 4]`: per list its first row, length, room, and (unions) the chunk count it has
# seen (-1: to build); `rows4` `[R, 4]` holds the starts and edge rows, `rows2` `[R, 2]` the
# unions (low, high); `meta`: rows in use in each, the room a list did not find in each
# (`ChunkHeap` compacts them when it is not 0), blocks, levels. `work` `[3, C, 2]`: unions
# being merged.
LIVE_SHIFT = 7
LIST_PTR, LIST_LEN, LIST_ROOM, LIST_SEEN = 0, 1, 2, 3
META_USED4, META_USED2, META_FULL4, META_FULL2, META_BLOCKS, META_LEVELS = 0, 1, 2, 3, 4, 5
LIVE_FALLBACK = -2


@numba.njit(cache=True)
def live_layout(span):
  """(blocks, levels, lists) of the live lists over start times `[0, span)`: the lists are
  each block's starts, edge rows and edge union, then each level's unions."""
  blocks = (span >> LIVE_SHIFT) + 1
  levels = 1
  while ((blocks - 1) >> (levels - 1)) > 0:
    levels += 1
  total = 3 * blocks
  for j in range(levels):
    total += ((blocks - 1) >> j) + 1
  return blocks, levels, total


@numba.njit(cache=True)
def _level_list(blocks, j, m):
  first = 3 * blocks
  for i in range(j):
    first += ((blocks - 1) >> i) + 1
  return first + m


@numba.njit(cache=True)
def _reserve(lists, rows, meta, used_at, full_at, lid, needed):
  """Room for `needed` rows in list `lid` (moved to the end of the rows in use, with a quarter
  more, when it has less); False (the room asked for noted in `meta`) when `rows` is full."""
  if needed <= lists[lid, LIST_ROOM]:
    return True
  room = max(needed + needed // 4, 8)
  first = meta[used_at]
  if first + room > rows.shape[0]:
    meta[full_at] = max(meta[full_at], room)
    return False
  old = lists[lid, LIST_PTR]
  for j in range(lists[lid, LIST_LEN]):
    for f in range(rows.shape[1]):
      rows[first + j, f] = rows[old + j, f]
  lists[lid, LIST_PTR], lists[lid, LIST_ROOM] = first, room
  meta[used_at] += room
  return True


@numba.njit(cache=True)
def live_compact(lists, first_list, last_list, rows, new_rows):
  """Copies lists `[first_list, last_list)` to `new_rows`, each with a quarter more room; the
  rows used."""
  used = 0
  for lid in range(first_list, last_list):
    length = lists[lid, LIST_LEN]
    room = max(length + length // 4, 8) if lists[lid, LIST_ROOM] > 0 else 0
    for j in range(length):
      for f in range(rows.shape[1]):
        new_rows[used + j, f] = rows[lists[lid, LIST_PTR] + j, f]
    lists[lid, LIST_PTR], lists[lid, LIST_ROOM] = used, room
    used += room
  return used


@numba.njit(cache=True)
def live_add(lists, rows4, meta, start, end, offset, used_end):
  """Files a committed chunk in its block's starts; False (nothing filed) when `rows4` is
  full. A chunk that starts before op 0 is only ever read through edges."""
  if start < 0:
    return True
  lid = start >> LIVE_SHIFT
  n = lists[lid, LIST_LEN]
  if not _reserve(lists, rows4, meta, META_USED4, META_FULL4, lid, n + 1):
    return False
  row = lists[lid, LIST_PTR] + n
  rows4[row, 0], rows4[row, 1], rows4[row, 2], rows4[row, 3] = start, end, offset, used_end
  lists[lid, LIST_LEN] = n + 1
  return True


@numba.njit(cache=True)
def heap_add(
  ptr, size, room, pool, used, span, lists, rows4, meta, start, end, offset, used_end, handle
):
  """`index_add` then `live_add`, one call per committed chunk: 0 when both filed it, 1 when
  the pool was full (nothing filed), 2 when `rows4` was (filed in the index only)."""
  if not index_add(ptr, size, room, pool, used, span, start, end, offset, used_end, handle):
    return 1
  if not live_add(lists, rows4, meta, start, end, offset, used_end):
    return 2
  return 0


@numba.njit(cache=True)
def live_add_all(lists, rows4, meta, starts, ends, offsets, sizes, alive, first, count, alignment):
  """`live_add` for every live chunk from handle `first` on: the handle it stopped at, `rows4`
  being full (`count` when all are filed)."""
  for i in range(first, count):
    if alive[i]:
      used_end = (offsets[i] + sizes[i] + alignment - 1) // alignment * alignment
      if not live_add(lists, rows4, meta, starts[i], ends[i], offsets[i], used_end):
        return i
  return count


@numba.njit(cache=True)
def live_remove(lists, rows4, meta, start, end, offset, used_end, handle):
  """Takes a removed chunk out of its block's starts (a row equal to its own: equal rows read
  alike), and sends the unions that have seen it to be built again."""
  blocks = meta[META_BLOCKS]
  if start >= 0:
    lid = start >> LIVE_SHIFT
    first, n = lists[lid, LIST_PTR], lists[lid, LIST_LEN]
    for row in range(first, first + n):
      if (
        rows4[row, 0] == start
        and rows4[row, 1] == end
        and rows4[row, 2] == offset
        and rows4[row, 3] == used_end
      ):
        for f in range(4):
          rows4[row, f] = rows4[first + n - 1, f]
        lists[lid, LIST_LEN] = n - 1
        break
    for j in range(meta[META_LEVELS]):
      lid = _level_list(blocks, j, (start >> LIVE_SHIFT) >> j)
      if lists[lid, LIST_SEEN] > handle:
        lists[lid, LIST_SEEN], lists[lid, LIST_LEN] = -1, 0
  for b in range(max((start >> LIVE_SHIFT) + 1, 0), min(((end - 1) >> LIVE_SHIFT) + 1, blocks)):
    union = 2 * blocks + b
    if lists[union, LIST_SEEN] > handle:
      lists[union, LIST_SEEN], lists[union, LIST_LEN] = -1, 0
      lists[blocks + b, LIST_LEN] = 0


@numba.njit(cache=True)
def _union_push(out, base, n, low, high):
  """Appends `[low, high)` (low not below any before it) to the union in `out[base:base + n]`;
  its new length."""
  if n > 0 and low <= out[base + n - 1, 1]:
    if high > out[base + n - 1, 1]:
      out[base + n - 1, 1] = high
    return n
  out[base + n, 0], out[base + n, 1] = low, high
  return n + 1


@numba.njit(cache=True)
def _union_merge(a, a_first, a_len, b, b_len, out):
  """The union of `a[a_first:a_first + a_len]` and `b[:b_len]` (each sorted by low) in
  `out`; its length."""
  i, j, n = 0, 0, 0
  while i < a_len or j < b_len:
    if j >= b_len or (i < a_len and a[a_first + i, 0] <= b[j, 0]):
      n = _union_push(out, 0, n, a[a_first + i, 0], a[a_first + i, 1])
      i += 1
    else:
      n = _union_push(out, 0, n, b[j, 0], b[j, 1])
      j += 1
  return n


@numba.njit(cache=True)
def _union_store(lists, rows2, meta, lid, source, n):
  """List `lid` set to the union `source[:n]`; False when `rows2` is full."""
  lists[lid, LIST_LEN] = 0
  if not _reserve(lists, rows2, meta, META_USED2, META_FULL2, lid, n):
    lists[lid, LIST_SEEN] = -1
    return False
  first = lists[lid, LIST_PTR]
  for j in range(n):
    rows2[first + j, 0], rows2[first + j, 1] = source[j, 0], source[j, 1]
  lists[lid, LIST_LEN] = n
  return True


@numba.njit(cache=True)
def _union_update(lists, rows2, meta, lid, hits, k, work, count):
  """Union list `lid` with the first `k` hits' ranges (offset, used end: rows 1, 2) added,
  seen up to chunk `count`; False when `rows2` is full (the list is built again)."""
  order = _offset_order(hits, k, 1)
  n = 0
  for j in range(k):
    i = order[j]
    n = _union_push(work[1], 0, n, hits[1, i], hits[2, i])
  return _union_add(lists, rows2, meta, lid, work, n, count)


@numba.njit(cache=True)
def _union_add(lists, rows2, meta, lid, work, n, count):
  """Union list `lid` with the union `work[1][:n]` added, seen up to chunk `count`; False when
  `rows2` is full (the list is built again)."""
  source = work[1]
  if lists[lid, LIST_SEEN] >= 0:
    n = _union_merge(rows2, lists[lid, LIST_PTR], lists[lid, LIST_LEN], work[1], n, work[2])
    source = work[2]
  if not _union_store(lists, rows2, meta, lid, source, n):
    return False
  lists[lid, LIST_SEEN] = count
  return True


@numba.njit(cache=True)
def _edge_refresh(
  ptr,
  size,
  pool,
  span,
  hits,
  lists,
  rows4,
  rows2,
  meta,
  h_start,
  h_end,
  h_offset,
  h_size,
  h_alive,
  count,
  alignment,
  work,
  b,
):
  """Brings block `b`'s edge union and edge rows up to date with the first `count` chunks;
  False when the rows are full."""
  blocks = meta[META_BLOCKS]
  union, edge_rows = 2 * blocks + b, blocks + b
  edge = b << LIVE_SHIFT
  whole = edge + (1 << LIVE_SHIFT)
  seen = lists[union, LIST_SEEN]
  if seen < 0:
    k = _collect(ptr, size, pool, span, edge, edge, hits)  # start < edge < end
    lists[edge_rows, LIST_LEN] = 0
    for j in range(k):
      hits[0, j] = h_end[hits[3, j]]
  else:
    k = 0
    for handle in range(seen, count):
      if h_alive[handle] and h_start[handle] < edge and edge < h_end[handle]:
        hits[0, k], hits[1, k] = h_end[handle], h_offset[handle]
        hits[2, k] = (h_offset[handle] + h_size[handle] + alignment - 1) // alignment * alignment
        hits[3, k] = handle
        k += 1
    if k == 0:
      lists[union, LIST_SEEN] = count
      return True
  # Those that end inside the block join the edge rows (merged from the back, in place); the
  # others the union.
  order = _offset_order(hits, k, 1)
  ending = 0
  for j in range(k):
    if hits[0, j] < whole:
      ending += 1
  length = lists[edge_rows, LIST_LEN]
  if ending > 0:
    if not _reserve(lists, rows4, meta, META_USED4, META_FULL4, edge_rows, length + ending):
      lists[union, LIST_SEEN], lists[union, LIST_LEN] = -1, 0
      return False
    first = lists[edge_rows, LIST_PTR]
    i, w = length - 1, length + ending - 1
    for j in range(k - 1, -1, -1):
      h = order[j]
      if hits[0, h] >= whole:
        continue
      while i >= 0 and rows4[first + i, 0] > hits[1, h]:
        for f in range(4):
          rows4[first + w, f] = rows4[first + i, f]
        i -= 1
        w -= 1
      rows4[first + w, 0], rows4[first + w, 1], rows4[first + w, 2] = (
        hits[1, h],
        hits[2, h],
        hits[0, h],
      )
      w -= 1
    lists[edge_rows, LIST_LEN] = length + ending
  n = 0
  for j in range(k):
    h = order[j]
    if hits[0, h] >= whole:
      n = _union_push(work[1], 0, n, hits[1, h], hits[2, h])
  return _union_add(lists, rows2, meta, union, work, n, count)


@numba.njit(cache=True)
def _level_refresh(
  lists, rows4, rows2, meta, h_start, h_alive, h_offset, h_size, count, alignment, hits, work, j, m
):
  """Brings level j's union of run m (the chunks that start in blocks `m << j` ..) up to date
  with the first `count` chunks; False when `rows2` is full."""
  blocks = meta[META_BLOCKS]
  lid = _level_list(blocks, j, m)
  seen = lists[lid, LIST_SEEN]
  k = 0
  if seen < 0:
    for b in range(m << j, min((m + 1) << j, blocks)):
      first = lists[b, LIST_PTR]
      for row in range(first, first + lists[b, LIST_LEN]):
        hits[1, k], hits[2, k] = rows4[row, 2], rows4[row, 3]
        k += 1
  else:
    low, high = m << (j + LIVE_SHIFT), (m + 1) << (j + LIVE_SHIFT)
    for handle in range(seen, count):
      if h_alive[handle] and low <= h_start[handle] and h_start[handle] < high:
        hits[1, k] = h_offset[handle]
        hits[2, k] = (h_offset[handle] + h_size[handle] + alignment - 1) // alignment * alignment
        k += 1
    if k == 0:
      lists[lid, LIST_SEEN] = count
      return True
  return _union_update(lists, rows2, meta, lid, hits, k, work, count)


@numba.njit(cache=True)
def _merge_fit(a, a_first, a_len, b, b_len, size):
  """`_fit_in` over the union of `a[a_first:a_first + a_len]` and `b[:b_len]` (ranges sorted
  by low), merged as it reads them."""
  best_start, best_length = -1, _INT64_MAX
  reach = 0
  i, j = 0, 0
  while i < a_len or j < b_len:
    if j >= b_len or (i < a_len and a[a_first + i, 0] <= b[j, 0]):
      low, high = a[a_first + i, 0], a[a_first + i, 1]
      i += 1
    else:
      low, high = b[j, 0], b[j, 1]
      j += 1
    length = low - reach
    if length >= size and (
      best_start < 0 or length < best_length or (length == best_length and reach < best_start)
    ):
      best_start, best_length = reach, length
    if high > reach:
      reach = high
  length = _INT64_MAX - reach
  if length >= size and (
    best_start < 0 or length < best_length or (length == best_length and reach < best_start)
  ):
    best_start = reach
  return best_start


@numba.njit(cache=True)
def _tile(x, last, levels):
  """The level of the largest aligned run of blocks that starts at block x and ends by
  `last`."""
  j = 0
  while j + 1 < levels and (x & ((2 << j) - 1)) == 0 and x + (2 << j) <= last:
    j += 1
  return j


@numba.njit(cache=True)
def _live_fit(
  ptr,
  size_,
  pool,
  span,
  hits,
  lists,
  rows4,
  rows2,
  meta,
  h_start,
  h_end,
  h_offset,
  h_size,
  h_alive,
  count,
  alignment,
  work,
  start,
  end,
  size,
):
  """`best_fit` over `[start, end)` through the live lists; LIVE_FALLBACK when they cannot
  answer (a request of no bytes, whose ties need handle order; an empty interval or one before
  op 0; rows full: the caller collects and sorts)."""
  blocks = meta[META_BLOCKS]
  b = start >> LIVE_SHIFT
  if size <= 0 or start < 0 or end <= start or b >= blocks:
    return LIVE_FALLBACK
  if not _edge_refresh(
    ptr,
    size_,
    pool,
    span,
    hits,
    lists,
    rows4,
    rows2,
    meta,
    h_start,
    h_end,
    h_offset,
    h_size,
    h_alive,
    count,
    alignment,
    work,
    b,
  ):
    return LIVE_FALLBACK
  last = min((end - 1) >> LIVE_SHIFT, blocks - 1)
  # The blocks between, tiled by aligned runs (the largest that fits at each step): their
  # unions brought up to date first (that uses `hits` and `work`).
  levels = meta[META_LEVELS]
  x = b + 1
  while x < last:
    j = _tile(x, last, levels)
    if not _level_refresh(
      lists,
      rows4,
      rows2,
      meta,
      h_start,
      h_alive,
      h_offset,
      h_size,
      count,
      alignment,
      hits,
      work,
      j,
      x >> j,
    ):
      return LIVE_FALLBACK
    x += 1 << j
  # The few read whole: edge rows still live at `start`, chunks started in b and live at
  # `start`, chunks started in the last block before `end`.
  k = 0
  first = lists[blocks + b, LIST_PTR]
  for row in range(first, first + lists[blocks + b, LIST_LEN]):
    if rows4[row, 2] > start:
      hits[1, k], hits[2, k] = rows4[row, 0], rows4[row, 1]
      k += 1
  first = lists[b, LIST_PTR]
  for row in range(first, first + lists[b, LIST_LEN]):
    if rows4[row, 0] < end and rows4[row, 1] > start:
      hits[1, k], hits[2, k] = rows4[row, 2], rows4[row, 3]
      k += 1
  if last > b:
    first = lists[last, LIST_PTR]
    for row in range(first, first + lists[last, LIST_LEN]):
      if rows4[row, 0] < end:
        hits[1, k], hits[2, k] = rows4[row, 2], rows4[row, 3]
        k += 1
  order = _offset_order(hits, k, 1)
  current = 0
  n = 0
  for j in range(k):
    i = order[j]
    n = _union_push(work[current], 0, n, hits[1, i], hits[2, i])
  # The tiles' unions merged shortest first, so that the long ones are read once.
  tiles = np.empty(2 * levels + 2, np.int64)
  lengths = np.empty(2 * levels + 2, np.int64)
  t = 0
  x = b + 1
  while x < last:
    j = _tile(x, last, levels)
    tiles[t] = _level_list(blocks, j, x >> j)
    lengths[t] = lists[tiles[t], LIST_LEN]
    t += 1
    x += 1 << j
  for i in np.argsort(lengths[:t]):
    lid = tiles[i]
    n = _union_merge(
      rows2, lists[lid, LIST_PTR], lists[lid, LIST_LEN], work[current], n, work[1 - current]
    )
    current = 1 - current
  union = 2 * blocks + b
  return _merge_fit(rows2, lists[union, LIST_PTR], lists[union, LIST_LEN], work[current], n, size)


@numba.njit(cache=True)
def fits_at(starts, ends, offsets, sizes, alive, count, start, end, size, offset, alignment):
  """`ChunkHeap.fits_at` for an aligned, non-negative offset: inside one free range of
  `[start, end)` that holds `size` bytes."""
  used_start, used_end = _live_sorted(
    starts, ends, offsets, sizes, alive, count, start, end, alignment
  )
  reach = 0
  for j in range(len(used_start) + 1):
    free_start = reach
    free_end = used_start[j] if j < len(used_start) else _INT64_MAX
    if free_end - free_start >= size and free_start <= offset and offset + size <= free_end:
      return True
    if j < len(used_start) and used_end[j] > reach:
      reach = used_end[j]
  return False


@numba.njit(cache=True)
def best_fit(starts, ends, offsets, sizes, alive, count, start, end, size, alignment):
  """`ChunkHeap.find_chunk` without a preferred offset: the start of the smallest free range of
  `[start, end)` that holds `size` bytes, the lowest on a tie (the top range is unbounded)."""
  used_start, used_end = _live_sorted(
    starts, ends, offsets, sizes, alive, count, start, end, alignment
  )
  return _smallest_fit(used_start, used_end, size)


@numba.njit(cache=True)
def resource_queue(budget, starts, demands):
  """`AsynchronousCopyResource._derive`'s queue `[T]` of the ordered copies: (owed `[C]`
  cumulative demand, arriving per op, work waiting after each op (Lindley's W), cumulative
  arrivals), as numpy's cumsum / bincount / minimum.accumulate compute them."""
  t, c = len(budget), len(starts)
  owed = np.empty(c, np.float64)
  total = 0.0
  for i in range(c):
    total += demands[i]
    owed[i] = total
  arriving = np.zeros(t, np.float64)
  top = max(t - 1, 0)
  for i in range(c):
    op = min(max(starts[i] + 1, 0), top)
    if op < t:
      arriving[op] += demands[i]
  waiting = np.empty(t, np.float64)
  arrived = np.empty(t, np.float64)
  balance, lowest, cumulative = 0.0, np.inf, 0.0
  for i in range(t):
    balance += arriving[i] - budget[i]
    if balance < lowest:
      lowest = balance
    waiting[i] = balance - min(0.0, lowest)
    cumulative += arriving[i]
    arrived[i] = cumulative
  return owed, arriving, waiting, arrived


@numba.njit(cache=True)
def resource_fits(
  budget,
  starts,
  ends,
  demands,
  arriving,
  arrived,
  waiting,
  owed,
  start,
  end,
  resource,
  relative_tolerance,
  total,
):
  """`AsynchronousCopyResource.has_enough_resource` for a copy that needs resource: the queue
  from its first op on with it arriving there (Lindley's recursion from the work waiting
  before); it must be served by its end, and every copy queued behind it (a later start) that
  needs resource by its own. `total`: the budgets' and demands' sum, for the tolerance."""
  t = len(budget)
  first = max(start + 1, 0)
  deadline = min(end - 1, t - 1)
  if deadline < first:
    return False
  behind = np.searchsorted(starts, start, side="right")
  waiting_before = waiting[first - 1] if first > 0 else 0.0
  tolerance = relative_tolerance * (total + resource)
  # The queue is needed up to the last deadline checked (all of it if one lies before `first`,
  # which numpy's negative indexing would read from the end).
  last = deadline
  for j in range(behind, len(demands)):
    if demands[j] > 0:
      d = min(ends[j] - 1, t - 1)
      last = t - 1 if d < first else max(last, d)
  served = np.empty(t - first, np.float64)
  balance = 0.0
  lowest = -waiting_before
  for i in range(first, last + 1):
    balance += arriving[i] - budget[i]
    shifted = balance + resource
    if shifted < lowest:
      lowest = shifted
    served[i - first] = arrived[i] + resource - (shifted - lowest)
  owed_before = owed[behind - 1] if behind else 0.0
  if served[deadline - first] < owed_before + resource - tolerance:
    return False
  for j in range(behind, len(demands)):
    if demands[j] > 0:
      d = min(ends[j] - 1, t - 1) - first
      if d < 0:
        d += len(served)  # numpy's negative indexing, as the array expression reads.
      if not served[d] >= owed[j] + resource - tolerance:
        return False
  return True


# ------------------------------------------------------------------ the copy resource's trees
# Two segment trees with range add and range minimum (`_tree_*`; the maximum of a value is the
# minimum of its negation), as arrays `values [2n]` and `adds [2n]` over `n` leaves (a power of
# two; leaf i at node n + i). Each node's value is the minimum of its children's plus its own
# pending add; a query pushes the adds on its two boundary paths down first.


@numba.njit(cache=True)
def _tree_apply(values, adds, n, node, amount):
  values[node] += amount
  if node < n:
    adds[node] += amount


@numba.njit(cache=True)
def _tree_rebuild(values, adds, node):
  """Recomputes the ancestors of `node` from their children."""
  while node > 1:
    node >>= 1
    values[node] = min(values[2 * node], values[2 * node + 1]) + adds[node]


@numba.njit(cache=True)
def _tree_push(values, adds, n, node):
  """Pushes the pending adds of the ancestors of `node` down, from the root."""
  height = 0
  while (1 << height) < n:
    height += 1
  for level in range(height, 0, -1):
    i = node >> level
    if adds[i] != 0.0:
      _tree_apply(values, adds, n, 2 * i, adds[i])
      _tree_apply(values, adds, n, 2 * i + 1, adds[i])
      adds[i] = 0.0


@numba.njit(cache=True)
def tree_add(values, adds, n, first, last, amount):
  """Adds `amount` to leaves `first` .. `last` (inclusive; nothing when empty)."""
  if first > last:
    return
  lo, hi = first + n, last + n + 1
  lo0, hi0 = lo, hi
  while lo < hi:
    if lo & 1:
      _tree_apply(values, adds, n, lo, amount)
      lo += 1
    if hi & 1:
      hi -= 1
      _tree_apply(values, adds, n, hi, amount)
    lo >>= 1
    hi >>= 1
  _tree_rebuild(values, adds, lo0)
  _tree_rebuild(values, adds, hi0 - 1)


@numba.njit(cache=True)
def tree_min(values, adds, n, first, last):
  """The minimum of leaves `first` .. `last` (inclusive; +inf when empty)."""
  if first > last:
    return np.inf
  lo, hi = first + n, last + n + 1
  _tree_push(values, adds, n, lo)
  _tree_push(values, adds, n, hi - 1)
  best = np.inf
  while lo < hi:
    if lo & 1:
      best = min(best, values[lo])
      lo += 1
    if hi & 1:
      hi -= 1
      best = min(best, values[hi])
    lo >>= 1
    hi >>= 1
  return best


@numba.njit(cache=True)
def tree_set(values, adds, n, leaf, value):
  """Sets leaf `leaf` to `value`."""
  node = leaf + n
  _tree_push(values, adds, n, node)
  values[node] = value
  _tree_rebuild(values, adds, node)


@numba.njit(cache=True)
def fenwick_add(tree, key, amount):
  """Adds `amount` at `key` of a Fenwick tree over keys 0 .. len(tree) - 2."""
  i = key + 1
  while i < len(tree):
    tree[i] += amount
    i += i & -i


@numba.njit(cache=True)
def fenwick_sum(tree, key):
  """The sum over keys 0 .. `key` (0.0 when `key` < 0)."""
  total = 0.0
  i = min(key + 1, len(tree) - 1)
  while i > 0:
    total += tree[i]
    i -= i & -i
  return total


@numba.njit(cache=True)
def resource_track(
  backlog, backlog_adds, n_ops, queue, queue_adds, n_keys, owed, budget_sum, start, end, demand
):
  """Records (`demand` > 0) or takes back (< 0) a copy's demand in
  `AsynchronousCopyResource`'s trees: it arrives at op start + 1 (clamped to the ops), so the
  backlog of every op from there on grows by it, and every copy behind it in the FIFO order
  (key > start + 1) owes it too. The copy's own key in `queue` is the caller's to set."""
  t = len(budget_sum)
  op = min(max(start + 1, 0), t - 1)
  tree_add(backlog, backlog_adds, n_ops, op, t - 1, demand)
  fenwick_add(owed, start + 1, demand)
  # `queue` holds minus (owed - budget by the deadline): owing more lowers it.
  tree_add(queue, queue_adds, n_keys, start + 2, len(owed) - 2, -demand)


@numba.njit(cache=True)
def resource_add(
  budget_sum, backlog, backlog_adds, n_ops, queue, queue_adds, n_keys, owed, start, end, demand
):
  """`resource_track` for a copy added with `demand` > 0, and its own key in `queue`: what it
  owes by its deadline (every copy up to it, itself included) less the budget served by then,
  negated (`queue` keeps per key the largest over its copies)."""
  resource_track(
    backlog, backlog_adds, n_ops, queue, queue_adds, n_keys, owed, budget_sum, start, end, demand
  )
  key = start + 1
  deadline = min(end - 1, len(budget_sum) - 1)
  behind = budget_sum[deadline] - fenwick_sum(owed, key)
  tree_set(
    queue, queue_adds, n_keys, key, min(tree_min(queue, queue_adds, n_keys, key, key), behind)
  )


@numba.njit(cache=True)
def resource_fits_tree(
  budget_sum,
  backlog,
  backlog_adds,
  n_ops,
  queue,
  queue_adds,
  n_keys,
  owed,
  start,
  end,
  resource,
  relative_tolerance,
  total,
):
  """`AsynchronousCopyResource.has_enough_resource` for a copy that needs resource, in
  O(log ops) from the trees (copy_resource.py derives the conditions). With B the budget
  served by op i (`budget_sum`) and S(i) the arrivals minus B up to i (`backlog`), the work
  served by op i once the copy arrives at op f = start + 1 is B(i) + min(0, min S[.. f - 1],
  min S[f .. i] + resource). It must cover what the copies up to it owe by its deadline, and
  what each copy behind it owes by its own: owed_j + resource - B(d_j) <= min(0, min S[..
  f - 1]) (the largest such, `queue`), as min S[f .. d_j] + resource already covers it (that
  copy fit when it was added, and nothing added since served less)."""
  t = len(budget_sum)
  first = max(start + 1, 0)
  deadline = min(end - 1, t - 1)
  if deadline < first:
    return False
  tolerance = relative_tolerance * (total + resource)
  idle = min(0.0, tree_min(backlog, backlog_adds, n_ops, 0, first - 1))
  served = budget_sum[deadline] + min(
    idle, tree_min(backlog, backlog_adds, n_ops, first, deadline) + resource
  )
  if served < fenwick_sum(owed, start + 1) + resource - tolerance:
    return False
  most_owed = -tree_min(queue, queue_adds, n_keys, max(start + 2, 0), len(owed) - 2)
  return not most_owed + resource - tolerance > idle


@numba.njit(cache=True)
def prefetch_window(
  prefix,
  copy_elapsed,
  start,
  end,
  use_elapsed_reduction,
  min_ratio,
  preferred_ratio,
  max_elapsed,
  monotone,
):
  """`CostAnalysisPrefetchIntervalPicker.window` without a preferred time, for start >= -1:
  (earliest, latest, preferred); elapsed(s, end) = prefix[end] - prefix[s + 1]. `monotone`:
  no op has a negative elapsed time, so elapsed(s, end) never grows with s and each search
  bisects (the same answers as the scans, which run otherwise)."""
  if not monotone:
    return _prefetch_window_scan(
      prefix,
      copy_elapsed,
      start,
      end,
      use_elapsed_reduction,
      min_ratio,
      preferred_ratio,
      max_elapsed,
    )
  # LatestPrefetchStartTime: the latest s in [start, end) whose overlap (plus the use's saving)
  # covers min_ratio x the copy (true up to some s, then false).
  min_interval = min_ratio * copy_elapsed
  latest = min(start, end) - 1
  lo, hi = max(start, -1), end - 1
  if lo <= hi and not min_interval > (prefix[end] - prefix[lo + 1]) + use_elapsed_reduction:
    while lo < hi:
      mid = (lo + hi + 1) // 2
      if not min_interval > (prefix[end] - prefix[mid + 1]) + use_elapsed_reduction:
        lo = mid
      else:
        hi = mid - 1
    latest = lo
  # The earliest s in [start, latest) whose overlap is within max_elapsed (false, then true).
  earliest = start
  if earliest < latest:
    earliest = latest
    lo, hi = start, latest  # hi: none is.
    while lo < hi:
      mid = (lo + hi) // 2
      if not max_elapsed < prefix[end] - prefix[mid + 1]:
        hi = mid
      else:
        lo = mid + 1
    earliest = lo
  if earliest > latest:
    return earliest, latest, earliest
  if latest <= earliest:
    return earliest, latest, earliest
  # PreferredPrefetchStartTime: closest to preferred_ratio x the copy, the earliest on a tie.
  # The distance never grows up to the last s whose elapsed reaches the target (`below` - 1),
  # and never shrinks from `below` on: the earliest of the left side's ties, or `below`.
  preferred_interval = preferred_ratio * copy_elapsed
  lo, hi = earliest, latest + 1
  while lo < hi:
    mid = (lo + hi) // 2
    if prefix[end] - prefix[mid + 1] < preferred_interval:
      hi = mid
    else:
      lo = mid + 1
  below = lo
  if below == earliest:
    return earliest, latest, earliest
  left = abs(preferred_interval - (prefix[end] - prefix[below]))  # At s = below - 1.
  lo, hi = earliest, below - 1
  while lo < hi:
    mid = (lo + hi) // 2
    if abs(preferred_interval - (prefix[end] - prefix[mid + 1])) <= left:
      hi = mid
    else:
      lo = mid + 1
  preferred = lo
  if below <= latest and abs(preferred_interval - (prefix[end] - prefix[below + 1])) < left:
    preferred = below
  return earliest, latest, preferred


@numba.njit(cache=True)
def _prefetch_window_scan(
  prefix, copy_elapsed, start, end, use_elapsed_reduction, min_ratio, preferred_ratio, max_elapsed
):
  """`prefetch_window` by scanning the ops, for any elapsed times."""
  # LatestPrefetchStartTime: the latest s in [start, end) whose overlap (plus the use's saving)
  # covers min_ratio x the copy.
  min_interval = min_ratio * copy_elapsed
  latest = min(start, end) - 1
  for s in range(end - 1, max(start, -1) - 1, -1):
    if not min_interval > (prefix[end] - prefix[s + 1]) + use_elapsed_reduction:
      latest = s
      break
  earliest = start
  if earliest < latest:
    earliest = latest
    for s in range(start, latest):
      if not max_elapsed < prefix[end] - prefix[s + 1]:
        earliest = s
        break
  if earliest > latest:
    return earliest, latest, earliest
  if latest <= earliest:
    return earliest, latest, earliest
  # PreferredPrefetchStartTime: closest to preferred_ratio x the copy, the earliest on a tie.
  preferred_interval = preferred_ratio * copy_elapsed
  preferred, best = earliest, np.inf
  for s in range(earliest, latest + 1):
    distance = abs(preferred_interval - (prefix[end] - prefix[s + 1]))
    if distance < best:
      preferred, best = s, distance
  return earliest, latest, preferred


# What `_next_start` returns once a window's starts are used up.
NO_START = -(1 << 62)


@numba.njit(cache=True)
def _first_start(earliest, latest, preferred, state):
  """Sets `state` [3] (next later start, next earlier start, whether the later side is next) to
  a window's first: XLA's `Begin` calls `Next` once, taking the preferred start from the later
  side, and the earlier side yields it again."""
  state[0], state[1] = preferred + 1, preferred
  state[2] = 0 if preferred >= earliest else 1
  if earliest > latest:
    state[0], state[1] = latest + 1, earliest - 1


@numba.njit(cache=True)
def _next_start(prefix, earliest, latest, end, num_explored, state):
  """The next start `PrefetchIntervalIterator` yields (XLA's `Next`), or `NO_START` once it is
  `Done`: alternately one later and one earlier than the preferred start; once the later side is
  used up, the earlier side thinned to steps of at least 1/`num_explored` of the window's
  elapsed time. elapsed(s, end) = prefix[end] - prefix[s + 1] (every s < end); `prefix` is read
  only while earlier starts remain."""
  increasing, decreasing = state[0], state[1]
  if increasing > latest and decreasing < earliest:
    return NO_START
  if state[2]:
    time = increasing
    state[0] = increasing + 1
    if decreasing >= earliest:
      state[2] = 0
    return time
  time = decreasing
  decreasing -= 1
  if decreasing >= earliest:
    target = 0.0
    if increasing > latest:
      target = (prefix[end] - prefix[time + 1]) + (
        prefix[end] - prefix[earliest + 1]
      ) / num_explored
    while decreasing >= earliest and prefix[end] - prefix[decreasing + 1] < target:
      decreasing -= 1
  state[1] = decreasing
  if increasing <= latest:
    state[2] = 1
  return time


@numba.njit(cache=True)
def prefetch_starts(prefix, earliest, latest, preferred, end, num_explored):
  """Every start `PrefetchIntervalIterator` yields for a window (none when empty), in its order
  (XLA's `Next` until `Done`, `_next_start`)."""
  if earliest > latest:
    return np.zeros(0, np.int64)
  out = np.empty(latest - earliest + 1, np.int64)
  state = np.empty(3, np.int64)
  _first_start(earliest, latest, preferred, state)
  k = 0
  while True:
    time = _next_start(prefix, earliest, latest, end, num_explored, state)
    if time == NO_START:
      return out[:k]
    out[k] = time
    k += 1


@numba.njit(cache=True)
def _extension(uses, end_use, count_picker, prefix, max_elapsed, max_count):
  """`find_best_chunk_candidate`'s candidate uses: (first, last), the first use at or after
  `end_use` and the last one reachable from it through consecutive uses kept without a copy
  (the picker's `can_allocate_in_alternate_memory_no_copy`)."""
  n = len(uses)
  first = np.searchsorted(uses, end_use, side="left")
  if first == n:
    raise ValueError("no use at or after the request's end")
  last = first
  while last + 1 < n:
    u, v = uses[last], uses[last + 1]
    if count_picker:
      keep = v - u <= max_count
    else:
      keep = max_elapsed > (0.0 if u == v else prefix[v] - prefix[u + 1])
    if not keep:
      break
    last += 1
  return first, last


@numba.njit(cache=True)
def best_chunk_candidate(
  start,
  end_use,
  size,
  uses,
  max_size,
  h_start,
  h_end,
  h_offset,
  h_size,
  h_alive,
  h_count,
  alignment,
  count_picker,
  prefix,
  max_elapsed,
  max_count,
):
  """`chunks.find_best_chunk_candidate` without a preferred offset: (found, offset, end use).
  `h_start` .. `alignment`: `ChunkHeap.kernel_state()`; `count_picker` .. `max_count`: the
  picker's `kernel_state()`, for `can_allocate_in_alternate_memory_no_copy` between
  consecutive uses. Scans every chunk per probe (`best_chunk_candidate_indexed` is the one
  msa's loop runs)."""
  first, last = _extension(uses, end_use, count_picker, prefix, max_elapsed, max_count)
  found, best_offset, best_use = False, 0, 0
  # std::lower_bound over uses[first : last + 1] with "the chunk fits" as the predicate.
  lo, count = first, last + 1 - first
  while count > 0:
    step = count // 2
    mid = lo + step
    use = uses[mid]
    offset = best_fit(
      h_start, h_end, h_offset, h_size, h_alive, h_count, start, use + 1, size, alignment
    )
    if offset + size <= max_size:
      if not found or use > best_use:
        found, best_offset, best_use = True, offset, use
      lo = mid + 1
      count -= step + 1
    else:
      count = step
  return found, best_offset, best_use


@numba.njit(cache=True)
def best_chunk_candidate_indexed(
  start,
  end_use,
  size,
  uses,
  max_size,
  h_ptr,
  h_size,
  h_pool,
  h_span,
  h_hits,
  h_sorted,
  h_lists,
  h_rows4,
  h_rows2,
  h_meta,
  h_starts,
  h_ends,
  h_offsets,
  h_sizes,
  h_alive,
  h_count,
  h_alignment,
  h_work,
  count_picker,
  prefix,
  max_elapsed,
  max_count,
):
  """`best_chunk_candidate` through the heap's time index and live lists (`h_ptr` ..
  `h_work`: `ChunkHeap.search_state()`): each probe of the binary search asks the live lists
  (`_live_fit`); where they cannot answer, the chunks live from `start` to the last candidate
  use are collected and sorted by offset once, and each probe reads those that start before
  its end (the chunks live in its interval, as every one ends after `start`)."""
  first, last = _extension(uses, end_use, count_picker, prefix, max_elapsed, max_count)
  k = -1  # Chunks collected: not yet.
  found, best_offset, best_use = False, 0, 0
  # std::lower_bound over uses[first : last + 1] with "the chunk fits" as the predicate.
  lo, count = first, last + 1 - first
  while count > 0:
    step = count // 2
    mid = lo + step
    use = uses[mid]
    offset = LIVE_FALLBACK
    if k < 0:
      offset = _live_fit(
        h_ptr,
        h_size,
        h_pool,
        h_span,
        h_hits,
        h_lists,
        h_rows4,
        h_rows2,
        h_meta,
        h_starts,
        h_ends,
        h_offsets,
        h_sizes,
        h_alive,
        h_count,
        h_alignment,
        h_work,
        start,
        use + 1,
        size,
      )
    if offset == LIVE_FALLBACK:
      if k < 0:
        k = _collect(h_ptr, h_size, h_pool, h_span, start, uses[last] + 1, h_hits)
        _by_offset(h_hits, k, size, h_sorted)
      offset = _fit_in(h_sorted, k, use + 1, size)
    if offset + size <= max_size:
      if not found or use > best_use:
        found, best_offset, best_use = True, offset, use
      lo = mid + 1
      count -= step + 1
    else:
      count = step
  return found, best_offset, best_use


@numba.njit(cache=True)
def plan_prefetch_starts(
  earliest,
  latest,
  preferred,
  num_explored,
  check_allowed,
  allowed,
  use,
  size,
  uses,
  max_size,
  max_starts,
  resource,
  check_resource,
  served,
  backlog,
  backlog_adds,
  n_ops,
  queue,
  queue_adds,
  n_keys,
  owed,
  rel_tol,
  total,
  h_ptr,
  h_size,
  h_pool,
  h_span,
  h_hits,
  h_sorted,
  h_lists,
  h_rows4,
  h_rows2,
  h_meta,
  h_starts,
  h_ends,
  h_offsets,
  h_sizes,
  h_alive,
  h_count,
  h_alignment,
  h_work,
  count_picker,
  prefix,
  max_elapsed,
  max_count,
):
  """`SegmentAllocator._plan_level_prefetches`' loop (allocate_segment.py; XLA's
  `PrefetchWithResourceConstraints` and `CheckPrefetchFit`): over the picker's starts for the
  window (`earliest`, `latest`, `preferred`, `num_explored`: `prefetch_starts`' order, each made
  only when the loop gets to it), skipping those not `allowed` (by position; when
  `check_allowed`: the FIFO order and outstanding-limit checks, made by the caller), the copy
  resource (`served` .. `total`:
  `AsynchronousCopyResource.kernel_state()`, when `check_resource`), then the chunk (`h_ptr`
  .. `max_count`: as `best_chunk_candidate_indexed`); the first `max_starts` that pass, as rows
  (start, offset, end use). A chunk failure caches the start and any start not after it ends
  the search (XLA's `exclusive_out_of_mem_start`)."""
  out = np.empty((max_starts, 3), np.int64)
  k = 0
  out_of_memory, out_of_memory_start = False, 0
  state = np.empty(3, np.int64)
  _first_start(earliest, latest, preferred, state)
  i = -1
  while True:
    start = _next_start(prefix, earliest, latest, use, num_explored, state)
    if start == NO_START:
      break
    i += 1
    if out_of_memory and start <= out_of_memory_start:
      break  # An earlier start holds the chunk longer: it cannot fit either.
    if check_allowed and not allowed[i]:
      continue
    if (
      check_resource
      and resource != 0
      and not resource_fits_tree(
        served,
        backlog,
        backlog_adds,
        n_ops,
        queue,
        queue_adds,
        n_keys,
        owed,
        start,
        use,
        resource,
        rel_tol,
        total,
      )
    ):
      continue
    found, offset, end_use = best_chunk_candidate_indexed(
      start + 1,
      use,
      size,
      uses,
      max_size,
      h_ptr,
      h_size,
      h_pool,
      h_span,
      h_hits,
      h_sorted,
      h_lists,
      h_rows4,
      h_rows2,
      h_meta,
      h_starts,
      h_ends,
      h_offsets,
      h_sizes,
      h_alive,
      h_count,
      h_alignment,
      h_work,
      count_picker,
      prefix,
      max_elapsed,
      max_count,
    )
    if not found:
      out_of_memory_start = max(out_of_memory_start, start) if out_of_memory else start
      out_of_memory = True
      continue
    out[k, 0], out[k, 1], out[k, 2] = start, offset, end_use
    k += 1
    if k == max_starts:
      break
  return out[:k]
