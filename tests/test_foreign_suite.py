"""The `foreign` suite: Keras models compiled through TensorFlow's XLA, for evaluation only."""

import pytest

from malloczero.env import MalloczeroError, validate_mapping
from malloczero.env.programs.suites import get_suite, program_summaries
from malloczero.env.solvers import solve


def test_foreign_suite_is_evaluation_only_on_both_machines_at_a_quarter():
  suite = get_suite("foreign")
  assert suite.evaluation_only
  assert suite.entries and {e.split for e in suite.entries} == {"heldout"}
  assert suite.split("heldout").entries == suite.entries
  with pytest.raises(MalloczeroError, match="evaluation only"):
    suite.split("train")
  programs = program_summaries()
  assert len({e.model for e in suite.entries}) >= 4
  assert any(programs[e.program]["train"] for e in suite.entries)  # A training step or more.
  for program in {e.program for e in suite.entries}:
    configs = {(e.hardware, e.capacity_fraction) for e in suite.entries if e.program == program}
    assert configs == {("tpu-v4i-like", 0.25), ("nnpi-like", 0.25)}, program


def test_foreign_entries_load_name_their_front_end_and_validate_msa():
  programs = program_summaries()
  for entry in get_suite("foreign").entries:
    workload, hardware = entry.load()
    summary = programs[entry.program]
    # Another front end than the Haiku zoo: TensorFlow, named in the workload and the manifest.
    assert summary["front_end"] == "tensorflow-keras"
    assert workload.source.startswith("xla-hlo (tensorflow ") and "jax" not in workload.source
    assert workload.source == summary["source"]
    assert (workload.num_ops, workload.num_buffers, workload.peak_live_bytes) == (
      summary["ops"],
      summary["buffers"],
      summary["peak_live_bytes"],
    )
    assert 100 <= workload.num_buffers <= 20_000, entry.name  # The default suite's sizes.
    assert hardware.levels[0].capacity_bytes < workload.peak_live_bytes  # Contended.
    result = solve(workload, hardware, "msa")
    validate_mapping(workload, hardware, result.mapping)
