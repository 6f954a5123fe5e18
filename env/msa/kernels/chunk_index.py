"""The chunk heap's time index (env/msa/chunks.py's `ChunkHeap`): the chunks live at some op of
an interval, found without a pass over every chunk.

Each live chunk is filed by its length class c (a length in [2^c, 2^(c + 1))) under the bucket
of its class that holds its start. Each bucket's chunks sit together in `pool` `[P,
POOL_WIDTH]` (rows `ptr[b]` .. `ptr[b] + fill[b]`, room for `room[b]`: the rows of `buckets`),
one row per chunk:
start, end, offset, end rounded up to the alignment, handle. A search streams through them: the
linked lists this replaced cost a dependent load per chunk, about 90 ns each once the heap
outgrew the caches.

The index travels as a `TimeIndex`'s fields and the chunks as a `Chunks`' (chunks.py; the
package docstring says why plain tuples).
"""

from __future__ import annotations

from malloczero.env.kernel_cache import njit
from malloczero.env.msa.chunks import Chunks, TimeIndex
from malloczero.env.msa.kernels.shared import INT64_MAX, align_up, offset_order

POOL_START, POOL_END, POOL_OFFSET, POOL_USED_END, POOL_HANDLE = 0, 1, 2, 3, 4
POOL_WIDTH = 5
_MIN_BUCKET_SHIFT = 6  # The time index's buckets span at least 64 ops.


@njit
def _index_classes(span):
  """How many length classes a time index over `span` start times has: 0 .. log2(span)."""
  classes = 1
  while (span >> classes) > 0:
    classes += 1
  return classes


@njit
def _index_class(span, c):
  """(first bucket, bucket width as a shift) of length class c: buckets of 2^c ops, but not
  narrower than 2^_MIN_BUCKET_SHIFT (a short chunk's bucket would hold about one chunk, and a
  long search would read one bucket per op, each from another place in the pool)."""
  first = 0
  for j in range(c):
    first += max(span >> max(j, _MIN_BUCKET_SHIFT), 1)
  return first, max(c, _MIN_BUCKET_SHIFT)


@njit
def _index_bucket(span, start, end):
  """The bucket a chunk over `[start, end)` is filed under: its length class c (lengths in [2^c,
  2^(c + 1)), measured from its start clamped to `[0, span)`; the last class takes every longer
  chunk too), then the bucket of its class that holds that start (`_index_class`)."""
  key = min(max(start, 0), span - 1)
  length = max(end - key, 1)
  c = 0
  while (length >> (c + 1)) > 0 and (span >> (c + 1)) > 0:
    c += 1
  first, shift = _index_class(span, c)
  return first + (key >> shift)


@njit
def index_buckets(span):
  """How many buckets a time index over `span` start times has."""
  first, _ = _index_class(span, _index_classes(span))
  return first


@njit
def index_add(index, start, end, offset, used_end, handle):
  """Files a chunk in its bucket of `index` (a `TimeIndex`); False (and nothing changed) when
  the pool has no room for the bucket to grow into (the caller grows it and asks again). A full
  bucket moves to the end of the pool's used rows (`used[0]`) with twice the room."""
  ptr, fill, room = index.buckets[0], index.buckets[1], index.buckets[2]
  pool, used = index.pool, index.used
  bucket = _index_bucket(index.span, start, end)
  if fill[bucket] == room[bucket]:
    grown = max(4, 2 * room[bucket])
    if used[0] + grown > len(pool):
      return False
    first = used[0]
    for j in range(fill[bucket]):
      for f in range(POOL_WIDTH):
        pool[first + j, f] = pool[ptr[bucket] + j, f]
    ptr[bucket], room[bucket] = first, grown
    used[0] += grown
  row = ptr[bucket] + fill[bucket]
  pool[row, POOL_START], pool[row, POOL_END], pool[row, POOL_OFFSET] = start, end, offset
  pool[row, POOL_USED_END], pool[row, POOL_HANDLE] = used_end, handle
  fill[bucket] += 1
  return True


@njit
def index_build(index, chunks):
  """Files every live chunk (`chunks`: `Chunks`' fields) into an empty time index (`TimeIndex`'
  fields); False when its pool is too small (`ChunkHeap` rebuilds the index when a chunk starts
  past its span or the pool is full)."""
  index, chunks = TimeIndex(*index), Chunks(*chunks)
  starts, ends, offsets, sizes = chunks.rects[0], chunks.rects[1], chunks.rects[2], chunks.rects[3]
  for i in range(chunks.count):
    if chunks.alive[i]:
      used_end = align_up(offsets[i] + sizes[i], chunks.alignment)
      if not index_add(index, starts[i], ends[i], offsets[i], used_end, i):
        return False
  return True


@njit
def index_remove(index, start, end, handle):
  """Takes a chunk out of its bucket (the bucket's last row moves into its place); `index`:
  `TimeIndex`' fields."""
  index = TimeIndex(*index)
  ptr, fill, pool = index.buckets[0], index.buckets[1], index.pool
  bucket = _index_bucket(index.span, start, end)
  last = ptr[bucket] + fill[bucket] - 1
  for row in range(ptr[bucket], last + 1):
    if pool[row, POOL_HANDLE] == handle:
      for f in range(POOL_WIDTH):
        pool[row, f] = pool[last, f]
      fill[bucket] -= 1
      return


@njit
def collect(index, start, end, hits):
  """Writes the chunks live at some op of `[start, end)` to `hits` `[4, capacity]` (start,
  offset, used end, handle; in no particular order) and returns how many. A chunk of class c
  live after `start` starts after `start + 1 - 2^(c + 1)` and before `end`, so each class is
  read over those buckets only: a bucket head per 2^max(c, 6) ops, and chunks of the length of
  the ones that are live, most of which are (not a pass over every chunk; the classes shorter
  than the narrowest bucket read a few more that ended before `start`)."""
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
          hits[0, k] = pool[row, POOL_START]
          hits[1, k] = pool[row, POOL_OFFSET]
          hits[2, k] = pool[row, POOL_USED_END]
          hits[3, k] = pool[row, POOL_HANDLE]
          k += 1
  return k


@njit
def _blocked(index, start, end, request, offset):
  """Whether a chunk live at some op of `[start, end)` starts below `offset + request` and
  ends (aligned up) above `offset`: `collect`'s walk, stopping at the first."""
  ptr, fill, pool, span = index.buckets[0], index.buckets[1], index.pool, index.span
  last_key = min(max(end - 1, 0), span - 1)
  classes = _index_classes(span)
  for c in range(classes):
    first_key = 0 if c == classes - 1 else max(start + 2 - (2 << c), 0)
    if first_key > last_key:
      continue
    base, shift = _index_class(span, c)
    for bucket in range(base + (first_key >> shift), base + (last_key >> shift) + 1):
      for row in range(ptr[bucket], ptr[bucket] + fill[bucket]):
        if (
          pool[row, POOL_START] < end
          and start < pool[row, POOL_END]
          and pool[row, POOL_OFFSET] < offset + request
          and pool[row, POOL_USED_END] > offset
        ):
          return True
  return False


@njit
def by_offset(hits, k, size, sorted_hits):
  """Writes the first `k` hits (`collect`'s) to `sorted_hits` (start, offset, used end) sorted
  by offset (`offset_order`)."""
  order = offset_order(hits, k, size)
  for j in range(k):
    i = order[j]
    sorted_hits[0, j] = hits[0, i]
    sorted_hits[1, j] = hits[1, i]
    sorted_hits[2, j] = hits[2, i]


@njit
def fit_in(sorted_hits, k, end, size):
  """The start of the smallest free range between the first `k` offset-sorted hits that start
  before `end` that holds `size` bytes, the lowest on a tie (the top range is unbounded)."""
  return fit_in_reach(sorted_hits, k, end, size)[0]


@njit
def fit_in_reach(sorted_hits, k, end, size):
  """`fit_in`, and the highest end (aligned up) of those hits: (start, reach)."""
  best_start, best_length = -1, INT64_MAX
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
  length = INT64_MAX - reach
  if length >= size and (
    best_start < 0 or length < best_length or (length == best_length and reach < best_start)
  ):
    best_start = reach
  return best_start, reach


@njit
def fits_at_indexed(index, start, end, size, offset):
  """`ChunkHeap.fits_at` through the time index (`TimeIndex`' fields). Over offset-sorted used
  ranges, `[offset, offset + size)` lies in a free range exactly when no live chunk starts below
  `offset + size` and ends (aligned up) above `offset` (every range before the first chunk at or
  above `offset + size` must end by `offset`), so no sort is needed (`offset` >= 0, as the
  caller checks)."""
  return not _blocked(TimeIndex(*index), start, end, size, offset)
