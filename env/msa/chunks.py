"""Where msa puts a buffer in fast memory: XLA's best-fit chunk search in time x address.

Reimplements, for one memory level:
* `GlobalDecreasingSizeBestFitHeap::MakeFreeChunks` and `SlicedAllocationFinder::Find` (openxla/
  xla, `xla/service/heap_simulator/heap_simulator.cc`; `FindChunkCandidate(s)` for one slice):
  the free address ranges over a time interval are what the chunks live in that interval leave,
  each used chunk's end rounded up to the alignment, and the range above the highest used chunk
  unbounded. The preferred offset is taken if the buffer fits there; otherwise the smallest free
  range that holds it, ties to the lower offset (the unbounded top range is the largest, so it
  is used only when no bounded range fits). The chunk may end past the memory: the caller checks
  `max_size_in_bytes`, as msa does.
* `CommitChunk` (`add`), and removal of a committed chunk (msa uncommits pending chunks when an
  allocation fails: `kFailRequiresUncommit`).
* `MsaAlgorithm::FindBestChunkCandidates` (`xla/service/memory_space_assignment/algorithm.cc`):
  with a preferred offset (the previous allocation's), only that offset; else the end time is
  extended by a binary search (`std::lower_bound` over the uses) towards the latest later use
  that could be kept without a copy (`CanAllocateInAlternateMemoryNoCopy` between consecutive
  uses) and still fits within the memory, so that the next segments can reuse the chunk.

Why: the chunk decides which later buffers still fit; msa's answer depends on XLA's exact rule
(best fit, not first fit; preferred offset first; the extension), so the agent's game and the
`msa` solver must share it.

Times: this module uses the project's half-open op intervals `[start, end)` for rectangles (XLA's
`BufferInterval` is inclusive `[start, end]`, i.e. `[start, end + 1)` here);
`find_best_chunk_candidate` takes XLA-style use times (an allocation reserved "until use u"
occupies `[start, u + 1)`). Each query reads only the chunks live in its interval, found
through a time index (`ChunkHeap`), and sorts them by offset (`fits_at` and `find_chunk`
jitted, env/msa/kernels/chunk_index.py and live_lists.py, as msa's decision process runs them
several times a step; `free_chunks` scans every chunk in numpy, for the tests).

Not modelled, and why: sliced allocations (`max_slices` >= 2, off by default in XLA) and the
slice-time permutations of `SlicedAllocationFinder`; colocations (`max_colocation_size`: a
buffer here is one value); repacking (`max_repacks` 0 by default).
"""

from __future__ import annotations

import dataclasses
from typing import Callable, NamedTuple, Sequence

import numpy as np

from malloczero.common.lazy import lazy_module

_index_kernels = lazy_module("malloczero.env.msa.kernels.chunk_index")
_live_kernels = lazy_module("malloczero.env.msa.kernels.live_lists")

# `chunk_index.POOL_WIDTH`, here too so that importing this module does not load numba.
_POOL_WIDTH = 5

_INITIAL_CAPACITY = 64
_INITIAL_SPAN = 64


class Chunks(NamedTuple):
  """The committed chunks as the kernels read them (`ChunkHeap.kernel_state()`): columns `[0,
  count)` used, the removed ones not `alive`."""

  rects: np.ndarray  # [4, capacity] int64, rows: start, end, offset, size
  alive: np.ndarray  # [capacity] bool
  count: int
  alignment: int


class TimeIndex(NamedTuple):
  """The time index (kernels/chunk_index.py): per bucket its first row in `pool`, its chunk
  count and its room; the pool of rows; the pool's rows in use (`used[0]`); the span of start
  times it covers."""

  buckets: np.ndarray  # [3, B] int64, rows: first row, chunk count, room
  pool: np.ndarray  # [P, POOL_WIDTH]
  used: np.ndarray  # [1]
  span: int


class LiveLists(NamedTuple):
  """The live lists (kernels/live_lists.py): per list its first row, length, room and the chunk
  count it has seen; the rows of starts and edges `[R, 4]`, of unions `[R, 2]`; their meta."""

  lists: np.ndarray
  rows4: np.ndarray
  rows2: np.ndarray
  meta: np.ndarray


class Scratch(NamedTuple):
  """A search's scratch: its hits as found `[4, capacity]` and sorted by offset `[3, capacity]`,
  the unions it merges `[3, capacity, 2]`."""

  hits: np.ndarray
  sorted: np.ndarray
  work: np.ndarray


class HeapSearch(NamedTuple):
  """What a search of the heap reads, as the kernels name `ChunkHeap.search_state()`'s four
  tuples."""

  index: TimeIndex
  lists: LiveLists
  chunks: Chunks
  hits: np.ndarray
  sorted: np.ndarray
  work: np.ndarray


@dataclasses.dataclass(frozen=True)
class ChunkCandidate:
  """A chunk found by `find_best_chunk_candidate`: `offset` and `size` in bytes, reserved from
  the allocation's start until (and including) op `end_use`, i.e. over `[start, end_use + 1)`."""

  offset: int
  size: int
  end_use: int

  @property
  def chunk_end(self) -> int:
    return self.offset + self.size


class ChunkHeap:
  """The chunks committed in one memory level: rectangles `[start, end)` x `[offset, offset +
  size)`, with XLA's `heap_size` (the highest chunk end ever committed). Removed chunks stay in
  the arrays, masked out, so handles returned by `add` stay valid.

  A time index finds the chunks live in a query's interval without a pass over all of them
  (msa's loop queries the heap several times per step, and a program of 100,000 buffers commits
  about 110,000 chunks): each live chunk is filed by its length class c (a length in [2^c,
  2^(c + 1))) under the bucket of width 2^c that holds its start. A chunk of class c live after
  op `start` starts after `start + 1 - 2^(c + 1)`, so a search for `[start, end)` reads, per
  class, the buckets from there to `end`: mostly chunks that are live, and a few bucket heads
  per op (`chunk_index.collect`). A bucket's chunks sit together in one pool of rows (what a
  search reads of a chunk), so a search streams through them; what it finds is copied out once
  and radix-sorted by offset. An interval tree over start times (each node's latest end) cost
  about five times as much per chunk found, and linked lists per bucket a cache miss per chunk;
  a search finds a few thousand chunks on XLA-like programs of 100,000 buffers.

  Best fit reads only the union of those chunks' address ranges, so a best-fit search goes
  through live lists of unions kept beside the index (kernels/live_lists.py): per block
  of 256 ops, the union of the chunks live across it from before, the few that end inside it
  and the chunks that start in it; per aligned run of blocks, the union of the chunks that start
  in it. Each union is brought up to date when a search reads it, from the chunks committed
  since; a removal sends the unions that held the chunk to be built again. A search then merges
  a few hundred intervals where it sorted a few thousand chunks (msa at 100,000 buffers: 8.1 s
  of chunk searches became 3.4 s, the same decisions). The index answers what the lists cannot
  (a request of no bytes, whose ties need handle order; an interval before op 0).
  """

  def __init__(self, alignment: int = 1):
    if alignment <= 0:
      raise ValueError(f"alignment must be positive, got {alignment}")
    self.alignment = int(alignment)
    self._set_rects(np.zeros((4, _INITIAL_CAPACITY), np.int64))
    self._alive = np.zeros(_INITIAL_CAPACITY, bool)
    self._count = 0
    self.heap_size = 0
    # A search's hits, as found and sorted by offset (`live_lists.best_fit_indexed`); the
    # unions it merges (`live_lists._live_fit`).
    self._hits = np.zeros((4, _INITIAL_CAPACITY), np.int64)
    self._sorted = np.zeros((3, _INITIAL_CAPACITY), np.int64)
    self._work = np.zeros((3, _INITIAL_CAPACITY, 2), np.int64)
    self._reindex(_INITIAL_SPAN, _INITIAL_CAPACITY)

  def __len__(self) -> int:
    return int(self._alive[: self._count].sum())

  def _set_rects(self, rects: np.ndarray) -> None:
    """The chunks' start, end, offset and size `[capacity]` each, as rows of one array (the
    kernels take it whole: kernels/__init__.py says why)."""
    self._rects = rects
    self._start, self._end, self._offset, self._size = rects

  def align_up(self, value: np.ndarray | int) -> np.ndarray | int:
    a = self.alignment
    return (value + a - 1) // a * a

  def _reindex(self, span: int, pool_rows: int) -> None:
    """Rebuilds the time index over start times [0, `span`) (a power of two), with every live
    chunk: per bucket its first row in `_pool`, its chunk count and its room; the pool's rows
    in use (`_pool_used[0]`). The pool doubles until every bucket fits."""
    self._span = span
    buckets = _index_kernels().index_buckets(span)
    pool_rows = max(int(pool_rows), _INITIAL_CAPACITY)
    while True:
      self._buckets = np.zeros((3, buckets), np.int64)
      self._pool = np.zeros((pool_rows, _POOL_WIDTH), np.int64)
      self._pool_used = np.zeros(1, np.int64)
      if _index_kernels().index_build(self._index_state(), self.kernel_state()):
        break
      pool_rows *= 2
    self._relist(span)

  def _relist(self, span: int) -> None:
    """Rebuilds the live lists (kernels/live_lists.py) over start times `[0, span)`: every
    live chunk filed in its block's starts, no union built yet."""
    k = _live_kernels()
    blocks, levels, lists = k.live_layout(span)
    self._lists = np.zeros((lists, 4), np.int64)
    self._lists[:, 3] = -1
    self._live_meta = np.array([0, 0, 0, 0, blocks, levels], np.int64)
    self._rows2 = np.zeros((max(_INITIAL_CAPACITY, 4 * self._count), 2), np.int64)
    self._rows4 = np.zeros((max(_INITIAL_CAPACITY, 2 * self._count), 4), np.int64)
    filed = 0
    while True:
      filed = k.live_add_all(self._lists_state(), self.kernel_state(), filed)
      if filed == self._count:
        break
      self._compact_lists()

  def _file_starts(self, i: int) -> None:
    """Files chunk i in its block's starts (the rows compacted, grown if need be, when full)."""
    args = (
      int(self._start[i]),
      int(self._end[i]),
      int(self._offset[i]),
      int(self.align_up(int(self._offset[i]) + int(self._size[i]))),
    )
    while not _live_kernels().live_add(self._lists_state(), *args):
      self._compact_lists()

  def _compact_lists(self) -> None:
    """Called when a list found no room in its rows: the lists of each kind of rows copied
    together, into twice the rows while they and the room asked for would fill more than
    half."""
    blocks = int(self._live_meta[4])
    for rows_name, used, full, first, last in (
      ("_rows4", 0, 2, 0, 2 * blocks),
      ("_rows2", 1, 3, 2 * blocks, len(self._lists)),
    ):
      if not self._live_meta[full]:
        continue
      lengths = self._lists[first:last, 1]
      needed = int((lengths + np.maximum(lengths // 4, 8)).sum() + self._live_meta[full])
      rows = getattr(self, rows_name)
      size = len(rows)
      while needed > size // 2:
        size *= 2
      new_rows = np.zeros((size, rows.shape[1]), np.int64)
      self._live_meta[used] = _live_kernels().live_compact(self._lists, first, last, rows, new_rows)
      self._live_meta[full] = 0
      setattr(self, rows_name, new_rows)

  def _grow(self) -> None:
    """Doubles the capacity of the chunk arrays."""
    grow = len(self._start)
    self._set_rects(np.concatenate([self._rects, np.zeros((4, grow), np.int64)], axis=1))
    self._alive = np.concatenate([self._alive, np.zeros(grow, bool)])
    self._hits = np.zeros((4, 2 * grow), np.int64)
    self._sorted = np.zeros((3, 2 * grow), np.int64)
    self._work = np.zeros((3, 2 * grow, 2), np.int64)

  def add(self, start: int, end: int, offset: int, size: int) -> int:
    """Commits a chunk (`CommitChunk`); returns its handle for `remove`."""
    if end <= start:
      raise ValueError(f"empty time interval [{start}, {end})")
    if offset < 0 or size < 0:
      raise ValueError(f"negative offset {offset} or size {size}")
    if self._count == len(self._start):
      self._grow()
    i = self._count
    self._start[i], self._end[i], self._offset[i], self._size[i] = start, end, offset, size
    self._alive[i] = True
    self._count += 1
    self.heap_size = max(self.heap_size, offset + size)
    if start >= self._span:
      self._reindex(1 << int(start).bit_length(), 2 * len(self._pool))  # Files this chunk too.
      return i
    filed = _live_kernels().heap_add(
      self._index_state(),
      self._lists_state(),
      int(start),
      int(end),
      int(offset),
      int(self.align_up(offset + size)),
      i,
    )
    if filed == 1:
      # The pool is full: rebuilt compact, with room to grow (this chunk filed too).
      self._reindex(self._span, 4 * self._count)
    elif filed == 2:
      self._file_starts(i)  # Its block's starts had no room: given room, then filed.
    return i

  @property
  def chunk_count(self) -> int:
    """Chunks committed so far, removed ones included (the next chunk's handle)."""
    return self._count

  def set_counts(self, count: int, heap_size: int) -> None:
    """Takes the count and heap size from a caller that committed chunks through the kernels
    directly, on room it made first (`reserve`; msa's jitted run, solver_loop.py)."""
    self._count, self.heap_size = int(count), int(heap_size)

  def cover_starts(self, starts: int) -> None:
    """Makes the time index cover start times `[0, starts)`, so that adding a chunk that
    starts there never rebuilds it (a kernel committing chunks cannot)."""
    if self._span < starts:
      self._reindex(1 << max(int(starts) - 1, 1).bit_length(), 2 * len(self._pool))

  def reserve(self, chunks: int, rows: int) -> None:
    """Room for `chunks` more chunks, and at least `rows` free rows in the time index's pool and
    in each kind of the live lists' rows, none of them waiting for room: what a caller that
    commits and searches through the kernels directly checks first (msa's jitted run,
    solver_loop.py). The pool grows as it is (a bucket's rows stay where they are); the lists'
    rows are compacted into rows large enough (`_compact_lists`)."""
    while self._count + chunks > len(self._alive):
      self._grow()
    free = len(self._pool) - int(self._pool_used[0])
    if free < rows:
      grown = max(2 * len(self._pool), int(self._pool_used[0]) + 2 * rows)
      pool = np.zeros((grown, self._pool.shape[1]), np.int64)
      pool[: len(self._pool)] = self._pool
      self._pool = pool
    meta = self._live_meta
    for used, full, array in ((0, 2, self._rows4), (1, 3, self._rows2)):
      if len(array) - int(meta[used]) < rows:
        meta[full] = max(int(meta[full]), rows)
    if meta[2] or meta[3]:
      self._compact_lists()

  def remove(self, handle: int) -> None:
    """Uncommits a chunk. XLA's heap size does not shrink when a chunk is removed either."""
    if not (0 <= handle < self._count and self._alive[handle]):
      raise KeyError(f"no committed chunk {handle}")
    self._alive[handle] = False
    start, end, offset = int(self._start[handle]), int(self._end[handle]), self._offset[handle]
    _index_kernels().index_remove(self._index_state(), start, end, handle)
    _live_kernels().live_remove(
      self._lists_state(),
      start,
      end,
      int(offset),
      int(self.align_up(int(offset) + int(self._size[handle]))),
      int(handle),
    )

  def chunks(self) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """The committed chunks as `[n]` arrays (start, end, offset, size)."""
    live = self._alive[: self._count]
    return (
      self._start[: self._count][live],
      self._end[: self._count][live],
      self._offset[: self._count][live],
      self._size[: self._count][live],
    )

  def kernel_state(self) -> tuple:
    """The chunks as the kernels take them (the index's rebuilds, the game's occupancy): a
    `Chunks`' fields, as a plain tuple (kernels/__init__.py says why)."""
    return (self._rects, self._alive, self._count, self.alignment)

  def _index_state(self) -> tuple:
    """The time index as its kernels take it: a `TimeIndex`' fields."""
    return (self._buckets, self._pool, self._pool_used, self._span)

  def _lists_state(self) -> tuple:
    """The live lists as their kernels take them: a `LiveLists`' fields."""
    return (self._lists, self._rows4, self._rows2, self._live_meta)

  def search_state(self) -> tuple[tuple, tuple, tuple, tuple]:
    """The heap as the searches take it (`live_lists.best_fit_indexed`,
    `best_chunk_candidate_indexed`, `prefetch.plan_prefetch_starts`): four arguments, a
    `TimeIndex`', a `LiveLists`', a `Chunks`' and a `Scratch`'s fields. Lists that found no
    room are given it first."""
    if self._live_meta[2] or self._live_meta[3]:
      self._compact_lists()
    return (
      self._index_state(),
      self._lists_state(),
      self.kernel_state(),
      (self._hits, self._sorted, self._work),
    )

  def overlapping(self, start: int, end: int) -> np.ndarray:
    """`[k]` handles of the committed chunks live at some op of `[start, end)`."""
    n = self._count
    hit = self._alive[:n] & (self._start[:n] < end) & (start < self._end[:n])
    return np.flatnonzero(hit)

  def free_chunks(self, start: int, end: int, size: int) -> tuple[np.ndarray, np.ndarray]:
    """`MakeFreeChunks`: the free address ranges over `[start, end)` that can hold `size`
    bytes, as `[k]` offsets and ends sorted by offset; the last end is `np.iinfo(int64).max`
    (the unbounded range above every chunk live in the interval)."""
    idx = self.overlapping(start, end)
    offsets = self._offset[idx]
    order = np.argsort(offsets, kind="stable")
    used_start = offsets[order]
    used_end = self.align_up(used_start + self._size[idx][order])
    reach = np.maximum.accumulate(used_end) if len(used_end) else used_end
    free_start = np.concatenate([[0], reach]).astype(np.int64)
    free_end = np.concatenate([used_start, [np.iinfo(np.int64).max]]).astype(np.int64)
    keep = free_end - free_start >= size
    return free_start[keep], free_end[keep]

  def fits_at(self, start: int, end: int, size: int, offset: int) -> bool:
    """Whether `size` bytes fit at `offset` over `[start, end)` (`FindForOffset` for one
    slice: inside one free range, at an aligned offset)."""
    if offset < 0 or offset % self.alignment:
      return False
    # `free_chunks` and the test above, as one jitted pass over the chunks live in the interval
    # (the per-call numpy overhead was most of msa's decision time).
    return bool(
      _index_kernels().fits_at_indexed(
        self._index_state(), int(start), int(end), int(size), int(offset)
      )
    )

  def find_chunk(self, start: int, end: int, size: int, preferred_offset: int | None = None) -> int:
    """`FindChunkCandidate`: the offset for `size` bytes over `[start, end)`: the preferred
    offset if it fits, else the start of the smallest free range that holds the buffer (ties to
    the lower offset). Always found (the top range is unbounded); may end past the memory."""
    if (
      preferred_offset is not None
      and preferred_offset >= 0
      and self.fits_at(start, end, size, preferred_offset)
    ):
      return int(preferred_offset)
    # The smallest of `free_chunks`' ranges, ties to the lower offset, in one jitted pass.
    heap = self.search_state()
    return int(_live_kernels().best_fit_indexed(*heap, int(start), int(end), int(size)))

  def find_chunk_within(
    self, start: int, end: int, size: int, max_size: int, preferred_offset: int | None = None
  ) -> int | None:
    """`find_chunk`, or None when that chunk ends past `max_size` (msa's
    `chunk_end() <= available_heap_size()` check)."""
    offset = self.find_chunk(start, end, size, preferred_offset)
    return offset if offset + size <= max_size else None


def find_best_chunk_candidate(
  heap: ChunkHeap,
  start: int,
  end_use: int,
  size: int,
  use_times: Sequence[int],
  max_size: int,
  can_keep_without_copy: Callable[[int, int], bool],
  preferred_offset: int | None = None,
) -> ChunkCandidate | None:
  """`FindBestChunkCandidates` for an allocation starting at op `start` that must serve the use
  at `end_use` (XLA's request end time).

  With `preferred_offset`: that offset over `[start, end_use + 1)` or nothing. Without: among the
  uses from the first one at or after `end_use` up to the last one reachable from it through
  consecutive uses that `can_keep_without_copy(u, next_u)` allows (the picker's
  `can_allocate_in_alternate_memory_no_copy`), a `std::lower_bound`-style binary search for the
  latest use until which a best-fit chunk still ends within `max_size`; the chunk found for the
  latest fitting use evaluated is returned, reserved until that use. `use_times` are the
  allocation value's use times, sorted; one of them must be >= `end_use`."""
  if preferred_offset is not None:
    if heap.fits_at(start, end_use + 1, size, preferred_offset) and (
      preferred_offset + size <= max_size
    ):
      return ChunkCandidate(int(preferred_offset), size, end_use)
    return None
  uses = np.asarray(use_times, np.int64)
  first = int(np.searchsorted(uses, end_use, side="left"))
  if first == len(uses):
    raise ValueError(f"no use at or after {end_use} among {uses.tolist()}")
  last = first
  while last + 1 < len(uses) and can_keep_without_copy(int(uses[last]), int(uses[last + 1])):
    last += 1
  best: ChunkCandidate | None = None
  # std::lower_bound over uses[first : last + 1] with "the chunk fits" as the predicate, exactly
  # as XLA runs it (the predicate records the latest fitting use it evaluates).
  lo, count = first, last + 1 - first
  while count > 0:
    step = count // 2
    mid = lo + step
    use = int(uses[mid])
    offset = heap.find_chunk(start, use + 1, size)
    if offset + size <= max_size:
      if best is None or use > best.end_use:
        best = ChunkCandidate(offset, size, use)
      lo = mid + 1
      count -= step + 1
    else:
      count = step
  return best
