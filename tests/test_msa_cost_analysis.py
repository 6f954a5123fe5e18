"""msa's cost analysis and buffer order (env/msa/cost_analysis.py, buffer_order.py) on XLA's own
tests, and against the cost model and XLA's sequential fold.

Cases named after an XLA test reproduce it (openxla/xla,
`xla/service/memory_space_assignment/` `memory_space_assignment_test.cc`); the others are worked by
hand, with XLA's test hardware where a workload is needed (tests/msa_xla_cases.py).
"""

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from malloczero.env.cost_model import CostModel
from malloczero.env.hardware import Hardware, MemoryLevel
from malloczero.env.msa import (
  CostAnalysis,
  CostAnalysisOptions,
  buffer_order,
)
from malloczero.env.msa.buffer_order import latest_use_times
from tests.msa_xla_cases import F32_4_3, XLA_HW, program, tanh_negate_chains
from tests.strategies import hardware_for, workloads


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
