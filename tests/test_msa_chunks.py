"""msa's best-fit chunk search (env/msa/chunks.py: `ChunkHeap`, `find_best_chunk_candidate`) on
XLA's heap simulator tests, and its jitted twin.

Cases named after an XLA test reproduce it (openxla/xla, `xla/service/heap_simulator/`
`heap_simulator_test.cc`); the others are worked by hand.
"""

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from malloczero.env.msa import (
  ChunkHeap,
  CostAnalysisPrefetchIntervalPicker,
  InstructionCountPrefetchIntervalPicker,
  find_best_chunk_candidate,
)


def test_chunk_candidate():
  """XLA's GlobalDecreasingSizeBestFitHeapTest.ChunkCandidate (heap_simulator_test.cc; its
  intervals are inclusive [start, end], here [start, end + 1)): buffers a..g placed one after
  the other with and without preferred offsets; each (offset, heap size) as XLA expects."""
  heap = ChunkHeap(alignment=1)
  steps = [  # size, start, inclusive end, preferred offset, expected offset, heap size
    (5, 6, 10, 5, 5, 10),  # a: preferred offset 5 is free
    (10, 3, 5, None, 0, 10),  # b
    (5, 2, 8, None, 10, 15),  # c: above a and b
    (5, 0, 2, 10, 0, 15),  # d: 10 is taken by c, best fit below it
    (10, 11, 13, 10, 10, 20),  # e: preferred 10 is free then
    (5, 3, 5, 20, 20, 25),  # f: preferred 20
    (10, 4, 8, 15, 25, 35),  # g: 15 is taken (c below, f above: 5 bytes), so above f
  ]
  for size, start, end, preferred, offset, heap_size in steps:
    assert heap.find_chunk(start, end + 1, size, preferred) == offset
    heap.add(start, end + 1, offset, size)
    assert heap.heap_size == heap_size


def test_best_fit_smallest_free_range_then_lower_offset_then_the_top():
  heap = ChunkHeap(alignment=8)
  heap.add(0, 10, 0, 16)  # [0, 16)
  heap.add(0, 10, 40, 8)  # gap [16, 40): 24 bytes
  heap.add(0, 10, 60, 4)  # gap [48, 60): 12; the chunk's end 64 rounds to 64
  heap.add(0, 10, 80, 8)  # gap [64, 80): 16
  heap.add(20, 30, 16, 100)  # not live over [0, 10)
  free_start, free_end = heap.free_chunks(0, 10, 1)
  assert free_start.tolist() == [16, 48, 64, 88]
  assert free_end[:3].tolist() == [40, 60, 80] and free_end[3] == np.iinfo(np.int64).max
  assert heap.find_chunk(0, 10, 12) == 48  # the 12-byte range fits exactly
  assert heap.find_chunk(0, 10, 13) == 64  # 16 is the smallest that holds 13
  assert heap.find_chunk(0, 10, 24) == 16
  assert heap.find_chunk(0, 10, 25) == 88  # nothing bounded fits: above every chunk
  assert heap.find_chunk_within(0, 10, 25, max_size=112) is None
  assert heap.find_chunk_within(0, 10, 24, max_size=112) == 16
  heap.add(5, 6, 16, 8)
  assert heap.find_chunk(0, 10, 16) == 24  # [24, 40) ties with [64, 80): the lower
  assert heap.find_chunk(0, 4, 24) == 16  # over [0, 4) the new chunk is not live
  # A preferred offset is taken only where the buffer fits and the offset is aligned.
  assert heap.find_chunk(0, 10, 8, preferred_offset=72) == 72
  assert heap.find_chunk(0, 10, 8, preferred_offset=76) == 48  # unaligned: best fit, 12 bytes
  assert heap.find_chunk(0, 10, 8, preferred_offset=0) == 48  # taken


def test_ties_go_to_the_lower_offset_and_removal_frees_the_range():
  heap = ChunkHeap()
  a = heap.add(0, 5, 0, 10)
  heap.add(0, 5, 20, 10)  # gaps [10, 20) and [30, 40) both 10 bytes
  heap.add(0, 5, 40, 10)
  assert heap.find_chunk(0, 5, 10) == 10
  heap.remove(a)
  assert heap.find_chunk(0, 5, 10) == 30  # [0, 20) is free again, but larger
  assert heap.find_chunk(0, 5, 20) == 0
  assert len(heap) == 2 and heap.heap_size == 50
  with pytest.raises(KeyError):
    heap.remove(a)


def test_best_chunk_candidate_extends_the_end_to_later_uses_while_it_fits():
  """FindBestChunkCandidates: a buffer used at 2, 5, 9 and 20, allocated from 0 for the use at 2;
  a 100-byte chunk occupies the 128-byte memory from op 12, so the chunk found for the use at 9
  is the latest one that fits (the binary search tries 5, then 9, then 20: too late)."""
  heap = ChunkHeap(alignment=8)
  heap.add(12, 30, 0, 100)
  keep = lambda a, b: True
  found = find_best_chunk_candidate(heap, 0, 2, 48, [2, 5, 9, 20], 128, keep)
  assert (found.offset, found.size, found.end_use) == (0, 48, 9)
  # The no-copy rule stops the extension: the gap from 5 to 9 is too long to keep it.
  stop = lambda a, b: b - a < 4
  assert find_best_chunk_candidate(heap, 0, 2, 48, [2, 5, 9, 20], 128, stop).end_use == 5
  # Starting from the use at 9, only 9 itself and later uses are candidates.
  assert find_best_chunk_candidate(heap, 0, 9, 48, [2, 5, 9, 20], 128, keep).end_use == 9
  # Nothing fits, even until the requested use.
  assert find_best_chunk_candidate(heap, 0, 20, 48, [2, 5, 9, 20], 128, keep) is None
  # With a preferred offset (the previous allocation's), only that offset, and no extension.
  assert find_best_chunk_candidate(heap, 0, 5, 16, [2, 5, 9], 128, keep, 96).end_use == 5
  assert find_best_chunk_candidate(heap, 0, 20, 16, [2, 20], 128, keep, 96) is None  # the chunk
  assert find_best_chunk_candidate(heap, 0, 20, 16, [2, 20], 128, keep, 104).offset == 104
  assert find_best_chunk_candidate(heap, 0, 5, 32, [2, 5, 9], 128, keep, 104) is None  # > 128
  with pytest.raises(ValueError):
    find_best_chunk_candidate(heap, 0, 21, 16, [2, 20], 128, keep)


@given(
  st.lists(
    st.tuples(st.integers(0, 30), st.integers(1, 12), st.integers(1, 100), st.integers(0, 12)),
    max_size=30,
  ),
  st.lists(st.integers(0, 40), min_size=1, max_size=8, unique=True),
  st.integers(-1, 40),
  st.integers(1, 80),
  st.integers(40, 300),
  st.sampled_from([1, 8]),
  st.lists(st.floats(0.0, 5.0), min_size=41, max_size=41),
  st.floats(0.0, 30.0),
  st.booleans(),
)
def test_jitted_best_chunk_candidate_matches_find_best_chunk_candidate(
  chunks, uses, start, size, max_size, alignment, elapsed, memory_copy, count_picker
):
  """The jitted `FindBestChunkCandidates` scan (tests/msa_reference_kernels.py, the reference of
  the indexed one msa's loop runs) finds the chunk `find_best_chunk_candidate` finds, with either
  picker's no-copy rule."""
  from tests.msa_reference_kernels import best_chunk_candidate

  heap = ChunkHeap(alignment)
  for i, (chunk_start, length, chunk_size, slot) in enumerate(chunks):
    handle = heap.add(chunk_start, chunk_start + length, slot * alignment * 4, chunk_size)
    if i % 5 == 4:
      heap.remove(handle)
  uses = np.array(sorted(uses), np.int64)
  end_use = int(uses[len(uses) // 2])
  picker = (
    InstructionCountPrefetchIntervalPicker(2, 10)
    if count_picker
    else CostAnalysisPrefetchIntervalPicker(np.array(elapsed), memory_copy)
  )
  expected = find_best_chunk_candidate(
    heap,
    start,
    end_use,
    size,
    uses.tolist(),
    max_size,
    picker.can_allocate_in_alternate_memory_no_copy,
  )
  found, offset, end = best_chunk_candidate(
    heap.kernel_state(), picker.kernel_state(), start, end_use, size, uses, max_size
  )
  assert (found, offset, end) == (
    (False, 0, 0) if expected is None else (True, expected.offset, expected.end_use)
  )


@given(
  st.lists(
    st.tuples(
      st.integers(0, 30),
      st.integers(1, 12),
      st.integers(1, 100),
      st.booleans(),
      st.integers(0, 120),
    ),
    max_size=40,
  ),
  st.sampled_from([1, 8, 64]),
)
def test_chunk_search_never_overlaps_and_is_best_fit(requests, alignment):
  heap = ChunkHeap(alignment)
  placed = []
  for start, length, size, use_preferred, preferred in requests:
    end = start + length
    free_start, free_end = heap.free_chunks(start, end, size)
    offset = heap.find_chunk(start, end, size, preferred * alignment if use_preferred else None)
    assert offset % alignment == 0
    if not (use_preferred and offset == preferred * alignment):
      # Best fit: no free range that holds the buffer is smaller than the one chosen.
      chosen = np.flatnonzero(free_start == offset)
      assert len(chosen) == 1
      lengths = free_end - free_start
      assert lengths[chosen[0]] == lengths.min()
    for s, e, o, z in placed:
      assert not (s < end and start < e and o < offset + size and offset < o + z)
    heap.add(start, end, offset, size)
    placed.append((start, end, offset, size))
