"""The proposer's research script (research/priority_proposer.py): one decode of the proposal
against the decoder's other inputs, the search seeded with it against the search without it, and
the script end to end."""

import csv
import os
import subprocess
import sys

import numpy as np
import pytest

from malloczero.actors.games import suite_games
from malloczero.common.errors import MalloczeroError
from malloczero.env.placement import Placement
from malloczero.env.solvers import solve
from malloczero.env.solvers.evo import decode, mapping_genomes
from malloczero.env.validator import validate_mapping
from malloczero.learner.proposer import (
  Labels,
  Proposer,
  fit,
  label_program,
  proposal_genome,
  request_features,
  requests_of,
)
from malloczero.learner.proposer.network import NEIGHBOURS
from malloczero.research.priority_proposer import (
  decode_once,
  keep_the_better,
  load_collected,
  merged_labels,
  model_folds,
  search_from_proposal,
)

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def test_the_search_from_the_proposal_keeps_at_least_its_seeds():
  spec = suite_games("tiny", "train")[2]
  proposer = fit([label_program(spec.workload, spec.hardware, seconds=0.2)], steps=50, batch=128)
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


def test_one_decode_of_the_proposal_is_measured_beside_the_decoders_other_inputs():
  spec = suite_games("tiny", "train")[0]
  proposer = fit([label_program(spec.workload, spec.hardware, seconds=0.2)], steps=100, batch=128)
  result, placement, chance = decode_once(spec.workload, spec.hardware, proposer)
  validate_mapping(spec.workload, spec.hardware, placement.mapping("proposer"))
  slow = placement.model.slow_only_time
  assert result["proposer"] == pytest.approx(slow / placement.total_time, rel=1e-12)
  fresh = Placement(placement.model, placement.requests)
  assert result["proposer"] == pytest.approx(slow / decode(fresh, proposal_genome(chance)))
  msa = solve(spec.workload, spec.hardware, "msa").mapping
  assert result["msa"] == pytest.approx(msa.speedup, rel=1e-12)
  assert result["msa_genome"] == pytest.approx(
    max(slow / decode(fresh, g) for g in mapping_genomes(fresh.requests, msa, spec.workload))
  )


def test_a_round_keeps_the_earlier_label_where_it_is_as_fast():
  placed_before = np.array([True, False, True])
  earlier = Labels(
    suite="tiny",
    entries=("a", "b"),
    placed=(placed_before, np.array([False])),
    fingerprints=("f-a", "f-b"),
    msa=np.array([1.0, 1.0]),
    evo=np.array([1.2, 1.1]),
    seconds=1.0,
  )
  slower = {"placed": ~placed_before, "evo": np.float64(1.15), "fingerprint": np.str_("f-a")}
  keep_the_better(slower, earlier, "a")
  assert slower["kept"] and slower["evo"] == 1.2
  np.testing.assert_array_equal(slower["placed"], placed_before)
  faster = {"placed": ~placed_before, "evo": np.float64(1.25), "fingerprint": np.str_("f-a")}
  keep_the_better(faster, earlier, "a")
  assert not faster["kept"] and faster["evo"] == 1.25
  np.testing.assert_array_equal(faster["placed"], ~placed_before)
  unknown = {"placed": placed_before, "evo": np.float64(1.0), "fingerprint": np.str_("f-c")}
  keep_the_better(unknown, earlier, "c")
  assert not unknown["kept"] and unknown["evo"] == 1.0
  stale = {"placed": np.array([True]), "evo": np.float64(1.0), "fingerprint": np.str_("other")}
  with pytest.raises(MalloczeroError, match="stale"):
    keep_the_better(stale, earlier, "b")


def test_added_labels_follow_the_earlier_ones_of_the_same_suite_and_search_time():
  def labels(suite, names, seconds=4.0):
    return Labels(
      suite=suite,
      entries=tuple(names),
      placed=tuple(np.arange(k + 1) % 2 == 0 for k in range(len(names))),
      fingerprints=tuple(f"f-{n}" for n in names),
      msa=np.ones(len(names)),
      evo=np.arange(1, len(names) + 1, dtype=float),
      seconds=seconds,
    )

  merged = merged_labels(labels("corpus", ["a", "b"]), labels("corpus", ["c"]))
  assert merged.entries == ("a", "b", "c") and merged.fingerprints == ("f-a", "f-b", "f-c")
  assert [len(p) for p in merged.placed] == [1, 2, 1]
  np.testing.assert_array_equal(merged.evo, [1.0, 2.0, 1.0])
  assert merged.suite == "corpus" and merged.seconds == 4.0
  with pytest.raises(MalloczeroError, match="suite 'tiny' at 4 s to labels of suite 'corpus'"):
    merged_labels(labels("corpus", ["a"]), labels("tiny", ["c"]))
  with pytest.raises(MalloczeroError, match="at 2 s to labels of suite 'corpus' at 4 s"):
    merged_labels(labels("corpus", ["a"]), labels("corpus", ["c"], seconds=2.0))
  with pytest.raises(MalloczeroError, match="^'b' labelled in both$"):
    merged_labels(labels("corpus", ["a", "b"]), labels("corpus", ["b", "c"]))


def test_model_folds_keep_each_model_whole_and_use_every_fold():
  models = ["gpt", "bert", "gpt", "mlp", "vgg", "bert", "unet"]
  folds = model_folds(models, 3)
  assert set(folds) == set(models) and set(folds.values()) == {0, 1, 2}
  assert sorted(list(folds.values()).count(k) for k in range(3)) == [1, 2, 2]
  assert model_folds(list(reversed(models)), 3) == folds  # By name, not by the labels' order.
  for bad in (1, 6):
    with pytest.raises(MalloczeroError, match=f"from 2 to the labels' 5 models, not {bad}"):
      model_folds(models, bad)


@pytest.mark.slow  # Subprocesses, each loading JAX.
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
  # Collected in two parts by size, the larger programs added to the smaller's labels.
  large = tmp_path / "large"
  for part, sizes in ((data, ["--max-requests", "100"]), (large, ["--min-requests", "101"])):
    collected = script("collect", "--suite", "tiny", "--split", "train", "--seconds", "0.2",
                       *sizes, "--out", str(part))  # fmt: skip
    assert collected.returncode == 0, collected.stderr[-2000:]
  names, added = sorted(os.listdir(data)), sorted(os.listdir(large))
  assert len(names) == 3 and len(added) == 2 and not set(names) & set(added)
  assert all(n.endswith(".npz") for n in names + added)
  labels, smaller = tmp_path / "labels.npz", tmp_path / "smaller.npz"
  packed = script("labels", "--data", str(data), "--suite", "tiny", "--seconds", "0.2",
                  "--out", str(smaller))  # fmt: skip
  assert packed.returncode == 0 and "saved" in packed.stdout, packed.stderr[-2000:]
  assert "3 programs" in packed.stdout
  packed = script("labels", "--data", str(large), "--suite", "tiny", "--seconds", "0.2",
                  "--add-to", str(smaller), "--out", str(labels))  # fmt: skip
  assert packed.returncode == 0 and "saved" in packed.stdout, packed.stderr[-2000:]
  assert "5 programs" in packed.stdout
  merged = Labels.load(str(labels))
  assert merged.entries[:3] == Labels.load(str(smaller)).entries
  assert sorted(merged.entries) == sorted(s.name for s in suite_games("tiny", "train"))
  again = script("labels", "--data", str(large), "--suite", "tiny", "--seconds", "0.2",
                 "--add-to", str(labels), "--out", str(tmp_path / "twice.npz"))  # fmt: skip
  assert again.returncode == 2 and again.stderr.count("\n") == 1
  assert "' and 1 more labelled in both" in again.stderr
  fitted = script("fit", "--labels", str(labels), "--steps", "100", "--members", "2",
                  "--saving-weight", "0.5", "--out", str(params))  # fmt: skip
  assert fitted.returncode == 0 and "training AUC" in fitted.stdout, fitted.stderr[-2000:]
  assert len(Proposer.load(str(params)).members) == 2
  # The next round: the search seeded with the proposal, never below the earlier labels.
  data2 = tmp_path / "round2"
  relabelled = script("collect", "--suite", "tiny", "--split", "train", "--seconds", "0.2",
                      "--seed", "1", "--proposer", str(params), "--better-than", str(labels),
                      "--out", str(data2))  # fmt: skip
  assert relabelled.returncode == 0, relabelled.stderr[-2000:]
  earlier = Labels.load(str(labels))
  for name, data in load_collected(str(data2)):
    row = earlier.entries.index(name)
    assert float(data["evo"]) >= float(earlier.evo[row])
    if data["kept"]:
      np.testing.assert_array_equal(data["placed"], earlier.placed[row])
  assert len(load_collected(str(data2))) == len(earlier.entries)
  assert "label)" in relabelled.stdout
  # make train's fit out of model: each model's programs decoded by a fit to the others'.
  # Each fold's fit tuned on its own programs' decodes too.
  crossval = script("crossval", "--labels", str(labels), "--folds", "2", "--steps", "50",
                    "--tune-steps", "2", "--out", str(tmp_path / "cv.csv"))  # fmt: skip
  assert crossval.returncode == 0 and "in 2 folds" in crossval.stdout, crossval.stderr[-2000:]
  assert crossval.stdout.count("tuning step 2/2: perturbations' geomean") == 2
  with open(tmp_path / "cv.csv") as f:
    rows = list(csv.DictReader(f))
  assert [r["entry"] for r in rows] == list(earlier.entries)
  fold_of_model = {(r["model"], r["fold"]) for r in rows}
  assert len(fold_of_model) == len({r["model"] for r in rows}) == 3
  assert {r["fold"] for r in rows} == {"0", "1"}
  neighbours = [f"{at:.1f} {order}" for at, order in NEIGHBOURS]
  for r in rows:
    assert float(r["labels' flags"]) > 0 and float(r["msa's mapping"]) > 0
    started = [float(r[k]) for k in ["0.5 bands", *neighbours]]
    assert float(r["the proposal and its neighbours"]) == max(started)
    assert float(r["with msa's mapping"]) >= max(max(started), float(r["msa's mapping"]))
    assert all(v > 0 for v in started)
  refused = script("crossval", "--labels", str(labels), "--folds", "4")
  assert refused.returncode == 2 and refused.stderr.count("\n") == 1
  assert "--folds must be from 2 to the labels' 3 models, not 4" in refused.stderr
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
  crossed = script("collect", "--suite", "tiny", "--min-requests", "101", "--max-requests", "100",
                   "--out", str(tmp_path / "crossed"))  # fmt: skip
  assert crossed.returncode == 2
  assert "--min-requests must be at most --max-requests" in crossed.stderr
  assert not os.path.exists(tmp_path / "crossed")
  negative = script("fit", "--labels", str(labels), "--tune-steps", "-1", "--out", str(params))
  assert negative.returncode == 2 and "--tune-steps must be at least 0" in negative.stderr
  empty = script("labels", "--data", str(tmp_path / "nothing"), "--out", str(labels))
  assert empty.returncode == 2 and "run `collect` first" in empty.stderr
