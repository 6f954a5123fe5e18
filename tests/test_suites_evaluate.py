"""Built-in suites load and agree with their manifest; evaluate writes consistent reports."""

import csv
import json
import subprocess
import sys

import pytest

from malloczero.env import MalloczeroError, validate_mapping
from malloczero.env.programs.suites import get_suite, program_summaries, suite_names
from malloczero.env.solvers import solve


def test_suites_exist_and_split_by_model():
  assert {"tiny", "default"} <= set(suite_names())
  for name in suite_names():
    suite = get_suite(name)
    train = {e.model for e in suite.entries if e.split == "train"}
    heldout = {e.model for e in suite.entries if e.split == "heldout"}
    assert not (suite.evaluation_only and suite.training_only), name
    assert bool(train) != suite.evaluation_only, name  # foreign, realistic: held out only.
    assert bool(heldout) != suite.training_only, name  # corpus: train only.
    assert not train & heldout, f"{name}: a model is both trained on and held out"


def test_default_suite_is_large_and_real():
  suite = get_suite("default")
  models = {e.model for e in suite.entries}
  assert len(models) >= 10
  assert {"resnet50", "bert", "gpt", "lstm", "mlp"} <= models
  programs = program_summaries()
  trained = [e for e in suite.entries if programs[e.program]["train"]]
  assert trained and len(trained) < len(suite.entries)  # inference and training steps
  assert {e.hardware for e in suite.entries} == {"tpu-v4i-like", "nnpi-like"}
  assert all(programs[e.program]["source"].startswith("xla-hlo") for e in suite.entries)


def test_tiny_entries_load_match_manifest_and_are_contended():
  programs = program_summaries()
  for entry in get_suite("tiny").entries:
    workload, hardware = entry.load()
    summary = programs[entry.program]
    assert (workload.num_ops, workload.num_buffers, workload.peak_live_bytes) == (
      summary["ops"],
      summary["buffers"],
      summary["peak_live_bytes"],
    )
    assert hardware.levels[0].capacity_bytes < workload.peak_live_bytes
    result = solve(workload, hardware, "greedy")
    validate_mapping(workload, hardware, result.mapping)


def test_unknown_suite_and_split():
  with pytest.raises(MalloczeroError, match="unknown suite 'nope'"):
    get_suite("nope")
  with pytest.raises(MalloczeroError, match="unknown split 'dev'"):
    get_suite("tiny").split("dev")


def _cli(*args):
  return subprocess.run(
    [sys.executable, "-m", "malloczero", *args], capture_output=True, text=True, timeout=600
  )


@pytest.mark.slow  # Integration-sized: subprocesses, compiles or every solver.
def test_cli_suite_list_and_show():
  listing = _cli("suite", "list")
  assert listing.returncode == 0 and "tiny" in listing.stdout and "default" in listing.stdout
  shown = _cli("suite", "show", "tiny")
  assert shown.returncode == 0
  for entry in get_suite("tiny").entries:
    assert entry.name in shown.stdout
  missing = _cli("suite", "show", "nope")
  assert missing.returncode == 1 and missing.stderr.startswith("malloczero: error: unknown suite")


@pytest.mark.slow
def test_cli_evaluate_writes_table_csv_json_markdown_and_png(tmp_path):
  out = tmp_path / "eval"
  result = _cli(
    "evaluate",
    "--suite",
    "tiny",
    "--solvers",
    "msa,msa-simple,greedy,cpsat",
    "--time-limit",
    "5",
    "--out",
    str(out),
  )
  assert result.returncode == 0, result.stderr
  entries = get_suite("tiny").entries
  report = json.loads((out / "evaluation.json").read_text())
  rows = report["rows"]
  assert [r["entry"] for r in rows] == [e.name for e in entries]
  with open(out / "evaluation.csv") as f:
    csv_rows = list(csv.DictReader(f))
  assert [r["entry"] for r in csv_rows] == [r["entry"] for r in rows]
  for r in rows:
    assert r["msa_vs_msa"] == 1.0
    assert r["cpsat_ms"] <= r["msa-simple_ms"] * (1 + 1e-6)  # msa-simple is CP-SAT's hint
    # CP-SAT's model has no copy contention: its bound is not one on the simulated time.
    assert r["cpsat_status"] in ("optimal (uncontended bound)", "feasible (uncontended bound)")
    assert r["greedy_speedup"] == pytest.approx(r["slow_only_ms"] / r["greedy_ms"])
    assert r["entry"] in result.stdout
  summary = report["summary"]
  assert summary["all"]["entries"] == len(entries)
  assert summary["train"]["entries"] + summary["heldout"]["entries"] == len(entries)
  assert summary["all"]["cpsat_wins"] == sum(r["cpsat_vs_msa"] > 1 + 1e-6 for r in rows)
  markdown = (out / "evaluation.md").read_text()
  per_program = markdown.split("## Per program")[1].split("## Pictures")[0]
  assert per_program.count("\n| ") == len(entries) + 1
  assert (out / "speedups.png").read_bytes()[:4] == b"\x89PNG"
  assert not (out / "mappings").exists()  # Only agents' mappings are written.
  bad = _cli("evaluate", "--suite", "tiny", "--solvers", "msa,magic", "--out", str(out))
  assert bad.returncode == 1 and "unknown solver(s) magic" in bad.stderr
