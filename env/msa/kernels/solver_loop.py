"""msa's own run as one kernel (env/msa/solver_loop.py says why and what it leaves to Python):
`MsaAlgorithm.steps(msa_only=True)` answered with msa's choice at every step, each plan and
commit the Python one's (algorithm.py's `_buffer_steps`, `_unread_value_step`,
`_segment_options`, `_commit`; allocate_segment.py's `SegmentAllocator`), in the same order,
through the same search kernels (`chunk_candidate`, `plan_starts`, `fits_at_indexed`,
`prefetch_window`), on the same chunk heaps (chunks.py) and copy-resource trees
(copy_resource.py).

Arguments: `LoopProgram`', `LoopCosts`', `LoopPickers`' and `LoopOutput`'s fields
(solver_loop.py); per fast level a heap's `(index, lists, (rects, alive), scratch)` tuples and
`[L, 3]` its chunk count, heap size and alignment; the two copy resources' trees (`CopyTrees`'
fields, prefetches then evictions; `total` is made here from `LoopOutput.sums`).
"""

from __future__ import annotations

import numpy as np

from malloczero.env.kernel_cache import njit
from malloczero.env.msa.allocate_segment import PrefetchRequest
from malloczero.env.msa.chunks import Chunks, HeapSearch, LiveLists, TimeIndex
from malloczero.env.msa.copy_resource import CopyTrees
from malloczero.env.msa.interval_picker import NoCopyBound, StartWindow, WhileNest
from malloczero.env.msa.kernels.chunk_index import fits_at_indexed, index_remove
from malloczero.env.msa.kernels.copy_trees import fits_tree, resource_add
from malloczero.env.msa.kernels.live_lists import chunk_candidate, heap_add, live_remove
from malloczero.env.msa.kernels.prefetch import plan_starts, prefetch_window
from malloczero.env.msa.kernels.shared import align_up, nested_elapsed
from malloczero.env.msa.solver_loop import (
  ABORTED,
  DONE,
  NEEDS_ROOM,
  NO_VALUE,
  STATE_COUNTS,
  STATE_NEEDED,
  STATE_NEXT,
  STATE_ROOM,
  STATE_ROWS,
  LoopCosts,
  LoopOutput,
  LoopPickers,
  LoopProgram,
)

NO_COPY = -1
# `LoopOutput.scratch` rows: a buffer's segments, one a column.
S_LEVEL, S_OFFSET, S_START, S_END, S_RESERVED, S_PREFETCH, S_EVICT_START, S_EVICT_DONE = range(8)
# Heap scalars' columns.
H_COUNT, H_SIZE, H_ALIGN = 0, 1, 2
# `MsaStats`' counts in `LoopOutput.state`, from STATE_COUNTS on (solver_loop.COUNTS).
KEPT, PREFETCHES, EVICTIONS, DEFAULT_USES = 0, 1, 2, 3


@njit
def _search(heap, scalars, level):
  """Level `level`'s heap as the searches name it (a `HeapSearch`)."""
  index, lists, arrays, scratch = heap
  hits, sorted_hits, work = scratch
  chunks = Chunks(arrays[0], arrays[1], scalars[level, H_COUNT], scalars[level, H_ALIGN])
  return HeapSearch(TimeIndex(*index), LiveLists(*lists), chunks, hits, sorted_hits, work)


@njit
def _heap_add(heap, scalars, level, start, end, offset, size):
  """`ChunkHeap.add` on room made beforehand: the chunk's handle, or -1 when an array is full
  (the loop gives up: only Python grows them)."""
  index, lists, arrays, _ = heap
  rects, alive = arrays
  i = scalars[level, H_COUNT]
  if end <= start or offset < 0 or size < 0 or i >= alive.shape[0] or start >= index[3]:
    return -1
  rects[0, i], rects[1, i], rects[2, i], rects[3, i] = start, end, offset, size
  alive[i] = True
  scalars[level, H_COUNT] = i + 1
  scalars[level, H_SIZE] = max(scalars[level, H_SIZE], offset + size)
  used_end = align_up(offset + size, scalars[level, H_ALIGN])
  if heap_add(index, lists, start, end, offset, used_end, i) != 0:
    return -1
  return i


@njit
def _heap_remove(heap, scalars, level, handle):
  """`ChunkHeap.remove`."""
  index, lists, arrays, _ = heap
  rects, alive = arrays
  alive[handle] = False
  start, end, offset = rects[0, handle], rects[1, handle], rects[2, handle]
  index_remove(index, start, end, handle)
  used_end = align_up(offset + rects[3, handle], scalars[level, H_ALIGN])
  live_remove(lists, start, end, offset, used_end, handle)


@njit
def _fits_at(heap, scalars, level, start, end, size, offset):
  """`ChunkHeap.fits_at`."""
  if offset < 0 or offset % scalars[level, H_ALIGN] != 0:
    return False
  return fits_at_indexed(heap[0], start, end, size, offset)


@njit
def _no_copy_bound(pickers, level):
  """Level `level`'s picker's `kernel_state()` (a `NoCopyBound`)."""
  if pickers.count_picker:
    return NoCopyBound(True, pickers.prefix[level], 0.0, pickers.count_max)
  return NoCopyBound(False, pickers.prefix[level], pickers.max_elapsed[level], 0)


@njit
def _can_keep(pickers, level, start, end):
  """The picker's `can_allocate_in_alternate_memory_no_copy(start, end)` (start <= end)."""
  if pickers.count_picker:
    return end - start <= pickers.count_max
  return pickers.max_elapsed[level] > _elapsed(pickers.prefix[level], start, end, pickers.nest)


@njit
def _elapsed(prefix, start, end, nest):
  """The picker's `logical_interval_elapsed(start, end)` (start <= end; `nest`: the program's
  loops or None, an argument so that numba leaves the loop branch out without loops)."""
  if nest is not None:
    return nested_elapsed(prefix, WhileNest(*nest), start, end)
  return 0.0 if start == end else prefix[end] - prefix[start + 1]


@njit
def _preferred_eviction_end(pickers, level, copy_elapsed, start, latest_end):
  """The picker's `preferred_eviction_end_time(copy_elapsed, start, latest_end)`."""
  if pickers.count_picker:
    return min(start + pickers.count_min, latest_end)
  return _eviction_end(
    pickers.prefix[level],
    pickers.monotone[level],
    pickers.preferred_ratio * copy_elapsed,
    start,
    latest_end,
    pickers.nest,
  )


@njit
def _eviction_end(prefix, monotone, target, start, latest_end, nest):
  """`_preferred_eviction_end` of the cost picker: the first end whose elapsed time from `start`
  reaches `target`."""
  if nest is not None:
    return _nested_eviction_end(prefix, WhileNest(*nest), target, start, latest_end)
  num_ops = prefix.shape[0] - 1
  if monotone and -1 <= start and start < latest_end and latest_end <= num_ops:
    base = prefix[start + 1]
    lo, hi = start + 1, latest_end + 1
    while lo < hi:
      mid = (lo + hi) // 2
      if prefix[mid] - base >= target:
        hi = mid
      else:
        lo = mid + 1
    return lo if lo <= latest_end else max(start + 1, latest_end + 1)
  for end in range(start + 1, latest_end + 1):
    if prefix[end] - prefix[start + 1] >= target:
      return end
  return max(start + 1, latest_end + 1)


@njit
def _nested_eviction_end(prefix, nest, target, start, latest_end):
  """`_preferred_eviction_end` of a program with loops (`nest`: a `WhileNest`): the first end
  whose `nested_elapsed` from `start` reaches `target`, as the Python picker's scan finds it
  (the elapsed time only grows with the end)."""
  for end in range(start + 1, latest_end + 1):
    if nested_elapsed(prefix, nest, start, end) >= target:
      return end
  return max(start + 1, latest_end + 1)


@njit
def _start_window(pickers, level, copy_elapsed, start, end, reduction):
  """The picker's `start_window(copy_elapsed, start, end, reduction)` for start >= -1 (a
  `StartWindow`)."""
  if pickers.count_picker:
    first = max(start, end - pickers.count_max)
    return StartWindow(first, end - pickers.count_min - 1, first, 1)
  rule = (
    pickers.prefix[level],
    pickers.min_ratio,
    pickers.preferred_ratio,
    pickers.max_elapsed[level],
    pickers.monotone[level],
  )
  earliest, latest, preferred = prefetch_window(
    rule, copy_elapsed, start, end, reduction, pickers.nest
  )
  return StartWindow(earliest, latest, preferred, pickers.num_explored)


@njit
def _trees(trees, output, r):
  """Resource r's trees (a `CopyTrees`) with its current budget and demand sum."""
  t = CopyTrees(*trees[r])
  total = output.sums[r, 0] + output.sums[r, 1]
  return CopyTrees(
    t.served, t.backlog, t.n_ops, t.queue, t.n_keys, t.owed, t.relative_tolerance, total
  )


@njit
def _has_enough(trees, output, r, start, end, resource):
  """`AsynchronousCopyResource.has_enough_resource` (never exact here)."""
  if resource == 0:
    return True
  return fits_tree(_trees(trees, output, r), start, end, resource)


@njit
def _add_copy(trees, output, r, start, end, resource):
  """`AsynchronousCopyResource.add_copy`: False when the copy does not fit (the Python loop
  raises there) or needs no trees' room (a negative demand: the resource would turn exact)."""
  if resource < 0 or not _has_enough(trees, output, r, start, end, resource):
    return False
  output.sums[r, 1] += resource
  if resource > 0 and start >= -1:
    resource_add(trees[r], start, end, resource)
  return True


@njit
def _has_room(heaps, scalars, chunks, state):
  """Whether every level's heap has room for `chunks` more chunks and `ROOM_ROWS` (and
  `ROOM_ROWS_PER_CHUNK` a chunk: `state[STATE_ROOM:]`) free rows in each row array, with no
  list waiting for room."""
  rows = state[STATE_ROOM] + state[STATE_ROOM + 1] * chunks
  for level in range(len(heaps)):
    index, lists, arrays, _ = heaps[level]
    pool, used = index[1], index[2]
    live_lists, rows4, rows2, meta = lists
    if scalars[level, H_COUNT] + chunks > arrays[1].shape[0]:
      return False
    if pool.shape[0] - used[0] < rows:
      return False
    if rows4.shape[0] - meta[0] < rows or rows2.shape[0] - meta[1] < rows:
      return False
    if meta[2] != 0 or meta[3] != 0:
      return False
  return True


@njit
def _new_segment(scratch, n, level, offset, start, end, reserved_end, prefetch_done):
  scratch[S_LEVEL, n], scratch[S_OFFSET, n], scratch[S_START, n] = level, offset, start
  scratch[S_END, n], scratch[S_RESERVED, n] = end, reserved_end
  scratch[S_PREFETCH, n] = prefetch_done
  scratch[S_EVICT_START, n], scratch[S_EVICT_DONE, n] = NO_COPY, NO_COPY


@njit
def _write_segments(output, b, n):
  """Appends the buffer's n segments to the output, in its segment list's order."""
  state, scratch, segments = output.state, output.scratch, output.segments
  row = state[STATE_ROWS]
  for s in range(n):
    segments[0, row] = b
    segments[1, row] = scratch[S_LEVEL, s]
    segments[2, row] = scratch[S_OFFSET, s]
    segments[3, row] = scratch[S_START, s]
    segments[4, row] = scratch[S_END, s]
    segments[5, row] = scratch[S_PREFETCH, s]
    segments[6, row] = scratch[S_EVICT_START, s]
    segments[7, row] = scratch[S_EVICT_DONE, s]
    row += 1
  state[STATE_ROWS] = row


@njit
def _first_keep(heaps, scalars, pickers, costs, start, use, size, uses):
  """`plan_keep` without a previous allocation: (level, offset, reserved end) of the best chunk
  of the fastest level that has one, level -1 when none."""
  for level in range(len(heaps)):
    if not _can_keep(pickers, level, start, use):
      continue
    heap = _search(heaps[level], scalars, level)
    found, offset, end_use = chunk_candidate(
      heap,
      _no_copy_bound(pickers, level),
      start,
      use,
      size,
      uses,
      costs.capacity[level],
      pickers.nest,
    )
    if found:
      return level, offset, end_use + 1
  return -1, 0, 0


@njit
def _unread_value(heaps, scalars, pickers, costs, output, b, size, def_op, single):
  """`_unread_value_step` with msa's choice: False when the heap was full."""
  state, scratch = output.state, output.scratch
  single[0] = def_op
  level, offset, reserved_end = _first_keep(
    heaps, scalars, pickers, costs, def_op, def_op, size, single
  )
  if level < 0:
    state[STATE_COUNTS + DEFAULT_USES] += 1
    return True
  if _heap_add(heaps[level], scalars, level, def_op, reserved_end, offset, size) < 0:
    return False
  _new_segment(scratch, 0, level, offset, def_op, def_op + 1, reserved_end, NO_COPY)
  _write_segments(output, b, 1)
  state[STATE_COUNTS + KEPT] += 1
  return True


@njit
def _plan_eviction(heaps, scalars, pickers, scratch, prev, copy_elapsed, size, use):
  """`plan_eviction`: the eviction's end, or NO_VALUE when refused (no limit here)."""
  level = scratch[S_LEVEL, prev]
  exclusive_start = scratch[S_START, prev]
  last_kept = scratch[S_END, prev] - 1
  reserved_end, offset = scratch[S_RESERVED, prev], scratch[S_OFFSET, prev]
  preferred = max(
    _preferred_eviction_end(pickers, level, copy_elapsed, exclusive_start, use), last_kept
  )
  end = min(preferred, use)
  while end > last_kept:
    if end <= reserved_end:
      break
    if _fits_at(heaps[level], scalars, level, reserved_end, end, size, offset):
      break
    end -= 1
  if end <= exclusive_start:
    return NO_VALUE
  return end


@njit
def _plan_prefetch(
  heaps, scalars, pickers, costs, trees, output, b, size, earliest, use, incidence, uses
):
  """`plan_all_prefetches`' levels with one start (msa's): (level, start, offset, end use) of
  the fastest level's first start that fits, level -1 when none."""
  copy_elapsed, resource = costs.copy[0, b], costs.copy[1, b]
  no_mask = np.zeros(0, np.bool_)
  for level in range(len(heaps)):
    reduction = costs.reductions[level, incidence]
    window = _start_window(pickers, level, copy_elapsed, earliest, use, reduction)
    request = PrefetchRequest(
      use,
      size,
      uses,
      costs.capacity[level],
      1,
      resource,
      costs.use_copy_resource,
      False,
      no_mask,
    )
    rows = plan_starts(
      window,
      request,
      _trees(trees, output, 0),
      _search(heaps[level], scalars, level),
      _no_copy_bound(pickers, level),
      pickers.nest,
    )
    if rows.shape[0] > 0:
      return level, rows[0, 0], rows[0, 1], rows[0, 2]
  return -1, 0, 0, 0


@njit
def _buffer(heaps, scalars, pickers, costs, trees, output, program, b):
  """`_buffer_steps` with msa's choice at every step: False when the loop must give up (a heap
  array full, or what the Python loop would refuse: a refused eviction, a copy that does not
  fit)."""
  state, scratch = output.state, output.scratch
  size = program.buffers[0, b]
  def_op = program.buffers[1, b]
  lo, hi = program.use_bounds[b], program.use_bounds[b + 1]
  uses = program.uses[0, lo:hi]
  incidences = program.uses[1, lo:hi]
  is_activation = def_op != -1
  copy_elapsed, resource = costs.copy[0, b], costs.copy[1, b]
  default_available = NO_VALUE if is_activation else -1
  prev = -1  # The previous allocation when in fast memory: its segment's column.
  prev_in_default = False
  segments = prefetches = evictions = kept = default_uses = 0
  segment_start = def_op
  for j in range(hi - lo):
    use, incidence = uses[j], incidences[j]
    # 1. Keep without a copy: the previous chunk extended to the use, or a new one.
    keep_level, keep_offset, keep_reserved = -1, 0, 0
    if prev >= 0:
      level = scratch[S_LEVEL, prev]
      if _can_keep(pickers, level, segment_start, use):
        reserved_end = scratch[S_RESERVED, prev]
        offset = scratch[S_OFFSET, prev]
        fits = True
        if use + 1 > reserved_end:
          if offset + size > costs.capacity[level] or not _fits_at(
            heaps[level], scalars, level, reserved_end, use + 1, size, offset
          ):
            fits = False
          else:
            reserved_end = use + 1
        if fits:
          keep_level, keep_offset, keep_reserved = level, offset, reserved_end
    elif not prev_in_default and is_activation:
      keep_level, keep_offset, keep_reserved = _first_keep(
        heaps, scalars, pickers, costs, segment_start, use, size, uses
      )
    if keep_level >= 0:
      level = keep_level
      if prev >= 0:
        if keep_reserved > scratch[S_RESERVED, prev]:
          handle = _heap_add(
            heaps[level],
            scalars,
            level,
            scratch[S_RESERVED, prev],
            keep_reserved,
            scratch[S_OFFSET, prev],
            size,
          )
          if handle < 0:
            return False
          scratch[S_RESERVED, prev] = keep_reserved
        scratch[S_END, prev] = max(scratch[S_END, prev], use + 1)
      else:
        handle = _heap_add(
          heaps[level], scalars, level, segment_start, keep_reserved, keep_offset, size
        )
        if handle < 0:
          return False
        _new_segment(
          scratch, segments, level, keep_offset, segment_start, use + 1, keep_reserved, NO_COPY
        )
        prev = segments
        segments += 1
      kept += 1
      segment_start = use
      continue
    # 2. Evict when the fast copy is the only one.
    needs_eviction = prev >= 0 and default_available == NO_VALUE
    eviction_end = NO_VALUE
    if needs_eviction:
      eviction_end = _plan_eviction(heaps, scalars, pickers, scratch, prev, copy_elapsed, size, use)
      if eviction_end == NO_VALUE:
        # Refused only by an outstanding-eviction limit, which this loop does not run: the
        # produced segment ends after its first use, so the eviction always has an op to run in.
        return False
      available = eviction_end
    else:
      available = def_op if default_available == NO_VALUE else default_available
    # 3. Prefetch: from when default memory holds the value, after the buffer's last segment
    # (and the eviction, holding its chunk until done).
    earliest = available
    if segments > 0:
      last_end = scratch[S_END, segments - 1]
      if eviction_end != NO_VALUE:
        last_end = max(last_end, eviction_end)
      earliest = max(earliest, last_end - 1)
    held = -1
    if eviction_end != NO_VALUE and eviction_end > scratch[S_RESERVED, prev]:
      level = scratch[S_LEVEL, prev]
      held = _heap_add(
        heaps[level],
        scalars,
        level,
        scratch[S_RESERVED, prev],
        eviction_end,
        scratch[S_OFFSET, prev],
        size,
      )
      if held < 0:
        return False
    fetch_level, start, offset, end_use = _plan_prefetch(
      heaps, scalars, pickers, costs, trees, output, b, size, earliest, use, incidence, uses
    )
    if held >= 0:
      level = scratch[S_LEVEL, prev]
      _heap_remove(heaps[level], scalars, level, held)
    # Commit: the eviction, then the prefetch or default memory.
    if needs_eviction:
      level = scratch[S_LEVEL, prev]
      exclusive_start = scratch[S_START, prev]
      end = eviction_end
      if end > scratch[S_RESERVED, prev]:
        handle = _heap_add(
          heaps[level],
          scalars,
          level,
          scratch[S_RESERVED, prev],
          end,
          scratch[S_OFFSET, prev],
          size,
        )
        if handle < 0:
          return False
        scratch[S_RESERVED, prev] = end
      scratch[S_END, prev] = max(scratch[S_END, prev], end)
      scratch[S_EVICT_START, prev], scratch[S_EVICT_DONE, prev] = exclusive_start + 1, end
      charged = resource
      if not _has_enough(trees, output, 1, exclusive_start, end, charged):
        charged = 0.0  # XLA's last retry charges nothing.
      if not _add_copy(trees, output, 1, exclusive_start, end, charged):
        return False
      evictions += 1
      default_available = end
    elif default_available == NO_VALUE:
      default_available = def_op  # Produced in default memory.
    if fetch_level >= 0:
      level = fetch_level
      if _heap_add(heaps[level], scalars, level, start + 1, end_use + 1, offset, size) < 0:
        return False
      if costs.use_copy_resource and not _add_copy(trees, output, 0, start, use, resource):
        return False
      prefetches += 1
      _new_segment(scratch, segments, level, offset, start + 1, use + 1, end_use + 1, use)
      prev = segments
      segments += 1
      prev_in_default = False
    else:
      prev = -1
      prev_in_default = True
      default_uses += 1
    segment_start = use
  state[STATE_COUNTS + KEPT] += kept
  state[STATE_COUNTS + DEFAULT_USES] += default_uses
  state[STATE_COUNTS + PREFETCHES] += prefetches
  state[STATE_COUNTS + EVICTIONS] += evictions
  _write_segments(output, b, segments)
  return True


@njit
def run_loop(program, costs, pickers, heaps, scalars, trees, output):
  """msa's own steps over the buffers from `output.state[STATE_NEXT]` on: DONE, NEEDS_ROOM
  (the next buffer needs room for `state[STATE_NEEDED]` chunks first) or ABORTED."""
  program, costs, pickers = LoopProgram(*program), LoopCosts(*costs), LoopPickers(*pickers)
  output = LoopOutput(*output)
  state = output.state
  single = np.zeros(1, np.int64)
  order = program.order
  for i in range(state[STATE_NEXT], order.shape[0]):
    b = order[i]
    needed = 3 * (program.use_bounds[b + 1] - program.use_bounds[b]) + 2
    if not _has_room(heaps, scalars, needed, state):
      state[STATE_NEXT], state[STATE_NEEDED] = i, needed
      return NEEDS_ROOM
    if program.use_bounds[b + 1] == program.use_bounds[b]:
      def_op = program.buffers[1, b]
      if def_op == -1:
        continue
      size = program.buffers[0, b]
      done = _unread_value(heaps, scalars, pickers, costs, output, b, size, def_op, single)
    else:
      done = _buffer(heaps, scalars, pickers, costs, trees, output, program, b)
    if not done:
      state[STATE_NEXT] = i
      return ABORTED
  state[STATE_NEXT] = order.shape[0]
  return DONE
