"""The training corpus and the `realistic` suite (scripts/make_corpus.py): wide enough, and apart
from every program the agent is judged on, by model name and by content; mosaics keep their
references' statistics."""

import collections
import os

import pytest

from malloczero.common.errors import WorkloadError
from malloczero.env.programs.mosaic import mosaic_workload
from malloczero.env.programs.suites import (
  WORKLOAD_DIR,
  content_hash,
  get_suite,
  program_summaries,
)
from malloczero.env.workload_json import load_workload


def _judged_on() -> dict[str, set]:
  """Models and programs evaluated and never trained on: default held-out, foreign, realistic."""
  suites = [get_suite("default").split("heldout"), get_suite("foreign"), get_suite("realistic")]
  entries = [e for s in suites for e in s.entries]
  return {"models": {e.model for e in entries}, "programs": {e.program for e in entries}}


def test_the_corpus_is_wide_train_only_and_from_three_front_ends():
  corpus = get_suite("corpus")
  programs = program_summaries()
  names = {e.program for e in corpus.entries}
  assert len(corpus.entries) >= 400 and corpus.training_only and not corpus.evaluation_only
  assert {e.split for e in corpus.entries} == {"train"}
  front_ends = collections.Counter(programs[p]["front_end"] for p in names)
  assert set(front_ends) == {"jax-haiku", "tensorflow-keras", "generated"}, front_ends
  buffers = sorted(programs[p]["buffers"] for p in names)
  assert buffers[len(buffers) // 10] <= 300 and buffers[-1] >= 15000  # About 100 to 20,000.
  # Every program meets both machines and at least two capacities.
  for program in names:
    mine = [e for e in corpus.entries if e.program == program]
    assert {e.hardware for e in mine} == {"tpu-v4i-like", "nnpi-like"}
    assert len({e.capacity_fraction for e in mine}) >= 2


def test_realistic_is_large_unseen_and_at_two_capacities_on_both_machines():
  realistic = get_suite("realistic")
  programs = program_summaries()
  names = {e.program for e in realistic.entries}
  assert realistic.evaluation_only and {e.split for e in realistic.entries} == {"heldout"}
  assert len(names) >= 12
  for program in names:
    assert 1000 <= programs[program]["buffers"] <= 20000, program
    mine = {(e.hardware, e.capacity_fraction) for e in realistic.entries if e.program == program}
    assert mine == {(h, f) for h in ("tpu-v4i-like", "nnpi-like") for f in (0.1, 0.25)}


def test_no_model_or_program_judged_on_is_in_the_corpus_by_name():
  corpus = get_suite("corpus")
  judged = _judged_on()
  assert not {e.model for e in corpus.entries} & judged["models"]
  assert not {e.program for e in corpus.entries} & judged["programs"]


def test_no_program_judged_on_is_in_the_corpus_by_content():
  """Hashes of what a solver sees (not names): a renamed copy would be caught. Each recorded
  hash is the file's."""
  summaries = program_summaries()

  def hashes(programs):
    found = {}
    for program in programs:
      digest = content_hash(load_workload(os.path.join(WORKLOAD_DIR, f"{program}.json.gz")))
      if "content_sha256" in summaries[program]:
        assert summaries[program]["content_sha256"] == digest, program
      found[digest] = program
    return found

  corpus = hashes({e.program for e in get_suite("corpus").entries})
  judged = hashes(_judged_on()["programs"])
  assert not set(corpus) & set(judged), [(corpus[h], judged[h]) for h in set(corpus) & set(judged)]


def test_a_renamed_program_has_the_same_content_hash_and_another_program_another():
  a = load_workload(os.path.join(WORKLOAD_DIR, "tiny-mlp-b2-train.json.gz"))
  b = load_workload(os.path.join(WORKLOAD_DIR, "tiny-gpt-b1-infer.json.gz"))
  import dataclasses

  assert content_hash(dataclasses.replace(a, name="other")) == content_hash(a)
  assert content_hash(a) != content_hash(b)


def _references():
  return [
    load_workload(os.path.join(WORKLOAD_DIR, f"{name}.json.gz"))
    for name in ("tiny-mlp-b2-train", "tiny-gpt-b1-infer", "tiny-vgg-b1-infer")
  ]


def test_a_mosaic_has_the_buffers_asked_for_from_its_references_and_is_reproducible():
  references = _references()
  mosaic = mosaic_workload(references, 300, seed=3, window_ops=(5, 20))
  assert 300 <= mosaic.num_buffers < 300 + max(r.num_buffers for r in references)
  # Every buffer size and op's flops is a reference's own.
  assert set(mosaic.arrays.sizes.tolist()) <= {s for r in references for s in r.arrays.sizes}
  assert set(mosaic.arrays.flops.tolist()) <= {f for r in references for f in r.arrays.flops}
  assert mosaic == mosaic_workload(references, 300, seed=3, window_ops=(5, 20))
  assert content_hash(mosaic) != content_hash(mosaic_workload(references, 300, seed=4))
  # Outputs only in the last window: they do not pile up to the end of the program.
  window = lambda b: int(b.name.split("/")[0].removeprefix("w"))
  last = max(window(b) for b in mosaic.buffers)
  assert last >= 2 and {window(b) for b in mosaic.buffers if b.kind == "output"} <= {last}


def test_a_mosaic_without_references_or_buffers_is_refused():
  with pytest.raises(WorkloadError, match="reference"):
    mosaic_workload([], 100)
  with pytest.raises(WorkloadError, match="positive"):
    mosaic_workload(_references(), 0)


def test_coverage_reports_quantiles_and_the_share_inside_the_corpus_range():
  from malloczero.evaluation.coverage import FEATURES, coverage, coverage_markdown, program_features

  references = _references()
  corpus = [program_features(w) for w in references]
  assert set(corpus[0]) == {f.name for f in FEATURES}
  bigger = [program_features(mosaic_workload(references, 2000, seed=0))]
  rows = coverage(corpus, {"same": corpus, "bigger": bigger})
  by_name = {r["feature"]: r for r in rows}
  assert all(r["same_inside"] == 1.0 for r in rows)  # A suite lies inside its own range.
  assert by_name["buffers"]["bigger_inside"] == 0.0  # 2,000 buffers: beyond every reference.
  low, mid, high = by_name["buffers"]["corpus"]
  assert low <= mid <= high
  table = coverage_markdown(rows, ["same", "bigger"])
  assert table.count("\n") == len(FEATURES) + 2 and "| 0% |" in table


def test_evaluating_the_corpus_held_out_split_is_one_line(tmp_path):
  from tests.command_line import run_cli

  out = tmp_path / "ev"
  result = run_cli(
    "evaluate", "--suite", "corpus", "--split", "heldout", "--solvers", "msa", "--out", str(out)
  )
  assert result.returncode == 1
  assert result.stderr == (
    "malloczero: error: suite 'corpus' is for training only: it has no held-out split (evaluate "
    "it with --split all or train; measure generalisation on another suite)\n"
  )
  assert not out.exists()
