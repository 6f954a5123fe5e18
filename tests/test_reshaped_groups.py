"""A weight kept across all its uses, or a group with its later uses cut off, as msa's
allocations do (build_requests(reshaped_groups=True)): the requests, their place in the order,
the one-of exclusion, and the decodes of msa's mapping they make possible on unrolled GRUs."""

import numpy as np
import pytest

from malloczero.env.cost_model import CostModel
from malloczero.env.placement import Placement
from malloczero.env.requests import build_requests
from malloczero.env.solvers import get_solver
from malloczero.env.solvers.evo import decode
from malloczero.env.validator import validate_mapping
from malloczero.env.workload_json import workload_from_dict
from tests.test_cost_model import HW  # fast 100 B/s, slow 10 B/s, copy 10 B/s, 1 flop/s
from tests.test_late_prefetches import buffer_windows, msa_mapping_decoded

# Weight w (10 B) is read by ops 1, 3 and 5; activation x (100 B) keeps each op 1 s busy in fast
# memory. w's 1 s copy hides behind one op, so each use's window starts one op before it, after
# the previous use: three groups, each copied in again.
PROGRAM = workload_from_dict(
  {
    "name": "weight-read-every-other-op",
    "source": "hand",
    "ops": [{"name": f"o{i}", "flops": 0.0} for i in range(6)],
    "buffers": [
      {"id": 0, "size": 100, "def": 0, "uses": [1, 2, 3, 4, 5], "kind": "activation"},
      {"id": 1, "size": 10, "def": None, "uses": [1, 3, 5], "kind": "parameter"},
    ],
  }
)
GROUPS = [(0, 2, 1, True, -1, -1), (2, 4, 3, True, -1, -1), (4, 6, 5, True, -1, -1)]


def test_a_weight_with_several_groups_gets_its_span_and_cuts_after_the_groups():
  model = CostModel(PROGRAM, HW)
  plain = build_requests(model)
  assert buffer_windows(plain, 1) == GROUPS and not plain.reshaped.any()
  requests = build_requests(model, reshaped_groups=True)
  # The span serves all three uses from the first group's window on; its cut to the first two
  # uses ends after op 3 (the cut to one use is the first group, kept once, as a group).
  assert buffer_windows(requests, 1) == sorted(
    GROUPS + [(0, 6, 1, True, -1, -1), (0, 4, 1, True, -1, -1)]
  )
  mine = np.flatnonzero(requests.buffer == 1)
  spans = {(int(requests.start[r]), int(requests.end[r])) for r in mine if requests.reshaped[r]}
  assert spans == {(0, 6), (0, 4)}
  served = {int(requests.end[r]): len(requests.ops(r)[0]) for r in mine if requests.reshaped[r]}
  assert served == {6: 3, 4: 2}
  # After every group in the order, so msa's order and its mapping's genomes decode the groups
  # as without them; the activation's requests are unchanged.
  assert np.all(np.flatnonzero(requests.reshaped) > np.flatnonzero(~requests.reshaped).max())
  assert buffer_windows(requests, 0) == buffer_windows(plain, 0)


def test_a_span_and_the_groups_it_covers_exclude_each_other():
  model = CostModel(PROGRAM, HW)
  requests = build_requests(model, reshaped_groups=True)
  mine = np.flatnonzero(requests.buffer == 1)
  (span,) = [r for r in mine if (requests.start[r], requests.end[r]) == (0, 6)]
  placement = Placement(model, requests)
  placement.place(int(span), 0, 0)
  assert all(placement.blocked(int(r)) for r in mine if r != span)
  for genome in (np.arange(len(requests), 0, -1.0), np.arange(1.0, len(requests) + 1)):
    decode(placement, genome)
    validate_mapping(PROGRAM, HW, placement.mapping("evo"))


def test_evo_offers_spans_and_cuts():
  assert get_solver("evo").reshaped_groups
  assert not get_solver("greedy").reshaped_groups


@pytest.mark.parametrize(
  "name",
  [
    # msa keeps each weight of the first GRU layer fast through all 48 steps, which a copy per
    # step cannot match.
    "tf-gru64x2-b8-infer@tpu-v4i-like:25%",
    # msa ends the forward GRU's recurrent kernel before its last use, where the backward GRU's
    # kernel takes its memory.
    "tf-bigru128-b4-infer@nnpi-like:25%",
  ],
)
def test_msa_s_mapping_of_an_unrolled_gru_decodes_to_msa_only_with_spans_and_cuts(name):
  decoded, model = msa_mapping_decoded("corpus", name)
  assert decoded(build_requests(model, True, True)) < 0.5
  assert decoded(get_solver("evo").requests(model)) > 0.99
