"""The assembled msa (env/msa/algorithm.py) on XLA's own behaviours.

Cases named after a test of openxla/xla `xla/service/memory_space_assignment/
memory_space_assignment_test.cc` rebuild its program as a hand-made workload on XLA's test
hardware (tests/msa_xla_cases.py's `XLA_HW`: alternate memory 128 B at 1000 B/s, default
memory at 100 B/s, copies at 100 B/s, 1000 flop/s, alignment 8). f32[2,3] = 24 B, f32[4,3] =
48 B; an elementwise op is one flop per element, a tanh 100 (XLA's transcendentals at 10/s).
XLA's schedule starts with its parameter instructions; here parameters exist at the program
start (-1) and op 0 is the first real op, so XLA's time t is op t - (number of parameters).
"""

import dataclasses
import json

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from malloczero.env.cost_model import NO_COPY, Allocations, CostModel
from malloczero.env.hardware import Hardware, MemoryLevel
from malloczero.env.msa.algorithm import (
  MsaAlgorithm,
  MsaDecisions,
  MsaOptions,
  allocations_mapping,
  msa_allocations,
  msa_mapping,
)
from malloczero.env.programs.suites import get_suite
from malloczero.env.solvers import SOLVERS, solve
from malloczero.env.validator import validate_mapping
from malloczero.env.workload import Workload
from malloczero.env.workload_json import workload_from_dict
from tests.msa_xla_cases import XLA_HW, tanh_negate_chains
from tests.strategies import hardware_for, workloads

F32_2_3, F32_4_3 = 24, 48
COUNT_PICKER = MsaOptions(picker="instruction_count")  # XLA's AssignMemorySpace default (2, 10).


class Program:
  """A little HLO-like builder: `op(name, operands, flops)` appends an op whose result is a new
  buffer; parameters are named up front; `outputs` are the program's results."""

  def __init__(self, size: int, parameters: list[str]):
    self.size = size
    self.ops: list[tuple[str, float]] = []
    self.defs: dict[str, int | None] = {p: None for p in parameters}
    self.uses: dict[str, list[int]] = {p: [] for p in parameters}

  def op(self, name: str, operands: list[str], flops_per_element: float = 1.0) -> str:
    t = len(self.ops)
    self.ops.append((name, flops_per_element * self.size / 4))
    for x in dict.fromkeys(operands):
      self.uses[x].append(t)
    self.defs[name], self.uses[name] = t, []
    return name

  def build(self, outputs: list[str]) -> Workload:
    buffers = []
    for i, (name, d) in enumerate(self.defs.items()):
      kind = "parameter" if d is None else "output" if name in outputs else "activation"
      buffers.append(
        {"id": i, "name": name, "size": self.size, "def": d, "uses": self.uses[name], "kind": kind}
      )
    return workload_from_dict(
      {
        "name": "xla-test",
        "source": "hand",
        "ops": [{"name": n, "flops": f} for n, f in self.ops],
        "buffers": buffers,
      }
    )


def segments_of(workload: Workload, allocations: Allocations, name: str) -> list[dict]:
  """The buffer's segments in time order, as dicts."""
  b = [x.name for x in workload.buffers].index(name)
  rows = [
    dict(
      level=int(allocations.level[i]),
      offset=int(allocations.offset[i]),
      start=int(allocations.start[i]),
      end=int(allocations.end[i]),
      prefetch_done=int(allocations.prefetch_done[i]),
      evict_start=int(allocations.evict_start[i]),
      evict_done=int(allocations.evict_done[i]),
    )
    for i in np.flatnonzero(allocations.buffer == b)
  ]
  return sorted(rows, key=lambda r: r["start"])


def run(workload: Workload, options: MsaOptions = MsaOptions()) -> Allocations:
  """msa's segments, after checking that its mapping validates."""
  mapping, _ = msa_mapping(CostModel(workload, XLA_HW), options)
  validate_mapping(workload, XLA_HW, mapping)
  allocations, _ = msa_allocations(workload, XLA_HW, options)
  return allocations


def max_in_flight(starts: np.ndarray, dones: np.ndarray, num_ops: int) -> int:
  """The most copies in flight during one op (a copy flies from boundary start to done)."""
  ops = np.arange(num_ops)
  if len(starts) == 0:
    return 0
  return int(((starts[:, None] <= ops[None, :]) & (ops[None, :] < dones[:, None])).sum(0).max())


# ----------------------------------------------------------------------------- XLA's programs


def simple_program() -> Workload:
  """XLA's `Simple`: add(p0, p1), sub(p0, p1), mul(add, sub) as the result; f32[2,3]."""
  p = Program(F32_2_3, ["p0", "p1"])
  p.op("add", ["p0", "p1"])
  p.op("sub", ["p0", "p1"])
  p.op("mul", ["add", "sub"])
  return p.build(["mul"])


def negate_chain() -> Workload:
  """XLA's `NegateChain`: negate0..6 from p0, add(negate6, p1) as the result."""
  p = Program(F32_2_3, ["p0", "p1"])
  x = "p0"
  for i in range(7):
    x = p.op(f"negate{i}", [x])
  p.op("add", [x, "p1"])
  return p.build(["add"])


def evict_and_prefetch(second_use: bool = False) -> Workload:
  """XLA's `EvictAndPrefetch`: tanh(p0) is read by `a` right away and by the root add after 14
  more ops; with `second_use` (`EvictAndPrefetchAndPrefetch`) the program goes on with a second
  chain of 14 ops whose root reads tanh again."""
  p = Program(F32_2_3, ["p0", "p1"])
  p.op("tanh", ["p0"], 100.0)
  p.op("a", ["tanh", "p0"])
  for name, operands in (
    ("b", ["p0", "p1"]),
    ("c", ["p0", "p1"]),
    ("d", ["p0", "p1"]),
    ("e", ["a", "b"]),
    ("f", ["a", "c"]),
    ("g", ["a", "d"]),
    ("h", ["b", "c"]),
    ("i", ["b", "d"]),
    ("j", ["c", "d"]),
    ("k", ["e", "f"]),
    ("l", ["g", "h"]),
    ("m", ["i", "j"]),
    ("n", ["k", "l"]),
    ("o", ["n", "m"]),
  ):
    p.op(name, operands)
  p.op("add0", ["o", "tanh"])
  if not second_use:
    return p.build(["add0"])
  for name, operands in (
    ("a1", ["add0", "p0"]),
    ("b1", ["p0", "p1"]),
    ("c1", ["p0", "p1"]),
    ("d1", ["p0", "p1"]),
    ("e1", ["a1", "b1"]),
    ("f1", ["a1", "c1"]),
    ("g1", ["a1", "d1"]),
    ("h1", ["b1", "c1"]),
    ("i1", ["b1", "d1"]),
    ("j1", ["c1", "d1"]),
    ("k1", ["e1", "f1"]),
    ("l1", ["g1", "h1"]),
    ("m1", ["i1", "j1"]),
    ("n1", ["k1", "l1"]),
    ("o1", ["n1", "m1"]),
  ):
    p.op(name, operands)
  p.op("add1", ["o1", "tanh"])
  return p.build(["add1"])


def evictions_shouldnt_be_delayed() -> Workload:
  """XLA's `EvictionsShouldntBeDelayed`: the tanh / negate chains of f32[4,3] with five
  redundant tanh(p0) that nothing reads (here program outputs, so that they are kept); 128 B
  hold two such buffers."""
  p = Program(F32_4_3, ["p0"])
  p.op("tanh0", ["p0"], 100.0)
  for i in range(5):
    p.op(f"tanh_redundant{i}", ["p0"], 100.0)
  p.op("negate0", ["tanh0"])
  p.op("tanh1", ["negate0"], 100.0)
  p.op("negate1", ["negate0"])
  p.op("tanh2", ["tanh1"], 100.0)
  p.op("negate2", ["negate1"])
  p.op("tanh3", ["tanh2"], 100.0)
  p.op("negate3", ["negate2"])
  return p.build(["tanh3", "negate3"] + [f"tanh_redundant{i}" for i in range(5)])


# ----------------------------------------------------------------------------- behaviours


def test_simple_keeps_add_and_sub_in_fast_memory_at_different_offsets():
  """XLA's `Simple`: add and sub in alternate memory at different offsets (both live until
  mul); the parameters' own positions and mul, the result, in default memory. Parameters reach
  fast memory only as copies: none for add (no op before it to hide one), one each for sub,
  started at the program start and hidden (by XLA's budgets) behind add's 0.72 s."""
  w = simple_program()
  allocations = run(w)
  add, sub = segments_of(w, allocations, "add"), segments_of(w, allocations, "sub")
  assert [(s["level"], s["start"], s["end"], s["prefetch_done"]) for s in add] == [
    (0, 0, 3, NO_COPY)
  ]
  assert [(s["level"], s["start"], s["end"], s["prefetch_done"]) for s in sub] == [
    (0, 1, 3, NO_COPY)
  ]
  assert add[0]["offset"] != sub[0]["offset"]
  for name in ("p0", "p1"):
    assert [
      (s["start"], s["prefetch_done"], s["end"]) for s in segments_of(w, allocations, name)
    ] == [(0, 1, 2)]
  assert segments_of(w, allocations, "mul") == []
  assert len({int(o) for o in allocations.offset}) == 4


def test_simple_with_the_instruction_count_picker_makes_no_copy():
  """`Simple` as XLA's test runs it (instruction-count picker, 2 / 10): add and sub in alternate
  memory. XLA also prefetches one parameter for sub (its test counts three chunks): there p0
  and p1 take schedule slots 0 and 1, so sub (slot 3) is three instructions after p0; here
  parameters exist at the program start (-1) and sub is op 1, two steps away, which the picker's
  minimum of two ops between copy start and use refuses. The time shift is docs/msa.md's
  "parameters' definition time" question."""
  w = simple_program()
  allocations = run(w, COUNT_PICKER)
  assert sorted(w.buffers[int(b)].name for b in allocations.buffer) == ["add", "sub"]
  assert not allocations.is_prefetch.any()


def test_negate_chain_with_the_instruction_count_picker_prefetches_p1():
  """XLA's `NegateChain` (instruction-count picker, 2 / 10): every negate produced in
  alternate memory and kept until its reader; p1 prefetched as early as it can be (XLA: the
  copy-start right after p1's parameter instruction) for the add; p0, read at once, is not."""
  w = negate_chain()
  allocations = run(w, COUNT_PICKER)
  for i in range(7):
    (negate,) = segments_of(w, allocations, f"negate{i}")
    assert (negate["start"], negate["end"], negate["prefetch_done"]) == (i, i + 2, NO_COPY)
  (p1,) = segments_of(w, allocations, "p1")
  assert (p1["start"], p1["prefetch_done"], p1["end"]) == (0, 7, 8)
  assert segments_of(w, allocations, "p0") == [] and segments_of(w, allocations, "add") == []


def test_negate_chain_with_the_cost_picker_keeps_the_negates_and_prefetches_p1_late():
  """NegateChain with the cost picker (0.8 / 1.5 / 10), XLA's `CostAnalysis` variant: the
  negates stay in alternate memory and the parameters' own positions in default memory (XLA's
  `CheckParametersInDefaultMemory`; here a parameter's fast segment is always a prefetched
  copy). p0 is read at once, so no copy can hide. p1's copy (24 B at 100 B/s, 0.24 s) starts at
  the picker's preferred start, the one whose overlapped ops come closest to 1.5 x the copy
  time: after op 5, so that negate6 (0.48 s) covers it, and the chunk is held two ops only."""
  w = negate_chain()
  allocations = run(w)
  for i in range(7):
    assert len(segments_of(w, allocations, f"negate{i}")) == 1
  assert segments_of(w, allocations, "p0") == []
  (p1,) = segments_of(w, allocations, "p1")
  assert (p1["start"], p1["prefetch_done"], p1["end"]) == (6, 7, 8)


def test_evict_and_prefetch():
  """XLA's `EvictAndPrefetch` (instruction-count picker): tanh is produced in alternate memory
  and kept for `a`; its second use is 15 ops later, longer than the picker keeps a buffer
  without a copy, so it is evicted (done two ops after it was produced) and prefetched back
  (the copy starting 10 ops before the use)."""
  w = evict_and_prefetch()
  allocations = run(w, COUNT_PICKER)
  produced, fetched = segments_of(w, allocations, "tanh")
  assert (produced["start"], produced["prefetch_done"]) == (0, NO_COPY)
  assert (produced["evict_start"], produced["evict_done"]) == (1, 2)
  assert (fetched["start"], fetched["prefetch_done"], fetched["end"]) == (7, 16, 17)
  assert fetched["evict_start"] == NO_COPY


def test_evict_and_prefetch_and_prefetch():
  """XLA's `EvictAndPrefetchAndPrefetch`: tanh read at ops 1, 16 and 32: one eviction, and
  both later uses get their own prefetch from the evicted copy."""
  w = evict_and_prefetch(second_use=True)
  allocations = run(w, COUNT_PICKER)
  tanh = segments_of(w, allocations, "tanh")
  assert [s["prefetch_done"] for s in tanh] == [NO_COPY, 16, 32]
  assert sum(s["evict_start"] != NO_COPY for s in tanh) == 1
  assert tanh[0]["evict_done"] <= tanh[1]["start"]


@pytest.mark.parametrize("limit", [0, 1, 2])
def test_evict_and_prefetch_limit_async_copies(limit):
  """XLA's `EvictAndPrefetchLimitAsyncCopies0/1/2`: with at most `limit` outstanding
  prefetches and evictions, no more are ever in flight; with 0 there are no copies at all
  (tanh, which would need an eviction, stays in default memory)."""
  w = evict_and_prefetch(second_use=True)
  options = MsaOptions(
    picker="instruction_count", max_outstanding_prefetches=limit, max_outstanding_evictions=limit
  )
  allocations = run(w, options)
  prefetch = allocations.is_prefetch
  evicted = allocations.is_evicted
  assert (
    max_in_flight(allocations.start[prefetch], allocations.prefetch_done[prefetch], w.num_ops)
    <= limit
  )
  assert (
    max_in_flight(allocations.evict_start[evicted], allocations.evict_done[evicted], w.num_ops)
    <= limit
  )
  _, stats = msa_allocations(w, XLA_HW, options)
  if limit == 0:
    assert not prefetch.any() and not evicted.any()
    # tanh's eviction is refused, so the whole buffer is taken back (kFailRequiresUncommit).
    assert segments_of(w, allocations, "tanh") == [] and stats.uncommitted_buffers == 1
  else:
    assert prefetch.any() and stats.evictions == 1 and stats.uncommitted_buffers == 0


def test_memory_boundedness_buffer_interval_compare_gives_the_negates_fast_memory():
  """XLA's `MemoryBoundednessBufferIntervalCompare` run through the whole loop (cost picker):
  interleaved tanh and negate chains of f32[4,3], two of which fit in 128 B. The negates are
  memory bound and sorted first: every negate but the result is produced in alternate memory,
  alternating between the two offsets; no tanh (compute bound) is."""
  w = tanh_negate_chains()
  allocations = run(w)
  for i in range(5):
    assert segments_of(w, allocations, f"tanh{i}") == []
  negates = [segments_of(w, allocations, f"negate{i}") for i in range(4)]
  assert all(len(n) == 1 and n[0]["prefetch_done"] == NO_COPY for n in negates)
  assert len({n[0]["offset"] for n in negates[:2]}) == 2


def test_evictions_shouldnt_be_delayed():
  """XLA's `EvictionsShouldntBeDelayed` (cost picker, f32[4,3]): at no op are more than two
  buffers in alternate memory, and something is."""
  w = evictions_shouldnt_be_delayed()
  allocations = run(w)
  assert len(allocations) > 0
  ops = np.arange(w.num_ops)
  live = (allocations.start[:, None] <= ops[None, :]) & (ops[None, :] < allocations.end[:, None])
  assert live.sum(0).max() <= 2


def test_xlas_elapsed_budgets_hide_a_copy_the_simulator_stalls_for_and_idle_budgets_do_not():
  """docs/msa.md's open question, on the smallest program that shows it: q is negated (op 0,
  memory bound: 0.48 s moving 48 B, 0.006 s of compute), then p is negated (op 1). XLA budgets op 0
  its
  elapsed 0.48 s, enough for p's 0.24 s copy, so msa prefetches p across op 0 for op 1, which
  then reads it 0.216 s faster. The cost model (XLA's `RuntimeSimulator` rule) moves
  copies only in default-memory idle time, none during op 0: the program stalls 0.24 s and ends
  0.024 s slower than with everything in default memory. With `copy_budget="idle"` msa sees no
  room before the add and leaves p in default memory."""
  p = Program(F32_2_3, ["p", "q"])
  p.op("x", ["q"])
  p.op("y", ["p"])
  w = p.build(["x", "y"])
  model = CostModel(w, XLA_HW)
  faithful, _ = msa_mapping(model)
  assert [(a["buffer"], a["start"], a["prefetch"]["done"]) for a in faithful.allocations] == [
    (0, 0, 1)
  ]
  assert faithful.estimated_time_s == pytest.approx(model.slow_only_time + 0.24 - 0.216)
  idle, _ = msa_mapping(model, MsaOptions(copy_budget="idle"))
  assert idle.allocations == () and idle.estimated_time_s == pytest.approx(model.slow_only_time)


def test_three_levels_fill_the_fastest_first_then_the_next():
  """docs/msa.md's extension (XLA has one alternate memory): with SRAM (48 B) + LLC (128 B) +
  DRAM, each segment tries SRAM first, then LLC. A chain of f32[4,3] negates keeps two values
  live at each op: one fits in SRAM, the other goes to LLC; all stay in fast memory."""
  hw = Hardware(
    "three",
    (
      MemoryLevel("sram", 48, 1000.0),
      MemoryLevel("llc", 128, 200.0),
      MemoryLevel("dram", 1 << 30, 100.0),
    ),
    peak_flops_per_s=1000.0,
    copy_bandwidth_bytes_per_s=100.0,
    alignment_bytes=8,
  )
  p = Program(F32_4_3, ["p0"])
  x = "p0"
  for i in range(4):
    x = p.op(f"negate{i}", [x])
  w = p.build([x])
  mapping, _ = msa_mapping(CostModel(w, hw))
  validate_mapping(w, hw, mapping)
  levels = {w.buffers[w.buffer_index[a["buffer"]]].name: a["level"] for a in mapping.allocations}
  assert set(levels) == {"negate0", "negate1", "negate2"}
  assert sorted(levels.values()) in ([0, 0, 1], [0, 1, 1])
  assert all(levels[f"negate{i}"] != levels[f"negate{i + 1}"] for i in range(2))


# ----------------------------------------------------------------------------- deferral


def two_values_one_fits() -> Workload:
  """a and b (f32[8,3], 96 B each) both live at op 2, where c reads them: 128 B of alternate
  memory holds one of them. Nothing else competes (no parameter)."""
  p = Program(96, [])
  p.op("a", [])
  p.op("b", [])
  p.op("c", ["a", "b"])
  return p.build(["c"])


def test_deferring_the_buffer_msa_allocates_first_gives_its_space_to_the_other():
  """The measured defer action (docs/results/defer-measurement.md): msa allocates a first and
  keeps it; deferred, a is allocated after b, which then holds the only chunk, and a stays in
  default memory. Deferring both keeps msa's relative order, hence msa's result."""
  w = two_values_one_fits()
  placed = lambda allocations: {n: segments_of(w, allocations, n) for n in ("a", "b")}
  msa, _ = msa_allocations(w, XLA_HW)
  assert [(s["start"], s["end"]) for s in placed(msa)["a"]] == [(0, 3)] and not placed(msa)["b"]
  a, b = ([x.name for x in w.buffers].index(n) for n in ("a", "b"))
  deferred = MsaAlgorithm(w, XLA_HW, deferred=frozenset({a})).run()
  assert not placed(deferred)["a"]
  assert [(s["start"], s["end"]) for s in placed(deferred)["b"]] == [(1, 3)]
  validate_mapping(w, XLA_HW, allocations_mapping(CostModel(w, XLA_HW), deferred, "msa"))
  for both in (frozenset({a, b}), frozenset({b})):
    assert placed(MsaAlgorithm(w, XLA_HW, deferred=both).run()) == placed(msa)


def same_segments(a: Allocations, b: Allocations) -> bool:
  """Every field of every segment, in allocation order (tests/test_msa_steps.py imports this
  module, so its `same_allocations` cannot be imported here)."""
  fields = [f.name for f in dataclasses.fields(Allocations)]
  return all(np.array_equal(getattr(a, f), getattr(b, f)) for f in fields)


def test_deferring_nothing_is_msa_exactly():
  workload, hardware = get_suite("tiny").entries[0].load()
  expected, stats = msa_allocations(workload, hardware)
  decisions = MsaDecisions(workload, hardware, deferred=frozenset())
  while not decisions.done:
    decisions.choose(decisions.msa_choice)
  assert same_segments(decisions.allocations(), expected) and decisions.stats == stats
  # Deferring every buffer keeps msa's order, hence msa's segments.
  every = frozenset(range(len(workload.buffers)))
  assert same_segments(MsaAlgorithm(workload, hardware, deferred=every).run(), expected)


# ----------------------------------------------------------------------------- options


def test_options_have_xlas_test_defaults_and_refuse_an_unknown_picker():
  options = MsaOptions()
  assert (
    options.min_overlap_to_async_copy_ratio,
    options.preferred_overlap_to_async_copy_ratio,
    options.max_overlap_to_mem_size_async_copy_ratio,
  ) == (0.8, 1.5, 10.0)
  assert (options.max_outstanding_prefetches, options.max_outstanding_evictions) == (-1, -1)
  assert options.use_copy_resource and not options.enforce_prefetch_fifo_order
  assert options.copy_budget == "elapsed"
  with pytest.raises(ValueError, match="unknown picker"):
    MsaOptions(picker="fastest")
  with pytest.raises(ValueError, match="unknown copy budget"):
    MsaOptions(copy_budget="free")


def test_msa_is_the_registered_solver_and_the_old_one_is_msa_simple():
  assert "msa" in SOLVERS and "msa-simple" in SOLVERS
  w = evict_and_prefetch()
  result = solve(w, XLA_HW, "msa")
  assert result.mapping.solver == "msa"
  assert result.info["evictions"] >= 0 and result.info["requests"] >= 0
  assert solve(w, XLA_HW, "msa-simple").mapping.solver == "msa-simple"


def test_the_cli_counts_msas_segments_and_buffers_not_requests(tmp_path, capsys):
  """msa's mapping is segments, not the game's requests: `solve` says how many of each."""
  from malloczero.env.workload_json import save_workload
  from malloczero.launch.cli import main

  save_workload(evict_and_prefetch(), tmp_path / "w.json")
  (tmp_path / "hw.json").write_text(json.dumps(XLA_HW.to_dict()))
  assert (
    main(
      [
        "solve",
        str(tmp_path / "w.json"),
        "--hardware",
        str(tmp_path / "hw.json"),
        "--solver",
        "msa",
        "--out",
        str(tmp_path / "map.json"),
      ]
    )
    == 0
  )
  line = capsys.readouterr().out.splitlines()[0]
  mapping, _ = msa_mapping(CostModel(evict_and_prefetch(), XLA_HW))
  buffers = len({a["buffer"] for a in mapping.allocations})
  assert line.startswith(
    f"msa: {len(mapping.allocations)} segments of {buffers} buffers in fast memory; "
  )


def test_a_work_directorys_cached_msa_speedups_of_the_old_msa_are_computed_again(tmp_path):
  """Training compares the agent with msa's speed-ups cached in workdir/baselines.json; a cache
  written before msa became XLA's loop (no version) must not stand for the new msa."""
  from malloczero.actors.games import GameSpec
  from malloczero.evaluation.baselines import BASELINE_VERSIONS, baseline_speedups

  entry = get_suite("tiny").entries[0]
  workload, hardware = entry.load()
  spec = GameSpec(entry.name, workload, hardware)
  stale = {b: {entry.name: 42.0} for b in ("msa", "greedy", "bestfit", "random")}
  (tmp_path / "baselines.json").write_text(json.dumps(stale))
  speedups = baseline_speedups([spec], str(tmp_path))
  assert speedups["msa"][entry.name] == pytest.approx(solve(workload, hardware, "msa").speedup)
  assert BASELINE_VERSIONS["bestfit"] == 1
  assert speedups["bestfit"][entry.name] == 42.0  # Same version: the cache stands.
  # greedy is at version 2 now: the unversioned cache is version 1, so it is solved again.
  assert speedups["greedy"][entry.name] == pytest.approx(
    solve(workload, hardware, "greedy").speedup
  )
  written = json.loads((tmp_path / "baselines.json").read_text())
  assert written["versions"] == BASELINE_VERSIONS and "versions" not in speedups
  assert baseline_speedups([spec], str(tmp_path)) == speedups


# ----------------------------------------------------------------------------- properties


@pytest.mark.slow  # Integration-sized: subprocesses, compiles or every solver.
@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.data())
def test_every_msa_mapping_validates_and_only_copy_stalls_can_cost_time(data):
  """Every mapping validates, and fast memory never slows an op: the ops alone never take
  longer than with everything in default memory. The whole program can: msa plans copies
  against the ops' default-memory elapsed times (XLA's `AsynchronousCopyResource` budgets),
  while the cost model, like XLA's `RuntimeSimulator`, advances copies only in default-memory
  idle time, so a prefetch hidden behind a memory-bound op by msa's account stalls here (e.g.
  two memory-bound ops, a parameter prefetched across the first for the second)."""
  workload = data.draw(workloads())
  hardware = data.draw(hardware_for(workload))
  picker = data.draw(st.sampled_from(["cost", "instruction_count"]))
  limit = data.draw(st.sampled_from([-1, 0, 1, 2]))
  options = MsaOptions(
    picker=picker, max_outstanding_prefetches=limit, max_outstanding_evictions=limit
  )
  model = CostModel(workload, hardware)
  mapping, _ = msa_mapping(model, options)
  report = validate_mapping(workload, hardware, mapping)
  assert report.estimated_time_s == pytest.approx(mapping.estimated_time_s, rel=1e-9)
  ops_only = model.evaluate(mapping.to_arrays(workload)).compute_and_memory_s
  assert ops_only <= model.slow_only_time * (1 + 1e-9)


def test_msa_on_the_tiny_suite_validates_and_beats_all_slow():
  for entry in get_suite("tiny").entries:
    workload, hardware = entry.load()
    result = solve(workload, hardware, "msa")  # solve() validates the mapping.
    assert result.speedup >= 1.0, entry.name
