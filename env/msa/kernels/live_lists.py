"""The chunk heap's live lists (env/msa/chunks.py's `ChunkHeap`): unions of the address ranges
of the chunks live over blocks of ops, kept beside the time index, and the best-fit searches
that read them.

A search of `[start, end)` meets every chunk live there, a few thousand on programs of 100,000
buffers, each collected from the time index and radix-sorted anew; reading them was its cost.
Best fit reads only the union of their address ranges (the free ranges between its parts: for a
request of at least one byte, ranges that touch leave no room between them), so these lists keep
unions, sorted, up to date from the chunks committed since (handles grow):
* per block of 2^LIVE_SHIFT ops (its edge `e` = its first op), the chunks that started before
  `e` and are live across the whole block, as a union (`EDGE_UNION`), and those that started
  before `e` and end inside it (`EDGE_ROWS`: offset, used end, end), with the ones live across
  the block found since the union was built, until `EDGE_PENDING` of them wait;
* per block, the chunks that start in it (`STARTS`: start, end, offset, used end), filed as they
  are committed;
* per aligned run of 2^j blocks (level j), the union of the chunks that start in it
  (`LEVEL_UNION`).
A search starting in block b then reads b's edge union, the edge rows still live, the chunks
that started in b (and in the block holding its end) and the level unions that tile the blocks
between: a few hundred intervals where it met thousands of chunks.

The lists travel as a `LiveLists`' fields: `lists` `[L, 4]`, per list its first row, length,
room, and (unions) the chunk count it has seen (-1: to build); `rows4` `[R, 4]` holds the starts
and edge rows, `rows2` `[R, 2]` the unions (low, high); `meta`: rows in use in each, the room a
list did not find in each (`ChunkHeap` compacts them when it is not 0), blocks, levels. A search
takes the whole heap (`ChunkHeap.search_state()`: the index's, the lists', the chunks' and the
scratch's tuples, named together as a `HeapSearch`), whose `work` `[3, C, 2]` holds the unions
being merged.
"""

from __future__ import annotations

import numpy as np

from malloczero.env.kernel_cache import njit
from malloczero.env.msa.chunks import Chunks, HeapSearch, LiveLists, TimeIndex
from malloczero.env.msa.interval_picker import NoCopyBound, WhileNest
from malloczero.env.msa.kernels.chunk_index import (
  by_offset,
  collect,
  fit_in,
  fit_in_reach,
  index_add,
)
from malloczero.env.msa.kernels.shared import INT64_MAX, align_up, nested_elapsed, offset_order

# Blocks of 2^LIVE_SHIFT ops: 256 searched msa's programs of 100,000 buffers in 12% less time
# than 128 (a search reads one block's starts whole, and fewer level unions between), and the
# 200,000-row CSV in 20% less; 512 as 128.
LIVE_SHIFT = 8
LIST_PTR, LIST_LEN, LIST_ROOM, LIST_SEEN = 0, 1, 2, 3
META_USED4, META_USED2, META_FULL4, META_FULL2, META_BLOCKS, META_LEVELS = 0, 1, 2, 3, 4, 5
LIVE_FALLBACK = -2
# Chunks live across a whole block that its edge rows keep before they join its edge union
# (`_edge_refresh`).
EDGE_PENDING = 32
# A level union takes the chunks committed since it was last brought up to date by passing them
# all, unless there are more than LEVEL_SCAN per block of its run and LEVEL_SCAN_PER_ROW times
# the chunks that start in the run: then it is built again from those (`_level_refresh`).
LEVEL_SCAN = 64
LEVEL_SCAN_PER_ROW = 4


@njit
def heap_search(index, lists, chunks, scratch):
  """`ChunkHeap.search_state()`'s four tuples named (a `HeapSearch`)."""
  hits, sorted_hits, work = scratch
  return HeapSearch(TimeIndex(*index), LiveLists(*lists), Chunks(*chunks), hits, sorted_hits, work)


@njit
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


@njit
def _level_list(blocks, j, m):
  first = 3 * blocks
  for i in range(j):
    first += ((blocks - 1) >> i) + 1
  return first + m


@njit
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


@njit
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


@njit
def _live_add(live, start, end, offset, used_end):
  """Files a committed chunk in its block's starts; False (nothing filed) when `rows4` is
  full. A chunk that starts before op 0 is only ever read through edges."""
  if start < 0:
    return True
  lists, rows4 = live.lists, live.rows4
  lid = start >> LIVE_SHIFT
  n = lists[lid, LIST_LEN]
  if not _reserve(lists, rows4, live.meta, META_USED4, META_FULL4, lid, n + 1):
    return False
  row = lists[lid, LIST_PTR] + n
  rows4[row, 0], rows4[row, 1], rows4[row, 2], rows4[row, 3] = start, end, offset, used_end
  lists[lid, LIST_LEN] = n + 1
  return True


@njit
def live_add(live, start, end, offset, used_end):
  """`_live_add` on the lists (`LiveLists`' fields)."""
  return _live_add(LiveLists(*live), start, end, offset, used_end)


@njit
def heap_add(index, live, start, end, offset, used_end, handle):
  """`index_add` then `live_add` (`TimeIndex`' and `LiveLists`' fields), one call per committed
  chunk: 0 when both filed it, 1 when the pool was full (nothing filed), 2 when `rows4` was
  (filed in the index only)."""
  if not index_add(TimeIndex(*index), start, end, offset, used_end, handle):
    return 1
  if not _live_add(LiveLists(*live), start, end, offset, used_end):
    return 2
  return 0


@njit
def live_add_all(live, chunks, first):
  """`live_add` for every live chunk from handle `first` on (`chunks`: `Chunks`' fields): the
  handle it stopped at, `rows4` being full (`count` when all are filed)."""
  live, chunks = LiveLists(*live), Chunks(*chunks)
  starts, ends, offsets, sizes = chunks.rects[0], chunks.rects[1], chunks.rects[2], chunks.rects[3]
  for i in range(first, chunks.count):
    if chunks.alive[i]:
      used_end = align_up(offsets[i] + sizes[i], chunks.alignment)
      if not _live_add(live, starts[i], ends[i], offsets[i], used_end):
        return i
  return chunks.count


@njit
def live_remove(live, start, end, offset, used_end, handle):
  """Takes a removed chunk out of its block's starts (a row equal to its own: equal rows read
  alike), and sends the unions that have seen it to be built again."""
  live = LiveLists(*live)
  lists, rows4, meta = live.lists, live.rows4, live.meta
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


@njit
def _union_push(out, base, n, reach, low, high):
  """Appends `[low, high)` (low not below any before it) to the union in `out[base:base + n]`,
  whose last range ends at `reach` (the caller keeps it: read back from `out`, each push waited
  for the one before it to be stored); (its new length, its new reach)."""
  if n > 0 and low <= reach:
    if high > reach:
      reach = high
      out[base + n - 1, 1] = reach
    return n, reach
  out[base + n, 0], out[base + n, 1] = low, high
  return n + 1, high


@njit
def _union_merge(a, a_first, a_len, b, b_len, out):
  """The union of `a[a_first:a_first + a_len]` and `b[:b_len]` (each sorted by low) in
  `out`; its length. Ties take `a` first. For each range of `b`, the ranges of `a` before it,
  as one run: the loop's branch goes the same way through a run."""
  i, n, reach = 0, 0, -1
  for j in range(b_len):
    low = b[j, 0]
    while i < a_len and a[a_first + i, 0] <= low:
      n, reach = _union_push(out, 0, n, reach, a[a_first + i, 0], a[a_first + i, 1])
      i += 1
    n, reach = _union_push(out, 0, n, reach, low, b[j, 1])
  while i < a_len:
    n, reach = _union_push(out, 0, n, reach, a[a_first + i, 0], a[a_first + i, 1])
    i += 1
  return n


@njit
def _union_store(live, lid, source, n):
  """List `lid` set to the union `source[:n]`; False when `rows2` is full."""
  lists, rows2 = live.lists, live.rows2
  lists[lid, LIST_LEN] = 0
  if not _reserve(lists, rows2, live.meta, META_USED2, META_FULL2, lid, n):
    lists[lid, LIST_SEEN] = -1
    return False
  first = lists[lid, LIST_PTR]
  for j in range(n):
    rows2[first + j, 0], rows2[first + j, 1] = source[j, 0], source[j, 1]
  lists[lid, LIST_LEN] = n
  return True


@njit
def _union_update(live, lid, hits, k, work, count):
  """Union list `lid` with the first `k` hits' ranges (offset, used end: rows 1, 2) added,
  seen up to chunk `count`; False when `rows2` is full (the list is built again)."""
  order = offset_order(hits, k, 1)
  n, reach = 0, -1
  for j in range(k):
    i = order[j]
    n, reach = _union_push(work[1], 0, n, reach, hits[1, i], hits[2, i])
  return _union_add(live, lid, work, n, count)


@njit
def _union_add(live, lid, work, n, count):
  """Union list `lid` with the union `work[1][:n]` added, seen up to chunk `count`; False when
  `rows2` is full (the list is built again)."""
  lists = live.lists
  source = work[1]
  if lists[lid, LIST_SEEN] >= 0:
    n = _union_merge(live.rows2, lists[lid, LIST_PTR], lists[lid, LIST_LEN], work[1], n, work[2])
    source = work[2]
  if not _union_store(live, lid, source, n):
    return False
  lists[lid, LIST_SEEN] = count
  return True


@njit
def _edge_rows_insert(lists, rows4, edge_rows, hits, order, k, whole, ending_only):
  """Merges the first `k` hits (by `order`: offset-sorted) into block's edge rows (offset, used
  end, end; sorted by offset), from the back, in place (room made by the caller); with
  `ending_only`, only those that end before `whole`."""
  length = lists[edge_rows, LIST_LEN]
  first = lists[edge_rows, LIST_PTR]
  added = 0
  for j in range(k):
    if not ending_only or hits[0, j] < whole:
      added += 1
  i, w = length - 1, length + added - 1
  for j in range(k - 1, -1, -1):
    h = order[j]
    if ending_only and hits[0, h] >= whole:
      continue
    while i >= 0 and rows4[first + i, 0] > hits[1, h]:
      for f in range(4):
        rows4[first + w, f] = rows4[first + i, f]
      i -= 1
      w -= 1
    row = first + w
    rows4[row, 0], rows4[row, 1], rows4[row, 2] = hits[1, h], hits[2, h], hits[0, h]
    w -= 1
  lists[edge_rows, LIST_LEN] = length + added


@njit
def _edge_refresh(heap, b):
  """Brings block `b`'s edge union and edge rows up to date with the heap's chunks; False when
  the rows are full. Chunks found since the union was built join the edge rows, those live
  across the whole block too (a query reads every edge row live at its start, and those always
  are): merging a few chunks into a union of hundreds of ranges at every query was most of a
  query's cost. They join the union when more than `EDGE_PENDING` wait."""
  live, chunks, hits, work = heap.lists, heap.chunks, heap.hits, heap.work
  lists, rows4, meta = live.lists, live.rows4, live.meta
  starts, ends, offsets, sizes = chunks.rects[0], chunks.rects[1], chunks.rects[2], chunks.rects[3]
  alive, alignment, count = chunks.alive, chunks.alignment, chunks.count
  blocks = meta[META_BLOCKS]
  union, edge_rows = 2 * blocks + b, blocks + b
  edge = b << LIVE_SHIFT
  whole = edge + (1 << LIVE_SHIFT)
  seen = lists[union, LIST_SEEN]
  if seen < 0:
    # Built again: those that end inside the block are the edge rows, the others the union.
    k = collect(heap.index, edge, edge, hits)  # start < edge < end
    lists[edge_rows, LIST_LEN] = 0
    for j in range(k):
      hits[0, j] = ends[hits[3, j]]
    order = offset_order(hits, k, 1)
    ending = 0
    for j in range(k):
      if hits[0, j] < whole:
        ending += 1
    if ending > 0:
      if not _reserve(lists, rows4, meta, META_USED4, META_FULL4, edge_rows, ending):
        lists[union, LIST_SEEN], lists[union, LIST_LEN] = -1, 0
        return False
      _edge_rows_insert(lists, rows4, edge_rows, hits, order, k, whole, True)
    n, reach = 0, -1
    for j in range(k):
      h = order[j]
      if hits[0, h] >= whole:
        n, reach = _union_push(work[1], 0, n, reach, hits[1, h], hits[2, h])
    return _union_add(live, union, work, n, count)
  k = 0
  for handle in range(seen, count):
    if alive[handle] and starts[handle] < edge and edge < ends[handle]:
      hits[0, k], hits[1, k] = ends[handle], offsets[handle]
      hits[2, k] = align_up(offsets[handle] + sizes[handle], alignment)
      hits[3, k] = handle
      k += 1
  if k == 0:
    lists[union, LIST_SEEN] = count
    return True
  length = lists[edge_rows, LIST_LEN]
  if not _reserve(lists, rows4, meta, META_USED4, META_FULL4, edge_rows, length + k):
    lists[union, LIST_SEEN], lists[union, LIST_LEN] = -1, 0
    return False
  _edge_rows_insert(lists, rows4, edge_rows, hits, offset_order(hits, k, 1), k, whole, False)
  lists[union, LIST_SEEN] = count
  first, length = lists[edge_rows, LIST_PTR], lists[edge_rows, LIST_LEN]
  waiting = 0
  for row in range(first, first + length):
    if rows4[row, 2] >= whole:
      waiting += 1
  if waiting <= EDGE_PENDING:
    return True
  # Those live across the whole block join the union; the edge rows keep the others, in order.
  n, w, reach = 0, first, -1
  for row in range(first, first + length):
    if rows4[row, 2] >= whole:
      n, reach = _union_push(work[1], 0, n, reach, rows4[row, 0], rows4[row, 1])
    else:
      for f in range(4):
        rows4[w, f] = rows4[row, f]
      w += 1
  lists[edge_rows, LIST_LEN] = w - first
  return _union_add(live, union, work, n, count)


@njit
def _level_refresh(heap, j, m):
  """Brings level j's union of run m (the chunks that start in blocks `m << j` ..) up to date
  with the heap's chunks; False when `rows2` is full."""
  live, chunks, hits = heap.lists, heap.chunks, heap.hits
  lists, rows4 = live.lists, live.rows4
  starts, offsets, sizes = chunks.rects[0], chunks.rects[2], chunks.rects[3]
  alive, alignment, count = chunks.alive, chunks.alignment, chunks.count
  blocks = live.meta[META_BLOCKS]
  lid = _level_list(blocks, j, m)
  seen = lists[lid, LIST_SEEN]
  k = 0
  if seen >= 0 and count - seen > (LEVEL_SCAN << j):
    # Many chunks since: the run's own starts, read whole, cost less than passing them all.
    rows = 0
    for b in range(m << j, min((m + 1) << j, blocks)):
      rows += lists[b, LIST_LEN]
    if count - seen > LEVEL_SCAN_PER_ROW * rows:
      seen = lists[lid, LIST_SEEN] = -1
  if seen < 0:
    for b in range(m << j, min((m + 1) << j, blocks)):
      first = lists[b, LIST_PTR]
      for row in range(first, first + lists[b, LIST_LEN]):
        hits[1, k], hits[2, k] = rows4[row, 2], rows4[row, 3]
        k += 1
  else:
    low, high = m << (j + LIVE_SHIFT), (m + 1) << (j + LIVE_SHIFT)
    for handle in range(seen, count):
      if alive[handle] and low <= starts[handle] and starts[handle] < high:
        hits[1, k] = offsets[handle]
        hits[2, k] = align_up(offsets[handle] + sizes[handle], alignment)
        k += 1
    if k == 0:
      lists[lid, LIST_SEEN] = count
      return True
  return _union_update(live, lid, hits, k, heap.work, count)


@njit
def _gap(low, high, reach, size, best_start, best_length):
  """One range of `_merge_fit`'s sweep: the free range before it, if the smallest so far that
  holds `size` (the lowest on a tie), and the reach after it: (best start, best length,
  reach)."""
  length = low - reach
  if length >= size and (
    best_start < 0 or length < best_length or (length == best_length and reach < best_start)
  ):
    best_start, best_length = reach, length
  return best_start, best_length, max(reach, high)


@njit
def _merge_fit(a, a_first, a_len, b, b_len, size):
  """`fit_in_reach` over the union of `a[a_first:a_first + a_len]` and `b[:b_len]` (ranges
  sorted by low), merged as it reads them (as `_union_merge`: runs of `a` between the ranges of
  `b`): (start, reach)."""
  best_start, best_length = -1, INT64_MAX
  reach = 0
  i = 0
  for j in range(b_len):
    low = b[j, 0]
    while i < a_len and a[a_first + i, 0] <= low:
      best_start, best_length, reach = _gap(
        a[a_first + i, 0], a[a_first + i, 1], reach, size, best_start, best_length
      )
      i += 1
    best_start, best_length, reach = _gap(low, b[j, 1], reach, size, best_start, best_length)
  while i < a_len:
    best_start, best_length, reach = _gap(
      a[a_first + i, 0], a[a_first + i, 1], reach, size, best_start, best_length
    )
    i += 1
  length = INT64_MAX - reach
  if length >= size and (
    best_start < 0 or length < best_length or (length == best_length and reach < best_start)
  ):
    best_start = reach
  return best_start, reach


@njit
def _tile(x, last, levels):
  """The level of the largest aligned run of blocks that starts at block x and ends by
  `last`."""
  j = 0
  while j + 1 < levels and (x & ((2 << j) - 1)) == 0 and x + (2 << j) <= last:
    j += 1
  return j


@njit
def _live_fit(heap, start, end, size):
  """`best_fit` over `[start, end)` through the live lists (`heap`: a `HeapSearch`), and the
  highest end (aligned up) of the chunks live there: (start, reach); (LIVE_FALLBACK, 0) when
  they cannot answer (a request of no bytes, whose ties need handle order; an empty interval or
  one before op 0; rows full: the caller collects and sorts)."""
  live, hits, work = heap.lists, heap.hits, heap.work
  lists, rows4, rows2, meta = live.lists, live.rows4, live.rows2, live.meta
  blocks = meta[META_BLOCKS]
  b = start >> LIVE_SHIFT
  if size <= 0 or start < 0 or end <= start or b >= blocks:
    return LIVE_FALLBACK, 0
  if not _edge_refresh(heap, b):
    return LIVE_FALLBACK, 0
  last = min((end - 1) >> LIVE_SHIFT, blocks - 1)
  # The blocks between, tiled by aligned runs (the largest that fits at each step): their
  # unions brought up to date first (that uses `hits` and `work`).
  levels = meta[META_LEVELS]
  x = b + 1
  while x < last:
    j = _tile(x, last, levels)
    if not _level_refresh(heap, j, x >> j):
      return LIVE_FALLBACK, 0
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
  order = offset_order(hits, k, 1)
  current = 0
  n, reach = 0, -1
  for j in range(k):
    i = order[j]
    n, reach = _union_push(work[current], 0, n, reach, hits[1, i], hits[2, i])
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


@njit
def best_fit_indexed(index, lists, chunks, scratch, start, end, size):
  """`ChunkHeap.find_chunk` without a preferred offset (`index` .. `scratch`:
  `ChunkHeap.search_state()`): the start of the smallest free range of `[start, end)` that holds
  `size` bytes, the lowest on a tie (the top range is unbounded), from the live lists, else the
  time index."""
  heap = heap_search(index, lists, chunks, scratch)
  offset, _ = _live_fit(heap, start, end, size)
  if offset != LIVE_FALLBACK:
    return offset
  k = collect(heap.index, start, end, heap.hits)
  by_offset(heap.hits, k, size, heap.sorted)
  return fit_in(heap.sorted, k, end, size)


@njit
def _extension(uses, end_use, picker, nest=None):
  """`find_best_chunk_candidate`'s candidate uses: (first, last), the first use at or after
  `end_use` and the last one reachable from it through consecutive uses kept without a copy
  (the picker's `can_allocate_in_alternate_memory_no_copy`; `picker`: a `NoCopyBound`; `nest`:
  the program's loops, a `WhileNest`'s fields, or None)."""
  n = len(uses)
  first = np.searchsorted(uses, end_use, side="left")
  if first == n:
    raise ValueError("no use at or after the request's end")
  last = first
  while last + 1 < n:
    u, v = uses[last], uses[last + 1]
    if picker.count_picker:
      keep = v - u <= picker.max_count
    elif nest is not None:
      keep = picker.max_elapsed > nested_elapsed(picker.prefix, WhileNest(*nest), u, v)
    else:
      keep = picker.max_elapsed > (0.0 if u == v else picker.prefix[v] - picker.prefix[u + 1])
    if not keep:
      break
    last += 1
  return first, last


@njit
def _probe(heap, start, use, size, uses, last, k):
  """Best fit over `[start, use + 1)` for `chunk_candidate`: (offset, reach, k), from the live
  lists or, where they cannot answer, from the chunks live from `start` to the last candidate
  use, collected and sorted once (k: how many; -1 while not collected)."""
  if k < 0:
    offset, reach = _live_fit(heap, start, use + 1, size)
    if offset != LIVE_FALLBACK:
      return offset, reach, k
    k = collect(heap.index, start, uses[last] + 1, heap.hits)
    by_offset(heap.hits, k, size, heap.sorted)
  offset, reach = fit_in_reach(heap.sorted, k, use + 1, size)
  return offset, reach, k


@njit
def chunk_candidate(heap, picker, start, end_use, size, uses, max_size, nest=None):
  """`best_chunk_candidate_indexed` on a named heap (`HeapSearch`) and picker
  (`NoCopyBound`, and its `nest_state()`).

  The last candidate use is probed first: when its chunk fits and every chunk live until it ends
  within `max_size` (always, for msa's heaps), the binary search would find a fitting chunk at
  every use it probes and end at that one, so its answer is that chunk. Why it would: a probe
  to an earlier use sees a subset of those chunks; the smallest free range it finds is either
  bounded above by one of them, so it ends within `max_size`, or it is the top range, whose start
  is at most the last probe's chunk end (its top range) or below the bounded range the last
  probe chose, which stays free. The binary search is the rest (the first is an exact copy)."""
  first, last = _extension(uses, end_use, picker, nest)
  k = -1  # Chunks collected: not yet.
  offset, reach, k = _probe(heap, start, uses[last], size, uses, last, k)
  if offset + size <= max_size and reach <= max_size:
    return True, offset, uses[last]
  found, best_offset, best_use = False, 0, 0
  # std::lower_bound over uses[first : last + 1] with "the chunk fits" as the predicate.
  lo, count = first, last + 1 - first
  while count > 0:
    step = count // 2
    mid = lo + step
    use = uses[mid]
    offset, reach, k = _probe(heap, start, use, size, uses, last, k)
    if offset + size <= max_size:
      if not found or use > best_use:
        found, best_offset, best_use = True, offset, use
      lo = mid + 1
      count -= step + 1
    else:
      count = step
  return found, best_offset, best_use


@njit
def best_chunk_candidate_indexed(
  index, lists, chunks, scratch, picker, start, end_use, size, uses, max_size, nest=None
):
  """`chunks.find_best_chunk_candidate` without a preferred offset: (found, offset, end use).
  `index` .. `scratch`: `ChunkHeap.search_state()`; `picker`: the picker's `kernel_state()` (a
  `NoCopyBound`'s fields) and `nest` its `nest_state()`, for
  `can_allocate_in_alternate_memory_no_copy` between consecutive uses.
  Each probe of the binary search asks the live lists (`_live_fit`); where they cannot answer, the
  chunks live from `start` to the last candidate use are collected and sorted by offset once, and
  each probe reads those that start before its end (the chunks live in its interval, as every one
  ends after `start`)."""
  heap = heap_search(index, lists, chunks, scratch)
  return chunk_candidate(heap, no_copy_bound(picker), start, end_use, size, uses, max_size, nest)


@njit
def no_copy_bound(picker):
  """The picker's `kernel_state()` named (a `NoCopyBound`)."""
  return NoCopyBound(*picker)
