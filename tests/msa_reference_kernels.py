"""Jitted whole-heap scans that msa's indexed searches must agree with (tests/test_msa_index.py,
the chunk tests): each reads every committed chunk, as XLA's `MakeFreeChunks` does, where the
time index and the live lists (env/msa/kernels/) read only those live in the interval. Jitted so
that the property tests can compare thousands of searches; numpy's `ChunkHeap.free_chunks` is
their own reference.

They take the heap as `ChunkHeap.kernel_state()` (a `Chunks`' fields) and the picker as its
`kernel_state()` (a `NoCopyBound`'s).
"""

from __future__ import annotations

import numpy as np

from malloczero.env.kernel_cache import njit
from malloczero.env.msa.chunks import Chunks
from malloczero.env.msa.kernels.live_lists import _extension, no_copy_bound
from malloczero.env.msa.kernels.shared import INT64_MAX, align_up


@njit
def _live_sorted(chunks, start, end):
  """The chunks live at some op of `[start, end)`, sorted by offset (stable): their offsets and
  ends rounded up to the alignment (`ChunkHeap.free_chunks`' used ranges)."""
  starts, ends, offsets, sizes = chunks.rects[0], chunks.rects[1], chunks.rects[2], chunks.rects[3]
  k = 0
  hit = np.empty(chunks.count, np.int64)
  for i in range(chunks.count):
    if chunks.alive[i] and starts[i] < end and start < ends[i]:
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
    used_end[j] = align_up(offsets[i] + sizes[i], chunks.alignment)
  return sorted_start, used_end


@njit
def _smallest_fit(used_start, used_end, size):
  """The start of the smallest free range between the offset-sorted used ranges that holds
  `size` bytes, the lowest on a tie (the top range is unbounded)."""
  best_start, best_length = -1, INT64_MAX
  reach = 0
  for j in range(len(used_start) + 1):
    free_start = reach
    free_end = used_start[j] if j < len(used_start) else INT64_MAX
    length = free_end - free_start
    if length >= size and (
      best_start < 0 or length < best_length or (length == best_length and free_start < best_start)
    ):
      best_start, best_length = free_start, length
    if j < len(used_start) and used_end[j] > reach:
      reach = used_end[j]
  return best_start


@njit
def fits_at(chunks, start, end, size, offset):
  """`ChunkHeap.fits_at` for an aligned, non-negative offset: inside one free range of
  `[start, end)` that holds `size` bytes."""
  used_start, used_end = _live_sorted(Chunks(*chunks), start, end)
  reach = 0
  for j in range(len(used_start) + 1):
    free_start = reach
    free_end = used_start[j] if j < len(used_start) else INT64_MAX
    if free_end - free_start >= size and free_start <= offset and offset + size <= free_end:
      return True
    if j < len(used_start) and used_end[j] > reach:
      reach = used_end[j]
  return False


@njit
def _best_fit(chunks, start, end, size):
  used_start, used_end = _live_sorted(chunks, start, end)
  return _smallest_fit(used_start, used_end, size)


@njit
def best_fit(chunks, start, end, size):
  """`ChunkHeap.find_chunk` without a preferred offset: the start of the smallest free range of
  `[start, end)` that holds `size` bytes, the lowest on a tie (the top range is unbounded)."""
  return _best_fit(Chunks(*chunks), start, end, size)


@njit
def best_chunk_candidate(chunks, picker, start, end_use, size, uses, max_size):
  """`chunks.find_best_chunk_candidate` without a preferred offset: (found, offset, end use),
  scanning every chunk per probe (`live_lists.best_chunk_candidate_indexed` is the one msa's
  loop runs)."""
  chunks = Chunks(*chunks)
  first, last = _extension(uses, end_use, no_copy_bound(picker))
  found, best_offset, best_use = False, 0, 0
  # std::lower_bound over uses[first : last + 1] with "the chunk fits" as the predicate.
  lo, count = first, last + 1 - first
  while count > 0:
    step = count // 2
    mid = lo + step
    use = uses[mid]
    offset = _best_fit(chunks, start, use + 1, size)
    if offset + size <= max_size:
      if not found or use > best_use:
        found, best_offset, best_use = True, offset, use
      lo = mid + 1
      count -= step + 1
    else:
      count = step
  return found, best_offset, best_use
