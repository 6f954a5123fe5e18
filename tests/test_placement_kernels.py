"""`Placement.place_in_order`, evo's jitted decode (env/placement_kernels.py): the same
placements as `place_where_it_saves_most` one request at a time, an exact program time, and a
clear error where it cannot continue."""

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from malloczero.env.cost_model import NO_COPY, CostModel
from malloczero.env.placement import Placement
from malloczero.env.programs.suites import get_suite
from malloczero.env.requests import build_requests
from malloczero.env.solvers import solve
from malloczero.env.solvers.evo import decode, mapping_genomes
from malloczero.env.validator import validate_mapping
from tests.strategies import hardware_for, workloads


def one_at_a_time(model, requests, order):
  placement = Placement(model, requests)
  for r in order:
    placement.place_where_it_saves_most(int(r), fit="best")
  return placement


def assert_same(jitted, reference, model):
  assert jitted.placed == reference.placed
  assert jitted.count == reference.count and jitted.num_copies == reference.num_copies
  assert jitted.total_time == pytest.approx(reference.total_time, rel=1e-12)
  assert model.evaluate(jitted.allocations()).total_time_s == pytest.approx(
    jitted.total_time, rel=1e-9
  )


@settings(max_examples=60, deadline=None)
@given(st.data())
def test_place_in_order_places_as_one_request_at_a_time(data):
  """Any program, split or whole requests, any order, any runs of it: the same placements in
  the same order, the same copies, and a program time a fresh evaluation confirms."""
  workload = data.draw(workloads())
  hardware = data.draw(hardware_for(workload))
  model = CostModel(workload, hardware)
  requests = build_requests(model, split_activations=data.draw(st.booleans()))
  order = np.asarray(data.draw(st.permutations(range(len(requests)))), np.int64)
  reference = one_at_a_time(model, requests, order)
  jitted = Placement(model, requests)
  cuts = sorted(data.draw(st.lists(st.integers(0, len(order)), max_size=3)))
  for run in np.split(order, cuts):
    jitted.place_in_order(run)
  assert_same(jitted, reference, model)
  validate_mapping(workload, hardware, jitted.mapping("evo"))
  # A second decode after a reset starts from nothing again.
  jitted.reset()
  jitted.place_in_order(order)
  assert_same(jitted, reference, model)


def test_a_training_steps_decode_evicts_and_matches_one_request_at_a_time():
  """A training step of the default suite with its activations split (evictions, prefetches
  back, one-of exclusion), decoded toward msa's mapping as evo's guided search seeds it."""
  (entry,) = (e for e in get_suite("default").entries if e.name == "vgg-b1-train@nnpi-like:25%")
  workload, hardware = entry.load()
  model = CostModel(workload, hardware)
  requests = build_requests(model, split_activations=True)
  assert np.any(requests.evict_start != NO_COPY)
  msa = solve(workload, hardware, "msa").mapping
  for genome in mapping_genomes(requests, msa, workload):
    order = np.argsort(-genome, kind="stable")
    reference = one_at_a_time(model, requests, order)
    jitted = Placement(model, requests)
    time_s = decode(jitted, genome)  # evo's decode: place_in_order over the genome's order
    assert time_s == jitted.total_time
    assert_same(jitted, reference, model)
    assert any(requests.evict_start[r] != NO_COPY for r, _, _ in jitted.placed)


def test_place_in_order_refuses_to_continue_a_placement_made_one_request_at_a_time():
  """Nor can `undo_last` take back what it placed."""
  entry = get_suite("default").split("all").entries[0]
  model = CostModel(*entry.load())
  requests = build_requests(model)
  placement = Placement(model, requests)
  placement.place_where_it_saves_most(0)
  with pytest.raises(ValueError, match="only its own placements since reset"):
    placement.place_in_order(np.arange(1, len(requests)))
  placement.reset()
  placement.place_in_order(np.arange(len(requests)))
  with pytest.raises(ValueError, match="nothing to undo"):
    placement.undo_last()
  assert placement.placed == one_at_a_time(model, requests, np.arange(len(requests))).placed
