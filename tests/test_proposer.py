"""The proposer (learner/proposer/): its features, its labels (evo's best mapping) and their
file, its fit, its proposal, and its saved parameters."""

import dataclasses
import os

import numpy as np
import pytest

from malloczero.actors.games import suite_games
from malloczero.common.errors import MalloczeroError
from malloczero.configs.config import get_config, with_section
from malloczero.configs.workdir import WorkDir
from malloczero.env.placement import Placement
from malloczero.env.requests import build_requests
from malloczero.env.solvers import solve
from malloczero.env.solvers.evo import decode, mapping_genomes
from malloczero.env.validator import validate_mapping
from malloczero.learner.proposer import (
  FEATURES,
  Labels,
  Proposer,
  auc,
  fingerprint,
  fit,
  label_program,
  labelled_programs,
  labels_of,
  neighbour_genomes,
  play_proposal,
  proposal_genome,
  propose,
  request_features,
  requests_of,
)
from malloczero.learner.proposer.features import window_max
from malloczero.learner.proposer.network import NEIGHBOURS, PROPOSE_AT, request_weights
from malloczero.system.training import fit_run_proposer


def test_window_max_is_the_max_over_each_window():
  rng = np.random.default_rng(0)
  series = rng.random(37)
  start = rng.integers(0, 37, size=200)
  end = np.minimum(37, start + rng.integers(0, 20, size=200))
  expected = [series[s:e].max() if e > s else 0.0 for s, e in zip(start, end)]
  np.testing.assert_array_equal(window_max(series, start, end), expected)


def test_features_are_finite_and_the_same_at_any_scale_of_the_program():
  spec = suite_games("tiny", "train")[0]
  model, requests = requests_of(spec.workload, spec.hardware)
  features = request_features(model, requests)
  assert features.shape == (len(requests), len(FEATURES)) and np.isfinite(features).all()
  # Shares and ranks stay in [0, 1]; the copy flag is the requests'.
  for name in ("saving per byte, rank in the program", "window over the program", "is a prefetch"):
    column = features[:, FEATURES.index(name)]
    assert column.min() >= 0 and column.max() <= 1
  np.testing.assert_array_equal(
    features[:, FEATURES.index("is a prefetch")], requests.is_prefetch.astype(np.float32)
  )


def test_a_programs_own_requests_have_the_same_features_whatever_spans_and_cuts_it_is_offered():
  """Counts, ranks, order and demand are the program's own requests' (`reshaped` left out): its
  requests' features with evo's spans and cuts are those without them."""
  for spec in suite_games("tiny", "train")[:3]:
    model, requests = requests_of(spec.workload, spec.hardware)
    assert requests.reshaped.any()
    alone = build_requests(model, split_activations=True, late_prefetches=True)
    features = request_features(model, requests)
    np.testing.assert_array_equal(features[~requests.reshaped], request_features(model, alone))
    column = features[:, FEATURES.index("is a span or cut of its buffer's groups")]
    np.testing.assert_array_equal(column, requests.reshaped.astype(np.float32))
    for name in ("saving per byte, rank in the program", "position in msa's order"):
      assert (
        0 <= features[:, FEATURES.index(name)].min() <= features[:, FEATURES.index(name)].max() <= 1
      )


def test_labels_are_evos_best_mapping_and_proposals_decode_to_a_valid_mapping():
  specs = suite_games("tiny", "train")[:3]
  programs = [label_program(s.workload, s.hardware, seconds=0.3) for s in specs]
  for spec, data in zip(specs, programs):
    model, requests = requests_of(spec.workload, spec.hardware)
    assert data["features"].shape == (len(requests), len(FEATURES))
    assert data["placed"].shape == (len(requests),) and data["placed"].any()
    # evo starts from msa's mapping as priorities: its best is at least their decodes.
    msa = solve(spec.workload, spec.hardware, "msa").mapping
    placement = Placement(model, requests)
    seeds = mapping_genomes(requests, msa, spec.workload)
    assert data["evo"] >= max(model.slow_only_time / decode(placement, g) for g in seeds) - 1e-12
    assert data["msa"] == pytest.approx(msa.speedup, rel=1e-12)
  proposer = fit(programs, seed=0, steps=300, batch=256)
  # It learns its labels: placed requests score above the others on the programs it fitted.
  scores = [auc(p["placed"], proposer.placed_chance(p["features"])) for p in programs]
  assert np.nanmean(scores) > 0.75
  placement = Placement(*requests_of(specs[0].workload, specs[0].hardware))
  genome, played_chance = play_proposal(proposer, placement)
  validate_mapping(specs[0].workload, specs[0].hardware, placement.mapping("proposer"))
  # The decode of the proposal is the proposal's genome decoded, nothing else.
  total = placement.total_time
  assert decode(Placement(placement.model, placement.requests), genome) == total
  chance = proposer.placed_chance(programs[0]["features"])
  assert ((chance >= 0) & (chance <= 1)).all() and (chance >= PROPOSE_AT).any()
  np.testing.assert_array_equal(genome, proposal_genome(chance))
  np.testing.assert_array_equal(played_chance, chance)


def test_the_proposals_neighbours_move_its_threshold_or_the_order_of_the_proposed():
  chance = np.array([0.2, 0.9, 0.5, 0.7, 0.1, 0.65, 0.85, 0.45, 0.55])
  order = lambda genome: list(np.argsort(-genome, kind="stable"))
  assert order(proposal_genome(chance)) == [1, 6, 3, 5, 2, 8, 0, 4, 7]
  # 0.45 joins the proposed at 0.4, in the band of 0.5 and 0.55 (0.4-0.6), in msa's order; at
  # 0.6, 0.5 and 0.55 join the rest, in msa's order; at 0.7, 0.65 too; at 0.9 only 0.9 is left.
  assert order(proposal_genome(chance, 0.4)) == [1, 6, 3, 5, 2, 7, 8, 0, 4]
  assert order(proposal_genome(chance, 0.6)) == [1, 6, 3, 5, 0, 2, 4, 7, 8]
  assert order(proposal_genome(chance, 0.7)) == [1, 6, 3, 0, 2, 4, 5, 7, 8]
  assert order(proposal_genome(chance, 0.9)) == [1, 0, 2, 3, 4, 5, 6, 7, 8]
  # By the chance itself: 0.55 before 0.5, which share a band; in msa's order: the proposed as
  # they come.
  assert order(proposal_genome(chance, order="chance")) == [1, 6, 3, 5, 8, 2, 0, 4, 7]
  assert order(proposal_genome(chance, order="msa")) == [1, 2, 3, 5, 6, 8, 0, 4, 7]
  assert order(proposal_genome(chance, 0.3, "chance")) == [1, 6, 3, 5, 8, 2, 7, 0, 4]
  with pytest.raises(MalloczeroError, match="unknown order of the proposed 'random'"):
    proposal_genome(chance, order="random")
  # The neighbours: the proposal at each other threshold and order, never the proposal itself.
  assert (PROPOSE_AT, "bands") not in NEIGHBOURS and len(set(NEIGHBOURS)) == len(NEIGHBOURS)
  expected = [proposal_genome(chance, at, by) for at, by in NEIGHBOURS]
  neighbours = neighbour_genomes(chance)
  assert len(neighbours) == len(expected) == 12
  for genome, want in zip(neighbours, expected):
    np.testing.assert_array_equal(genome, want)
  # Every threshold from 0.1 to 0.9 in bands, 0.3-0.7 by the chance, 0.5 in msa's order.
  bands = [0.1, 0.2, 0.3, 0.4, 0.6, 0.7, 0.8, 0.9]
  assert sorted(at for at, by in NEIGHBOURS if by == "bands") == bands
  assert sorted(at for at, by in NEIGHBOURS if by != "bands") == [0.3, 0.5, 0.5, 0.7]


def test_a_labels_search_seeded_with_a_proposal_is_at_least_the_proposal():
  spec = suite_games("tiny", "train")[1]
  proposer = fit([label_program(spec.workload, spec.hardware, seconds=0.2)], steps=100, batch=128)
  data = label_program(spec.workload, spec.hardware, seconds=0.2, seed=1, proposer=proposer)
  placement = Placement(*requests_of(spec.workload, spec.hardware))
  proposal = propose(proposer, placement.model, placement.requests)
  slow = placement.model.slow_only_time
  assert data["evo"] >= slow / decode(placement, proposal) - 1e-12
  assert data["placed"].shape == proposal.shape and data["evaluations"] >= 3


def test_the_proposal_puts_the_requests_expected_placed_first_surest_band_first_in_msas_order():
  genome = proposal_genome(np.array([0.2, 0.9, 0.5, 0.7, 0.1, 0.65, 0.85, 0.45]))
  # Bands of 0.2: 0.85 and 0.9 (msa's order between them), then 0.65 and 0.7, then 0.5; the
  # requests below an even chance after all of them, in msa's order.
  assert list(np.argsort(-genome, kind="stable")) == [1, 6, 3, 5, 2, 0, 4, 7]


def test_auc_counts_ties_as_half():
  placed = np.array([True, False, True, False])
  assert auc(placed, np.array([0.9, 0.1, 0.8, 0.2])) == 1.0
  assert auc(placed, np.array([0.5, 0.5, 0.5, 0.5])) == 0.5
  assert auc(placed, np.array([0.1, 0.9, 0.2, 0.8])) == 0.0
  assert np.isnan(auc(np.array([True, True]), np.array([0.1, 0.2])))


def test_a_saved_proposer_loads_and_proposes_the_same(tmp_path):
  spec = suite_games("tiny", "train")[1]
  programs = [label_program(spec.workload, spec.hardware, seconds=0.2)]
  proposer = fit(programs, seed=1, steps=50, batch=128)
  proposer.save(str(tmp_path / "p.npz"))
  loaded = Proposer.load(str(tmp_path / "p.npz"))
  features = programs[0]["features"]
  np.testing.assert_array_equal(loaded.placed_chance(features), proposer.placed_chance(features))


def test_each_program_weighs_the_same_and_a_share_of_it_goes_by_saving():
  small = {"placed": np.zeros(2, bool), "saving": np.array([3.0, 1.0])}
  large = {"placed": np.zeros(4, bool), "saving": np.array([0.0, 0.0, 0.0, 2.0])}
  even = request_weights([small, large], saving_weight=0.0)
  np.testing.assert_allclose(even, [0.25, 0.25, 0.125, 0.125, 0.125, 0.125])
  by_saving = request_weights([small, large], saving_weight=1.0)
  np.testing.assert_allclose(by_saving, [0.375, 0.125, 0.0, 0.0, 0.0, 0.5])
  mixed = request_weights([small, large], saving_weight=0.25)
  np.testing.assert_allclose(mixed, 0.75 * even + 0.25 * by_saving)
  # A program that saves nothing anywhere keeps its even weights.
  idle = {"placed": np.zeros(2, bool), "saving": np.zeros(2)}
  np.testing.assert_allclose(request_weights([idle], saving_weight=1.0), [0.5, 0.5])
  with pytest.raises(MalloczeroError, match="in \\[0, 1\\]"):
    request_weights([small], saving_weight=1.5)
  with pytest.raises(MalloczeroError, match="needs each program's `saving`"):
    request_weights([{"placed": np.zeros(2, bool)}], saving_weight=0.25)
  with pytest.raises(MalloczeroError, match="at least one member"):
    fit([small | {"features": np.zeros((2, 3), np.float32)}], members=0)


def test_the_proposer_proposes_by_its_members_mean_chance_and_reads_a_single_networks_file(
  tmp_path,
):
  spec = suite_games("tiny", "train")[1]
  programs = [label_program(spec.workload, spec.hardware, seconds=0.2)]
  proposer = fit(programs, seed=1, steps=50, batch=128, members=2)
  assert len(proposer.members) == 2
  features = programs[0]["features"]
  alone = [
    dataclasses.replace(proposer, members=(m,)).placed_chance(features) for m in proposer.members
  ]
  assert not np.allclose(alone[0], alone[1])  # Each member from its own seed.
  np.testing.assert_allclose(proposer.placed_chance(features), np.mean(alone, 0), rtol=1e-6)
  # A file of one network under `params|` (before ensembles) loads as a proposer of one member.
  flat = {f"params|{m}|{n}": v for m, p in proposer.members[0].items() for n, v in p.items()}
  np.savez(tmp_path / "single.npz", mean=proposer.mean, std=proposer.std, **flat)
  single = Proposer.load(str(tmp_path / "single.npz"))
  assert len(single.members) == 1
  np.testing.assert_array_equal(single.placed_chance(features), alone[0])


def test_labels_round_trip_through_their_file_and_refit_the_suites_programs(tmp_path):
  entries = suite_games_entries("tiny")[:3]
  labelled = [(e.name, label_program(*e.load(), seconds=0.2)) for e in entries]
  labels = labels_of("tiny", labelled, seconds=0.2)
  path = str(tmp_path / "labels.npz")
  labels.save(path)
  loaded = Labels.load(path)
  assert loaded.entries == tuple(e.name for e in entries) and loaded.suite == "tiny"
  for (_, data), flags in zip(labelled, loaded.placed):
    np.testing.assert_array_equal(flags, data["placed"])
  np.testing.assert_array_equal(loaded.evo, labels.evo)
  programs = labelled_programs(loaded)
  for (_, data), program in zip(labelled, programs):
    np.testing.assert_array_equal(program["features"], data["features"])
    np.testing.assert_array_equal(program["placed"], data["placed"])
  assert len(labelled_programs(loaded, max_programs=2, seed=1)) == 2


def test_labels_of_changed_requests_or_a_missing_entry_are_refused(tmp_path):
  entry = suite_games_entries("tiny")[0]
  data = label_program(*entry.load(), seconds=0.1)
  labels = labels_of("tiny", [(entry.name, data)], seconds=0.1)
  stale = dataclasses.replace(labels, fingerprints=("0" * 16,))
  with pytest.raises(MalloczeroError, match="stale"):
    labelled_programs(stale)
  gone = dataclasses.replace(labels, entries=("no-such-program@tpu:10%",))
  with pytest.raises(MalloczeroError, match="no longer has"):
    labelled_programs(gone)
  assert fingerprint(requests_of(*entry.load())[1]) == labels.fingerprints[0]


def test_unreadable_labels_and_proposers_are_one_line_errors(tmp_path):
  bad = tmp_path / "bad.npz"
  bad.write_bytes(b"not an npz")
  for load in (Labels.load, Proposer.load):
    with pytest.raises(MalloczeroError) as caught:
      load(str(bad))
    assert "\n" not in str(caught.value)
  np.savez(tmp_path / "other.npz", mean=np.zeros(3), std=np.ones(3))
  with pytest.raises(MalloczeroError, match="not a proposer"):
    Proposer.load(str(tmp_path / "other.npz"))


def suite_games_entries(suite):
  from malloczero.env.programs.suites import get_suite

  return list(get_suite(suite).split("train").entries)


def test_a_run_fits_its_proposer_once_and_none_without_steps(tmp_path):
  """`train` fits the proposer before the run trains (system/training.py `fit_run_proposer`) to
  the built-in corpus labels; a resumed run keeps it; `proposer.steps` 0 fits none."""
  config = get_config("tiny")
  lines: list[str] = []
  run = str(tmp_path / "run")
  assert fit_run_proposer(config, run, lines.append) > 0
  path = WorkDir(run).proposer
  assert Proposer.load(path).mean.shape == (len(FEATURES),)
  steps = config.proposer.steps * config.proposer.members
  assert config.proposer.members > 1 and len(Proposer.load(path).members) == config.proposer.members
  assert any(f"step {steps}/{steps}, loss" in line for line in lines)
  assert lines[-1].startswith(f"proposer: saved {path}")
  before = os.stat(path).st_mtime_ns
  assert fit_run_proposer(config, run, lines.append) == 0.0
  assert os.stat(path).st_mtime_ns == before
  off = with_section(config, "proposer", steps=0)
  assert fit_run_proposer(off, str(tmp_path / "off"), lines.append) == 0.0
  assert not os.path.exists(WorkDir(str(tmp_path / "off")).proposer)
  broken = with_section(config, "proposer", labels=str(tmp_path / "missing.npz"))
  with pytest.raises(MalloczeroError, match="cannot read the labels"):
    fit_run_proposer(broken, str(tmp_path / "broken"), lines.append)
