"""Copies timed as msa times them (build_requests(late_prefetches=True)): a prefetched group's
late variant, the groups of all-slow windows, the one-of exclusion in Placement, and the decode
of msa's mapping they make possible on a GRU."""

import dataclasses

import numpy as np

from malloczero.env.cost_model import CostModel
from malloczero.env.placement import Placement
from malloczero.env.programs.suites import get_suite
from malloczero.env.requests import build_requests
from malloczero.env.solvers import get_solver, solve
from malloczero.env.solvers.evo import decode, mapping_genomes
from malloczero.env.validator import validate_mapping
from malloczero.env.workload_json import workload_from_dict
from tests.test_cost_model import HW  # fast 100 B/s, slow 10 B/s, copy 10 B/s, 1 flop/s
from tests.test_split_activations import _rows, windows

# Activation x (100 B) is written by op 0 and read by ops 1-4; weight w (100 B) is read by op 5.
# Each op moves 100 B: 1 s in fast memory, 10 s in slow. w's 10 s copy cannot hide behind the
# 5 s of all-fast reference time before op 5, so its window starts at program start; behind
# all-slow times (msa's prefetch picker) one op hides it: the late window starts at op 4.
PROGRAM = workload_from_dict(
  {
    "name": "cheap-in-fast-memory",
    "source": "hand",
    "ops": [{"name": f"o{i}", "flops": 0.0} for i in range(6)],
    "buffers": [
      {"id": 0, "size": 100, "def": 0, "uses": [1, 2, 3, 4], "kind": "activation"},
      {"id": 1, "size": 100, "def": None, "uses": [5], "kind": "parameter"},
    ],
  }
)


def buffer_windows(requests, buffer):
  """`windows`' rows of one buffer's requests: (start, end, first use, prefetch, evict start,
  evict done), sorted."""
  mine = requests.buffer == buffer
  return windows(dataclasses.replace(requests, **_rows(requests, mine)))


def test_a_weight_whose_window_reaches_program_start_gets_a_late_variant():
  model = CostModel(PROGRAM, HW)
  assert buffer_windows(build_requests(model), 1) == [(0, 6, 5, True, -1, -1)]
  late = build_requests(model, late_prefetches=True)
  assert buffer_windows(late, 1) == [(0, 6, 5, True, -1, -1), (4, 6, 5, True, -1, -1)]
  # Against the all-fast reference the late copy hides behind op 4's 1 s only: 9 s of it are
  # exposed, against 5 s for the early one.
  exposed = sorted(float(t) for t, b in zip(late.exposed_copy_time, late.buffer) if b == 1)
  assert exposed == [5.0, 9.0]
  # Activations and the whole ranges are as without the variants.
  assert windows(build_requests(model, True, True)) == sorted(
    windows(build_requests(model, True)) + [(4, 6, 5, True, -1, -1)]
  )


def test_an_activation_is_evicted_between_uses_where_msa_s_timing_hides_the_copies():
  """a (100 B) is written by op 0 and read by ops 1 and 4; x (100 B) keeps ops 1-3 busy in
  default memory (10 s each, 1 s in fast memory). Behind the all-fast reference no copy of a
  hides before op 4, so its uses form one group: the whole live range alone. Behind all-slow
  times (msa's picker) the eviction after op 0 is done by boundary 2 and the prefetch for op 4
  hides behind op 3: a group produced in place and evicted, and one prefetched again."""
  program = workload_from_dict(
    {
      "name": "evicted-between-uses",
      "source": "hand",
      "ops": [{"name": f"o{i}", "flops": 0.0} for i in range(5)],
      "buffers": [
        {"id": 0, "size": 100, "def": 0, "uses": [1, 4], "kind": "activation"},
        {"id": 1, "size": 100, "def": 1, "uses": [2, 3], "kind": "activation"},
      ],
    }
  )
  model = CostModel(program, HW)
  assert buffer_windows(build_requests(model, True), 0) == [(0, 5, 0, False, -1, -1)]
  assert buffer_windows(build_requests(model, True, True), 0) == [
    (0, 2, 0, False, 1, 2),  # produced in place by o0, read by o1, evicted
    (0, 5, 0, False, -1, -1),  # the whole live range
    (3, 5, 4, True, -1, -1),  # prefetched again for o4 behind o3
  ]


def test_a_group_and_its_late_variant_exclude_each_other():
  model = CostModel(PROGRAM, HW)
  requests = build_requests(model, late_prefetches=True)
  early, late = sorted(np.flatnonzero(requests.buffer == 1), key=lambda r: requests.start[r])
  placement = Placement(model, requests)
  placement.place(int(early), 0, 0)
  assert placement.blocked(int(late))
  placement.reset()
  placement.place(int(late), 0, 0)
  assert placement.blocked(int(early))
  # One decode places at most one of the two, whatever the order.
  for genome in (np.arange(len(requests), 0, -1.0), np.arange(1.0, len(requests) + 1)):
    decode(placement, genome)
    assert sum(int(requests.buffer[r]) == 1 for r in placement.request_indices()) <= 1
    validate_mapping(PROGRAM, HW, placement.mapping("evo"))


def test_evo_offers_late_prefetches():
  assert get_solver("evo").late_prefetches and get_solver("evo").split_activations
  assert not get_solver("greedy").late_prefetches


def msa_mapping_decoded(suite: str, name: str):
  """`decoded(requests)`: the best one decode of msa's mapping of the entry `name` of `suite`
  over `requests` (each of `mapping_genomes`, each mapping validated), x msa; and the entry's
  cost model."""
  entry = next(e for e in get_suite(suite).entries if e.name == name)
  workload, hardware = entry.load()
  model = CostModel(workload, hardware)
  msa = solve(workload, hardware, "msa").mapping

  def decoded(requests) -> float:
    placement = Placement(model, requests)
    speedups = []
    for genome in mapping_genomes(requests, msa, workload):
      speedups.append(model.slow_only_time / decode(placement, genome))
      validate_mapping(workload, hardware, placement.mapping("evo"))
    return max(speedups) / msa.speedup

  return decoded, model


def test_msa_s_mapping_of_a_gru_decodes_to_msa_only_with_late_windows():
  """TF's GRU at inference: every op is cheap in fast memory, so each weight's early window
  starts at program start, and the first placed holds the memory the others need through the
  whole program; msa copies each a few ops before its use."""
  decoded, model = msa_mapping_decoded("foreign", "tf-gru-b8-infer@nnpi-like:25%")
  assert decoded(build_requests(model, split_activations=True)) < 0.5
  assert decoded(build_requests(model, split_activations=True, late_prefetches=True)) > 0.99
  assert decoded(get_solver("evo").requests(model)) > 0.99
