"""The building blocks of XLA's memory-space assignment (env/msa/), on XLA's own tests.

Cases named after an XLA test reproduce it (openxla/xla, `xla/service/memory_space_assignment/`
`prefetch_interval_picker_test.cc`, `memory_space_assignment_test.cc`); the others are worked by
hand, with XLA's test hardware where a workload is needed: alternate memory 128 B at 1000 B/s,
default memory at 100 B/s, copies at 100 B/s, 1000 flop/s, alignment 8; f32[4,3] = 48 B,
f32[2,4] = 32 B; a negate is 1 flop per element, a tanh 100 (XLA's transcendentals at 10/s).
"""

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from malloczero.env.cost_model import CostModel
from malloczero.env.hardware import Hardware, MemoryLevel
from malloczero.env.msa import (
  ChunkHeap,
  CostAnalysis,
  CostAnalysisOptions,
  CostAnalysisPrefetchIntervalPicker,
  InstructionCountPrefetchIntervalPicker,
  PrefetchIntervalOptions,
  buffer_order,
  find_best_chunk_candidate,
)
from malloczero.env.msa.buffer_order import latest_use_times
from malloczero.env.msa.copy_resource import AsynchronousCopyResource
from malloczero.env.msa.interval_picker import PrefetchIntervalIterator
from malloczero.env.msa.kernels import prefetch
from malloczero.env.workload import Workload
from tests.strategies import hardware_for, workloads

XLA_HW = Hardware(
  "xla-test",
  (MemoryLevel("alternate", 128, 1000.0), MemoryLevel("default", 1 << 30, 100.0)),
  peak_flops_per_s=1000.0,
  copy_bandwidth_bytes_per_s=100.0,
  alignment_bytes=8,
)
F32_4_3 = 48
NEGATE, TANH = 12.0, 1200.0  # flops of f32[4,3] negate / tanh


def program(ops: list[tuple[str, float]], buffers: list[dict]) -> Workload:
  return Workload.from_dict(
    {
      "name": "hand",
      "source": "hand",
      "ops": [{"name": n, "flops": f} for n, f in ops],
      "buffers": [{"id": i, **b} for i, b in enumerate(buffers)],
    }
  )


def tanh_negate_chains() -> Workload:
  """XLA's MemoryBoundednessBufferIntervalCompare: p0 -> tanh0..tanh4 and p1 -> negate0..negate4,
  interleaved (tanh0, negate0, tanh1, ...), the two last ones program outputs. Buffers: p0, p1,
  tanh0, negate0, ..., tanh4, negate4 (positions 0..11)."""
  ops, buffers = (
    [],
    [
      {"name": "p0", "size": F32_4_3, "def": None, "uses": [0], "kind": "parameter"},
      {"name": "p1", "size": F32_4_3, "def": None, "uses": [1], "kind": "parameter"},
    ],
  )
  for i in range(5):
    ops += [(f"tanh{i}", TANH), (f"negate{i}", NEGATE)]
    last = i == 4
    for j, name in enumerate(("tanh", "negate")):
      buffers.append(
        {
          "name": f"{name}{i}",
          "size": F32_4_3,
          "def": 2 * i + j,
          "uses": [] if last else [2 * i + j + 2],
          "kind": "output" if last else "activation",
        }
      )
  return program(ops, buffers)


# ----------------------------------------------------------------------------- cost analysis


def test_cost_analysis_memory_bound_and_compute_bound_benefits():
  ca = CostAnalysis(tanh_negate_chains(), XLA_HW)
  # negate: compute 12/1000 s; memory 48 B read + 48 B written at 100 B/s.
  # tanh: compute 1200/1000 = 1.2 s > memory 0.96 s.
  np.testing.assert_allclose(ca.compute_elapsed[:2], [1.2, 0.012])
  np.testing.assert_allclose(ca.memory_elapsed[:2], [0.96, 0.96])
  np.testing.assert_allclose(ca.elapsed[:2], [1.2, 0.96])
  a = ca.workload.arrays
  for e in range(len(a.incidence_op)):
    op = a.incidence_op[e]
    if op % 2:  # negate: memory bound; one 48 B position at 1000 B/s saves 0.48 - 0.048.
      assert ca.incidence_benefit[e] == pytest.approx(0.432)
      assert ca.incidence_elapsed_in_alternate[e] == pytest.approx(0.528)
      assert ca.use_elapsed_reduction[e] == pytest.approx(0.432)
    else:  # tanh: compute bound; how far from memory bound, 0.96 - 1.2.
      assert ca.incidence_benefit[e] == pytest.approx(-0.24)
      assert ca.use_elapsed_reduction[e] == pytest.approx(0.0)
  root48 = np.sqrt(48.0)
  expected = (
    np.array([0.0, 0.432, -0.24, 0.864, -0.24, 0.864, -0.24, 0.864, -0.24, 0.864, -0.24, 0.432])
    / root48
  )
  # p0 feeds only a tanh: its parameter position's 0 beats the use's -0.24.
  np.testing.assert_allclose(ca.memory_boundedness, expected)
  assert ca.async_copy_elapsed(F32_4_3) == pytest.approx(0.48)


def test_memory_boundedness_adds_positive_benefits_else_keeps_the_largest():
  """GetMemoryBoundedness's fold: the definition on a compute-bound op (negative), two
  memory-bound uses (added), one compute-bound use (ignored once positive); a second buffer with
  only compute-bound positions keeps the largest (least negative) benefit."""
  w = program(
    [("def", 1000.0), ("use1", 0.0), ("use2", 0.0), ("use3", 1000.0)],
    [
      {"size": 40, "def": 0, "uses": [1, 2, 3], "kind": "activation"},
      {"size": 10, "def": 0, "uses": [3], "kind": "activation"},
    ],
  )
  ca = CostAnalysis(w, XLA_HW)
  # use1, use2 read 40 B: memory 0.4 s > compute 0: benefit 0.4 - 0.04 each.
  assert ca.memory_boundedness[0] == pytest.approx(2 * 0.36 / np.sqrt(40))
  # Buffer 1: def op 0 memory (40 + 10) / 100 = 0.5 < 1 s compute: -0.5; use op 3 (40 + 10 B):
  # -0.5 as well.
  assert ca.memory_boundedness[1] == pytest.approx(-0.5 / np.sqrt(10))


def test_partial_use_bytes_scale_the_benefit_and_the_copy_option_scales_copies():
  w = program(
    [("gather", 0.0)],
    [
      {"size": 1000, "def": None, "uses": [0], "kind": "parameter", "use_bytes": [100]},
      {"size": 50, "def": 0, "uses": [], "kind": "output"},
    ],
  )
  ca = CostAnalysis(w, XLA_HW)
  # The gather reads 100 of the table's 1000 bytes: its use saves 100 x (1/100 - 1/1000).
  assert ca.incidence_benefit[0] == pytest.approx(0.9)
  assert ca.memory_boundedness[0] == pytest.approx(0.9 / np.sqrt(1000))
  doubled = CostAnalysis(w, XLA_HW, CostAnalysisOptions(async_copy_bandwidth_scaling_factor=2.0))
  assert doubled.async_copy_elapsed(1000) == pytest.approx(5.0)


def test_op_elapsed_with_alternate_bytes_matches_the_single_position_costs():
  ca = CostAnalysis(tanh_negate_chains(), XLA_HW)
  a = ca.workload.arrays
  reads = np.zeros(ca.workload.num_ops)
  use = np.flatnonzero((a.incidence_op == 3) & ~ca.incidence_is_def)[0]
  reads[3] = a.incidence_bytes[use]
  elapsed = ca.op_elapsed_with_alternate_bytes(reads)
  assert elapsed[3] == pytest.approx(ca.incidence_elapsed_in_alternate[use])
  np.testing.assert_allclose(np.delete(elapsed, 3), np.delete(ca.elapsed, 3))
  # Both sides in alternate memory: 0.096 s of memory, still above 0.012 s of compute.
  both = ca.op_elapsed_with_alternate_bytes(reads, np.where(np.arange(10) == 3, 48.0, 0.0))
  assert both[3] == pytest.approx(0.096)


def test_pipeline_overhead_window_adds_compute_share_of_default_bytes():
  ca = CostAnalysis(
    tanh_negate_chains(), XLA_HW, CostAnalysisOptions(pipeline_overhead_window_size_mib=1.0)
  )
  # Window larger than the op: overhead = default bytes / all bytes x compute = 0.012 s.
  assert ca.elapsed[1] == pytest.approx(0.96 + 0.012)


def test_three_levels_one_cost_analysis_per_alternate_level():
  """docs/msa.md's proposal for SRAM + LLC + DRAM: one cost analysis per fast level. A negate's
  48-byte output saves 0.48 - 0.048 s in a 1000 B/s SRAM, 0.48 - 0.24 s in a 200 B/s LLC; the
  default-memory elapsed times do not depend on the level."""
  hw = Hardware(
    "three",
    (
      MemoryLevel("sram", 128, 1000.0),
      MemoryLevel("llc", 512, 200.0),
      MemoryLevel("dram", 1 << 30, 100.0),
    ),
    peak_flops_per_s=1000.0,
    copy_bandwidth_bytes_per_s=100.0,
    alignment_bytes=8,
  )
  w = tanh_negate_chains()
  sram = CostAnalysis(w, hw, CostAnalysisOptions(alternate_level=0))
  llc = CostAnalysis(w, hw, CostAnalysisOptions(alternate_level=1))
  negate0_def = sram.buffer_incidences(3).start
  assert sram.incidence_benefit[negate0_def] == pytest.approx(0.432)
  assert llc.incidence_benefit[negate0_def] == pytest.approx(0.24)
  np.testing.assert_allclose(sram.elapsed, llc.elapsed)
  assert np.all(buffer_order(w, sram.memory_boundedness) == buffer_order(w, llc.memory_boundedness))


def test_cost_analysis_rejects_a_level_that_is_not_fast():
  with pytest.raises(ValueError, match="alternate_level"):
    CostAnalysis(tanh_negate_chains(), XLA_HW, CostAnalysisOptions(alternate_level=1))


# ----------------------------------------------------------------------------- buffer order


def test_memory_boundedness_buffer_interval_compare_puts_negates_before_tanhs():
  """XLA's MemoryBoundednessBufferIntervalCompare: with room for two f32[4,3] buffers, negates
  (memory bound) win fast memory over tanhs (compute bound). The order: the four negate
  activations (0.864 each; earlier last use first), p1 before the output negate4 (0.432 each,
  longer live range first), p0 (0), then the tanhs (-0.24; the output tanh4 last, shorter)."""
  w = tanh_negate_chains()
  order = buffer_order(w, CostAnalysis(w, XLA_HW).memory_boundedness)
  names = [w.buffers[i].name for i in order]
  assert names == [
    "negate0",
    "negate1",
    "negate2",
    "negate3",
    "p1",
    "negate4",
    "p0",
    "tanh0",
    "tanh1",
    "tanh2",
    "tanh3",
    "tanh4",
  ]


def test_buffer_order_tie_breaks_follow_xlas_tuple():
  """Equal boundedness: larger first; then longer live range; then earlier latest use; then
  earlier start; then lower id. The override priority comes before all of them."""
  w = program(
    [("a", 0.0)] * 8,
    [
      {"size": 8, "def": 0, "uses": [2], "kind": "activation"},  # 0
      {"size": 16, "def": 0, "uses": [2], "kind": "activation"},  # 1 larger
      {"size": 8, "def": 0, "uses": [1, 5], "kind": "activation"},  # 2 longer
      {"size": 8, "def": 3, "uses": [5], "kind": "activation"},  # 3 same length as 0, later
      {"size": 8, "def": 1, "uses": [3], "kind": "activation"},  # 4 = 0 shifted by one
      {"size": 8, "def": 0, "uses": [2], "kind": "activation"},
    ],
  )  # 5 = 0, higher id
  flat = np.zeros(w.num_buffers)
  assert buffer_order(w, flat).tolist() == [1, 2, 0, 5, 4, 3]
  np.testing.assert_array_equal(latest_use_times(w), [2, 2, 5, 5, 3, 2])
  priority = np.array([1, 1, 1, 1, 1, 0])
  assert buffer_order(w, flat, priority).tolist() == [5, 1, 2, 0, 4, 3]
  # Boundedness dominates size; differences below float32 precision are ties.
  assert buffer_order(w, np.array([0, 0, 0, 0, 0, 1.0]))[0] == 5
  assert buffer_order(w, np.array([1, 1, 1, 1, 1, 1 + 1e-9]))[0] == 1


@given(st.data())
def test_buffer_order_is_a_permutation_sorted_by_boundedness(data):
  w = data.draw(workloads())
  hw = data.draw(hardware_for(w))
  ca = CostAnalysis(w, hw)
  order = buffer_order(w, ca.memory_boundedness)
  assert sorted(order.tolist()) == list(range(w.num_buffers))
  bounded = ca.memory_boundedness[order].astype(np.float32)
  assert np.all(np.diff(bounded) <= 0)
  assert np.all(np.isfinite(ca.memory_boundedness))


# ----------------------------------------------------------------------------- interval picker


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


# ----------------------------------------------------------------------------- chunks


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


# ----------------------------------------------------------------------------- cross-checks


def xla_fold(def_benefit: float, use_benefits: list[float]) -> float:
  """GetMemoryBoundedness's loop, literally: use by use, in order."""
  benefit = def_benefit
  for use in use_benefits:
    if benefit > 0 and use > 0:
      benefit += use
    else:
      benefit = max(benefit, use)
  return benefit


@pytest.mark.slow  # Integration-sized: subprocesses, compiles or every solver.
@given(st.data())
def test_memory_boundedness_equals_xlas_sequential_fold(data):
  w = data.draw(workloads())
  hw = data.draw(hardware_for(w))
  ca = CostAnalysis(w, hw)
  a = w.arrays
  for b in range(w.num_buffers):
    rows = range(*ca.buffer_incidences(b).indices(len(a.incidence_op)))
    defs = [ca.incidence_benefit[e] for e in rows if ca.incidence_is_def[e]]
    uses = [ca.incidence_benefit[e] for e in rows if not ca.incidence_is_def[e]]
    expected = xla_fold(defs[0] if defs else 0.0, uses) if (defs or uses) else 0.0
    assert ca.memory_boundedness[b] == pytest.approx(
      expected / np.sqrt(max(a.sizes[b], 1)), rel=1e-9, abs=1e-300
    )


@given(st.data())
def test_default_memory_elapsed_is_the_cost_models_all_slow_op_time(data):
  w = data.draw(workloads())
  hw = data.draw(hardware_for(w))
  model = CostModel(w, hw)
  np.testing.assert_allclose(
    CostAnalysis(w, hw).elapsed, np.maximum(model.compute_time, model.slow_memory_time), rtol=1e-12
  )
