"""The cost model on hand-computed cases, and the incremental update against fresh evaluation."""

import dataclasses
import re

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from malloczero.env import PRESETS, Hardware, HardwareError, MemoryLevel, load_hardware
from malloczero.env.cost_model import Allocations, CostModel
from malloczero.env.requests import build_requests
from malloczero.env.simulator import Copies, simulate_copies, total_stall_loop
from malloczero.env.workload_json import workload_from_dict, workload_from_ops
from tests.strategies import hardware_for, workloads

# Round numbers: fast 100 B/s, slow 10 B/s, copy 10 B/s, 1 flop/s.
HW = Hardware(
  "toy",
  (MemoryLevel("fast", 1000, 100.0), MemoryLevel("slow", 10**9, 10.0)),
  peak_flops_per_s=1.0,
  copy_bandwidth_bytes_per_s=10.0,
  alignment_bytes=1,
)
PROGRAM = workload_from_dict(
  {
    "name": "toy",
    "source": "hand",
    "ops": [
      {"name": "a", "flops": 1.0},
      {"name": "b", "flops": 0.0},
      {"name": "c", "flops": 30.0},
      {"name": "d", "flops": 2.0},
    ],
    "buffers": [
      {"id": 0, "size": 100, "def": None, "uses": [3], "kind": "parameter"},
      {"id": 1, "size": 200, "def": 0, "uses": [1, 2], "kind": "activation"},
      {"id": 2, "size": 50, "def": 1, "uses": [3], "kind": "activation"},
    ],
  }
)


def test_hand_computed_times():
  model = CostModel(PROGRAM, HW)
  # op a: max(1, 200/10) = 20; b: max(0, (200+50)/10) = 25; c: max(30, 200/10) = 30;
  # d: max(2, (100+50)/10) = 15.
  assert model.slow_only_time == pytest.approx(20 + 25 + 30 + 15)
  # Reference (all fast): a 2, b 2.5, c 30, d 2; copy of the 100-byte parameter takes 10 s.
  np.testing.assert_allclose(model.reference_time, [2, 2.5, 30, 2])
  # Activation 1 in fast over [0, 3): a 2, b max(0, 2 + 5) = 7, c 30: saves 18 + 18 + 0.
  one = Allocations(*(np.array([v]) for v in (1, 0, 0, 0, 3)))
  assert model.evaluate(one).total_time_s == pytest.approx(90 - 36)
  # Parameter 0 prefetched over [2, 4): op c (30 s) reads 200 B from default memory (20 s), so
  # it leaves 10 s of default-memory idle time: exactly the 10 s copy, no stall;
  # op d becomes max(2, 1 + 5) = 6, saving 9.
  param = Allocations(*(np.array([v]) for v in (0, 0, 0, 2, 4)))
  ev = model.evaluate(param)
  assert ev.total_time_s == pytest.approx(90 - 9) and ev.total_stall_s == 0.0
  # Prefetched over [3, 4): nothing to hide behind, the program stalls 10 s before op d.
  late = Allocations(*(np.array([v]) for v in (0, 0, 0, 3, 4)))
  ev = model.evaluate(late)
  np.testing.assert_allclose(ev.stall_s, [0, 0, 0, 10, 0])
  assert ev.total_time_s == pytest.approx(91.0)


def test_requests_window_hides_the_copy():
  requests = build_requests(CostModel(PROGRAM, HW))
  param = np.flatnonzero(requests.buffer == 0)[0]
  # Latest start that hides 10 s of copy before op 3 is op 2 (30 s of reference time).
  assert (requests.start[param], requests.end[param]) == (2, 4)
  assert requests.exposed_copy_time[param] == 0.0
  act = np.flatnonzero(requests.buffer == 1)[0]
  assert (requests.start[act], requests.end[act]) == (0, 3)
  # Request order: memory-boundedness (saving / sqrt(size)) descending.
  bounded = requests.standalone_saving[:, 0] / np.sqrt(requests.size)
  assert np.all(np.diff(bounded) <= 0)


@given(st.data())
def test_requests_follow_the_grouping_rule_buffer_by_buffer(data):
  """Each request serves a run of its buffer's incidences: an activation all of them over its
  live range; a parameter a group of uses, a new group starting exactly where a use's window
  (the latest start that hides its copy) starts after the previous use."""
  workload = data.draw(workloads())
  model = CostModel(workload, data.draw(hardware_for(workload)))
  requests = build_requests(model)
  a = workload.arrays
  served = {}
  for r in range(len(requests)):
    b = int(requests.buffer[r])
    assert not a.is_output[b]
    ops, moved = requests.ops(r)
    lo, hi = a.buffer_incidence_start[b], a.buffer_incidence_start[b + 1]
    mine = a.incidence_op[lo:hi].tolist()
    first = mine.index(int(ops[0]))
    assert ops.tolist() == mine[first : first + len(ops)]
    np.testing.assert_array_equal(moved, a.incidence_bytes[lo + first : lo + first + len(ops)])
    assert requests.first_use[r] == (ops[0] if a.is_prefetched[b] else a.live_start[b])
    if not a.is_prefetched[b]:
      assert len(ops) == len(mine)
      assert (requests.start[r], requests.end[r]) == (a.live_start[b], a.live_end[b])
      continue
    prefix = model.reference_prefix
    window = lambda op: max(
      int(np.searchsorted(prefix, prefix[op] - model.copy_time[b], side="right")) - 1, 0
    )
    assert (requests.start[r], requests.end[r]) == (window(ops[0]), ops[-1] + 1)
    joins = [window(mine[i]) <= mine[i - 1] for i in range(1, len(mine))]
    assert first == 0 or not joins[first - 1]  # It starts a group ...
    assert all(joins[first : first + len(ops) - 1])  # ... joined by its next uses ...
    assert first + len(ops) == len(mine) or not joins[first + len(ops) - 1]  # ... up to the next.
    assert (b, first) not in served
    served[b, first] = len(ops)


@given(seed=st.integers(0, 1000))
def test_incremental_delta_equals_fresh_difference(seed):
  from malloczero.env.programs.synthetic import contended, random_workload

  workload = random_workload(seed, num_ops=25)
  hw = contended(PRESETS["nnpi-like"], workload, 0.3)
  model = CostModel(workload, hw)
  requests = build_requests(model)
  rng = np.random.default_rng(seed)
  memory = model.slow_memory_time.copy()
  op_time = np.maximum(model.compute_time, memory)
  chosen = []
  total = model.slow_only_time
  # Place a random subset of requests (ignoring address overlap: the cost model does not care).
  for r in rng.permutation(len(requests))[: max(1, len(requests) // 2)]:
    level = int(rng.integers(hw.num_fast_levels))
    ops, nbytes = requests.ops(r)
    savings = model.saving_per_fast_level(
      memory, op_time, ops, nbytes, float(requests.exposed_copy_time[r])
    )
    new_memory, new_time, saved = model.placement_delta(
      memory, op_time, ops, nbytes, level, float(requests.exposed_copy_time[r])
    )
    assert saved == pytest.approx(savings[level], rel=1e-12, abs=1e-18)
    memory[ops], op_time[ops] = new_memory, new_time
    total -= saved + float(requests.exposed_copy_time[r])  # Op time only: copies are simulated.
    chosen.append((r, level))
  rs = np.array([c[0] for c in chosen])
  alloc = Allocations(
    requests.buffer[rs],
    np.array([c[1] for c in chosen]),
    np.zeros(len(rs), np.int64),
    requests.start[rs],
    requests.end[rs],
  )
  assert model.evaluate(alloc).compute_and_memory_s == pytest.approx(total, rel=1e-9)


def test_presets_and_hardware_json(tmp_path):
  import json

  assert PRESETS["nnpi-like"].num_levels == 3
  lv = PRESETS["nnpi-like"].levels
  assert lv[0].capacity_bytes == 4 << 20 and lv[1].capacity_bytes == 24 << 20
  assert lv[1].bandwidth_bytes_per_s == pytest.approx(lv[0].bandwidth_bytes_per_s / 10)
  assert lv[2].bandwidth_bytes_per_s == pytest.approx(lv[0].bandwidth_bytes_per_s / 100)
  path = tmp_path / "hw.json"
  path.write_text(json.dumps(PRESETS["tpu-v4i-like"].to_dict()))
  assert load_hardware(str(path)) == PRESETS["tpu-v4i-like"]
  # A fast capacity is for the fast levels together, in the preset's ratio (SRAM:LLC = 1:6),
  # each aligned down to 64 B: 14 MiB is 2 MiB of SRAM and 12 MiB of LLC.
  half = PRESETS["nnpi-like"].with_fast_capacity(14 << 20)
  assert [level.capacity_bytes for level in half.levels] == [2 << 20, 12 << 20, 32 << 30]
  odd = PRESETS["nnpi-like"].with_fast_capacity(1000)
  # 142.9 -> 128, 857.1 -> 832.
  assert [level.capacity_bytes for level in odd.levels[:2]] == [128, 832]
  assert odd.fast_capacity_bytes == 960 <= 1000
  # One fast level gets exactly what was asked.
  assert PRESETS["tpu-v4i-like"].with_fast_capacity(1000).levels[0].capacity_bytes == 1000
  llc = PRESETS["nnpi-like"].with_level_capacities({"LLC": 1 << 20})
  assert [level.capacity_bytes for level in llc.levels] == [4 << 20, 1 << 20, 32 << 30]
  for levels, message in (
    (
      {"DRAM": 5},
      "no fast level 'DRAM' (fast levels: SRAM, LLC); 'DRAM' is the slow default memory",
    ),
    ({"L2": 5}, "no fast level 'L2'"),
    ({"SRAM": 0}, "capacity of 'SRAM' must be positive"),
  ):
    with pytest.raises(HardwareError, match=re.escape(message)):
      PRESETS["nnpi-like"].with_level_capacities(levels)


@pytest.mark.parametrize(
  "mutate,message",
  [
    (lambda d: d["levels"][0].update(capacity_bytes=0), "capacity 0; capacities must be positive"),
    (lambda d: d["levels"][0].update(bandwidth_bytes_per_s=1.0), "ordered fastest first"),
    (lambda d: d.update(levels=d["levels"][:1]), "at least two memory levels"),
    (lambda d: d.update(alignment_bytes=48), "power of two"),
    (lambda d: d.update(peak_flops_per_s=-1), "peak_flops_per_s must be positive"),
    (lambda d: d.pop("copy_bandwidth_bytes_per_s"), "missing required key"),
    (lambda d: d["levels"][0].update(capacity_bytes="big"), "'capacity_bytes' must be an integer"),
  ],
)
def test_impossible_hardware_is_rejected(tmp_path, mutate, message):
  import json

  data = PRESETS["tpu-v4i-like"].to_dict()
  mutate(data)
  path = tmp_path / "hw.json"
  path.write_text(json.dumps(data))
  with pytest.raises(HardwareError, match=message) as info:
    load_hardware(str(path))
  assert "\n" not in str(info.value)


def test_unknown_hardware_and_a_program_too_big_for_slow_memory():
  from malloczero.env.game import RequestsGame

  with pytest.raises(HardwareError, match="unknown hardware 'tpu-v9'"):
    load_hardware("tpu-v9")
  tiny_slow = Hardware(
    "tiny", (MemoryLevel("fast", 64, 100.0), MemoryLevel("slow", 100, 10.0)), 1.0, 1.0, 1
  )
  with pytest.raises(HardwareError, match="peak live bytes 350 exceed the slow memory"):
    RequestsGame(PROGRAM, tiny_slow)


# ------------------------------------------------------------------ copy contention (simulator)


def reference_stalls(idle_s, start, done, work_s):
  """XLA's RuntimeSimulator as a plain loop: [T + 1] stall at each boundary.

  At boundary t: copies issued at t join the FIFO queue; for each copy due at t that is still
  queued the program stalls while the queue runs at full speed until it is done; then op t runs
  and the queue advances for the op's idle time."""
  num_ops = len(idle_s)
  order = sorted(range(len(start)), key=lambda k: (start[k], done[k], k))
  queue: list[list] = []  # [copy, remaining seconds]
  stalls = [0.0] * (num_ops + 1)
  for t in range(num_ops + 1):
    queue.extend([k, float(work_s[k])] for k in order if start[k] == t)
    for k in [k for k in order if done[k] == t]:
      if any(q[0] == k for q in queue):
        while True:
          head = queue.pop(0)
          stalls[t] += head[1]
          if head[0] == k:
            break
    if t == num_ops:
      break
    left = float(idle_s[t])
    while queue and left > 0:
      used = min(left, queue[0][1])
      queue[0][1] -= used
      left -= used
      if queue[0][1] <= 0:
        queue.pop(0)
  return np.array(stalls)


@st.composite
def copy_cases(draw):
  num_ops = draw(st.integers(1, 12))
  idle = draw(
    st.lists(st.one_of(st.just(0.0), st.floats(0.0, 5.0)), min_size=num_ops, max_size=num_ops)
  )
  k = draw(st.integers(0, 10))
  start = [draw(st.integers(0, num_ops)) for _ in range(k)]
  done = [draw(st.integers(s, num_ops)) for s in start]
  work = [draw(st.one_of(st.just(0.0), st.floats(0.0, 6.0))) for _ in range(k)]
  return (
    np.array(idle, float),
    np.array(start, np.int64),
    np.array(done, np.int64),
    np.array(work, float),
  )


@given(copy_cases())
def test_vectorised_copy_simulation_equals_the_reference_loop(case):
  idle, start, done, work = case
  fast = simulate_copies(idle, Copies(start, done, work))
  np.testing.assert_allclose(
    fast.stall_s, reference_stalls(idle, start, done, work), rtol=1e-9, atol=1e-9
  )


@given(copy_cases())
def test_jitted_stall_loop_equals_the_reference_loop(case):
  idle, start, done, work = case
  np.testing.assert_allclose(
    total_stall_loop(idle, Copies(start, done, work)),
    reference_stalls(idle, start, done, work).sum(),
    rtol=1e-9,
    atol=1e-9,
  )


# XLA's memory-space-assignment test hardware: fast 128 B @ 1000 B/s, slow @ 100 B/s, copy
# 100 B/s, 1000 flop/s, alignment 8. A 24-byte buffer (f32[2,3]) takes 0.024 s to touch in fast
# memory, 0.24 s in default memory, and 0.24 s to copy.
XLA_HW = Hardware(
  "xla-test",
  (MemoryLevel("alternate", 128, 1000.0), MemoryLevel("default", 1 << 20, 100.0)),
  peak_flops_per_s=1000.0,
  copy_bandwidth_bytes_per_s=100.0,
  alignment_bytes=8,
)


def xla_program(flops, buffers):
  return workload_from_ops("xla-" + "-".join(str(int(f)) for f in flops), "hand", flops, buffers)


def param(i, size, uses):
  return {"id": i, "name": f"p{i}", "size": size, "def": None, "uses": uses, "kind": "parameter"}


def prefetch(buffer, start, end, done):
  """One prefetched allocation per buffer, at offsets that do not overlap."""
  col = lambda *v: np.array(v, np.int64)
  offsets = [32 * i for i in range(len(buffer))]
  return Allocations(
    col(*buffer),
    col(*[0] * len(buffer)),
    col(*offsets),
    col(*start),
    col(*end),
    prefetch_done=col(*done),
  )


def test_one_prefetch_hidden_in_idle_time():
  # op0 computes for 1 s touching nothing: 1 s of default-memory idle time, enough for the
  # 0.24 s copy of p0 due before op1; op1 then reads p0 in fast memory (0.024 s).
  program = xla_program([1000.0, 0.0], [param(0, 24, [1])])
  model = CostModel(program, XLA_HW)
  assert model.slow_only_time == pytest.approx(1.24)
  ev = model.evaluate(prefetch([0], [0], [2], [1]))
  assert ev.total_stall_s == 0.0 and ev.total_time_s == pytest.approx(1.024)


def test_one_prefetch_exposed_stalls_for_what_remains():
  # op0 computes for 0.1 s: the copy does 0.1 s of its 0.24 s, the program stalls 0.14 s.
  model = CostModel(xla_program([100.0, 0.0], [param(0, 24, [1])]), XLA_HW)
  ev = model.evaluate(prefetch([0], [0], [2], [1]))
  np.testing.assert_allclose(ev.stall_s, [0.0, 0.14, 0.0], atol=1e-12)
  assert ev.total_time_s == pytest.approx(0.1 + 0.14 + 0.024)


def test_two_prefetches_share_the_idle_time_first_in_first_out():
  # Both issued before op0 (0.3 s idle): p0 (due at op1) is served first and done at 0.24; p1
  # gets 0.06 s there and 0.024 s during op1 (p0 read from fast memory: no default traffic),
  # and the program stalls for its last 0.156 s before op2.
  program = xla_program([300.0, 0.0, 0.0], [param(0, 24, [1]), param(1, 24, [2])])
  model = CostModel(program, XLA_HW)
  both = model.evaluate(prefetch([0, 1], [0, 0], [2, 3], [1, 2]))
  np.testing.assert_allclose(both.stall_s, [0, 0, 0.156, 0], atol=1e-12)
  assert both.total_time_s == pytest.approx(0.3 + 0.024 + 0.156 + 0.024)
  np.testing.assert_allclose(both.copy_finish_s, [0.24, 0.48])
  # Alone, p1's copy is done by 0.24 with no stall: the second copy finishes later when shared.
  alone = model.evaluate(prefetch([1], [0], [3], [2]))
  assert alone.total_stall_s == 0.0 and alone.copy_finish_s[0] == pytest.approx(0.24)
  assert alone.total_time_s == pytest.approx(0.3 + 0.24 + 0.024)


def test_a_copy_cannot_advance_during_an_op_busy_on_default_memory():
  # op0 reads 48 B from default memory with no compute: 0.48 s all on default memory, no idle
  # time, so p0's copy issued before it is still whole at op1: a 0.24 s stall.
  program = xla_program([0.0, 0.0], [param(0, 24, [1]), param(1, 48, [0])])
  model = CostModel(program, XLA_HW)
  ev = model.evaluate(prefetch([0], [0], [2], [1]))
  np.testing.assert_allclose(ev.stall_s, [0.0, 0.24, 0.0], atol=1e-12)
  assert ev.total_time_s == pytest.approx(0.48 + 0.24 + 0.024)
  # With 1 s of compute op0 takes 1 s and leaves 0.52 s idle: the copy hides.
  busy = CostModel(xla_program([1000.0, 0.0], [param(0, 24, [1]), param(1, 48, [0])]), XLA_HW)
  assert busy.evaluate(prefetch([0], [0], [2], [1])).total_stall_s == 0.0


def reference_evaluate(workload, hardware, alloc):
  """Program time by plain loops: each incidence's level, op times, idle times, then the copy
  queue by `reference_stalls`."""
  inv = 1.0 / np.array([lv.bandwidth_bytes_per_s for lv in hardware.levels])
  memory = [0.0] * workload.num_ops
  default = [0.0] * workload.num_ops
  a = workload.arrays
  for b, t, nbytes in zip(a.incidence_buffer, a.incidence_op, a.incidence_bytes):
    level = hardware.slow_level
    for i in range(len(alloc)):
      if (
        alloc.buffer[i] == b and alloc.start[i] <= t < alloc.end[i] and t >= alloc.prefetch_done[i]
      ):
        level = alloc.level[i]
    memory[t] += nbytes * inv[level]
    if level == hardware.slow_level:
      default[t] += nbytes * inv[level]
  compute = a.flops / hardware.peak_flops_per_s
  op_time = [max(c, m) for c, m in zip(compute, memory)]
  idle = np.array([max(o - d, 0.0) for o, d in zip(op_time, default)])
  starts, dones, work = [], [], []
  for i in range(len(alloc)):
    copy_s = a.sizes[alloc.buffer[i]] / hardware.copy_bandwidth_bytes_per_s
    if alloc.prefetch_done[i] >= 0:
      starts.append(alloc.start[i]), dones.append(alloc.prefetch_done[i]), work.append(copy_s)
    if alloc.evict_start[i] >= 0:
      starts.append(alloc.evict_start[i]), dones.append(alloc.evict_done[i]), work.append(copy_s)
  return sum(op_time) + reference_stalls(idle, starts, dones, work).sum()


@pytest.mark.slow  # Integration-sized: subprocesses, compiles or every solver.
@given(st.data())
def test_evaluation_equals_plain_loops_on_random_programs_with_evictions(data):
  from hypothesis import assume

  from malloczero.env import MalloczeroError, RequestsGame
  from tests.strategies import hardware_for, workloads

  workload = data.draw(workloads())
  hardware = data.draw(hardware_for(workload))
  try:
    game = RequestsGame(workload, hardware)
  except MalloczeroError:
    assume(False)
  rng = np.random.default_rng(data.draw(st.integers(0, 100)))
  ts = game.reset()
  while not ts.last():
    legal = np.flatnonzero(ts.observation["legal_actions"])
    ts = game.step(legal[rng.integers(len(legal))])
  alloc = game.allocations()
  # Evict some activations produced in place, over a random window after their definition.
  evict_start, evict_done = alloc.evict_start.copy(), alloc.evict_done.copy()
  for i in np.flatnonzero((alloc.prefetch_done < 0) & (alloc.end - alloc.start >= 2)):
    if rng.random() < 0.5:
      evict_start[i] = rng.integers(alloc.start[i] + 1, alloc.end[i] + 1)
      evict_done[i] = rng.integers(evict_start[i], alloc.end[i] + 1)
  alloc = dataclasses.replace(alloc, evict_start=evict_start, evict_done=evict_done)
  fresh = CostModel(workload, hardware).evaluate(alloc)
  assert fresh.total_time_s == pytest.approx(
    reference_evaluate(workload, hardware, alloc), rel=1e-9
  )


def test_uses_before_a_prefetch_is_done_read_default_memory():
  # p0 is used by op0 (0.1 s of compute) and op2; a segment over [0, 3) whose prefetch is due
  # at op2 serves only op2: op0 still reads the default-memory copy, 0.24 s with no idle time,
  # and the copy hides in op1's 1 s of compute.
  program = xla_program([100.0, 1000.0, 0.0], [param(0, 24, [0, 2])])
  model = CostModel(program, XLA_HW)
  ev = model.evaluate(prefetch([0], [0], [3], [2]))
  np.testing.assert_allclose(ev.op_time_s, [0.24, 1.0, 0.024])
  assert ev.total_stall_s == 0.0 and ev.total_time_s == pytest.approx(1.264)
  # Due at op0 instead, it serves both uses (op0 takes its 0.1 s of compute), but the program
  # first waits for the whole copy.
  ev = model.evaluate(prefetch([0], [0], [3], [0]))
  np.testing.assert_allclose(ev.op_time_s, [0.1, 1.0, 0.024])
  np.testing.assert_allclose(ev.stall_s, [0.24, 0, 0, 0])
  assert ev.total_time_s == pytest.approx(1.364)
