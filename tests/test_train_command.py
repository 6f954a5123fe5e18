"""`malloczero train` end to end: a tiny run trains and reports its curve, `--workload` keeps its
fastest mapping, Ctrl-C keeps the checkpoint, bad flags and impossible launches are refused in one
line before anything runs, and a run resumes only with the same programs."""

import json
import os
import subprocess
import sys

import pytest

from tests.command_line import REPO, run_cli


@pytest.mark.slow
def test_train_runs_a_tiny_single_process_training_and_reports_its_curve(tmp_path):
  workdir = tmp_path / "run"
  result = run_cli(
    "train",
    "--launch",
    "single",
    "--config",
    "tiny",
    "--max-learner-steps",
    "4",
    "--set",
    "eval_every_steps=4",
    "--workdir",
    str(workdir),
    "--quiet",
  )
  assert result.returncode == 0, result.stderr[-2000:]
  assert "learning curve" in result.stdout and "4 learner steps" in result.stdout
  for name in (
    "learning_curve.png",
    "learning_curve.csv",
    "baselines.json",
    "config.json",
    os.path.join("checkpoints", "learner_state.npz"),
  ):
    assert (workdir / name).exists(), name
  with open(workdir / "config.json") as f:
    assert json.load(f)["name"] == "tiny"


@pytest.mark.slow
def test_train_workload_keeps_the_fastest_mapping_and_compares_it(tmp_path):
  """`train --workload`: trains on that one program, keeps its fastest mapping found (validated,
  with its picture) and ends with one line against msa, bestfit and evo."""
  from malloczero.env import load_hardware, load_workload, validate_mapping
  from malloczero.env.mapping import load_mapping

  workdir = tmp_path / "run"
  workload = os.path.join(REPO, "env", "programs", "data", "workloads", "tiny-vgg-b1-infer.json.gz")
  result = run_cli(
    "train",
    "--launch",
    "single",
    "--config",
    "tiny",
    "--workload",
    workload,
    "--hardware",
    "tpu-v4i-like",
    "--capacity",
    "20000",
    "--max-learner-steps",
    "30",
    "--set",
    "eval_every_steps=15",
    "--workdir",
    str(workdir),
    "--quiet",
  )
  assert result.returncode == 0, result.stderr[-2000:]
  last = result.stdout.strip().splitlines()[-1]
  assert last.startswith("tiny-vgg-b1-infer: best mapping found ") and "x evo" in last, last
  report = json.loads((workdir / "program_report.json").read_text())
  (entry,) = report["programs"]
  assert entry["program"] == "tiny-vgg-b1-infer" and entry["best_found"] >= entry["msa"]
  demonstrations = json.loads((workdir / "checkpoints" / "demonstrations.json").read_text())
  assert [d["program"] for d in demonstrations] == ["tiny-vgg-b1-infer"]
  if entry["found_by"] == "agent":  # The agent beat msa: its mapping is kept and valid.
    mapping = load_mapping(entry["mapping"])
    hardware = load_hardware("tpu-v4i-like").with_fast_capacity(20000)
    check = validate_mapping(load_workload(workload), hardware, mapping)
    assert check.speedup == pytest.approx(entry["best_found"], rel=1e-6)
    assert os.path.exists(entry["mapping"][: -len(".json")] + ".png")
    assert entry["mapping"] in last
  else:
    assert entry["best_found"] == entry["msa"] and "found nothing faster than msa" in last
  curve = (workdir / "learning_curve.csv").read_text()
  assert ",train," in curve and ",heldout," not in curve  # One program, a training one.


@pytest.mark.slow
@pytest.mark.parametrize("signum", ["SIGINT", "SIGTERM"])
def test_interrupted_train_keeps_its_checkpoint(tmp_path, signum):
  """Ctrl-C (exit 130) or SIGTERM (143) during single-process training saves a checkpoint a
  restart can resume from, and the one line says how."""
  import signal
  import time

  from malloczero.learner.checkpoint import load_params

  workdir = tmp_path / "run"
  process = subprocess.Popen(
    [
      sys.executable,
      "-m",
      "malloczero",
      "train",
      "--launch",
      "single",
      "--config",
      "tiny",
      "--max-learner-steps",
      "100000",
      "--set",
      "eval_every_steps=100000",
      "--workdir",
      str(workdir),
      "--quiet",
    ],
    cwd=REPO,
    stdout=subprocess.PIPE,
    stderr=subprocess.PIPE,
    text=True,
  )
  log = workdir / "logs" / "learner" / "logs.csv"
  deadline = time.monotonic() + 280
  while time.monotonic() < deadline and process.poll() is None:
    if log.exists() and len(log.read_text().splitlines()) > 3:  # Header + 3 learner steps.
      break
    time.sleep(0.5)
  assert process.poll() is None, process.communicate()[1][-2000:]
  process.send_signal(getattr(signal, signum))
  try:
    _, stderr = process.communicate(timeout=120)
  except subprocess.TimeoutExpired:
    process.kill()  # A run that ignored the signal must not outlive the test.
    process.communicate()
    raise
  code, said = (130, "interrupted") if signum == "SIGINT" else (143, "terminated")
  assert process.returncode == code, stderr[-2000:]
  assert stderr.endswith(
    f"malloczero: {said}; resume with: malloczero train --launch single "
    f"--config tiny --max-learner-steps 100000 --set eval_every_steps=100000 "
    f"--workdir {workdir} --quiet\n"
  ), stderr[-2000:]
  checkpoint = workdir / "checkpoints" / "learner_state.npz"
  assert checkpoint.exists()
  assert load_params(str(checkpoint))  # A real, loadable parameter tree.


@pytest.mark.slow  # Integration-sized: subprocesses, compiles or every solver.
def test_train_rejects_bad_flags_in_one_line():
  cases = (
    (("train", "--config", "huge"), 2),
    (("train", "--max-learner-steps", "0"), 2),
    (("train", "--num-actors", "0"), 2),
    (("train", "--launch", "remote"), 2),
    (("train", "--suite", "nope"), 1),
    (("train", "--hardware", "tpu-v4i-like"), 1),
    (("train", "--set", "learner.demonstration_fraction=1"), 2),
    (("train", "--set", "learner.demonstration_departures=1.5"), 2),
    (("train", "--set", "learner.reanalyse_fraction=1.5"), 2),
    (("train", "--set", "search.q_spread_floor=-1"), 2),
    (("train", "--set", "search.q_spread_floor=inf"), 2),
    (("train", "--set", "search.eval_msa_prior_logit=-2"), 2),
    (("train", "--workload", "no-such-file.json", "--hardware", "tpu-v4i-like"), 1),
    (
      (
        "train",
        "--launch",
        "vertex_ai",
        "--hardware",
        "tpu-v4i-like",
        "--capacity",
        "20000",
        "--workload",
        os.path.join(REPO, "env", "programs", "data", "workloads", "tiny-vgg-b1-infer.json.gz"),
      ),
      1,
    ),
  )
  for args, code in cases:
    result = run_cli(*args)
    assert result.returncode == code, (args, result.stderr)
    assert result.stderr.startswith("malloczero: error: ") and result.stderr.count("\n") == 1


@pytest.mark.parametrize("value", ["1", "-0.1", "x"])
def test_skip_below_is_a_fraction_checked_before_anything_runs(tmp_path, capsys, value):
  from malloczero.launch.cli import main

  workdir = tmp_path / "run"
  train = ("train", "--launch", "single", "--config", "tiny", "--workdir", str(workdir))
  for args, start in (
    (
      (*train, "--set", f"game.skip_below={value}"),
      f"malloczero: error: --set game.skip_below={value}: game.skip_below: expected a fraction "
      "in [0, 1)",
    ),
    (
      ("solve", "w.json", "--solver", "evo-msa", "--skip-below", value),
      "malloczero: error: argument --skip-below: expected a fraction in [0, 1)",
    ),
  ):
    with pytest.raises(SystemExit) as exit_info:
      main(list(args))
    assert exit_info.value.code == 2, args
    err = capsys.readouterr().err
    assert err.startswith(start) and err.count("\n") == 1, err
  assert not workdir.exists()


def test_more_local_actors_than_the_machine_runs_are_refused_unless_oversubscribed(
  tmp_path, capsys, monkeypatch
):
  """`--num-actors 1000` on 2 cores used to be accepted silently and spawn hundreds of processes."""
  import types

  import psutil

  from malloczero.launch import cli
  from malloczero.system import distributed

  workdir = tmp_path / "run"
  too_many = str(distributed.ACTORS_PER_CORE * len(os.sched_getaffinity(0)) + 1)
  for launch in ("local_mp", "local_mt"):
    code = cli.main(
      [
        "train",
        "--launch",
        launch,
        "--config",
        "tiny",
        "--num-actors",
        too_many,
        "--workdir",
        str(workdir),
      ]
    )
    err = capsys.readouterr().err
    assert code == 2 and err.count("\n") == 1, err
    assert (
      err.startswith(
        f"malloczero: error: --num-actors {too_many} is more than this machine can run: "
      )
      and "CPU core(s)" in err
      and "--oversubscribe" in err
    )
  assert not workdir.exists()
  # Memory bounds local_mp (one process per node) as well as cores.
  monkeypatch.setattr(
    psutil,
    "virtual_memory",
    lambda: types.SimpleNamespace(
      available=distributed.OTHER_NODES_RESIDENT_BYTES + distributed.ACTOR_RESIDENT_BYTES
    ),
  )
  assert distributed.local_actor_limit("local_mp")[0] == 1
  assert "available memory runs at most 1 actors" in distributed.local_actor_limit("local_mp")[1]
  assert distributed.local_actor_limit("local_mt")[0] == (
    distributed.ACTORS_PER_CORE * len(os.sched_getaffinity(0))
  )
  # --oversubscribe lets the launch go on (to the next check: an impossible --max-steps here, on
  # a run with its final report, which is refused rather than reported again).
  workdir.mkdir()
  (workdir / "report.md").write_text("# Final evaluation\n")
  monkeypatch.setattr("malloczero.system.distributed.check_workdir", lambda config, workdir: 10)
  code = cli.main(
    [
      "train",
      "--launch",
      "local_mt",
      "--config",
      "tiny",
      "--num-actors",
      too_many,
      "--oversubscribe",
      "--max-steps",
      "5",
      "--workdir",
      str(workdir),
    ]
  )
  assert code == 1 and "raise --max-steps" in capsys.readouterr().err
  # Cloud workers are not this machine's: vertex_ai is not checked (it refuses a local workdir).
  code = cli.main(
    [
      "train",
      "--launch",
      "vertex_ai",
      "--config",
      "tiny",
      "--num-actors",
      "1000",
      "--workdir",
      str(tmp_path / "cloud"),
    ]
  )
  err = capsys.readouterr().err
  assert code == 1 and "/gcs/" in err and "more than this machine" not in err


def test_a_workload_run_resumes_only_with_the_same_program(tmp_path):
  """config.json of a `train --workload` run (its hardware included) is read back as equal, and
  another capacity is refused before anything runs."""
  from malloczero.env import MalloczeroError
  from malloczero.launch.cli import build_parser
  from malloczero.launch.commands.train import train_config
  from malloczero.system.training import check_workdir, save_config

  workload = os.path.join(REPO, "env", "programs", "data", "workloads", "tiny-vgg-b1-infer.json.gz")

  def config(capacity):
    return train_config(
      build_parser().parse_args(
        [
          "train",
          "--config",
          "tiny",
          "--workload",
          workload,
          "--hardware",
          "tpu-v4i-like",
          "--capacity",
          capacity,
        ]
      )
    )

  first = config("20000")
  assert first.suite == "" and [p.name for p in first.programs] == ["tiny-vgg-b1-infer"]
  save_config(first, str(tmp_path))
  assert check_workdir(config("20000"), str(tmp_path)) is None
  with pytest.raises(
    MalloczeroError,
    match="with other networks, game settings, report suite, --workload programs or capacity",
  ):
    check_workdir(config("40000"), str(tmp_path))


def test_a_run_resumes_only_with_the_same_capacity_variants(tmp_path):
  """Capacity variants change the programs actors play and demonstrations cover: a resume with
  others is refused before anything runs, one with the same ones goes on."""
  import dataclasses

  from malloczero.configs.config import get_config
  from malloczero.env import MalloczeroError
  from malloczero.system.training import check_workdir, save_config

  varied = dataclasses.replace(get_config("tiny"), capacity_variants=(0.5,))
  save_config(varied, str(tmp_path))
  assert check_workdir(varied, str(tmp_path)) is None
  with pytest.raises(MalloczeroError, match="capacity variants"):
    check_workdir(get_config("tiny"), str(tmp_path))
  # Another report suite: the learning curve would mix two suites' figures.
  with pytest.raises(MalloczeroError, match="report suite"):
    check_workdir(dataclasses.replace(varied, report_suite="default"), str(tmp_path))


def test_a_single_process_run_at_its_max_steps_is_refused(tmp_path, capsys, monkeypatch):
  from malloczero.launch import cli

  monkeypatch.setattr("malloczero.system.single_process.check_workdir", lambda config, workdir: 10)
  code = cli.main(
    [
      "train",
      "--launch",
      "single",
      "--config",
      "tiny",
      "--max-steps",
      "5",
      "--workdir",
      str(tmp_path / "run"),
    ]
  )
  err = capsys.readouterr().err
  assert code == 1 and "already at learner step 10 >= --max-steps 5" in err, err


@pytest.mark.slow
def test_a_bad_demonstrations_file_is_one_line_with_no_native_log_before_it(trained_run, tmp_path):
  """The single-process trainer restores before Reverb starts, and Reverb's C++ lines go to
  WORKDIR/nodes/native.log, not before the error."""
  import shutil

  workdir = tmp_path / "run"
  shutil.copytree(trained_run["workdir"], workdir)
  (workdir / "checkpoints" / "demonstrations.json").write_text("garbage")
  result = run_cli(
    "train",
    "--launch",
    "single",
    "--config",
    "tiny",
    "--workdir",
    str(workdir),
    "--max-steps",
    "100000",
    "--quiet",
  )
  assert result.returncode == 1, result.stderr[-2000:]
  assert result.stderr.count("\n") == 1 and "demonstrations file" in result.stderr, result.stderr
