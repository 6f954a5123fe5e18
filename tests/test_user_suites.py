"""User suites (`malloczero suite make`, env/programs/user_suites.py): a directory of programs made
into a manifest that `suite show`, `train --suite` and `evaluate --suite` take as they take a
built-in suite; the split is by program and reproducible; a changed, missing or unknown program
file is refused in one line that names it."""

import csv
import json
import os
import shutil

import pytest

from tests.command_line import REPO, run_cli, run_main

WORKLOADS = os.path.join(REPO, "env", "programs", "data", "workloads")
TINY = ("tiny-gpt-b1-infer", "tiny-lstm-b1-train", "tiny-mlp-b2-train", "tiny-vgg-b1-infer")


@pytest.fixture
def programs(tmp_path):
  """A directory of the four tiny workloads, one in a subdirectory, and a MiniMalloc problem."""
  directory = tmp_path / "programs"
  (directory / "more").mkdir(parents=True)
  for i, name in enumerate(TINY):
    target = directory / ("more" if i == 0 else "") / f"{name}.json.gz"
    shutil.copy(os.path.join(WORKLOADS, f"{name}.json.gz"), target)
  shutil.copy(os.path.join(REPO, "tests", "data", "minimalloc_A.1048576.csv"), directory)
  return directory


def make(capsys, directory, out, *flags):
  return run_main(
    capsys, "suite", "make", directory, "--hardware", "tpu-v4i-like", "--out", out, *flags
  )


def test_suite_make_splits_by_program_reproducibly_and_the_manifest_loads(
  programs, tmp_path, capsys
):
  from malloczero.env.programs.suites import get_suite

  out = tmp_path / "mine.json"
  code, stdout, err = make(capsys, programs, out, "--capacities", "0.1,0.25", "--heldout", "0.4")
  assert code == 0, err
  assert "suite 'mine', 5 programs, 10 entries (6 train, 4 held out" in stdout
  manifest = json.loads(out.read_text())
  assert set(manifest["programs"]) == {
    "more/tiny-gpt-b1-infer",
    "tiny-lstm-b1-train",
    "tiny-mlp-b2-train",
    "tiny-vgg-b1-infer",
    "minimalloc_A.1048576",
  }
  assert manifest["programs"]["more/tiny-gpt-b1-infer"]["path"] == os.path.join(
    "programs", "more", "tiny-gpt-b1-infer.json.gz"
  )
  suite = get_suite(str(out))
  assert suite.name == "mine" and len(suite.entries) == 10
  held = {e.program for e in suite.entries if e.split == "heldout"}
  assert len(held) == 2
  for program in manifest["programs"]:  # Every entry of a program is on the same side.
    assert len({e.split for e in suite.entries if e.program == program}) == 1
  entry = next(e for e in suite.entries if e.name == "tiny-vgg-b1-infer@tpu-v4i-like:25%")
  workload, hardware = entry.load()
  assert workload.name == "tiny-vgg-b1-infer" and hardware.name.startswith("tpu-v4i-like")

  again = tmp_path / "again.json"
  assert make(capsys, programs, again, "--capacities", "0.1,0.25", "--heldout", "0.4")[0] == 0
  assert json.loads(again.read_text())["entries"] == manifest["entries"]
  other = tmp_path / "other.json"
  draws = set()
  for seed in range(6):
    assert make(capsys, programs, other, "--heldout", "0.4", "--seed", seed)[0] == 0
    draws.add(frozenset(e.program for e in get_suite(str(other)).entries if e.split == "heldout"))
  assert len(draws) > 1, "the seed should change which programs are held out"

  # The directory moved together with its manifest still works: paths are the manifest's.
  moved = tmp_path / "moved"
  moved.mkdir()
  shutil.move(str(programs), moved / "programs")
  shutil.move(str(out), moved / "mine.json")
  assert len(get_suite(str(moved / "mine.json")).entries) == 10
  code, stdout, _ = run_main(capsys, "suite", "show", moved / "mine.json")
  assert code == 0 and "tiny-lstm-b1-train@tpu-v4i-like:10%" in stdout


def test_a_changed_missing_or_unknown_program_file_is_refused_in_one_line(
  programs, tmp_path, capsys
):
  notes = programs / "notes.md"
  notes.write_text("not a program")
  code, _, err = make(capsys, programs, tmp_path / "s.json")
  assert code == 1 and err.count("\n") == 1
  assert f"{notes}: unknown program format" in err and not (tmp_path / "s.json").exists()
  notes.unlink()

  out = tmp_path / "s.json"
  assert make(capsys, programs, out)[0] == 0
  csv_file = programs / "minimalloc_A.1048576.csv"
  original = csv_file.read_bytes()
  csv_file.write_bytes(original + b"\n")
  for argv in (("suite", "show", out), ("evaluate", "--suite", out, "--solvers", "msa")):
    code, _, err = run_main(capsys, *argv)
    assert code == 1 and err.count("\n") == 1, err
    assert f"program file {csv_file} changed since the suite was made" in err
  csv_file.write_bytes(original)
  assert run_main(capsys, "suite", "show", out)[0] == 0

  gone = programs / "tiny-vgg-b1-infer.json.gz"
  gone.unlink()
  code, _, err = run_main(
    capsys, "train", "--config", "tiny", "--launch", "single", "--suite", out, "--workdir",
    tmp_path / "run",
  )  # fmt: skip
  assert code == 1 and err.count("\n") == 1
  assert f"program file {gone} is missing" in err and not (tmp_path / "run").exists()

  not_a_suite = tmp_path / "workload.json"
  not_a_suite.write_text(json.dumps({"name": "x"}))
  code, _, err = run_main(capsys, "suite", "show", not_a_suite)
  assert code == 1 and "not a suite manifest" in err and err.count("\n") == 1


def test_the_built_in_suites_are_manifests_of_the_same_format_made_by_the_same_code(tmp_path):
  """Each built-in suite is a manifest `read_suite_file` reads (its programs' files checked), and
  `write_builtin_suites`, which the generator scripts call, writes back the committed ones."""
  from malloczero.env.programs.suites import SUITES_DIR, get_suite, suite_names
  from malloczero.env.programs.user_suites import load_builtin_suites, write_builtin_suites

  names = suite_names()
  assert {"default", "tiny", "foreign", "realistic", "corpus"} <= set(names)
  for name in names:
    committed = json.loads(open(os.path.join(SUITES_DIR, f"{name}.json")).read())
    assert committed["format"] == "malloczero-suite/1" and committed["name"] == name
    assert all(e.path and e.file_sha256 for e in get_suite(name).entries)
  # The small suites: the code is the same for all, and the corpus's workloads take seconds.
  collected = load_builtin_suites()
  assert sorted(collected["suites"]) == sorted(names)
  collected["suites"] = {n: collected["suites"][n] for n in ("tiny", "default", "foreign")}
  written = write_builtin_suites(collected, str(tmp_path))
  assert len(written) == 3
  for path in written:
    again = json.loads(open(path).read())
    committed = json.loads(open(os.path.join(SUITES_DIR, os.path.basename(path))).read())
    for manifest in (again, committed):  # Paths are relative to where each was written.
      for program in manifest["programs"].values():
        program["path"] = os.path.basename(program["path"])
    assert again == committed


def test_suite_make_refuses_bad_flags_in_one_line(programs, tmp_path, capsys):
  hw = ("--hardware", "tpu-v4i-like")
  out = ("--out", tmp_path / "s.json")
  cases = [
    ((programs, *out), "needs --hardware"),
    ((programs, *hw), "needs --out"),
    ((tmp_path / "none", *hw, *out), "no such directory"),
    ((programs, "--hardware", "tpu-v9", *out), "unknown hardware 'tpu-v9'"),
    ((programs, *hw, "--out", tmp_path / "s.txt"), "a .json file"),
    ((programs, *hw, "--capacities", "0,0.5", *out), "in (0, 1]"),
  ]
  cases = [(("suite", "make", *argv), said) for argv, said in cases]
  cases.append(
    (("suite", "show", "default", "--heldout", "0.5"), "--heldout: for 'suite make' only")
  )
  for argv, said in cases:
    code, _, err = run_main(capsys, *argv)
    assert code in (1, 2) and said in err and err.count("\n") == 1, (argv, err)


def test_train_keeps_a_user_suite_by_its_absolute_path(programs, tmp_path, capsys, monkeypatch):
  """The nodes and a resumed run find the manifest from any directory."""
  from malloczero.launch.cli import build_parser
  from malloczero.launch.commands.train import train_config

  assert make(capsys, programs, tmp_path / "mine.json")[0] == 0
  monkeypatch.chdir(tmp_path)
  args = ["train", "--config", "tiny", "--suite", "mine.json", "--set", "report_suite=mine.json"]
  config = train_config(build_parser().parse_args(args))
  assert config.suite == config.report_suite == str(tmp_path / "mine.json")


@pytest.mark.slow
def test_a_suite_of_jax_programs_trains_evaluates_its_heldout_programs_and_resumes(tmp_path):
  """Six programs compiled by XLA on the CPU (four as HLO text, two imported by `import-hlo`),
  made into a suite with a third of them held out; `tiny` trains on it, its checkpoint is
  evaluated on the held-out programs, and the run resumes."""
  from malloczero.env.programs.zoo import compiled_hlo_text

  directory = tmp_path / "dumps"
  directory.mkdir()
  compiled = (
    ("mlp", 2, True),
    ("gpt", 1, False),
    ("vgg", 1, False),
    ("lstm", 1, True),
    ("mlp", 1, False),
    ("gru", 1, False),
  )
  for i, (model, batch, train) in enumerate(compiled):
    name = f"{model}-b{batch}-{'train' if train else 'infer'}"
    hlo = directory / f"{name}.hlo"
    hlo.write_text(compiled_hlo_text(model, batch, train, tiny=True))
    if i >= 4:
      result = run_cli("import-hlo", str(hlo), "--out", str(directory / f"{name}.json.gz"))
      assert result.returncode == 0, result.stderr
      hlo.unlink()
  suite = tmp_path / "dumps.json"
  result = run_cli(
    "suite", "make", str(directory), "--hardware", "tpu-v4i-like", "--capacities", "0.25",
    "--heldout", "0.34", "--out", str(suite),
  )  # fmt: skip
  assert result.returncode == 0, result.stderr
  assert "6 programs, 6 entries (4 train, 2 held out" in result.stdout
  entries = json.loads(suite.read_text())["entries"]
  heldout = sorted(e["name"] for e in entries if e["split"] == "heldout")

  workdir = tmp_path / "run"
  train = ("train", "--launch", "single", "--config", "tiny", "--suite", str(suite))
  steps = ("--set", "eval_every_steps=4", "--workdir", str(workdir), "--quiet")
  result = run_cli(*train, "--max-learner-steps", "4", *steps)
  assert result.returncode == 0, result.stderr[-2000:]
  assert "4 learner steps" in result.stdout
  with open(workdir / "config.json") as f:
    assert json.load(f)["suite"] == str(suite)
  with open(workdir / "learning_curve.csv") as f:
    first = list(csv.DictReader(f))
  assert [(r["learner_steps"], r["split"], r["programs"]) for r in first] == [
    ("0", "train", "4"),
    ("0", "heldout", "2"),
    ("4", "train", "4"),
    ("4", "heldout", "2"),
  ]

  out = tmp_path / "evaluation"
  result = run_cli(
    "evaluate", "--suite", str(suite), "--split", "heldout", "--checkpoint", str(workdir),
    "--solvers", "msa", "--simulations", "4", "--attempts", "1", "--search-seconds", "0",
    "--out", str(out),
  )  # fmt: skip
  assert result.returncode == 0, result.stderr[-2000:]
  with open(out / "evaluation.csv") as f:
    rows = list(csv.DictReader(f))
  assert sorted(r["entry"] for r in rows) == heldout
  assert all(float(r["agent_policy_speedup"]) > 0 and float(r["msa_speedup"]) > 0 for r in rows)

  result = run_cli(*train, "--max-learner-steps", "8", *steps)  # The same command, resumed.
  assert result.returncode == 0, result.stderr[-2000:]
  with open(workdir / "learning_curve.csv") as f:
    resumed = list(csv.DictReader(f))
  assert resumed[:4] == first  # Kept, not measured again from step 0.
  assert [(r["learner_steps"], r["split"]) for r in resumed[4:]] == [
    ("8", "train"),
    ("8", "heldout"),
  ]
