"""MiniMalloc CSVs at their own scale: a buffer is written at `lower` and read at `upper - 1`,
the compressed time axis keeps the objective exactly, a mapping reads in the CSV's own times,
and the solvers handle a real challenge instance."""

import json
import pathlib

import numpy as np
import pytest

from malloczero.env import MappingError, WorkloadError, load_workload, save_workload
from malloczero.env.cost_model import CostModel
from malloczero.env.hardware import PRESETS
from malloczero.env.mapping import Mapping
from malloczero.env.minimalloc_csv import workload_from_minimalloc_csv
from malloczero.env.requests import build_requests
from malloczero.env.solvers import solve
from malloczero.env.validator import validate_mapping
from malloczero.env.workload import Buffer, Op, Workload

DATA = pathlib.Path(__file__).parent / "data"
INSTANCE_A = DATA / "minimalloc_A.1048576.csv"  # google/minimalloc benchmarks/asplos2024/A
# Endpoints 0, 2, 3, 7, 10, 16 (and nothing covers [10, 16) but buffer 4).
TINY = "id,lower,upper,size\n0,0,7,300\n1,2,3,500\n2,3,10,400\n3,2,7,200\n4,10,16,100\n"


def raw_workload(text: str, name: str) -> Workload:
  """The CSV read without compression: one zero-flop op per time step, each buffer defined at
  step `lower` and used at step `upper - 1` (only defined when that is the same step)."""
  rows = [list(map(int, line.split(","))) for line in text.strip().splitlines()[1:]]
  num_ops = max(r[2] for r in rows)
  return Workload(
    name,
    "minimalloc-csv",
    tuple(Op(f"t{t}", 0.0) for t in range(num_ops)),
    tuple(
      Buffer(i, f"b{i}", size, lo, (hi - 1,) if hi - 1 > lo else (), "activation")
      for i, lo, hi, size in rows
    ),
  )


def test_tiny_csv_compresses_to_the_steps_where_buffers_are_written_and_read():
  w = workload_from_minimalloc_csv(TINY, name="tiny")
  # 0 and each row's lower, lower + 1, upper - 1 and upper: 12 distinct points, 11 ops.
  assert w.time_axis.tolist() == [0, 1, 2, 3, 4, 6, 7, 9, 10, 11, 15, 16]
  assert [o.weight for o in w.ops] == [1, 1, 1, 1, 2, 1, 2, 1, 1, 4, 1]
  a = w.arrays
  # Buffer 2 lives on [3, 10): written at op 3 (time 3), read at op 7 (time 9), one step each.
  assert (a.live_start[2], a.live_end[2]) == (3, 8)
  lo, hi = a.buffer_incidence_start[2], a.buffer_incidence_start[3]
  assert a.incidence_op[lo:hi].tolist() == [3, 7]
  assert a.incidence_bytes[lo:hi].tolist() == [400, 400]
  # Buffer 1 lives on [2, 3), one step: only written.
  assert a.incidence_op[a.buffer_incidence_start[1] : a.buffer_incidence_start[2]].tolist() == [2]
  # Two incidences at most per buffer, whatever the lengths of the ranges.
  assert len(a.incidence_op) == 2 * w.num_buffers - 1
  assert w.peak_live_bytes == raw_workload(TINY, "tiny").peak_live_bytes == 1000


@pytest.mark.parametrize("solver", ["msa", "bestfit", "cpsat"])
def test_compressed_csv_keeps_the_objective_and_the_mapping_exactly(solver):
  """Slow-only time, each buffer's standalone saving and the time of the same mapping are equal
  on the raw and the compressed time axis; the mapping file is the same on both."""
  raw, small = raw_workload(TINY, "tiny"), workload_from_minimalloc_csv(TINY, name="tiny")
  hw = PRESETS["minimalloc"].with_fast_capacity(800)
  raw_model, small_model = CostModel(raw, hw), CostModel(small, hw)
  assert small_model.slow_only_time == pytest.approx(raw_model.slow_only_time, rel=1e-12)
  saving = lambda model: dict(
    zip(
      build_requests(model).buffer.tolist(), build_requests(model).standalone_saving[:, 0].tolist()
    )
  )
  assert saving(small_model) == pytest.approx(saving(raw_model), rel=1e-12)
  options = {"time_limit_s": 5.0} if solver == "cpsat" else {}
  mapping = solve(small, hw, solver, **options).mapping
  assert mapping.allocations
  # An activation's window is its CSV row's [lower, upper), in the CSV's own times.
  rows = {
    int(r.split(",")[0]): tuple(map(int, r.split(",")[1:3])) for r in TINY.strip().splitlines()[1:]
  }
  assert all((a["start"], a["end"]) == rows[a["buffer"]] for a in mapping.allocations)
  # The same file validates against the raw workload, and both evaluate to the same time.
  assert validate_mapping(raw, hw, mapping).estimated_time_s == pytest.approx(
    mapping.estimated_time_s, rel=1e-12
  )
  assert raw_model.evaluate(mapping.to_arrays(raw)).total_time_s == pytest.approx(
    small_model.evaluate(mapping.to_arrays(small)).total_time_s, rel=1e-12
  )
  raw_mapping = solve(raw, hw, solver, **options).mapping
  assert raw_mapping.estimated_time_s == pytest.approx(mapping.estimated_time_s, rel=1e-9)


def test_the_game_on_a_compressed_csv_plays_exactly_as_on_the_raw_one():
  """Same requests in the same order, same observations and rewards at every step."""
  from malloczero.env.game import RequestsGame

  hw = PRESETS["minimalloc"].with_fast_capacity(800)
  games = [
    RequestsGame(w, hw)
    for w in (raw_workload(TINY, "tiny"), workload_from_minimalloc_csv(TINY, name="tiny"))
  ]
  steps = [g.reset() for g in games]
  while True:
    for key in steps[0].observation:
      np.testing.assert_allclose(
        steps[0].observation[key], steps[1].observation[key], rtol=1e-6, err_msg=key
      )
    assert (steps[0].reward or 0.0) == pytest.approx(steps[1].reward or 0.0, rel=1e-12)
    if steps[0].last():
      break
    action = 1 if steps[0].observation["legal_actions"][1] else 0
    steps = [g.step(action) for g in games]
  assert games[0].total_time == pytest.approx(games[1].total_time, rel=1e-12)


def test_a_time_inside_a_compressed_op_is_a_one_line_error():
  w = workload_from_minimalloc_csv(TINY, name="tiny")
  hw = PRESETS["minimalloc"].with_fast_capacity(800)
  mapping = solve(w, hw, "msa").mapping
  first = mapping.allocations[0]
  inside = next(t for t in range(first["start"], first["end"]) if t not in w.time_axis)
  bad = Mapping.from_dict(dict(mapping.to_dict(), allocations=[dict(first, start=inside)]))
  with pytest.raises(
    MappingError,
    match=rf"allocation 0: 'start' = {inside} is not an op boundary of "
    r"'tiny' \(its ops start at times 0, 1, 2, 3, 4, 6, \.\.\., 16\)",
  ):
    validate_mapping(w, hw, bad)


def test_weighted_ops_round_trip_through_json(tmp_path):
  w = workload_from_minimalloc_csv(TINY, name="tiny")
  path = tmp_path / "tiny.json"
  save_workload(w, path)
  assert json.loads(path.read_text())["ops"][4] == {"name": "t4", "flops": 0.0, "weight": 2}
  assert load_workload(path) == w
  data = json.loads(path.read_text())
  data["ops"][0]["weight"] = 0
  path.write_text(json.dumps(data))
  with pytest.raises(
    WorkloadError,
    match=r"op 0 \('t0'\): 'weight' must be an integer from 1 to "
    r"2\*\*60, got 0",
  ):
    load_workload(path)


def test_real_instance_has_one_op_per_interval_between_distinct_access_points():
  """Challenge instance A (MiniMalloc's own header) spans 2**20 time steps in 208 ops."""
  w = load_workload(INSTANCE_A)
  points = set()
  for line in INSTANCE_A.read_text().strip().splitlines()[1:]:
    _, lo, hi, _ = map(int, line.split(","))
    points |= {lo, lo + 1, hi - 1, hi}
  assert w.num_ops == len(points | {0}) - 1 == 208
  assert w.time_axis[-1] == 1 << 20 and w.num_buffers == 154
  assert w.peak_live_bytes <= 1 << 20


def test_cpsat_places_everything_on_a_real_instance_with_room():
  """CP-SAT's model of a compressed challenge instance is small: with the fast memory at 1.5x
  the instance's peak (room to pack) it places every buffer. (At 1.25x it found every buffer's
  place in under a second while a buffer's saving was its bytes x time; weighted by its bytes
  alone, as a buffer written once and read once is, it places about 145 of 154 in a minute.)"""
  w = load_workload(INSTANCE_A)
  hw = PRESETS["minimalloc"].with_fast_capacity(w.peak_live_bytes * 3 // 2)
  result = solve(w, hw, "cpsat", time_limit_s=20.0)
  assert len(result.mapping.allocations) == w.num_buffers
  assert result.mapping.speedup == pytest.approx(1e3, rel=1e-9)  # fast 1000x the slow memory
  assert np.isfinite(result.solve_time_s)
