"""The request-priority proposer (research/priority_proposer.py): its features, its labels (evo's
best mapping), its fit, one decode of its proposal, and the script end to end."""

import csv
import os
import subprocess
import sys

import numpy as np
import pytest

from malloczero.actors.games import suite_games
from malloczero.env.placement import Placement
from malloczero.env.solvers import solve
from malloczero.env.solvers.evo import decode, mapping_genomes
from malloczero.env.validator import validate_mapping
from malloczero.research.priority_proposer import (
  FEATURES,
  PROPOSE_AT,
  Proposer,
  _window_max,
  auc,
  collect_one,
  decode_once,
  fit,
  proposal_genome,
  request_features,
  requests_of,
  search_from_proposal,
)

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def test_window_max_is_the_max_over_each_window():
  rng = np.random.default_rng(0)
  series = rng.random(37)
  start = rng.integers(0, 37, size=200)
  end = np.minimum(37, start + rng.integers(0, 20, size=200))
  expected = [series[s:e].max() if e > s else 0.0 for s, e in zip(start, end)]
  np.testing.assert_array_equal(_window_max(series, start, end), expected)


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


def test_labels_are_evos_best_mapping_and_proposals_decode_to_a_valid_mapping():
  specs = suite_games("tiny", "train")[:3]
  programs = [collect_one(s.workload, s.hardware, seconds=0.3) for s in specs]
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
  result, placement, chance = decode_once(specs[0].workload, specs[0].hardware, proposer)
  validate_mapping(specs[0].workload, specs[0].hardware, placement.mapping("proposer"))
  assert result["proposer"] == pytest.approx(
    placement.model.slow_only_time / placement.total_time, rel=1e-12
  )
  assert set(result) >= {"msa", "msa_genome", "greedy_order", "proposer"}
  assert ((chance >= 0) & (chance <= 1)).all() and (chance >= PROPOSE_AT).any()


def test_the_proposal_puts_the_requests_expected_placed_first_in_msas_order():
  genome = proposal_genome(np.array([0.2, 0.9, 0.5, 0.7, 0.1]))
  assert list(np.argsort(-genome, kind="stable")) == [1, 2, 3, 0, 4]


def test_auc_counts_ties_as_half():
  placed = np.array([True, False, True, False])
  assert auc(placed, np.array([0.9, 0.1, 0.8, 0.2])) == 1.0
  assert auc(placed, np.array([0.5, 0.5, 0.5, 0.5])) == 0.5
  assert auc(placed, np.array([0.1, 0.9, 0.2, 0.8])) == 0.0
  assert np.isnan(auc(np.array([True, True]), np.array([0.1, 0.2])))


def test_the_search_from_the_proposal_keeps_at_least_its_seeds():
  spec = suite_games("tiny", "train")[2]
  proposer = fit([collect_one(spec.workload, spec.hardware, seconds=0.2)], steps=50, batch=128)
  result = search_from_proposal(spec.workload, spec.hardware, proposer, seconds=0.5, seed=3)
  model, requests = requests_of(spec.workload, spec.hardware)
  placement = Placement(model, requests)
  msa = solve(spec.workload, spec.hardware, "msa").mapping
  seeds = [
    model.slow_only_time / decode(placement, g)
    for g in mapping_genomes(requests, msa, spec.workload)
  ]
  proposal = proposal_genome(proposer.placed_chance(request_features(model, requests)))
  assert result["msa"] == pytest.approx(msa.speedup, rel=1e-12)
  assert result["msa_seeded"] >= max(seeds) - 1e-12
  assert (
    result["proposer_seeded"]
    >= max(seeds + [model.slow_only_time / decode(placement, proposal)]) - 1e-12
  )
  assert result["msa_seeded_decodes"] >= 2 and result["proposer_seeded_decodes"] >= 3


def test_a_saved_proposer_loads_and_proposes_the_same(tmp_path):
  spec = suite_games("tiny", "train")[1]
  programs = [collect_one(spec.workload, spec.hardware, seconds=0.2)]
  proposer = fit(programs, seed=1, steps=50, batch=128)
  proposer.save(str(tmp_path / "p.npz"))
  loaded = Proposer.load(str(tmp_path / "p.npz"))
  features = programs[0]["features"]
  np.testing.assert_array_equal(loaded.placed_chance(features), proposer.placed_chance(features))


@pytest.mark.slow  # Three subprocesses, each loading JAX.
def test_the_script_collects_fits_and_decodes_a_suite(tmp_path):
  def script(*args):
    return subprocess.run(
      [sys.executable, os.path.join(REPO, "scripts", "priority_proposer.py"), *args],
      capture_output=True,
      text=True,
      cwd=REPO,
      timeout=600,
    )

  data, params, out = tmp_path / "data", tmp_path / "p.npz", tmp_path / "decodes.csv"
  collected = script("collect", "--suite", "tiny", "--split", "train", "--seconds", "0.2",
                     "--out", str(data))  # fmt: skip
  assert collected.returncode == 0, collected.stderr[-2000:]
  names = sorted(os.listdir(data))
  assert len(names) == len(suite_games("tiny", "train")) and all(n.endswith(".npz") for n in names)
  fitted = script("fit", "--data", str(data), "--steps", "100", "--out", str(params))
  assert fitted.returncode == 0 and "training AUC" in fitted.stdout, fitted.stderr[-2000:]
  decoded = script("decode", "--params", str(params), "--suite", "tiny", "--split", "heldout",
                   "--out", str(out))  # fmt: skip
  assert decoded.returncode == 0, decoded.stderr[-2000:]
  with open(out) as f:
    rows = list(csv.DictReader(f))
  assert len(rows) == len(suite_games("tiny", "heldout"))
  assert all(float(r["proposer"]) > 0 and float(r["msa"]) > 0 for r in rows)
  assert "proposer" in decoded.stdout and "W/T/L" in decoded.stdout
  searched = script("search", "--params", str(params), "--suite", "tiny", "--split", "heldout",
                    "--seconds", "0.3", "--out", str(tmp_path / "search.csv"))  # fmt: skip
  assert searched.returncode == 0 and "with the proposal" in searched.stdout, searched.stderr[
    -2000:
  ]
  with open(tmp_path / "search.csv") as f:
    rows = list(csv.DictReader(f))
  assert len(rows) == len(suite_games("tiny", "heldout"))
  assert all(float(r["proposer_seeded"]) > 0 and float(r["msa_seeded"]) > 0 for r in rows)
  # Bad input: one line, a non-zero exit.
  missing = script("decode", "--params", str(tmp_path / "none.npz"), "--suite", "tiny")
  assert missing.returncode == 2 and missing.stderr.count("\n") == 1
  assert missing.stderr.startswith("error: ")
  empty = script("fit", "--data", str(tmp_path / "nothing"), "--out", str(params))
  assert empty.returncode == 2 and "run `collect` first" in empty.stderr
