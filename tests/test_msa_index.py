"""msa's indexed searches (env/msa/chunks.py's time index, copy_resource.py's trees) against
the whole-heap scans (tests/msa_reference_kernels.py) and the op-by-op queue they replace: the
same answers on random heaps and copy sets, removals and a growing span of start times
included."""

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from malloczero.env.msa import AsyncCopy, AsynchronousCopyResource, ChunkHeap
from malloczero.env.msa.chunks import _POOL_WIDTH
from malloczero.env.msa.kernels import chunk_index, live_lists, prefetch
from tests import msa_reference_kernels as reference

_chunks = st.lists(
  st.tuples(
    st.integers(-1, 300),  # start
    st.integers(1, 200),  # length
    st.integers(0, 40),  # offset slot
    st.integers(1, 100),  # size
    st.booleans(),  # removed again
  ),
  max_size=60,
)


def test_the_pool_width_is_the_kernels():
  assert _POOL_WIDTH == chunk_index.POOL_WIDTH


@settings(max_examples=150, deadline=None)
@given(
  _chunks,
  st.lists(st.tuples(st.integers(-2, 520), st.integers(1, 300), st.integers(0, 120)), max_size=12),
  st.sampled_from([1, 8, 64]),
)
def test_indexed_searches_find_what_the_whole_heap_scan_finds(chunks, queries, alignment):
  heap = ChunkHeap(alignment)
  for start, length, slot, size, removed in chunks:
    handle = heap.add(start, start + length, slot * 16, size)
    if removed:
      heap.remove(handle)
  state = heap.kernel_state()
  for start, length, size in queries:
    end = start + length
    assert live_lists.best_fit_indexed(
      *heap.search_state(), start, end, size
    ) == reference.best_fit(state, start, end, size)
    for offset in (0, alignment, size * alignment, 16 * alignment):
      assert chunk_index.fits_at_indexed(heap.search_state()[0], start, end, size, offset) == (
        reference.fits_at(state, start, end, size, offset)
      )


@settings(max_examples=100, deadline=None)
@given(
  _chunks,
  st.lists(st.integers(0, 500), min_size=1, max_size=10, unique=True),
  st.integers(-1, 200),
  st.integers(1, 100),
  st.integers(40, 900),
  st.booleans(),
)
def test_the_indexed_chunk_candidate_is_the_scanned_one(
  chunks, uses, start, size, max_size, count_picker
):
  heap = ChunkHeap(8)
  for chunk_start, length, slot, chunk_size, removed in chunks:
    handle = heap.add(chunk_start, chunk_start + length, slot * 16, chunk_size)
    if removed:
      heap.remove(handle)
  uses = np.array(sorted(uses), np.int64)
  end_use = int(uses[len(uses) // 2])
  picker = (count_picker, np.linspace(0.0, 50.0, 502), 30.0, 60)
  scanned = reference.best_chunk_candidate(
    heap.kernel_state(), picker, start, end_use, size, uses, max_size
  )
  indexed = live_lists.best_chunk_candidate_indexed(
    *heap.search_state(), picker, start, end_use, size, uses, max_size
  )
  assert scanned == indexed


@settings(max_examples=150, deadline=None)
@given(
  st.lists(st.integers(0, 32).map(lambda q: q / 4), min_size=1, max_size=30),
  st.lists(
    st.tuples(
      st.integers(-1, 31),
      st.integers(1, 12),
      st.integers(0, 24).map(lambda q: q / 4),
      st.booleans(),
    ),
    max_size=25,
  ),
)
def test_the_resource_trees_answer_as_the_op_by_op_queue(budgets, specs):
  """Copies added when they fit and some removed again: every check on the trees agrees with
  the queue rebuilt op by op (`_exact_fits`). Quarters, so that both sum exactly (the trees
  sum in another order, within the tolerance of the queue's sums)."""
  resource = AsynchronousCopyResource(budgets)
  added = []
  for i, (start, length, demand, remove_one) in enumerate(specs):
    end = start + length
    fits = resource.has_enough_resource(start, end, demand)
    assert fits == (demand == 0 or resource._exact_fits(start, end, demand))
    if fits:
      copy = AsyncCopy(start, end, demand, i)
      resource.add_copy(copy)
      added.append(copy)
    if remove_one and added:
      resource.remove_copy(added.pop(len(added) // 2))
  assert not resource.exact
  for start in range(-1, len(budgets)):
    for end in (start + 2, start + 5, len(budgets)):
      for demand in (0.5, 2.0):
        assert resource.has_enough_resource(start, end, demand) == resource._exact_fits(
          start, end, demand
        )
  for copy in added:
    resource.remove_copy(copy)
  np.testing.assert_array_equal(resource.current_resources(), budgets)


def test_a_copy_the_trees_cannot_hold_makes_the_checks_rebuild_the_queue():
  resource = AsynchronousCopyResource([2.0] * 6)
  resource.add_copy(AsyncCopy(-3, 3, 2.0, 0))  # Starts before -1: serves from op 0, as -1.
  assert resource.exact
  assert not resource.has_enough_resource(-1, 2, 3.0)  # 2 + 3 > 4 by op 1
  assert resource.has_enough_resource(-1, 3, 2.0)


@settings(max_examples=200, deadline=None)
@given(
  st.lists(st.sampled_from([0.0, 0.0, 0.25, 1.0, 1.5, 3.0, 1e-3]), min_size=1, max_size=40),
  st.integers(-1, 40),
  st.integers(0, 40),
  st.sampled_from([0.0, 0.5, 1.0, 2.0, 7.0]),
  st.sampled_from([0.0, 0.5, 2.0]),
  st.sampled_from([1.0, 4.0, 30.0]),
)
def test_the_picker_bisects_to_the_starts_and_ends_its_scans_find(
  elapsed, start, end, copy_elapsed, reduction, memory_copy
):
  """With no negative elapsed time the window and the eviction end are bisected; zeros make
  runs of equal elapsed times, where the scans take the earliest."""
  from malloczero.env.msa import CostAnalysisPrefetchIntervalPicker

  picker = CostAnalysisPrefetchIntervalPicker(np.array(elapsed), memory_copy)
  assert picker.monotone
  end = min(end, len(elapsed))
  rule = (picker.prefix, 0.8, 1.5, picker.max_async_copy_elapsed, True)
  args = (copy_elapsed, start, end, reduction)
  assert prefetch.prefetch_window(rule, *args) == prefetch.prefetch_window_scan(rule, *args)
  bisected = picker.preferred_eviction_end_time(copy_elapsed, start, end)
  picker.monotone = False
  assert bisected == picker.preferred_eviction_end_time(copy_elapsed, start, end)


@settings(max_examples=150, deadline=None)
@given(
  st.lists(
    st.tuples(
      st.sampled_from(["add", "add", "remove", "query"]),
      st.integers(-1, 3000),  # start
      st.sampled_from([1, 30, 300, 3000]),  # longest length
      st.integers(0, 1 << 20),  # length, offset slot, size (drawn from it)
    ),
    min_size=1,
    max_size=120,
  ),
  st.sampled_from([1, 8, 64]),
)
def test_the_live_lists_answer_as_the_scan_as_chunks_come_and_go(operations, alignment):
  """Searches between commits and removals, over spans of many blocks: the live lists' unions
  (edges, starts, level runs; brought up to date at each search) give the scan's best fit and
  chunk candidate."""
  heap = ChunkHeap(alignment)
  handles = []
  for kind, start, longest, draw in operations:
    length = 1 + draw % longest
    if kind == "add":
      handles.append(heap.add(start, start + length, (draw % 61) * 4 * alignment, 1 + draw % 300))
    elif kind == "remove" and handles:
      heap.remove(handles.pop(draw % len(handles)))
    elif kind == "query":
      if handles and draw % 2:  # Where a chunk ends or starts: the edges of liveness.
        chunk = handles[draw % len(handles)]
        start = int((heap._end if draw % 4 == 1 else heap._start)[chunk])
      start, size = max(start, 0), 1 + draw % 400
      assert live_lists.best_fit_indexed(*heap.search_state(), start, start + length, size) == (
        reference.best_fit(heap.kernel_state(), start, start + length, size)
      )
      uses = np.array([start + length, start + 2 * length, start + 5 * length], np.int64)
      picker = (True, np.zeros(1, np.float64), 0.0, 10 * length)
      args = (start, start + length, size, uses, 61 * 4 * alignment + 150)
      assert live_lists.best_chunk_candidate_indexed(
        *heap.search_state(), picker, *args
      ) == reference.best_chunk_candidate(heap.kernel_state(), picker, *args)


def test_the_kernels_state_tuples_are_short_enough_for_numbas_type_cache():
  """numba's dispatch caches an argument's type by a fingerprint only while it is under 40 bytes
  (env/msa/kernels/__init__.py); a longer tuple is typed in Python on every call, 0.1 ms each, as
  slow as the rest of msa's step together."""
  from numba._dispatcher import compute_fingerprint

  from malloczero.env.msa import CostAnalysisPrefetchIntervalPicker

  heap = ChunkHeap(8)
  heap.add(0, 10, 0, 64)
  picker = CostAnalysisPrefetchIntervalPicker(np.ones(20), 4.0)
  states = {
    **dict(zip(("index", "lists", "chunks", "scratch"), heap.search_state())),
    "trees": AsynchronousCopyResource(np.ones(20)).kernel_state(),
    "picker": picker.kernel_state(),
    "window": picker.start_window(1.0, 0, 10),
    "request": (10, 64, np.arange(3), 1 << 20, 4, 1.0, True, False, np.zeros(0, bool)),
  }
  for name, state in states.items():
    assert len(compute_fingerprint(state)) < 40, name
