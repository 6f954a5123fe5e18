"""Inputs at the scale of real traces: the memory guard, the validator's overlap sweep, the
generators and the bench entries that measure them."""

import json

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from malloczero.env import memory_guard, validator
from malloczero.env.hardware import PRESETS
from malloczero.env.memory_guard import InputTooLargeError, estimated_bytes
from malloczero.env.minimalloc_csv import workload_from_minimalloc_csv
from malloczero.env.msa.algorithm import msa_allocations
from malloczero.env.programs.synthetic import contended, minimalloc_csv_text, xla_like_workload
from malloczero.env.validator import _any_rectangle_overlap
from malloczero.env.workload_json import load_workload
from malloczero.launch import cli


def _long_ranges_csv(rows: int) -> str:
  """Every buffer spans about half the ops: what once made rows x ops incidences."""
  lines = ["id,lower,upper,size"] + [f"{i},{i},{rows + i},64" for i in range(rows)]
  return "\n".join(lines) + "\n"


def test_a_csv_too_big_for_the_memory_is_refused_in_one_line_by_the_cli(
  tmp_path, monkeypatch, capsys
):
  path = tmp_path / "wide.csv"
  path.write_text(_long_ranges_csv(3000))
  monkeypatch.setattr(memory_guard, "available_bytes", lambda: 200 << 20)
  code = cli.main(
    ["solve", str(path), "--capacity", "4096", "--solver", "msa", "--out", str(tmp_path / "m.json")]
  )
  err = capsys.readouterr().err.strip()
  assert code != 0 and not (tmp_path / "m.json").exists()
  assert len(err.splitlines()) == 1, err
  # 3,000 buffers over 5,999 ops, each written once and read once: the numbers are named.
  assert "wide: needs about 0.3 GB" in err and "3,000 buffers" in err and "5,999 ops" in err
  assert "6,000 incidences" in err and "0.2 GB this machine has available" in err


def test_the_guard_refuses_before_building_the_ops_and_buffers(monkeypatch):
  monkeypatch.setattr(memory_guard, "available_bytes", lambda: 100 << 20)

  def built(*args, **kwargs):
    raise AssertionError("built before the guard")

  monkeypatch.setattr("malloczero.env.minimalloc_csv.Op", built)
  monkeypatch.setattr("malloczero.env.minimalloc_csv.Buffer", built)
  with pytest.raises(InputTooLargeError, match="huge: needs about 0.4 GB .*40,000 incidences"):
    workload_from_minimalloc_csv(_long_ranges_csv(20_000), name="huge")


def test_a_csv_costs_memory_linear_in_its_rows_not_in_the_lengths_of_their_ranges():
  """Two incidences per buffer at most, and O(rows) ops, however long the ranges are."""
  for rows in (50, 500):
    w = workload_from_minimalloc_csv(_long_ranges_csv(rows), name="long")
    assert len(w.arrays.incidence_op) == 2 * rows and w.num_ops == 2 * rows - 1
  short = workload_from_minimalloc_csv(minimalloc_csv_text(2000, seed=1), name="short")
  assert len(short.arrays.incidence_op) <= 2 * 2000 and short.num_ops <= 4 * 2000


def test_what_fits_is_not_refused_and_an_unknown_memory_refuses_nothing(monkeypatch):
  text = _long_ranges_csv(50)
  need = estimated_bytes(99, 50, 2 * 50)
  monkeypatch.setattr(memory_guard, "available_bytes", lambda: need)
  assert workload_from_minimalloc_csv(text, name="fits").num_buffers == 50
  monkeypatch.setattr(memory_guard, "available_bytes", lambda: need - 1)
  with pytest.raises(InputTooLargeError):
    workload_from_minimalloc_csv(text, name="fits")
  monkeypatch.setattr(memory_guard, "available_bytes", lambda: None)
  assert len(workload_from_minimalloc_csv(text, name="fits").arrays.incidence_op) == 2 * 50


def test_the_estimate_counts_one_incidence_per_access_of_a_csv_buffer(monkeypatch):
  seen = []
  monkeypatch.setattr(memory_guard, "check_fits_in_memory", lambda *a: seen.append(a))
  monkeypatch.setattr("malloczero.env.workload.check_fits_in_memory", lambda *a: seen.append(a))
  monkeypatch.setattr(
    "malloczero.env.minimalloc_csv.check_fits_in_memory", lambda *a: seen.append(a)
  )
  w = workload_from_minimalloc_csv(_long_ranges_csv(40), name="count")
  incidences = len(w.arrays.incidence_op)
  assert incidences == 80
  assert seen[0] == ("count", w.num_ops, 40, incidences)  # Before the ops and buffers ...
  assert seen[1] == ("count", w.num_ops, 40, incidences)  # ... and before the arrays.


@settings(max_examples=200, deadline=None)
@given(
  st.lists(
    st.tuples(st.integers(0, 20), st.integers(0, 6), st.integers(0, 40), st.integers(0, 12)),
    max_size=12,
  )
)
def test_the_overlap_sweep_agrees_with_the_pairwise_test(rects):
  rects = np.array(rects, np.int64).reshape(-1, 4)
  start, end = rects[:, 0], rects[:, 0] + rects[:, 1]
  lo, hi = rects[:, 2], rects[:, 2] + rects[:, 3]
  pairwise = any(
    start[i] < end[j] and start[j] < end[i] and lo[i] < hi[j] and lo[j] < hi[i]
    for i in range(len(rects))
    for j in range(i + 1, len(rects))
  )
  swept = _any_rectangle_overlap(start, end, lo, hi)
  assert swept or not pairwise  # Never misses a clash the validator's pairwise test sees.
  if (start < end).all() and (lo < hi).all():
    assert swept == pairwise
    # The jitted sweep that large mappings take gives the same answer.
    assert _jitted_overlap(start, end, lo, hi) == pairwise


def _jitted_overlap(start, end, lo, hi) -> bool:
  """`_any_rectangle_overlap` with the jitted sweep (validator_kernels.py) however few the
  rectangles are."""
  minimum = validator.JIT_SWEEP_COLD_MIN
  validator.JIT_SWEEP_COLD_MIN = 0
  try:
    return _any_rectangle_overlap(start, end, lo, hi)
  finally:
    validator.JIT_SWEEP_COLD_MIN = minimum


def test_the_jitted_sweep_finds_one_clash_among_many_rectangles():
  """A large level: msa's mapping of a program of 8,000 buffers has no clash; moving one
  allocation onto another's bytes makes one, which the jitted sweep finds."""
  workload = xla_like_workload(8000, seed=2)
  hardware = contended(PRESETS["tpu-v4i-like"], workload, 0.25)
  allocations, _ = msa_allocations(workload, hardware)
  start, end, lo = allocations.start, allocations.end, allocations.offset
  hi = lo + hardware.align(workload.arrays.sizes[allocations.buffer])
  assert len(start) > 5000
  assert not _jitted_overlap(start, end, lo, hi) and not _any_rectangle_overlap(start, end, lo, hi)
  # Another allocation live at the same op as allocation 0, moved onto its first byte.
  other = int(np.flatnonzero((start <= start[0]) & (end > start[0]))[1])
  lo, hi = lo.copy(), hi.copy()
  hi[other] += lo[0] - lo[other]
  lo[other] = lo[0]
  assert _jitted_overlap(start, end, lo, hi) and _any_rectangle_overlap(start, end, lo, hi)


def test_generated_inputs_are_deterministic_and_load(tmp_path):
  text = minimalloc_csv_text(500, seed=3)
  assert text == minimalloc_csv_text(500, seed=3) != minimalloc_csv_text(500, seed=4)
  path = tmp_path / "g.csv"
  path.write_text(text)
  assert load_workload(path).num_buffers == 500
  w = xla_like_workload(1000, seed=1)
  assert abs(w.num_buffers - 1000) <= 2 and w == xla_like_workload(1000, seed=1)


@pytest.mark.slow  # Integration-sized: a solve with the agent in a process of its own.
def test_bench_scale_agent_times_the_whole_solve_of_an_hlo_step_in_its_own_process():
  from malloczero.launch.benchmarks import bench_scale_agent

  report = bench_scale_agent(hlo_buffers=300)
  json.dumps(report)
  assert "scale_agent_300_buffers_policy_failed" not in report, report
  assert report["scale_agent_300_buffers_import_s"] > 0
  assert report["scale_agent_300_buffers_flattened_buffers"] > 100
  assert report["scale_agent_300_buffers_policy_s"] > 0
  assert report["scale_agent_300_buffers_policy_speedup_x"] > 1


@pytest.mark.slow  # Integration-sized: a solve per solver, each in a process of its own.
def test_bench_runs_every_solver_under_its_time_limit_in_its_own_process():
  from malloczero.launch.benchmarks import bench_solvers_at_scale

  report = bench_solvers_at_scale(300, 2.0, ["msa", "greedy", "evo"])
  json.dumps(report)
  for solver in ("msa", "greedy", "evo"):
    assert f"solvers_300_buffers_{solver}_failed" not in report, report
    assert report[f"solvers_300_buffers_{solver}_wall_s"] > 0
    assert 10 < report[f"solvers_300_buffers_{solver}_peak_mb"] < 4096
    assert report[f"solvers_300_buffers_{solver}_speedup_x"] >= 1
