"""The proposer's measured-and-not-adopted variants (research/proposer_variants.py): rival groups
and the two decodes of them, the second network's view of the first's chances, and the script."""

import csv
import dataclasses

import numpy as np
import pytest

from malloczero.actors.games import suite_games
from malloczero.env.placement import Placement
from malloczero.env.solvers.evo import decode
from malloczero.learner.proposer import (
  FEATURES,
  Labels,
  fit,
  label_program,
  labels_of,
  proposal_genome,
  request_features,
  requests_of,
)
from malloczero.learner.proposer.network import PROPOSE_AT
from malloczero.research.proposer_variants import (
  EXPECTED_DEMAND,
  GENOMES,
  expected_demand_features,
  main,
  rival_group_chance,
  rival_groups,
  rivals_by_chance,
)


@pytest.fixture(scope="module")
def program():
  spec = suite_games("tiny", "train")[1]
  model, requests = requests_of(spec.workload, spec.hardware)
  chance = np.random.default_rng(0).random(len(requests))
  return spec, model, requests, chance


def _overlap(requests, i, j):
  return requests.start[i] < requests.end[j] and requests.start[j] < requests.end[i]


def test_rival_groups_are_a_buffers_requests_linked_by_overlapping_windows(program):
  _, _, requests, _ = program
  groups = rival_groups(requests)
  assert np.bincount(groups).max() > 1 and (np.bincount(groups) > 0).all()
  for g in np.unique(groups):
    members = np.flatnonzero(groups == g)
    assert len(set(requests.buffer[members])) == 1
    # Linked: sorted by start, each member overlaps the reach of those before it.
    ordered = members[np.argsort(requests.start[members], kind="stable")]
    reach = requests.end[ordered[0]]
    for k in ordered[1:]:
      assert requests.start[k] < reach
      reach = max(reach, requests.end[k])
  # No request of one group overlaps a request of its buffer's other groups.
  for i in range(len(groups)):
    others = np.flatnonzero((requests.buffer == requests.buffer[i]) & (groups != groups[i]))
    assert not any(_overlap(requests, i, j) for j in others)


def test_rivals_by_chance_deal_each_buffers_places_likeliest_first(program):
  _, _, requests, chance = program
  genome, plain = rivals_by_chance(chance, requests), proposal_genome(chance)
  rows = len(chance)
  plain_tie = 1e-3 * (rows - np.arange(rows)) / rows
  # The proposed and their bands are the proposal's; only the tie-break moves, within a buffer.
  tie = genome - plain + plain_tie
  for b in np.unique(requests.buffer):
    own = np.flatnonzero(requests.buffer == b)
    np.testing.assert_allclose(np.sort(tie[own]), np.sort(plain_tie[own]))
    likeliest_first = own[np.argsort(-chance[own], kind="stable")]
    assert np.all(np.diff(tie[likeliest_first]) < 0)
  assert not np.allclose(tie, plain_tie)


def test_a_rival_groups_likeliest_request_takes_the_groups_chance_where_it_reaches_the_threshold(
  program,
):
  _, _, requests, chance = program
  groups = rival_groups(requests)
  raised = rival_group_chance(chance, requests)
  changed = np.flatnonzero(raised != chance)
  assert len(changed) > 0
  for i in changed:
    members = groups == groups[i]
    assert chance[i] == chance[members].max() and chance[i] < PROPOSE_AT
    assert raised[i] == pytest.approx(min(chance[members].sum(), 0.999))
  for g in np.unique(groups):
    members = groups == g
    if chance[members].sum() < PROPOSE_AT or chance[members].max() >= PROPOSE_AT:
      np.testing.assert_array_equal(raised[members], chance[members])


def test_every_variant_decodes_to_a_mapping_and_a_certain_proposal_is_the_plain_one(program):
  _, model, requests, chance = program
  placement = Placement(model, requests)
  for genome in GENOMES.values():
    assert decode(placement, genome(chance, requests)) > 0
  certain = (chance > 0.5).astype(float)
  np.testing.assert_array_equal(
    proposal_genome(rival_group_chance(certain, requests)), proposal_genome(certain)
  )


def test_expected_demand_with_every_chance_one_is_the_features_demand(program):
  _, model, requests, chance = program
  context = expected_demand_features(model, requests, chance)
  assert context.shape == (len(requests), len(EXPECTED_DEMAND)) and np.isfinite(context).all()
  full = expected_demand_features(model, requests, np.ones(len(requests)))
  features = request_features(model, requests)
  for ours, theirs in (
    ("expected placed bytes over the window, mean, over fast capacity", "mean demand over the "
     "window, over fast capacity"),
    ("the same, peak", "peak demand over the window, over fast capacity"),
  ):  # fmt: skip
    np.testing.assert_allclose(
      full[:, EXPECTED_DEMAND.index(ours)], features[:, FEATURES.index(theirs)], rtol=1e-5
    )
  # Halving every chance halves what is expected.
  half = expected_demand_features(model, requests, np.full(len(requests), 0.5))
  np.testing.assert_allclose(half[:, :2], full[:, :2] / 2, rtol=1e-5)


def test_the_script_saves_chances_decodes_them_and_stacks_a_second_network(tmp_path, capsys):
  specs = suite_games("tiny", "train")
  labelled = [(s.name, label_program(s.workload, s.hardware, seconds=0.1)) for s in specs]
  labels = tmp_path / "labels.npz"
  labels_of("tiny", labelled, 0.1).save(str(labels))
  chances = tmp_path / "chances.npz"
  assert main(["chances", "--labels", str(labels), "--folds", "2", "--steps", "20",
               "--members", "1", "--out", str(chances)]) == 0  # fmt: skip
  out = tmp_path / "corpus.csv"
  assert main(["decode", "--chances", str(chances), "--labels-suite", "tiny",
               "--out", str(out)]) == 0  # fmt: skip
  with open(out) as f:
    rows = list(csv.DictReader(f))
  assert [r["entry"] for r in rows] == [s.name for s in specs]
  assert all(float(r[k]) > 0 for r in rows for k in GENOMES)
  params = tmp_path / "first.npz"
  fit([{"features": d["features"], "placed": d["placed"], "saving": d["saving"]}
       for _, d in labelled], steps=20, batch=64, members=1).save(str(params))  # fmt: skip
  prefix = tmp_path / "stacked"
  assert main(["stack", "--labels", str(labels), "--chances", str(chances), "--params",
               str(params), "--steps", "20", "--suites", "tiny:heldout",
               "--out", str(prefix)]) == 0  # fmt: skip
  with open(f"{prefix}-tiny.csv") as f:
    rows = list(csv.DictReader(f))
  assert len(rows) == len(suite_games("tiny", "heldout"))
  assert {"first: proposal", "second: proposal", "second: rival group sum"} <= set(rows[0])
  assert "rival group sum" in capsys.readouterr().out
  # Chances of other labels, an unreadable file and stale chances: one line, a non-zero exit;
  # a proposer decoded on a suite.
  other = tmp_path / "other.npz"
  earlier = Labels.load(str(labels))
  dataclasses.replace(earlier, entries=tuple(reversed(earlier.entries))).save(str(other))
  assert main(["stack", "--labels", str(other), "--chances", str(chances), "--params",
               str(params), "--out", str(prefix)]) == 2  # fmt: skip
  assert main(["decode", "--chances", str(tmp_path / "none.npz")]) == 2
  stale = tmp_path / "stale.npz"
  np.savez(stale, entries=np.array([specs[0].name]), chance0=np.full(3, 0.5))
  assert main(["decode", "--chances", str(stale), "--labels-suite", "tiny"]) == 2
  assert main(["decode", "--params", str(params), "--suite", "tiny", "--split", "train",
               "--out", str(tmp_path / "suite.csv")]) == 0  # fmt: skip
  with open(tmp_path / "suite.csv") as f:
    assert [r["entry"] for r in csv.DictReader(f)] == [s.name for s in specs]
  errors = capsys.readouterr().err.splitlines()
  assert len(errors) == 3 and "are not of the labels' programs" in errors[0]
  assert errors[1].startswith("error: cannot read the chances")
  assert f"the chances of '{specs[0].name}' are not of its" in errors[2]
  assert not list(tmp_path.glob("*.tmp.npz"))
