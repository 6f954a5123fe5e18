"""msa's own run as one jitted loop (env/msa/solver_loop.py): `MsaAlgorithm.run` makes the
segments and counts the decision process makes with msa's choice at every step (the Python
loop the game plays), under every option the jitted loop runs; the options it leaves to Python
take the Python loop; a loop that runs out of room mid-buffer gives up and the Python loop's
answer is returned."""

import dataclasses

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from malloczero.env.hardware import PRESETS
from malloczero.env.msa import solver_loop
from malloczero.env.msa.algorithm import MsaAlgorithm, MsaOptions, msa_policy, play
from malloczero.env.programs.synthetic import contended, random_workload, xla_like_workload
from tests.msa_xla_cases import XLA_HW
from tests.strategies import hardware_for, loop_workloads, workloads
from tests.test_msa_steps import hand_made, rows

LOOP_OPTIONS = st.builds(
  MsaOptions,
  picker=st.sampled_from(["cost", "instruction_count"]),
  use_copy_resource=st.booleans(),
  copy_budget=st.sampled_from(["elapsed", "idle"]),
  preferred_overlap_to_async_copy_ratio=st.sampled_from([0.5, 1.5, 4.0]),
  max_overlap_to_mem_size_async_copy_ratio=st.sampled_from([0.01, 10.0]),
)


def jitted(workload, hardware, options=MsaOptions(), deferred=frozenset()):
  """`MsaAlgorithm.run`'s segments and counts, checking that the jitted loop made them."""
  algorithm = MsaAlgorithm(workload, hardware, options, deferred)
  resources = (algorithm.allocator.prefetch_resource, algorithm.allocator.eviction_resource)
  assert solver_loop.supported(options, resources)
  allocations = algorithm.run()
  assert algorithm.jitted
  return allocations, algorithm.stats


def python_loop(workload, hardware, options=MsaOptions()):
  return play(workload, hardware, msa_policy, options, 1)


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.data())
def test_the_jitted_run_makes_the_python_loops_segments_on_random_programs(data):
  workload = data.draw(workloads())
  hardware = data.draw(hardware_for(workload))
  options = data.draw(LOOP_OPTIONS)
  got, got_stats = jitted(workload, hardware, options)
  expected, expected_stats = python_loop(workload, hardware, options)
  assert rows(got) == rows(expected)
  assert got_stats == expected_stats


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.data())
def test_the_jitted_run_makes_the_python_loops_segments_on_programs_with_loops(data):
  """The jitted loop reads the loops as the Python loop's pickers do (the window, the start
  walk, the no-copy bound and the eviction's end, env/msa/interval_picker.py's "Loops")."""
  workload = data.draw(loop_workloads())
  hardware = data.draw(hardware_for(workload))
  options = data.draw(LOOP_OPTIONS)
  got, got_stats = jitted(workload, hardware, options)
  expected, expected_stats = python_loop(workload, hardware, options)
  assert rows(got) == rows(expected)
  assert got_stats == expected_stats


@pytest.mark.parametrize(
  "hardware,fraction,options",
  [
    ("tpu-v4i-like", 0.25, MsaOptions()),
    ("nnpi-like", 0.1, MsaOptions()),
    ("tpu-v4i-like", 0.1, MsaOptions(picker="instruction_count")),
    ("nnpi-like", 0.25, MsaOptions(use_copy_resource=False, copy_budget="idle")),
  ],
)
def test_the_jitted_run_makes_the_python_loops_segments_on_contended_programs(
  hardware, fraction, options
):
  """Programs large enough that the heaps grow (the loop returns to Python for room) and
  evictions, keeps and prefetches all happen."""
  workload = xla_like_workload(1500, seed=3)
  machine = contended(PRESETS[hardware], workload, fraction)
  got, got_stats = jitted(workload, machine, options)
  expected, expected_stats = python_loop(workload, machine, options)
  assert rows(got) == rows(expected)
  assert got_stats == expected_stats
  assert got_stats.kept and got_stats.prefetches
  assert got_stats.evictions or hardware == "nnpi-like"


@pytest.mark.parametrize("name,workload,options", hand_made(), ids=[c[0] for c in hand_made()])
def test_xlas_programs_take_the_loop_their_options_allow(name, workload, options, monkeypatch):
  """The outstanding-copy limits and the FIFO order run in Python; the rest jitted; the
  segments are the decision process's either way."""
  calls = []
  real = solver_loop.run_loop
  monkeypatch.setattr(solver_loop, "run_loop", lambda a: calls.append(1) or real(a))
  algorithm = MsaAlgorithm(workload, XLA_HW, options)
  got = algorithm.run()
  expected, stats = python_loop(workload, XLA_HW, options)
  assert rows(got) == rows(expected) and algorithm.stats == stats
  limited = options.max_outstanding_prefetches >= 0 or options.max_outstanding_evictions >= 0
  assert bool(calls) == (not limited and not options.enforce_prefetch_fifo_order)


def test_deferred_buffers_go_last_in_the_jitted_run_too():
  workload = random_workload(5, 120)
  machine = contended(PRESETS["tpu-v4i-like"], workload, 0.25)
  deferred = frozenset(range(0, 120, 7))
  got, _ = jitted(workload, machine, deferred=deferred)
  decisions_order = MsaAlgorithm(workload, machine, deferred=deferred)
  steps = decisions_order.steps(1, msa_only=True)
  try:
    decision = next(steps)
    while True:
      decision = steps.send(decision.msa_choice)
  except StopIteration as stop:
    expected = stop.value
  assert rows(got) == rows(expected)


def test_a_loop_that_runs_out_of_room_mid_buffer_gives_way_to_the_python_loop(monkeypatch):
  """With no room asked before a buffer, the heap's row arrays fill during one: the jitted loop
  gives up (`ABORTED`) and `run` answers with the Python loop on a fresh state."""
  monkeypatch.setattr(solver_loop, "ROOM_ROWS", 0)
  monkeypatch.setattr(solver_loop, "ROOM_ROWS_PER_CHUNK", 0)
  results = []
  real = solver_loop.run_loop
  monkeypatch.setattr(solver_loop, "run_loop", lambda a: results.append(real(a)) or results[-1])
  workload = xla_like_workload(800, seed=1)
  machine = contended(PRESETS["tpu-v4i-like"], workload, 0.25)
  algorithm = MsaAlgorithm(workload, machine)
  got = algorithm.run()
  assert results == [None] and not algorithm.jitted
  expected, stats = python_loop(workload, machine)
  assert rows(got) == rows(expected) and algorithm.stats == stats


def test_after_the_jitted_run_the_heaps_hold_the_segments_chunks():
  """The heaps' counts and sizes are the loop's: every segment's chunk is live in its level,
  at its offset, from its start."""
  workload = random_workload(9, 300)
  machine = contended(PRESETS["nnpi-like"], workload, 0.25)
  algorithm = MsaAlgorithm(workload, machine)
  allocations = algorithm.run()
  size = machine.align(workload.arrays.sizes[allocations.buffer])
  for level, heap in enumerate(algorithm.heaps):
    start, end, offset, chunk_size = heap.chunks()
    chunks = set(zip(start.tolist(), offset.tolist(), chunk_size.tolist()))
    mine = allocations.level == level
    for s, o, n in zip(allocations.start[mine], allocations.offset[mine], size[mine]):
      assert (int(s), int(o), int(n)) in chunks
    if mine.any():
      assert heap.heap_size == int(np.max(offset + chunk_size))
  assert dataclasses.asdict(algorithm.stats)["kept"] > 0
