"""The building blocks of XLA's memory-space assignment (env/solvers/msa/), on XLA's own tests.

Cases named after an XLA test reproduce it (openxla/xla, `xla/service/memory_space_assignment/`
`prefetch_interval_picker_test.cc`, `memory_space_assignment_test.cc`); the others are worked by
hand, with XLA's test hardware where a workload is needed: alternate memory 128 B at 1000 B/s,
default memory at 100 B/s, copies at 100 B/s, 1000 flop/s, alignment 8; f32[4,3] = 48 B,
f32[2,4] = 32 B; a negate is 1 flop per element, a tanh 100 (XLA's transcendentals at 10/s).
"""

import numpy as np
import pytest
from hypothesis import given, strategies as st

from malloczero.env.hardware import Hardware, MemoryLevel
from malloczero.env.solvers.msa import CostAnalysis, CostAnalysisOptions, buffer_order
from malloczero.env.solvers.msa.buffer_order import latest_use_times
from malloczero.env.workload import Workload
from tests.strategies import hardware_for, workloads

XLA_HW = Hardware("xla-test", (MemoryLevel("alternate", 128, 1000.0),
                               MemoryLevel("default", 1 << 30, 100.0)),
                  peak_flops_per_s=1000.0, copy_bandwidth_bytes_per_s=100.0, alignment_bytes=8)
F32_4_3 = 48
NEGATE, TANH = 12.0, 1200.0  # flops of f32[4,3] negate / tanh


def program(ops: list[tuple[str, float]], buffers: list[dict]) -> Workload:
  return Workload.from_dict({
      "name": "hand", "source": "hand",
      "ops": [{"name": n, "flops": f} for n, f in ops],
      "buffers": [{"id": i, **b} for i, b in enumerate(buffers)]})


def tanh_negate_chains() -> Workload:
  """XLA's MemoryBoundednessBufferIntervalCompare: p0 -> tanh0..tanh4 and p1 -> negate0..negate4,
  interleaved (tanh0, negate0, tanh1, ...), the two last ones program outputs. Buffers: p0, p1,
  tanh0, negate0, ..., tanh4, negate4 (positions 0..11)."""
  ops, buffers = [], [
      {"name": "p0", "size": F32_4_3, "def": None, "uses": [0], "kind": "parameter"},
      {"name": "p1", "size": F32_4_3, "def": None, "uses": [1], "kind": "parameter"}]
  for i in range(5):
    ops += [(f"tanh{i}", TANH), (f"negate{i}", NEGATE)]
    last = i == 4
    for j, name in enumerate(("tanh", "negate")):
      buffers.append({"name": f"{name}{i}", "size": F32_4_3, "def": 2 * i + j,
                      "uses": [] if last else [2 * i + j + 2],
                      "kind": "output" if last else "activation"})
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
  expected = np.array([0.0, 0.432, -0.24, 0.864, -0.24, 0.864, -0.24, 0.864, -0.24, 0.864,
                       -0.24, 0.432]) / root48
  # p0 feeds only a tanh: its parameter position's 0 beats the use's -0.24.
  np.testing.assert_allclose(ca.memory_boundedness, expected)
  assert ca.async_copy_elapsed(F32_4_3) == pytest.approx(0.48)


def test_memory_boundedness_adds_positive_benefits_else_keeps_the_largest():
  """GetMemoryBoundedness's fold: the definition on a compute-bound op (negative), two
  memory-bound uses (added), one compute-bound use (ignored once positive); a second buffer with
  only compute-bound positions keeps the largest (least negative) benefit."""
  w = program([("def", 1000.0), ("use1", 0.0), ("use2", 0.0), ("use3", 1000.0)], [
      {"size": 40, "def": 0, "uses": [1, 2, 3], "kind": "activation"},
      {"size": 10, "def": 0, "uses": [3], "kind": "activation"}])
  ca = CostAnalysis(w, XLA_HW)
  # use1, use2 read 40 B: memory 0.4 s > compute 0: benefit 0.4 - 0.04 each.
  assert ca.memory_boundedness[0] == pytest.approx(2 * 0.36 / np.sqrt(40))
  # Buffer 1: def op 0 memory (40 + 10) / 100 = 0.5 < 1 s compute: -0.5; use op 3 (40 + 10 B):
  # -0.5 as well.
  assert ca.memory_boundedness[1] == pytest.approx(-0.5 / np.sqrt(10))


def test_partial_use_bytes_scale_the_benefit_and_the_copy_option_scales_copies():
  w = program([("gather", 0.0)], [
      {"size": 1000, "def": None, "uses": [0], "kind": "parameter", "use_bytes": [100]},
      {"size": 50, "def": 0, "uses": [], "kind": "output"}])
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
  ca = CostAnalysis(tanh_negate_chains(), XLA_HW,
                    CostAnalysisOptions(pipeline_overhead_window_size_mib=1.0))
  # Window larger than the op: overhead = default bytes / all bytes x compute = 0.012 s.
  assert ca.elapsed[1] == pytest.approx(0.96 + 0.012)


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
  assert names == ["negate0", "negate1", "negate2", "negate3", "p1", "negate4", "p0",
                   "tanh0", "tanh1", "tanh2", "tanh3", "tanh4"]


def test_buffer_order_tie_breaks_follow_xlas_tuple():
  """Equal boundedness: larger first; then longer live range; then earlier latest use; then
  earlier start; then lower id. The override priority comes before all of them."""
  w = program([("a", 0.0)] * 8, [
      {"size": 8, "def": 0, "uses": [2], "kind": "activation"},        # 0
      {"size": 16, "def": 0, "uses": [2], "kind": "activation"},       # 1 larger
      {"size": 8, "def": 0, "uses": [1, 5], "kind": "activation"},     # 2 longer
      {"size": 8, "def": 3, "uses": [5], "kind": "activation"},        # 3 same length as 0, later
      {"size": 8, "def": 1, "uses": [3], "kind": "activation"},        # 4 = 0 shifted by one
      {"size": 8, "def": 0, "uses": [2], "kind": "activation"}])       # 5 = 0, higher id
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
