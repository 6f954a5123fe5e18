"""msa on programs with loops: the cost analysis's per-invocation costs and while multiplier, the
prefetch interval picker's while nest levels (env/msa/cost_analysis.py, interval_picker.py and
their kernels), the copy budgets, and msa and its game on the suites' loop programs.

Cases named after an XLA test reproduce it (openxla/xla,
`xla/service/memory_space_assignment/prefetch_interval_picker_test.cc`): XLA's `FakeCostAnalysis`
gives every instruction 1 s and every copy 3 s, and the picker skips the while instruction's own
time. Here the programs are workloads on XLA's test hardware (tests/msa_xla_cases.py) whose ops
are compute bound at 1000 flops (1 s), loop ops weighted by their trip counts (msa counts one
iteration) and a zero-cost op at the parent's level where XLA has the while instruction (the
importer makes none: docs/msa.md).
"""

import dataclasses

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from malloczero.env import MsaGame, validate_mapping
from malloczero.env.msa import (
  ChunkHeap,
  CostAnalysis,
  CostAnalysisOptions,
  CostAnalysisPrefetchIntervalPicker,
  PrefetchIntervalOptions,
)
from malloczero.env.msa.algorithm import msa_allocations
from malloczero.env.msa.allocate_segment import SegmentAllocator
from malloczero.env.msa.chunks import find_best_chunk_candidate
from malloczero.env.msa.interval_picker import PrefetchIntervalIterator
from malloczero.env.msa.kernels import live_lists
from malloczero.env.msa.settings import MsaOptions
from malloczero.env.programs.suites import get_suite, suite_names
from malloczero.env.workload import Op, Workload
from tests.msa_xla_cases import XLA_HW, program
from tests.test_msa_game import play
from tests.test_msa_interval_picker import every_start_the_prefetch_loop_walks
from tests.test_msa_steps import same_allocations

XLA_PICKER = PrefetchIntervalOptions(1.0, 2.0, 12.0)  # The ratios of XLA's picker tests.
# The copy time of XLA's fake cost analysis (3 s) at XLA_HW's 100 B/s: the size of the buffer
# prefetched, and of the alternate memory (max ratio 12 x 3 s = 36 s).
COPY_3S_BYTES = 300


def with_loops(workload: Workload, depths, weights) -> Workload:
  """`workload` with its ops' loop depths and weights replaced."""
  ops = tuple(
    Op(o.name, o.flops, int(weight), int(depth))
    for o, depth, weight in zip(workload.ops, depths, weights)
  )
  return dataclasses.replace(workload, ops=ops)


def one_second_ops(depths, trips, zero_cost=(), end_flops=1000.0) -> Workload:
  """Ops of 1000 flops (1 s per invocation on XLA_HW, compute bound), at `depths`, each weighted
  by the product of `trips[level]` over its levels; `zero_cost` ops (XLA's while instructions)
  have no flops; the last op (`end_flops`) reads the 300-byte parameter p0."""
  n = len(depths)
  flops = [0.0 if t in zero_cost else 1000.0 for t in range(n - 1)] + [end_flops]
  w = program(
    [(f"op{t}", f) for t, f in enumerate(flops)],
    [{"name": "p0", "size": COPY_3S_BYTES, "def": None, "uses": [n - 1], "kind": "parameter"}],
  )
  weights = [int(np.prod(trips[:depth])) for depth in depths]
  return with_loops(w, depths, weights)


def test_prefetch_interval_order_while():
  """XLA's PrefetchIntervalOrderWhile: negates at 1..17, the state tuple at 18, the loop's
  condition at 19-20 and body at 21-24 (level 1), the while at 25, negates at 26..30, the add at
  31 reading param0. Starts offered: 25 (right after the loop: elapsed 5, the closest to 2 x 3
  s), 26, 18, 27 (the latest: 3 s), 17 (the earliest: op 18, the loop's 6 ops counted 5 times
  each and ops 26-30 make 36 s <= 12 x 3 s); never a start inside the loop."""
  depths = [0] * 19 + [1] * 6 + [0] * 7
  w = one_second_ops(depths, trips=[8], zero_cost={25}, end_flops=4000.0)
  ca = CostAnalysis(w, XLA_HW)
  assert ca.elapsed[19:25].tolist() == [1.0] * 6  # One iteration, not 8.
  assert ca.elapsed[25] == 0.0
  use = ca.buffer_incidences(0).start
  assert ca.use_elapsed_reduction[use] == 0.0  # The add is compute bound.
  picker = CostAnalysisPrefetchIntervalPicker.from_cost_analysis(ca, COPY_3S_BYTES, XLA_PICKER)
  copy = ca.async_copy_elapsed(COPY_3S_BYTES)
  assert copy == 3.0 and picker.max_async_copy_elapsed == 36.0
  it = picker.begin(copy, -1, 31, 0.0)
  assert [it.next() for _ in range(5)] == [25, 26, 18, 27, 17]
  assert it.done()
  assert picker.start_times(copy, -1, 31, 0.0) == [25, 26, 18, 27, 17]
  assert every_start_the_prefetch_loop_walks(picker, copy, -1, 31, 0.0) == [25, 26, 18, 27, 17]
  assert picker.logical_interval_elapsed(17, 31) == 36.0
  assert picker.logical_interval_elapsed(20, 23) == 2.0  # Inside the loop: one iteration.


def test_nested_while():
  """XLA's NestedWhile: the outer loop's condition at 5-6 and body at 7-20 (level 1) holds the
  inner loop (condition 11-12, body 13-16: level 2) and its while at 17; the outer while at 21.
  The root at 23 reads param0: the latest start is 4, before the outer loop, where the 196 s
  between count the inner loop's ops 25 times and the outer's 5."""
  depths = [0] * 5 + [1] * 6 + [2] * 6 + [1] * 4 + [0] * 3
  w = one_second_ops(depths, trips=[3, 4], zero_cost={17, 21}, end_flops=4000.0)
  assert [o.weight for o in w.ops[10:18]] == [3, 12, 12, 12, 12, 12, 12, 3]
  ca = CostAnalysis(w, XLA_HW)
  picker = CostAnalysisPrefetchIntervalPicker.from_cost_analysis(ca, COPY_3S_BYTES, XLA_PICKER)
  assert picker.latest_prefetch_start_time(3.0, 0, 23, 0.0) == 4
  assert picker.logical_interval_elapsed(4, 23) == 196.0
  assert picker.window(3.0, 0, 23, 0.0).latest == 4
  # Inside the outer body, across the inner loop: the inner ops count 5 times, the outer once.
  assert picker.min_while_nest_level(9, 19) == 1
  assert picker.logical_interval_elapsed(9, 19) == 1 + 6 * 5 + 0 + 1


def test_benefits_are_multiplied_only_where_memory_bound_and_costs_are_per_invocation():
  """A loop of 7 iterations (depth 1) with a memory-bound op and a compute-bound op, and a
  depth-0 op of weight 4 (four identical steps merged: kept whole). Per invocation, each loop
  op's times are the flat program's; the memory-bound benefit is 5x, the compute-bound one (how
  far from memory bound) unchanged; with `while_execution_count` 2, 2x."""
  buffers = [
    {"name": "x", "size": 480, "def": None, "uses": [0, 1, 2], "kind": "parameter"},
    {"name": "y", "size": 48, "def": 0, "uses": [2], "kind": "activation"},
  ]
  flat = program([("merged", 10.0), ("copy", 0.0), ("tanh", 12000.0)], buffers)
  looped = with_loops(flat, depths=[0, 1, 1], weights=[4, 7, 7])
  flat_weighted = with_loops(flat, depths=[0, 0, 0], weights=[4, 1, 1])
  a, b = CostAnalysis(flat_weighted, XLA_HW), CostAnalysis(looped, XLA_HW)
  for name in ("compute_elapsed", "memory_elapsed", "elapsed", "use_elapsed_reduction"):
    np.testing.assert_array_equal(getattr(b, name), getattr(a, name), err_msg=name)
  assert b.elapsed[0] == pytest.approx(4 * (480 + 48) / 100)  # The merged op stays x4.
  np.testing.assert_array_equal(b.while_multiplier, [1.0, 5.0, 5.0])
  ops = looped.arrays.incidence_op
  memory_bound = a.memory_elapsed[ops] > a.compute_elapsed[ops]
  assert memory_bound.tolist() == [True, True, False, True, False]
  expected = np.where(memory_bound, a.incidence_benefit * [1, 5, 1, 1, 1], a.incidence_benefit)
  np.testing.assert_allclose(b.incidence_benefit, expected, rtol=1e-15)
  twice = CostAnalysis(looped, XLA_HW, CostAnalysisOptions(while_execution_count=2.0))
  assert twice.incidence_benefit[1] == pytest.approx(2 * a.incidence_benefit[1])
  # The buffer order's key follows: x's copy-op benefit counts 5 times.
  assert b.memory_boundedness[0] > a.memory_boundedness[0]
  with pytest.raises(ValueError, match="while_execution_count"):
    CostAnalysisOptions(while_execution_count=0.5)


def test_a_program_without_loops_gets_the_flat_arrays_and_picker():
  w = one_second_ops([0] * 6, trips=[])
  ca = CostAnalysis(w, XLA_HW)
  assert not ca.has_loops and ca.incidence_bytes is w.arrays.incidence_bytes
  picker = CostAnalysisPrefetchIntervalPicker.from_cost_analysis(ca, 300)
  assert not picker.loops and picker.nest_state() is None
  np.testing.assert_array_equal(picker.op_elapsed, ca.elapsed)


def test_copy_budgets_are_one_iteration_of_each_op():
  """XLA lends the copy resources `GetInstructionElapsed` per invocation: a loop op of 8
  iterations lends one iteration's time (the cost model's own charge is 8 of them)."""
  w = one_second_ops([0, 1, 1, 0], trips=[8])
  allocator = SegmentAllocator(w, XLA_HW, MsaOptions())
  expected = [1.0, 1.0, 1.0, 3.0]  # The last op reads 300 B at 100 B/s.
  np.testing.assert_array_equal(allocator.prefetch_resource.initial_resources, expected)
  np.testing.assert_array_equal(allocator.eviction_resource.initial_resources, expected)
  idle = SegmentAllocator(w, XLA_HW, MsaOptions(copy_budget="idle"))
  np.testing.assert_array_equal(idle.prefetch_resource.initial_resources, [1.0, 1.0, 1.0, 0.0])


def xla_picker_starts(elapsed, levels, w, copy, start, end, reduction, options):
  """The starts XLA's `CostAnalysisPrefetchIntervalPicker` offers (`Begin`, then `Next` until
  `Done`), transcribed loop for loop from prefetch_interval_picker.cc over op times (start -1
  is the program start, level 0): an independent check of the picker's vectorised searches."""
  levels = list(levels) + [0]
  weighted = [e * w**lv for e, lv in zip(elapsed, levels)]
  prefix = np.concatenate([[0.0], np.cumsum(weighted)])

  def level(t):
    return 0 if t < 0 else levels[t]

  def interval(s, e):
    if s == e:
      return 0.0
    return (prefix[e] - prefix[s + 1]) / float(w) ** min(levels[max(s, 0) : e + 1])

  min_ratio, preferred_ratio, max_elapsed, explored = options
  latest = end - 1
  while latest >= start and (
    level(latest) != level(end) or min_ratio * copy > interval(latest, end) + reduction
  ):
    latest -= 1
  earliest = start
  while earliest < latest and (
    level(earliest) != level(end) or max_elapsed < interval(earliest, end)
  ):
    earliest += 1
  if earliest > latest:
    return []
  preferred, best = earliest, interval(earliest, end)
  for t in range(earliest + 1, latest + 1):
    if level(t) == level(end) and abs(preferred_ratio * copy - interval(t, end)) < abs(
      preferred_ratio * copy - best
    ):
      preferred, best = t, interval(t, end)
  state = {"increasing": preferred, "decreasing": preferred, "use_increasing": True}

  def done():
    return state["increasing"] > latest and state["decreasing"] < earliest

  def next_start():
    if state["use_increasing"]:
      time = state["increasing"]
      state["increasing"] += 1
      while state["increasing"] <= latest and level(state["increasing"]) != level(end):
        state["increasing"] += 1
      if state["decreasing"] >= earliest:
        state["use_increasing"] = False
      return time
    time = state["decreasing"]
    state["decreasing"] -= 1
    target = 0.0
    if state["increasing"] > latest:
      target = interval(time, end) + interval(earliest, end) / explored
    while state["decreasing"] >= earliest and (
      level(state["decreasing"]) != level(end) or interval(state["decreasing"], end) < target
    ):
      state["decreasing"] -= 1
    if state["increasing"] <= latest:
      state["use_increasing"] = True
    return time

  next_start()  # Begin's own.
  starts = []
  while not done():
    starts.append(next_start())
  return starts


@st.composite
def nested_levels(draw, num_ops: int) -> list[int]:
  """While nest levels of `num_ops` ops: up to three loops, each a span of ops one level deeper
  than the ops around it (nested or one after another)."""
  levels = [0] * num_ops
  for _ in range(draw(st.integers(0, 3))):
    first = draw(st.integers(0, num_ops - 1))
    last = draw(st.integers(first, num_ops - 1))
    for t in range(first, last + 1):
      levels[t] += 1
  return levels


@settings(max_examples=300, deadline=None)
@given(
  st.integers(2, 40).flatmap(
    lambda n: st.tuples(
      st.lists(st.sampled_from([0.0, 0.5, 1.0, 2.0, 7.0]), min_size=n, max_size=n),
      nested_levels(n),
    )
  ),
  st.sampled_from([1.0, 2.0, 5.0]),
  st.sampled_from([0.5, 3.0, 20.0]),
  st.sampled_from([0.0, 0.5]),
  st.sampled_from([(1.0, 2.0, 12.0), (0.8, 1.5, 10.0), (0.5, 4.0, 3.0)]),
  st.integers(1, 4),
  st.data(),
)
def test_the_picker_with_loops_offers_xlas_starts(
  program_levels, w, copy, reduction, ratios, explored, data
):
  """On random ops and loops, the Python picker's iterator, its jitted start walk and the prefetch
  loop's walk all offer the starts of XLA's picker, transcribed (`xla_picker_starts`), and the
  jitted window is the Python one's."""
  elapsed, levels = program_levels
  end = data.draw(st.integers(0, len(elapsed) - 1))
  start = data.draw(st.integers(-1, end))
  options = PrefetchIntervalOptions(*ratios, explored)
  picker = CostAnalysisPrefetchIntervalPicker(np.array(elapsed), 1.0, options, levels, w)
  max_elapsed = picker.max_async_copy_elapsed
  expected = xla_picker_starts(
    elapsed, levels, w, copy, start, end, reduction, (*ratios[:2], max_elapsed, explored)
  )
  window = picker.window(copy, start, end, reduction)
  assert picker.window(copy, start, end, reduction, preferred_time=end + 1) == window
  assert list(PrefetchIntervalIterator(picker, window, end)) == expected
  assert picker.start_times(copy, start, end, reduction) == expected
  assert every_start_the_prefetch_loop_walks(picker, copy, start, end, reduction) == expected
  latest = picker.latest_prefetch_start_time(copy, start, end, reduction)
  assert window.latest == latest
  for s in range(max(start, -1), end + 1):  # Against the transcription's interval.
    want = (picker.prefix[end] - picker.prefix[s + 1]) / float(w) ** min(
      (levels + [0])[max(s, 0) : end + 1]
    )
    assert picker.logical_interval_elapsed(s, end) == (0.0 if s == end else want)


@settings(max_examples=100, deadline=None)
@given(
  st.integers(2, 30).flatmap(
    lambda n: st.tuples(
      st.lists(st.sampled_from([0.0, 1.0, 3.0]), min_size=n, max_size=n), nested_levels(n)
    )
  ),
  st.sampled_from([1.0, 5.0]),
  st.sampled_from([2.0, 6.0, 30.0]),
  st.data(),
)
def test_the_chunk_searchs_no_copy_bound_follows_the_loops(program_levels, w, memory_copy, data):
  """The jitted chunk candidate extends a chunk over the uses the Python picker keeps without a
  copy (`can_allocate_in_alternate_memory_no_copy`, the elapsed time divided by the loops it
  does not span), as the Python search does; and the eviction's end is the first one whose
  divided elapsed time covers the copy."""
  elapsed, levels = program_levels
  n = len(elapsed)
  picker = CostAnalysisPrefetchIntervalPicker(
    np.array(elapsed), memory_copy, PrefetchIntervalOptions(0.8, 1.5, 1.0), levels, w
  )
  uses = np.array(sorted(data.draw(st.sets(st.integers(0, n - 1), min_size=1, max_size=6))))
  start = data.draw(st.integers(-1, int(uses[0])))
  end_use = int(data.draw(st.sampled_from(uses.tolist())))
  heap = ChunkHeap(8)
  heap.add(0, n, 0, 64)
  keep = picker.can_allocate_in_alternate_memory_no_copy
  expected = find_best_chunk_candidate(heap, start + 1, end_use, 32, uses.tolist(), 256, keep)
  found, offset, end = live_lists.best_chunk_candidate_indexed(
    *heap.search_state(),
    picker.kernel_state(),
    start + 1,
    end_use,
    32,
    uses,
    256,
    picker.nest_state(),
  )
  assert found and (offset, end) == (expected.offset, expected.end_use)
  latest_end = data.draw(st.integers(start + 1, n))
  copy = data.draw(st.sampled_from([0.5, 2.0, 9.0]))
  eviction_end = picker.preferred_eviction_end_time(copy, start, latest_end)
  ends = [
    e
    for e in range(start + 1, latest_end + 1)
    if picker.logical_interval_elapsed(start, e) >= 1.5 * copy
  ]
  assert eviction_end == (ends[0] if ends else max(start + 1, latest_end + 1))


# The suites' programs with loops (the importer's flattened while loops): the default suite's
# GRU scans, the foreign suite's TensorFlow training steps.
LOOP_PROGRAMS = (
  "gru-b1-infer",
  "gru-b1-train",
  "gru-b16-infer",
  "gru-b16-train",
  "tf-gru-b8-train",
  "tf-lstm-b8-train",
  "tf-transformer-b2-train",
)


def loop_entries():
  """One suite entry (hardware and capacity) for each program of `LOOP_PROGRAMS`."""
  entries = {}
  for suite in suite_names():
    for entry in get_suite(suite).entries:
      if entry.program in LOOP_PROGRAMS:
        entries.setdefault(entry.program, entry)
  assert sorted(entries) == sorted(LOOP_PROGRAMS)
  # The TensorFlow steps' games take seconds each.
  return [
    pytest.param(entries[name], marks=[pytest.mark.slow] if name.startswith("tf-") else [])
    for name in LOOP_PROGRAMS
  ]


@pytest.mark.parametrize("entry", loop_entries(), ids=lambda e: e.name)
def test_msa_and_its_game_play_the_suites_programs_with_loops(entry):
  """On each program with loops, msa's slot at every step is the msa solver (whose mapping
  validates), and a random episode plays to the end with a mapping that validates."""
  workload, hardware = entry.load()
  assert any(o.loop_depth for o in workload.ops)
  game = MsaGame(workload, hardware)
  play(game, "msa")
  expected, _ = msa_allocations(workload, hardware)
  assert same_allocations(game.allocations(), expected)
  validate_mapping(workload, hardware, game.mapping("msa"))
  rewards = play(game, "random", seed=1)
  assert len(rewards) == game.num_steps > 0
  validate_mapping(workload, hardware, game.mapping("random"))


def test_while_execution_count_is_an_msa_option_from_the_command_line(tmp_path, capsys):
  """XLA's `xla_tpu_memory_space_assignment_while_execution_count` as `--msa-option`: each fast
  level's cost analysis counts a loop's benefits that many times per nest level; counting a GRU's
  steps once, msa keeps fewer of its buffers in fast memory than at XLA's 5."""
  from malloczero.env.mapping import load_mapping
  from malloczero.env.workload_json import save_workload
  from malloczero.launch import cli

  entry = next(p.values[0] for p in loop_entries() if p.values[0].program == "gru-b16-infer")
  workload, hardware = entry.load()
  once = SegmentAllocator(workload, hardware, MsaOptions(while_execution_count=1.0))
  assert [a.options.while_execution_count for a in once.analyses] == [1.0]
  kept_once, _ = msa_allocations(workload, hardware, MsaOptions(while_execution_count=1.0))
  kept_five, _ = msa_allocations(workload, hardware)
  assert len(kept_once) < len(kept_five)

  path, out = str(tmp_path / "gru.json"), str(tmp_path / "map.json")
  save_workload(workload, path)
  capacity = [f"--capacity={lv.name}={lv.capacity_bytes}" for lv in hardware.levels[:-1]]
  base = ["solve", path, "--hardware", entry.hardware, *capacity, "--solver", "msa"]
  assert cli.main([*base, "--msa-option", "while_execution_count=1", "--out", out]) == 0
  capsys.readouterr()
  validate_mapping(workload, hardware, load_mapping(out))
  assert cli.main([*base, "--msa-option", "while_execution_count=0.5"]) == 2
  err = capsys.readouterr().err
  assert err.count("\n") == 1 and "while_execution_count must be a finite number >= 1" in err, err
