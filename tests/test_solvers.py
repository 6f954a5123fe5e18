"""Baselines: msa follows XLA's rules, CP-SAT is optimal and never worse, every mapping
validates."""

import importlib
import json
import re
import subprocess
import sys
import time

import numpy as np
import pytest

from malloczero.env import (
  PRESETS,
  Hardware,
  MalloczeroError,
  MemoryLevel,
  load_mapping,
  validate_mapping,
)
from malloczero.env.cost_model import CostModel
from malloczero.env.placement import Placement
from malloczero.env.programs.synthetic import contended, random_workload
from malloczero.env.requests import build_requests
from malloczero.env.solvers import SOLVERS, solve
from malloczero.env.solvers.evo import decode, decode_until, evo, mapping_priorities
from malloczero.env.workload_json import workload_from_dict

HW = Hardware(
  "toy",
  (MemoryLevel("fast", 1000, 100.0), MemoryLevel("slow", 10**9, 10.0)),
  peak_flops_per_s=1.0,
  copy_bandwidth_bytes_per_s=10.0,
  alignment_bytes=1,
)


def program(buffers, flops):
  return workload_from_dict(
    {
      "name": "hand",
      "source": "hand",
      "ops": [{"name": f"op{t}", "flops": f} for t, f in enumerate(flops)],
      "buffers": buffers,
    }
  )


@pytest.mark.slow  # Integration-sized: subprocesses, compiles or every solver.
@pytest.mark.parametrize("preset", ["tpu-v4i-like", "nnpi-like"])
@pytest.mark.parametrize("seed", [0, 1])
def test_every_solver_mapping_validates(preset, seed):
  workload = random_workload(seed, num_ops=30)
  hardware = contended(PRESETS[preset], workload, 0.2)
  for solver in SOLVERS:
    options = {"time_limit_s": 5.0} if solver == "cpsat" else {}
    result = solve(workload, hardware, solver, **options)
    report = validate_mapping(workload, hardware, result.mapping)
    assert report.estimated_time_s == pytest.approx(result.mapping.estimated_time_s, rel=1e-9)
    assert result.speedup >= 1.0 or solver == "random"


@pytest.mark.parametrize("preset", ["tpu-v4i-like", "nnpi-like"])
@pytest.mark.parametrize("seed", [0, 1, 2])
def test_bestfit_without_the_game_places_what_the_bestfit_solver_places(preset, seed):
  """`heuristics.bestfit` (pack's fallback, no game) and the `bestfit` solver (the requests
  game's first candidate at every step) are one rule: the same placements, the same time."""
  from malloczero.env.solvers.heuristics import bestfit

  workload = random_workload(seed, num_ops=30)
  hardware = contended(PRESETS[preset], workload, 0.2)
  model = CostModel(workload, hardware)
  placement = Placement(model, build_requests(model))
  bestfit(placement)
  played = solve(workload, hardware, "bestfit").mapping
  rows = [(a["request"], a["level"], a["offset"]) for a in played.allocations]
  assert placement.placed and rows == [tuple(row) for row in placement.placed]
  assert placement.total_time == pytest.approx(played.estimated_time_s, rel=1e-12)


def test_msa_places_the_more_memory_bound_buffer_when_only_one_fits():
  # Two 600-byte activations live together; only one fits in 1000 bytes. B is read by two
  # memory-bound ops, A by one: B saves twice as much and must win.
  w = program(
    [
      {"id": 0, "name": "A", "size": 600, "def": 0, "uses": [2], "kind": "activation"},
      {"id": 1, "name": "B", "size": 600, "def": 1, "uses": [2, 3], "kind": "activation"},
    ],
    [0.0, 0.0, 0.0, 0.0],
  )
  result = solve(w, HW, "msa")
  assert [a["buffer"] for a in result.mapping.allocations] == [1]


def test_msa_orders_by_time_saved_over_sqrt_size_not_by_saving():
  # A: 900 bytes over 3 ops saves 3*900*0.09 = 243 s; boundedness 243/30 = 8.1.
  # B: 100 bytes over 2 ops saves 2*100*0.09 = 18 s; boundedness 18/10 = 1.8.
  # C: 400 bytes over 2 ops saves 72 s; boundedness 72/20 = 3.6.
  # MSA's order is A, C, B; A takes 900 of 1000 bytes, so B (100) fits after it and C does not.
  w = program(
    [
      {"id": 0, "name": "A", "size": 900, "def": 0, "uses": [1, 2], "kind": "activation"},
      {"id": 1, "name": "B", "size": 100, "def": 0, "uses": [1], "kind": "activation"},
      {"id": 2, "name": "C", "size": 400, "def": 1, "uses": [2], "kind": "activation"},
    ],
    [0.0, 0.0, 0.0],
  )
  requests = build_requests(CostModel(w, HW))
  assert requests.buffer.tolist() == [0, 2, 1]
  placed = {a["buffer"]: a["offset"] for a in solve(w, HW, "msa").mapping.allocations}
  assert placed == {0: 0, 1: 900}


def test_best_fit_chooses_the_smallest_gap_that_holds_the_buffer():
  w = program(
    [
      {"id": i, "name": f"b{i}", "size": s, "def": 0, "uses": [1], "kind": "activation"}
      for i, s in enumerate([400, 200, 300, 100, 100])
    ],
    [0.0, 0.0],
  )
  model = CostModel(w, HW)
  placement = Placement(model, build_requests(model))
  by_buffer = {int(b): r for r, b in enumerate(placement.requests.buffer)}
  # Leave free [0, 400) and [900, 1000): best fit for 100 bytes is 900, first fit is 0.
  placement.place(by_buffer[1], 0, 400)
  placement.place(by_buffer[2], 0, 600)
  r = by_buffer[3]
  assert placement.best_fit(r, 0) == 900
  assert placement.first_fit(r, 0) == 0


def test_msa_simple_skips_a_prefetch_whose_copy_cannot_be_hidden_greedy_weighs_it_msa_stalls():
  # A 100-byte parameter read by ops 0 and 1 (one group): nothing runs before op 0 to hide its
  # 10 s copy, so all of it is exposed; reading it fast saves 2 x 100 x (1/10 - 1/100) = 18 s.
  # Net +8 s: the greedy takes it; msa-simple (minimum overlap ratio 1) does not prefetch it.
  w = program(
    [
      {"id": 0, "name": "w", "size": 100, "def": None, "uses": [0, 1], "kind": "parameter"},
      {"id": 1, "name": "x", "size": 1000, "def": 0, "uses": [], "kind": "output"},
    ],
    [0.0, 0.0],
  )
  model = CostModel(w, HW)
  requests = build_requests(model)
  assert len(requests) == 1 and (requests.start[0], requests.end[0]) == (0, 2)
  assert requests.exposed_copy_time[0] == pytest.approx(10.0)
  assert solve(w, HW, "msa-simple").mapping.allocations == ()
  greedy = solve(w, HW, "greedy").mapping
  assert [a["buffer"] for a in greedy.allocations] == [0]
  assert greedy.estimated_time_s == pytest.approx(model.slow_only_time - 8.0)
  # msa (XLA's rules): no copy for op 0; for op 1 one started at the program start, which op
  # 0's elapsed 110 s covers by XLA's budget. Op 0 moves only default-memory bytes, so the copy
  # engine gets no idle time there: the program stalls the whole 10 s for a 9 s saving.
  msa = solve(w, HW, "msa").mapping
  assert [(a["buffer"], a["start"], a["prefetch"]["done"]) for a in msa.allocations] == [(0, 0, 1)]
  assert msa.estimated_time_s == pytest.approx(model.slow_only_time + 10.0 - 9.0)


@pytest.mark.parametrize("seed", range(4))
def test_cpsat_is_optimal_for_its_own_model_and_says_the_bound_is_uncontended(seed):
  workload = random_workload(100 + seed, num_ops=14)
  hardware = contended(PRESETS["nnpi-like" if seed % 2 else "tpu-v4i-like"], workload, 0.25)
  cp = solve(workload, hardware, "cpsat", time_limit_s=30.0)
  assert cp.info["status"] == "optimal"
  # The proven bound matches its objective up to the model's integer rounding; the model has no
  # copy contention, so the mapping's simulated time (validated by solve) may differ.
  assert cp.info["bound_s"] == pytest.approx(cp.info["objective_s"], rel=1e-5)
  assert "without copy contention" in cp.info["bound_note"]
  # Whatever its model says, the mapping it returns simulates no slower than its hint.
  hint = solve(workload, hardware, "msa-simple").mapping.estimated_time_s
  assert cp.mapping.estimated_time_s <= hint * (1 + 1e-9)


def test_evo_is_never_worse_than_decoding_its_seed_orders():
  workload = random_workload(8, num_ops=40)
  hardware = contended(PRESETS["tpu-v4i-like"], workload, 0.2)
  model = CostModel(workload, hardware)
  placement = Placement(model, build_requests(model))
  n = len(placement.requests)
  seed_time = decode(placement, (n - np.arange(n)) / n)
  result = solve(workload, hardware, "evo", evaluations=30)
  assert result.info["evaluations"] == 30
  assert result.mapping.estimated_time_s <= seed_time * (1 + 1e-12)
  history = result.info["best_time_per_generation_s"]
  assert all(b <= a * (1 + 1e-12) for a, b in zip(history, history[1:]))


def test_evo_seeded_with_a_mappings_priorities_is_never_worse_than_that_mapping():
  """`mapping_priorities` of a mapping put its placed requests first: decoding that genome places
  what the mapping placed (where it still saves), and evo seeded with it (`initial`) ends no
  slower than the decode and says whether the seed led its first population."""
  workload = random_workload(8, num_ops=40)
  hardware = contended(PRESETS["tpu-v4i-like"], workload, 0.2)
  model = CostModel(workload, hardware)
  requests = build_requests(model)
  greedy = solve(workload, hardware, "greedy").mapping
  genome = mapping_priorities(requests, greedy, workload)
  ids = np.array([b.id for b in workload.buffers])
  placed = {int(ids[requests.buffer[r]]) for r in np.flatnonzero(genome > 1)}
  assert placed == {a["buffer"] for a in greedy.allocations}
  assert np.all((genome > 0) & (genome <= 2))
  placement = Placement(model, requests)
  seeded_time = decode(placement, genome)
  placement = Placement(model, requests)
  info = evo(placement, evaluations=14, initial=[genome])
  assert info["evaluations"] == 14 and isinstance(info["initial_best"], bool)
  assert placement.total_time <= seeded_time * (1 + 1e-12)
  unseeded = evo(Placement(model, requests), evaluations=14)
  assert "initial_best" not in unseeded
  # First in line, the seed is the one decode a budget of one allows.
  placement = Placement(model, requests)
  info = evo(placement, evaluations=1, initial=[genome], initial_first=True)
  assert info["evaluations"] == 1 and info["initial_best"] is True
  assert placement.total_time == pytest.approx(seeded_time, rel=1e-12)
  # With no grace, a limit already spent stops the first decode where it is.
  info = evo(Placement(model, requests), time_limit_s=0.0, initial=[genome], grace_s=0.0)
  assert info["evaluations"] == 1 and "cut_short" in info


class StepClock:
  """A clock that moves only when a decode runs: each decode takes `cost` seconds."""

  def __init__(self, cost: float):
    self.now, self.cost, self.decodes = 0.0, cost, 0

  def __call__(self) -> float:
    return self.now

  def decode_until(self, placement, priority, deadline):
    self.decodes += 1
    self.now += self.cost
    return decode_until(placement, priority, None)


@pytest.mark.parametrize("limit", [0.0, 2.5, 7.0, 20.0, 35.5])
def test_evo_never_starts_a_decode_that_would_overrun_its_time_limit(monkeypatch, limit):
  """With every decode taking one second, evo stops while this decode and the final decode of
  the best genome still fit: the clock never passes the limit (the first decode always runs, so
  a limit under one decode costs exactly that one), and it uses all the time it safely can."""
  evo_module = importlib.import_module("malloczero.env.solvers.evo")
  clock = StepClock(1.0)
  monkeypatch.setattr(importlib.import_module("malloczero.env.solvers.time_limit"), "clock", clock)
  monkeypatch.setattr(evo_module, "decode_until", clock.decode_until)
  workload = random_workload(8, num_ops=40)
  hardware = contended(PRESETS["tpu-v4i-like"], workload, 0.2)
  model = CostModel(workload, hardware)
  placement = Placement(model, build_requests(model))
  info = evo_module.evo(placement, evaluations=1000, time_limit_s=limit)
  assert clock.now <= max(limit, 1.0)
  assert clock.now > limit - 3.0  # Stops only when two more decodes would not fit.
  assert info["stopped_by_time_limit"] and info["evaluations"] <= clock.decodes
  # What it leaves in `placement` is the best mapping it found.
  assert placement.total_time == pytest.approx(min(info["best_time_per_generation_s"]))


def test_a_clock_late_at_the_final_decode_still_leaves_the_best_mapping(monkeypatch):
  """Without grace (the agent's guided search), a clock that jumps past the limit just before
  the final decode of the best genome must not cut that decode short: the best mapping found is
  what `placement` holds, not a partial one."""
  evo_module = importlib.import_module("malloczero.env.solvers.evo")
  clock = StepClock(1.0)
  evaluations = 30

  def late_decode_until(placement, priority, deadline):
    clock.decodes += 1
    clock.now += clock.cost + (1000.0 if clock.decodes > evaluations else 0.0)
    return decode_until(placement, priority, deadline)

  monkeypatch.setattr(importlib.import_module("malloczero.env.solvers.time_limit"), "clock", clock)
  monkeypatch.setattr(evo_module, "decode_until", late_decode_until)
  workload = random_workload(30, num_ops=120)
  hardware = contended(PRESETS["tpu-v4i-like"], workload, 0.2)
  model = CostModel(workload, hardware)
  placement = Placement(model, build_requests(model))
  info = evo_module.evo(placement, evaluations=evaluations, time_limit_s=500.0, seed=1, grace_s=0.0)
  assert clock.decodes == evaluations + 1  # The final decode ran, after the clock jumped.
  assert clock.now > 500.0 and "cut_short" not in info
  assert placement.total_time == pytest.approx(min(info["best_time_per_generation_s"]))
  assert placement.total_time < model.slow_only_time


def test_a_decode_past_its_deadline_stops_where_it_is(monkeypatch):
  """A program too large to decode in its time limit: the decode stops at the deadline, the
  requests not reached left in slow memory (a valid mapping, no faster than the whole decode)."""
  evo_module = importlib.import_module("malloczero.env.solvers.evo")
  workload = random_workload(30, num_ops=120)
  hardware = contended(PRESETS["tpu-v4i-like"], workload, 0.2)
  model = CostModel(workload, hardware)
  placement = Placement(model, build_requests(model))
  n = len(placement.requests)
  assert n > evo_module.CLOCK_EVERY
  order = (n - np.arange(n)) / n
  whole, complete = evo_module.decode_until(placement, order, None)
  assert complete and whole == decode(placement, order)
  ticks = iter(range(10**6))
  monkeypatch.setattr(
    importlib.import_module("malloczero.env.solvers.time_limit"), "clock", lambda: next(ticks)
  )
  cut, complete = evo_module.decode_until(placement, order, 1.5)  # Past it at the third look.
  placed = len(placement.placed)
  assert not complete and 0 < placed <= 2 * evo_module.CLOCK_EVERY < len(order)
  assert cut == placement.total_time and cut >= whole
  validate_mapping(workload, hardware, placement.mapping("evo"))


def test_evo_time_limit_bounds_the_whole_solve_including_building():
  """`solve` takes what building the model took from the solver's share: with a limit already
  spent, evo decodes msa's order once and returns that (validated) mapping."""
  workload = random_workload(8, num_ops=40)
  hardware = contended(PRESETS["tpu-v4i-like"], workload, 0.2)
  result = solve(workload, hardware, "evo", time_limit_s=1e-9)
  assert result.info["evaluations"] == 1 and result.info["stopped_by_time_limit"]
  assert result.mapping.allocations


def test_solve_time_includes_building_the_requests(monkeypatch):
  """Building is part of the solve: a build that sleeps 0.2 s shows in the solve time (a lower
  bound only, which a loaded machine cannot break) and is taken from evo's time limit."""
  registry = importlib.import_module("malloczero.env.solvers.registry")

  def slow_build(model, *flags):
    time.sleep(0.2)
    return build_requests(model, *flags)

  monkeypatch.setattr(registry, "build_requests", slow_build)
  workload = random_workload(8, num_ops=40)
  hardware = contended(PRESETS["tpu-v4i-like"], workload, 0.2)
  assert solve(workload, hardware, "msa").solve_time_s >= 0.2
  result = solve(workload, hardware, "evo", time_limit_s=0.15, evaluations=1000)
  assert result.solve_time_s >= 0.2 and result.info["evaluations"] == 1


def test_cpsat_time_limit_covers_building_its_model():
  """A limit already spent by building leaves CP-SAT no search: it returns its hint, msa-simple's
  mapping (valid, in the requests' space CP-SAT models), and says why, rather than searching
  past the limit."""
  workload = random_workload(8, num_ops=40)
  hardware = contended(PRESETS["tpu-v4i-like"], workload, 0.2)
  result = solve(workload, hardware, "cpsat", time_limit_s=1e-9)
  assert result.info["status"] == "unknown"
  assert re.search(r"building the model (took|reached the time limit)", result.info["fallback"])
  assert result.mapping.estimated_time_s == pytest.approx(
    solve(workload, hardware, "msa-simple").mapping.estimated_time_s, rel=1e-12
  )


def test_unknown_solver_is_a_one_line_error():
  w = random_workload(1, num_ops=10)
  with pytest.raises(MalloczeroError, match="unknown solver 'magic'"):
    solve(w, contended(PRESETS["tpu-v4i-like"], w, 0.3), "magic")


@pytest.mark.slow  # Integration-sized: subprocesses, compiles or every solver.
def test_cli_solve_writes_a_valid_mapping_and_a_plot(tmp_path):
  csv = tmp_path / "prog.csv"
  csv.write_text("id,lower,upper,size\n0,0,4,300\n1,1,3,500\n2,3,6,400\n3,2,5,200\n")
  out, png = tmp_path / "map.json", tmp_path / "map.png"
  run = lambda *a: subprocess.run(
    [sys.executable, "-m", "malloczero", *a], capture_output=True, text=True, timeout=300
  )
  result = run(
    "solve",
    str(csv),
    "--capacity",
    "800",
    "--solver",
    "cpsat",
    "--out",
    str(out),
    "--plot",
    str(png),
  )
  assert result.returncode == 0, result.stderr
  assert "CP-SAT optimal" in result.stdout and "validated" in result.stdout
  assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
  assert run("validate", str(csv), str(out)).returncode == 0
  # Bytes x time: buffer 0 1200, 1 1000, 2 1200, 3 600. All four exceed 800 bytes at ops 2
  # and 3; dropping buffer 3 fits (800 and 700 bytes) and keeps the most, 3400 byte-steps.
  mapping = load_mapping(out)
  assert sorted(a["buffer"] for a in mapping.allocations) == [0, 1, 2]
  assert json.loads(out.read_text())["solver"] == "cpsat"
  bad = run("solve", str(csv), "--solver", "msa")
  assert bad.returncode == 1 and "needs --capacity" in bad.stderr


def test_greedy_keeps_only_placements_that_save_simulated_time_and_undo_restores_the_state():
  workload = random_workload(0, num_ops=30)
  hardware = contended(PRESETS["tpu-v4i-like"], workload, 0.25)
  model = CostModel(workload, hardware)
  placement = Placement(model, build_requests(model))
  for r in range(len(placement.requests)):
    before = (placement.total_time, len(placement.placed), placement.memory_time.copy())
    level = 0
    offset = placement.best_fit(r, level)
    if offset is None:
      continue
    placement.place(r, level, offset)
    placement.undo_last()
    assert (placement.total_time, len(placement.placed)) == before[:2]
    np.testing.assert_array_equal(placement.memory_time, before[2])
    placed = placement.place_where_it_saves_most(r)
    assert placement.total_time <= before[0] if placed else placement.total_time == before[0]
  assert model.evaluate(placement.allocations()).total_time_s == pytest.approx(
    placement.total_time, rel=1e-9
  )
  assert placement.total_time <= model.slow_only_time


@pytest.mark.parametrize("solver", ["greedy", "bestfit", "random", "msa-simple"])
def test_one_pass_heuristics_stop_where_their_time_limit_finds_them(monkeypatch, solver):
  """The one-pass solvers look at the clock every `CLOCK_EVERY` requests: past the limit the rest
  stay in slow memory and the result says it was cut short (a 100,000-buffer program takes them
  minutes); within it they are what they always were."""
  heuristics = importlib.import_module("malloczero.env.solvers.heuristics")
  workload = random_workload(30, num_ops=120)
  hardware = contended(PRESETS["tpu-v4i-like"], workload, 0.2)
  whole = solve(workload, hardware, solver)
  assert "cut_short" not in whole.info
  ticks = iter(range(10**6))
  monkeypatch.setattr(
    importlib.import_module("malloczero.env.solvers.time_limit"), "clock", lambda: next(ticks)
  )
  cut = solve(workload, hardware, solver, time_limit_s=3.0)
  assert cut.info["cut_short"].startswith("time limit:")
  reached = int(re.search(r"\d+", cut.info["cut_short"]).group())
  assert 0 < reached < cut.info["requests"] and reached % heuristics.CLOCK_EVERY == 0
  validate_mapping(workload, hardware, cut.mapping)
