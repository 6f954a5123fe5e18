"""msa's prefetch interval pickers (env/msa/interval_picker.py) and the jitted prefetch loop's
walk of their starts, on XLA's own tests.

Cases named after an XLA test reproduce it (openxla/xla,
`xla/service/memory_space_assignment/` `prefetch_interval_picker_test.cc`,
`memory_space_assignment_test.cc`); the others are worked by hand, with XLA's test hardware where a
workload is needed (tests/msa_xla_cases.py).
"""

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from malloczero.env.msa import (
  ChunkHeap,
  CostAnalysis,
  CostAnalysisPrefetchIntervalPicker,
  InstructionCountPrefetchIntervalPicker,
  PrefetchIntervalOptions,
)
from malloczero.env.msa.copy_resource import AsynchronousCopyResource
from malloczero.env.msa.interval_picker import PrefetchIntervalIterator
from malloczero.env.msa.kernels import prefetch
from tests.msa_xla_cases import XLA_HW, program


def fake_picker(op_elapsed, max_ratio: float) -> CostAnalysisPrefetchIntervalPicker:
  """XLA's FakeCostAnalysis: the given elapsed per logical time, every copy (of the 32-byte
  memory too) 3 s; ratios min 1, preferred 2, max `max_ratio`."""
  return CostAnalysisPrefetchIntervalPicker(
    np.asarray(op_elapsed, float),
    memory_copy_elapsed=3.0,
    options=PrefetchIntervalOptions(1.0, 2.0, max_ratio),
  )


def test_prefetch_interval_order():
  """XLA's PrefetchIntervalOrder: param0 at time 0, negates a..u at 1..21, the root add at 22
  uses param0; every op 1 s, the copy 3 s, the add 0.5 s faster with param0 in alternate.
  The preferred start 15 (elapsed 6 = 2 x copy) first, then alternately later and earlier until
  the min ratio (18: elapsed 3 + 0.5 >= 3) and the max ratio (9: elapsed 12 = 4 x 3)."""
  picker = fake_picker(np.ones(23), max_ratio=4.0)
  it = picker.begin(copy_elapsed=3.0, start=0, end=22, use_elapsed_reduction=0.5)
  order = []
  while not it.done():
    order.append(it.next())
  assert order == [15, 16, 14, 17, 13, 18, 12, 11, 10, 9]
  assert it.latest_time == 18
  with pytest.raises(StopIteration):
    it.next()
  # Too little time between start and use: no interval at all.
  assert picker.begin(3.0, start=19, end=22, use_elapsed_reduction=0.5).done()
  assert picker.start_times(3.0, 19, 22, 0.5) == []


def test_earliest_latest_window_too_small():
  """XLA's EarliestLatestWindowTooSmall: param0, negate (1), tanh (2, elapsed 20), add (3) of
  tanh and negate. For the add's use of negate, earliest and latest fall on the long op; the
  only start offered is 1, just before it."""
  picker = fake_picker([1.0, 1.0, 20.0, 1.0], max_ratio=12.0)
  it = picker.begin(3.0, start=1, end=3, use_elapsed_reduction=0.5)
  assert not it.done()
  assert it.next() == 1
  assert it.done()


def test_picker_on_a_cost_analysis_counts_op_zero_from_program_start():
  """The same chain as PrefetchIntervalOrder as a workload (21 negates of f32[2,4], then the add
  of the last one and p0) on XLA's test hardware: every negate 64 B / 100 B/s = 0.64 s, the
  copy of p0 0.32 s, the add 0.288 s faster with p0 in alternate memory. Latest start 20 (0 +
  0.288 >= 0.8 x 0.32), preferred 19 (0.64 closest to 1.5 x 0.32), earliest 0: from program
  start (-1) the 21 negates take 13.44 s > 10 x 1.32 s (the copy time of a 134-byte memory,
  measured as XLA does on s32[134 / 4]: 132 bytes), from 0 the 20 after op 0 take 12.8 s."""
  ops = [(f"negate{i}", 8.0) for i in range(21)] + [("add", 8.0)]
  buffers = [{"name": "p0", "size": 32, "def": None, "uses": [0, 21], "kind": "parameter"}]
  buffers += [
    {"name": f"n{i}", "size": 32, "def": i, "uses": [i + 1], "kind": "activation"}
    for i in range(20)
  ]
  buffers += [
    {"name": "n20", "size": 32, "def": 20, "uses": [21], "kind": "activation"},
    {"name": "v", "size": 32, "def": 21, "uses": [], "kind": "output"},
  ]
  w = program(ops, buffers)
  ca = CostAnalysis(w, XLA_HW)
  picker = CostAnalysisPrefetchIntervalPicker.from_cost_analysis(ca, 134)
  assert picker.max_async_copy_elapsed == pytest.approx(13.2)
  use = ca.buffer_incidences(0).start + 1  # p0's use by the add
  assert ca.use_elapsed_reduction[use] == pytest.approx(0.288)
  copy = ca.async_copy_elapsed(32)
  window = picker.window(copy, -1, 21, ca.use_elapsed_reduction[use])
  assert (window.earliest, window.latest, window.preferred) == (0, 20, 19)
  assert picker.start_times(copy, -1, 21, ca.use_elapsed_reduction[use]) == [19, 20] + list(
    range(18, -1, -1)
  )
  assert picker.logical_interval_elapsed(-1, 21) == pytest.approx(21 * 0.64)


def test_live_range_too_long_and_eviction_end():
  """CanAllocateInAlternateMemoryNoCopy refuses an interval whose elapsed time reaches max_ratio
  x the whole memory's copy time (here 10 x 1.28 s = 12.8 s); PreferredEvictionEndTime is the
  first end covering preferred_ratio x the copy time."""
  picker = CostAnalysisPrefetchIntervalPicker(np.full(40, 0.64), memory_copy_elapsed=1.28)
  assert picker.can_allocate_in_alternate_memory_no_copy(0, 20)  # 19 ops: 12.16 s
  assert not picker.can_allocate_in_alternate_memory_no_copy(0, 21)  # 20 ops: 12.8 s
  assert picker.can_allocate_in_alternate_memory_no_copy(5, 5)
  # An eviction copying 0.48 s wants 0.72 s of ops: two of them after the start.
  assert picker.preferred_eviction_end_time(0.48, start=3, latest_end=30) == 6
  assert picker.preferred_eviction_end_time(0.48, start=3, latest_end=4) == 5
  assert picker.estimated_prefetch_end_time(0.48, start=3, end=30) == 5
  assert picker.estimated_prefetch_end_time(10.0, start=3, end=8) == 8


def test_earlier_starts_are_thinned_once_later_ones_run_out():
  """With many short ops the earlier side moves by at least 1/100 of the window's elapsed time
  per step (XLA's kNumExploredDecreasingIntervals): ops of 1 s, a copy of 100 s, a use at
  1000: latest 899 (100 s), preferred 799 (200 s), earliest 0 (999 s <= 10000 s)."""
  picker = CostAnalysisPrefetchIntervalPicker(
    np.ones(1001), memory_copy_elapsed=10000.0, options=PrefetchIntervalOptions(1.0, 2.0, 1.0)
  )
  starts = picker.start_times(copy_elapsed=100.0, start=0, end=1000)
  window = picker.window(100.0, 0, 1000)
  assert (window.earliest, window.latest, window.preferred) == (0, 899, 799)
  assert starts[:3] == [799, 800, 798]
  assert len(starts) < 2 * 100 + 110
  later_done = starts.index(899)
  tail = starts[later_done + 2 :]
  gaps = [
    picker.logical_interval_elapsed(b, 1000) - picker.logical_interval_elapsed(a, 1000)
    for a, b in zip(tail, tail[1:])
  ]
  assert min(gaps) >= 999 / 100


def test_instruction_count_picker():
  """XLA's InstructionCountPrefetchIntervalPicker(2, 10), AssignMemorySpace's default in
  memory_space_assignment_test.cc: a use at 22 may be prefetched from 12 (10 ops before) to 19
  (Done once only 2 ops remain); one at 5 from the program start; keeping without a copy up to
  10 ops; an eviction 2 ops long."""
  picker = InstructionCountPrefetchIntervalPicker(2, 10)
  assert picker.start_times(0.0, 0, 22) == list(range(12, 20))
  assert picker.begin(0.0, 0, 22).latest_time == 19
  assert picker.start_times(0.0, -1, 5) == [-1, 0, 1, 2]
  assert picker.start_times(0.0, 3, 5) == []
  assert picker.can_allocate_in_alternate_memory_no_copy(0, 10)
  assert not picker.can_allocate_in_alternate_memory_no_copy(0, 11)
  assert picker.preferred_eviction_end_time(0.0, 4, 30) == 6
  assert picker.preferred_eviction_end_time(0.0, 4, 5) == 5
  assert picker.logical_interval_elapsed(3, 7) == 3.0


@given(
  st.lists(st.floats(0.0, 10.0), min_size=1, max_size=40),
  st.floats(0.01, 20.0),
  st.floats(0.0, 5.0),
  st.floats(0.1, 2.0),
  st.floats(1.0, 4.0),
  st.floats(0.0, 50.0),
  st.data(),
)
def test_picker_yields_each_start_once_within_its_window(
  elapsed, copy, reduction, min_ratio, preferred_ratio, memory_copy, data
):
  picker = CostAnalysisPrefetchIntervalPicker(
    np.array(elapsed), memory_copy, PrefetchIntervalOptions(min_ratio, preferred_ratio, 1.0)
  )
  end = data.draw(st.integers(0, len(elapsed) - 1))
  start = data.draw(st.integers(-1, end))
  window = picker.window(copy, start, end, reduction)
  starts = picker.start_times(copy, start, end, reduction)
  assert len(starts) == len(set(starts))
  assert all(window.earliest <= s <= window.latest for s in starts)
  if window.empty:
    assert starts == []
    return
  assert starts[0] == window.preferred
  # Every later start is tried; earlier ones may be thinned away (zero-time ops), not later ones.
  assert set(range(window.preferred, window.latest + 1)) <= set(starts)
  # Latest: the min-ratio rule holds there and at no later start.
  rule = lambda s: picker.logical_interval_elapsed(s, end) + reduction >= min_ratio * copy
  assert rule(window.latest)
  assert not any(rule(s) for s in range(window.latest + 1, end))


def every_start_the_prefetch_loop_walks(
  picker, copy: float, start: int, end: int, reduction: float
):
  """The starts `plan_prefetch_starts` tries, in its order: on an empty heap with the copy
  resource unchecked every start passes, so it returns them all (up to a large `max_starts`)."""
  request = (end, 1, np.array([end]), 1 << 40, 10_000, 0.0, False, False, np.zeros(0, bool))
  rows = prefetch.plan_prefetch_starts(
    picker.start_window(copy, start, end, reduction),
    request,
    AsynchronousCopyResource(np.ones(end + 1)).kernel_state(),
    *ChunkHeap(1).search_state(),
    picker.kernel_state(),
    picker.nest_state(),
  )
  return rows[:, 0].tolist()


@given(
  st.lists(st.floats(0.0, 10.0), min_size=1, max_size=40),
  st.floats(0.01, 20.0),
  st.floats(0.0, 5.0),
  st.floats(0.1, 2.0),
  st.floats(1.0, 4.0),
  st.floats(0.0, 50.0),
  st.integers(1, 10),
  st.data(),
)
def test_picker_jitted_window_and_starts_match_the_reference(
  elapsed, copy, reduction, min_ratio, preferred_ratio, memory_copy, explored, data
):
  """The jitted window and start sequence (what msa's loop runs) equal the numpy searches and
  the `Next` / `Done` iterator they replace, start for start."""
  picker = CostAnalysisPrefetchIntervalPicker(
    np.array(elapsed),
    memory_copy,
    PrefetchIntervalOptions(min_ratio, preferred_ratio, 1.0, explored),
  )
  end = data.draw(st.integers(0, len(elapsed) - 1))
  start = data.draw(st.integers(-1, end))
  latest = picker.latest_prefetch_start_time(copy, start, end, reduction)
  window = picker.window(copy, start, end, reduction)
  assert window.latest == latest
  # The numpy path: a preferred time past the latest is ignored, so it recomputes the window.
  assert picker.window(copy, start, end, reduction, preferred_time=end + 1) == window
  expected = list(PrefetchIntervalIterator(picker, window, end))
  assert picker.start_times(copy, start, end, reduction) == expected
  # msa's prefetch loop makes them one at a time as it goes, in the same order.
  assert every_start_the_prefetch_loop_walks(picker, copy, start, end, reduction) == expected


@pytest.mark.parametrize("explored, tried", [(1, 9), (2, 10), (5, 12)])
def test_the_prefetch_loop_thins_the_earlier_starts_as_the_picker(explored, tried):
  """A long window, its later side used up first: the earlier side thinned to 1/`explored` of
  its elapsed time (of the window's 37 starts, `tried` are)."""
  picker = CostAnalysisPrefetchIntervalPicker(
    np.ones(40), 50.0, PrefetchIntervalOptions(0.5, 1.5, 1.0, explored)
  )
  expected = picker.start_times(4.0, 0, 39)
  assert len(expected) == tried
  assert every_start_the_prefetch_loop_walks(picker, 4.0, 0, 39, 0.0) == expected


@pytest.mark.parametrize("start, end", [(0, 22), (-1, 5), (3, 5), (10, 11), (0, 1)])
def test_the_prefetch_loop_walks_the_instruction_count_pickers_starts(start, end):
  picker = InstructionCountPrefetchIntervalPicker(2, 10)
  expected = picker.start_times(0.0, start, end)
  assert every_start_the_prefetch_loop_walks(picker, 0.0, start, end, 0.0) == expected
