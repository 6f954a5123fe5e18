"""An activation's groups beside its whole live range (build_requests(split_activations=True)):
the windows, the one-of exclusion in Placement, exact costs and valid mappings."""

import dataclasses
import json
import os
import subprocess
import sys

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from malloczero.env import MemoryLevel
from malloczero.env.cost_model import NO_COPY, CostModel
from malloczero.env.placement import Placement
from malloczero.env.requests import build_requests
from malloczero.env.solvers import solve
from malloczero.env.solvers.evo import decode, mapping_genomes
from malloczero.env.validator import validate_mapping
from malloczero.env.workload_json import workload_from_dict
from tests.strategies import hardware_for, workloads
from tests.test_cost_model import HW  # fast 100 B/s, slow 10 B/s, copy 10 B/s, 1 flop/s

# A 100-byte copy takes 10 s. Activation 0 is made by op a, read by b, and read again by e after
# two 50 s ops: reference times 1, 1, 50, 50, 1 (prefix 0, 1, 2, 52, 102, 103).
PROGRAM = workload_from_dict(
  {
    "name": "forward-backward",
    "source": "hand",
    "ops": [
      {"name": "a", "flops": 1.0},
      {"name": "b", "flops": 0.0},
      {"name": "c", "flops": 50.0},
      {"name": "d", "flops": 50.0},
      {"name": "e", "flops": 0.0},
    ],
    "buffers": [{"id": 0, "size": 100, "def": 0, "uses": [1, 4], "kind": "activation"}],
  }
)


def windows(requests):
  return sorted(
    (int(s), int(e), int(f), bool(p), int(es), int(ed))
    for s, e, f, p, es, ed in zip(
      requests.start,
      requests.end,
      requests.first_use,
      requests.is_prefetch,
      requests.evict_start,
      requests.evict_done,
    )
  )


def test_an_activation_read_again_later_gets_its_groups_beside_its_live_range():
  model = CostModel(PROGRAM, HW)
  assert windows(build_requests(model)) == [(0, 5, 0, False, NO_COPY, NO_COPY)]
  # The eviction issued after a (boundary 1) hides behind c by boundary 3, where the prefetch
  # for e (latest start hiding 10 s: boundary 3, behind d) may start.
  assert windows(build_requests(model, split_activations=True)) == [
    (0, 3, 0, False, 1, 3),  # produced in place by a, read by b, evicted
    (0, 5, 0, False, NO_COPY, NO_COPY),  # the whole live range
    (3, 5, 4, True, NO_COPY, NO_COPY),  # prefetched again for e
  ]


def test_an_activation_s_later_uses_get_a_group_per_gap():
  """Read at b, e and h with 100 s of ops before each of e and h: one eviction, then a prefetch
  before e and another before h."""
  flops = (("a", 1.0), ("b", 0.0), ("c", 50.0), ("d", 50.0), ("e", 0.0), ("f", 50.0))
  flops += (("g", 50.0), ("h", 0.0))
  ops = [{"name": n, "flops": f} for n, f in flops]
  buffers = [{"id": 0, "size": 100, "def": 0, "uses": [1, 4, 7], "kind": "activation"}]
  program = workload_from_dict({"name": "twice", "source": "hand", "ops": ops, "buffers": buffers})
  model = CostModel(program, HW)
  evicted, whole = (0, 3, 0, False, 1, 3), (0, 8, 0, False, NO_COPY, NO_COPY)
  assert windows(build_requests(model, split_activations=True)) == [
    evicted,
    whole,
    (3, 5, 4, True, NO_COPY, NO_COPY),
    (6, 8, 7, True, NO_COPY, NO_COPY),
  ]


def test_no_group_where_the_eviction_cannot_be_done_before_the_prefetch_starts():
  """With one 50 s op between the reads, the eviction and the prefetch would both need it."""
  ops = [{"name": n, "flops": f} for n, f in (("a", 1.0), ("b", 0.0), ("c", 50.0), ("e", 0.0))]
  buffers = [{"id": 0, "size": 100, "def": 0, "uses": [1, 3], "kind": "activation"}]
  program = workload_from_dict({"name": "short", "source": "hand", "ops": ops, "buffers": buffers})
  split = build_requests(CostModel(program, HW), split_activations=True)
  assert windows(split) == [(0, 4, 0, False, NO_COPY, NO_COPY)]


def test_a_placed_request_excludes_the_overlapping_requests_of_its_buffer():
  model = CostModel(PROGRAM, HW)
  requests = build_requests(model, split_activations=True)
  first, whole, again = (
    int(np.flatnonzero((requests.start == s) & (requests.end == e))[0])
    for s, e in ((0, 3), (0, 5), (3, 5))
  )
  placement = Placement(model, requests)
  assert placement.place_where_it_saves_most(whole)
  assert placement.blocked(first) and placement.blocked(again)
  assert not placement.place_where_it_saves_most(first) and placement.best_fit(again, 0) is None
  placement.undo_last()
  assert not placement.blocked(first) and not placement.blocked(again)
  assert placement.place_where_it_saves_most(first) and placement.place_where_it_saves_most(again)
  assert placement.blocked(whole) and placement.first_fit(whole, 0) is None
  allocations = placement.allocations()
  np.testing.assert_array_equal(allocations.evict_start, [1, NO_COPY])
  np.testing.assert_array_equal(allocations.evict_done, [3, NO_COPY])
  np.testing.assert_array_equal(allocations.prefetch_done, [NO_COPY, 4])
  # a, b and e read fast memory (9 s saved each); the eviction hides behind c, the prefetch
  # behind d.
  assert placement.total_time == pytest.approx(model.slow_only_time - 27.0)
  assert model.evaluate(allocations).total_time_s == pytest.approx(placement.total_time)
  validate_mapping(PROGRAM, HW, placement.mapping("evo"))


@settings(max_examples=40, deadline=None)
@given(st.data())
def test_decodes_of_split_requests_are_exact_and_valid(data):
  """Any priority order: the incremental time equals a fresh evaluation (evictions in the copy
  queue), the mapping validates, no two placed requests of one buffer overlap, and the requests
  without the split are exactly the split's whole live ranges and parameter groups."""
  workload = data.draw(workloads())
  hardware = data.draw(hardware_for(workload))
  model = CostModel(workload, hardware)
  split = build_requests(model, split_activations=True)
  plain = build_requests(model)
  kept = ~(~split.is_prefetch & (split.evict_start != NO_COPY))
  kept &= ~(split.is_prefetch & ~workload.arrays.is_prefetched[split.buffer])
  assert windows(plain) == windows(dataclasses.replace(split, **_rows(split, kept)))
  placement = Placement(model, split)
  rng = np.random.default_rng(data.draw(st.integers(0, 2**31 - 1)))
  time_s = decode(placement, rng.random(len(split)))
  assert model.evaluate(placement.allocations()).total_time_s == pytest.approx(time_s, rel=1e-9)
  validate_mapping(workload, hardware, placement.mapping("evo"))
  placed = placement.request_indices()
  for b in np.unique(split.buffer[placed]):
    spans = sorted(
      zip(
        split.start[placed][split.buffer[placed] == b], split.end[placed][split.buffer[placed] == b]
      )
    )
    assert all(e <= s for (_, e), (s, _) in zip(spans, spans[1:]))


def _rows(requests, keep):
  names = ("start", "end", "first_use", "is_prefetch", "evict_start", "evict_done")
  return {n: getattr(requests, n)[keep] for n in names}


def test_msa_mapping_genomes_put_an_evicted_activation_s_groups_before_its_whole_range():
  """A mapping that keeps the activation fast near a and again near e (evicted between): any
  overlap keeps all three requests; `WHOLE_KEPT` keeps only the two groups, whose decode gives
  back that mapping, and so does the genome of the requests that match its allocations best;
  with no evicting request (and so no requests that overlap) there is one genome."""
  model = CostModel(PROGRAM, HW)
  requests = build_requests(model, split_activations=True)
  placement = Placement(model, requests)
  groups = [
    int(np.flatnonzero((requests.start == s) & (requests.end == 5 - 2 * (s == 0)))[0])
    for s in (0, 3)
  ]
  for r in groups:
    assert placement.place_where_it_saves_most(r)
  mapping = placement.mapping("evo")
  loose, strict, matched = mapping_genomes(requests, mapping, PROGRAM)
  assert np.all(loose > 1.0)
  assert sorted(np.flatnonzero(strict > 1.0).tolist()) == sorted(groups)
  assert sorted(np.flatnonzero(matched > 1.0).tolist()) == sorted(groups)
  time_s = decode(placement, strict)
  assert sorted(placement.request_indices().tolist()) == sorted(groups)
  assert time_s == pytest.approx(mapping.estimated_time_s)
  assert len(mapping_genomes(build_requests(model), mapping, PROGRAM)) == 1


def test_evo_evicts_a_forward_activation_where_another_needs_its_space_meanwhile():
  """Activation A (100 B, made by a, read by b and f) and B (150 B, made by c, read by d) do not
  both fit in the 200 bytes of fast memory over c and d. Kept whole, A saves 18 s and excludes B
  (27 s); its groups save as much, the eviction hiding behind b and the prefetch behind e, so evo
  keeps both: 45 s of the 74 s all-slow time."""
  flops = (("a", 1.0), ("b", 12.0), ("c", 0.0), ("d", 0.0), ("e", 12.0), ("f", 0.0))
  program = workload_from_dict(
    {
      "name": "forward-backward-pressure",
      "source": "hand",
      "ops": [{"name": n, "flops": f} for n, f in flops],
      "buffers": [
        {"id": 0, "size": 100, "def": 0, "uses": [1, 5], "kind": "activation"},
        {"id": 1, "size": 150, "def": 2, "uses": [3], "kind": "activation"},
      ],
    }
  )
  hardware = dataclasses.replace(HW, levels=(MemoryLevel("fast", 200, 100.0), HW.levels[1]))
  result = solve(program, hardware, "evo", evaluations=20, seed=0)
  assert result.mapping.slow_only_time_s == pytest.approx(74.0)
  assert result.mapping.estimated_time_s == pytest.approx(74.0 - 45.0)
  a_copies = sorted(
    ("eviction" in a, "prefetch" in a) for a in result.mapping.allocations if a["buffer"] == 0
  )
  assert a_copies == [(False, True), (True, False)]


def test_the_msa_genome_decode_script_writes_a_row_per_entry_and_refuses_an_unknown_suite(tmp_path):
  script = os.path.join(
    os.path.dirname(os.path.dirname(__file__)), "scripts", "msa_genome_decodes.py"
  )
  out = tmp_path / "rows.json"
  done = subprocess.run(
    [sys.executable, script, "--suite", "tiny", "--out", str(out)], capture_output=True, text=True
  )
  assert done.returncode == 0, done.stderr
  rows = json.loads(out.read_text())
  assert len(rows) == 6 and "| split, better of two |" in done.stdout
  for row in rows:
    assert row["split, better of two"] == max(row["split, any overlap"], row["split, whole kept"])
    assert all(row[c] > 1.0 for c in ("msa", "whole ranges", "split, any overlap"))
    assert row["split and late prefetches, best of the genomes"] > 1.0
    assert row["split, late prefetches, spans and cuts, best of evo's genomes"] > 1.0
    assert row["late prefetch requests"] > 0
  assert sum(row["span and cut requests"] for row in rows) > 0
  bad = subprocess.run([sys.executable, script, "--suite", "nope"], capture_output=True, text=True)
  assert (
    bad.returncode == 2 and bad.stderr.startswith("error: ") and len(bad.stderr.splitlines()) == 1
  )
