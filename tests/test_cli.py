"""The command line end to end: bench writes a well-formed report, train trains and rejects bad
flags in one line, setup is idempotent."""

import json
import os
import subprocess
import sys
import time

import pytest

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _cli(*args, timeout=300):
  return subprocess.run(
    [sys.executable, "-m", "malloczero", *args],
    capture_output=True,
    text=True,
    timeout=timeout,
    cwd=REPO,
  )


@pytest.mark.slow
def test_bench_quick_writes_json_with_units_in_keys(tmp_path):
  out = tmp_path / "bench.json"
  result = _cli("bench", "--quick", "--out", str(out))
  assert result.returncode == 0, result.stderr
  report = json.loads(out.read_text())
  for key in (
    "game_steps_per_s",
    "cost_model_full_evaluations_per_s",
    "cost_model_incremental_updates_per_s",
    "search_small_moves_per_s",
    "search_small_simulations_per_s",
    "acting_small_moves_per_s",
    "learner_small_updates_per_s",
  ):
    assert report[key] > 0 and key in result.stdout
  # "a ~1,000-segment program": ~1,000 requests, ~1,700 msa decisions under random play.
  assert 900 <= report["requests_game_steps_per_episode"] <= 1300
  assert 1000 <= report["game_steps_per_episode"] <= 2500
  assert report["requests_game_steps_per_s"] > 0
  assert report["eval_program_buffers"] >= 2000
  assert report["search_small_batch"] == 64 and report["search_small_simulations"] == 32
  assert report["learner_small_batch"] == 256 and report["learner_small_unroll"] == 5


@pytest.mark.slow  # Integration-sized: subprocesses, compiles or every solver.
def test_commands_keep_compiled_programs_in_the_users_cache_unless_told_otherwise(tmp_path):
  """The cache goes under XDG_CACHE_HOME, also when JAX was imported first; a
  JAX_COMPILATION_CACHE_DIR the user set wins, and an empty one leaves the cache off."""
  script = (
    "import os, jax; from malloczero.launch.compilation_cache import use_compilation_cache; "
    "use_compilation_cache(); print(repr(jax.config.jax_compilation_cache_dir)); "
    "print(repr(os.environ['JAX_COMPILATION_CACHE_DIR']))"
  )

  def cache_dirs(**env) -> list[str]:
    """[JAX's cache directory, the one the launched nodes inherit], as Python literals."""
    clean = {k: v for k, v in os.environ.items() if k != "JAX_COMPILATION_CACHE_DIR"}
    result = subprocess.run(
      [sys.executable, "-c", script],
      capture_output=True,
      text=True,
      cwd=REPO,
      env={**clean, **env},
      timeout=120,
    )
    assert result.returncode == 0, result.stderr[-2000:]
    return result.stdout.splitlines()

  xdg, mine = str(tmp_path / "xdg"), str(tmp_path / "mine")
  default = os.path.join(xdg, "malloczero", "jax")
  assert cache_dirs(XDG_CACHE_HOME=xdg) == [repr(default)] * 2
  assert cache_dirs(XDG_CACHE_HOME=xdg, JAX_COMPILATION_CACHE_DIR=mine) == [repr(mine)] * 2
  assert cache_dirs(JAX_COMPILATION_CACHE_DIR="") == [repr("")] * 2  # Off, and left off.


@pytest.mark.slow
def test_train_runs_a_tiny_single_process_training_and_reports_its_curve(tmp_path):
  workdir = tmp_path / "run"
  result = _cli(
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


def test_a_log_line_stays_one_line_however_long():
  """A run's log lines and closing line (`flushing_print`) are never broken at the console's
  width: a long work directory path once made the closing line two."""
  import io

  from rich.console import Console

  from malloczero.launch.flags import flushing_print

  out = Console(file=io.StringIO(), width=40)
  line = "tiny: best mapping found 1.100x (msa 1.000x): 1.100x msa; " + "/d" * 60 + ".json"
  flushing_print(out)(line)
  assert out.file.getvalue() == line + "\n"


@pytest.mark.slow
def test_train_workload_keeps_the_fastest_mapping_and_compares_it(tmp_path):
  """`train --workload`: trains on that one program, keeps its fastest mapping found (validated,
  with its picture) and ends with one line against msa, bestfit and evo."""
  from malloczero.env import load_hardware, load_workload, validate_mapping
  from malloczero.env.mapping import load_mapping

  workdir = tmp_path / "run"
  workload = os.path.join(REPO, "env", "programs", "data", "workloads", "tiny-vgg-b1-infer.json.gz")
  result = _cli(
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
def test_interrupted_train_keeps_its_checkpoint(tmp_path):
  """Ctrl-C during training exits 130 and leaves a checkpoint a restart can resume from."""
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
  process.send_signal(signal.SIGINT)
  try:
    _, stderr = process.communicate(timeout=120)
  except subprocess.TimeoutExpired:
    process.kill()  # A run that ignored Ctrl-C must not outlive the test.
    process.communicate()
    raise
  assert process.returncode == 130, stderr[-2000:]
  assert "malloczero: interrupted" in stderr and "resume with: malloczero train" in stderr
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
    result = _cli(*args)
    assert result.returncode == code, (args, result.stderr)
    assert result.stderr.startswith("malloczero: error: ") and result.stderr.count("\n") == 1


def test_unknown_command_and_flag_are_one_line_errors():
  for args in (("frobnicate",), ("bench", "--quik")):
    result = _cli(*args)
    assert result.returncode == 2
    assert result.stderr.startswith("malloczero: error: ") and result.stderr.count("\n") == 1


def test_make_setup_is_idempotent():
  assert os.path.exists(os.path.join(REPO, ".venv", ".malloczero-installed")), (
    "run the tests through `make test`, which builds .venv"
  )
  result = subprocess.run(["make", "-q", "setup"], cwd=REPO, capture_output=True, text=True)
  assert result.returncode == 0, "make setup would reinstall although nothing changed"


@pytest.mark.slow
def test_import_jax_writes_a_workload_and_rejects_unknown_models(tmp_path):
  from malloczero.env import load_workload

  out = tmp_path / "mlp.json.gz"
  result = _cli("import-jax", "mlp", "--tiny", "--train", "--batch", "2", "--out", str(out))
  assert result.returncode == 0, result.stderr
  workload = load_workload(out)
  assert workload.name == "tiny-mlp-b2-train" and workload.source.startswith("xla-hlo")
  assert "XLA's memory analysis" in result.stdout
  bad = _cli("import-jax", "alexnet", "--out", str(tmp_path / "x.json"))
  assert bad.returncode == 1 and bad.stderr.count("\n") == 1
  assert "unknown model 'alexnet'" in bad.stderr and "resnet50" in bad.stderr


@pytest.mark.slow
def test_import_hlo_round_trip_and_malformed_text(tmp_path):
  from malloczero.env import load_workload
  from malloczero.env.programs.zoo import compiled_hlo_text

  hlo = tmp_path / "gpt.hlo"
  hlo.write_text(compiled_hlo_text("gpt", 1, False, tiny=True))
  out = tmp_path / "gpt.json"
  result = _cli("import-hlo", str(hlo), "--out", str(out))
  assert result.returncode == 0, result.stderr
  assert load_workload(out).num_ops > 5
  truncated = tmp_path / "cut.hlo"
  truncated.write_text(hlo.read_text()[: len(hlo.read_text()) // 2])
  bad = _cli("import-hlo", str(truncated), "--out", str(out))
  assert bad.returncode == 1 and bad.stderr.startswith("malloczero: error: ")
  assert bad.stderr.count("\n") == 1


@pytest.mark.slow  # Integration-sized: subprocesses, compiles or every solver.
def test_import_hlo_compiles_an_unscheduled_module_unless_told_not_to(tmp_path):
  from malloczero.env import load_workload

  hlo = tmp_path / "eager.hlo"
  hlo.write_text(
    "HloModule eager\n\nENTRY %main (a: f32[64,32], b: f32[64,32]) -> f32[64,32] {\n"
    "  %a = f32[64,32]{1,0} parameter(0)\n  %b = f32[64,32]{1,0} parameter(1)\n"
    "  %add = f32[64,32]{1,0} add(%a, %b)\n"
    "  ROOT %neg = f32[64,32]{1,0} negate(%add)\n}\n"
  )
  out = tmp_path / "eager.json"
  result = _cli("import-hlo", str(hlo), "--out", str(out))
  assert result.returncode == 0, result.stderr
  assert result.stderr.count("\n") == 1 and "not scheduled: compiled it with XLA" in result.stderr
  assert load_workload(out).num_ops == 1  # One fusion.
  result = _cli("import-hlo", str(hlo), "--no-compile", "--out", str(out))
  assert result.returncode == 0, result.stderr
  assert result.stderr.count("\n") == 1 and "print order is taken as the schedule" in result.stderr
  assert [o.name for o in load_workload(out).ops] == ["add", "neg"]


@pytest.mark.parametrize("seed", ["-1", "2147483648", "10000000000000000000000000000000", "x"])
def test_every_seed_flag_is_checked_before_anything_runs(tmp_path, capsys, seed):
  """`train --seed -1` used to end in numpy's ValueError traceback and leave config.json behind."""
  from malloczero.launch.cli import main

  workdir = tmp_path / "run"
  for args in (
    ("train", "--launch", "single", "--config", "tiny", "--workdir", str(workdir)),
    ("train", "--launch", "local_mp", "--config", "tiny", "--workdir", str(workdir)),
    ("solve", "w.json", "--solver", "random"),
    ("evaluate", "--suite", "tiny"),
  ):
    with pytest.raises(SystemExit) as exit_info:
      main([*args, "--seed", seed])
    assert exit_info.value.code == 2, args
    err = capsys.readouterr().err
    assert err.startswith("malloczero: error: argument --seed: ") and err.count("\n") == 1, err
    assert "0 and 2**31-1" in err or "expected an integer seed" in err
  assert not workdir.exists()


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


def test_train_skip_below_reaches_the_game_config():
  from malloczero.launch.cli import build_parser
  from malloczero.launch.commands.train import train_config

  args = build_parser().parse_args(["train", "--config", "tiny", "--set", "game.skip_below=0.001"])
  assert train_config(args).game.skip_below == 0.001
  args = build_parser().parse_args(["train", "--config", "tiny"])
  assert train_config(args).game.skip_below == 0.0


def test_train_demonstration_and_search_flags_reach_the_config():
  from malloczero.launch.cli import build_parser
  from malloczero.launch.commands.train import train_config

  args = build_parser().parse_args(
    [
      "train",
      "--config",
      "tiny",
      "--set",
      "learner.demonstration_fraction=0",
      "--set",
      "search.q_spread_floor=0.3",
      "--set",
      "search.eval_q_spread_floor=0.2",
      "--set",
      "search.eval_msa_prior_logit=0",
      "--set",
      "learner.demonstration_departures=1",
      "--set",
      "learner.reanalyse_fraction=0.5",
      "--set",
      "learner.decay_steps=5000",
    ]
  )
  config = train_config(args)
  assert config.learner.decay_steps == 5000
  # tiny: 32 items a batch, all from replay with no demonstrations; half of them reanalysed.
  assert config.learner.reanalyse_fraction == 0.5 and config.learner.reanalyse_batch == 16
  assert config.learner.demonstration_fraction == 0.0 and config.learner.demonstration_batch == 0
  assert config.learner.demonstration_departures == 1.0
  assert config.search.q_spread_floor == 0.3 and config.search.eval_msa_prior_logit == 0.0
  assert config.search.eval_q_spread_floor == 0.2
  default = train_config(build_parser().parse_args(["train"]))  # The small preset.
  assert default.capacity_variants == () and default.learner.decay_steps == 10_000
  varied = train_config(build_parser().parse_args(["train", "--set", "capacity_variants=0.1,0.5"]))
  assert varied.capacity_variants == (0.1, 0.5)
  assert default.learner.demonstration_fraction == 0.25 and default.search.q_spread_floor == 0.01
  assert default.search.eval_msa_prior_logit == 0.0 and default.learner.reanalyse_batch == 0
  assert default.search.eval_q_spread_floor == 0.1
  assert default.game.reward == "advantage" and default.actor.segment_moves == 64
  timed = train_config(
    build_parser().parse_args(
      ["train", "--set", "game.reward=time", "--set", "actor.segment_moves=0"]
    )
  )
  assert timed.game.reward == "time" and timed.actor.segment_moves == 0
  assert default.actor.imitate_gains_only
  whole = train_config(
    build_parser().parse_args(["train", "--set", "actor.imitate_gains_only=off"])
  )
  assert not whole.actor.imitate_gains_only and whole.actor.segment_moves == 64


def test_imitate_gains_only_takes_on_or_off_in_one_line(capsys):
  from malloczero.launch import cli

  with pytest.raises(SystemExit) as exit_info:
    cli.main(["train", "--set", "actor.imitate_gains_only=yes", "--workdir", "unused"])
  err = capsys.readouterr().err.strip().splitlines()
  assert (
    exit_info.value.code == 2
    and len(err) == 1
    and "expected on, off, true or false, got 'yes'" in err[0]
  ), err


def test_short_games_with_the_time_reward_are_a_flag_error(capsys):
  from malloczero.launch import cli

  code = cli.main(["train", "--set", "game.reward=time", "--workdir", "unused"])
  err = capsys.readouterr().err.strip()
  assert code == 2 and len(err.splitlines()) == 1 and "segment_moves to 0" in err, err


def test_more_local_actors_than_the_machine_runs_are_refused_unless_oversubscribed(
  tmp_path, capsys, monkeypatch
):
  """`--num-actors 1000` on 2 cores used to be accepted silently and spawn hundreds of processes."""
  import types

  import psutil

  from malloczero.launch import cli
  from malloczero.system import program

  workdir = tmp_path / "run"
  too_many = str(program.ACTORS_PER_CORE * len(os.sched_getaffinity(0)) + 1)
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
      available=program.OTHER_NODES_RESIDENT_BYTES + program.ACTOR_RESIDENT_BYTES
    ),
  )
  assert program.local_actor_limit("local_mp")[0] == 1
  assert "available memory runs at most 1 actors" in program.local_actor_limit("local_mp")[1]
  assert program.local_actor_limit("local_mt")[0] == (
    program.ACTORS_PER_CORE * len(os.sched_getaffinity(0))
  )
  # --oversubscribe lets the launch go on (to the next check: an impossible --max-steps here).
  workdir.mkdir()
  monkeypatch.setattr("malloczero.system.program.check_workdir", lambda config, workdir: 10)
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
    MalloczeroError, match="with other networks, game settings, --workload programs or capacity"
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


def test_flag_values_only_a_command_can_judge_are_flag_errors(tmp_path, capsys):
  """Infinite limits, both --compile and --no-compile, and --msa-option for baselines that ignore
  it exit 2 in one line, as argparse's own flag errors do."""
  from malloczero.launch import cli

  workload = os.path.join(REPO, "env", "programs", "data", "workloads", "tiny-vgg-b1-infer.json.gz")
  cases = [
    (
      ["solve", workload, "--hardware", "nnpi-like", "--solver", "cpsat", "--time-limit", "inf"],
      "expected a finite positive number, got inf",
    ),
    (["train", "--max-seconds", "inf"], "expected a finite positive number, got inf"),
    (
      ["train", "--set", "capacity_variants=0.1,1.5"],
      "capacity_variants: expected fractions in (0, 1], each once (F,F,...), got '0.1,1.5'",
    ),
    (
      [
        "train",
        "--workload",
        workload,
        "--hardware",
        "nnpi-like",
        "--set",
        "capacity_variants=0.5",
      ],
      "capacity variants vary a suite's entries: train on a suite",
    ),
    (
      ["import-hlo", "x.hlo", "--out", str(tmp_path / "w.json"), "--compile", "--no-compile"],
      "given twice",
    ),
    (
      [
        "evaluate",
        "--suite",
        "tiny",
        "--solvers",
        "greedy,evo",
        "--msa-option",
        "picker=cost",
        "--out",
        str(tmp_path / "never"),
      ],
      "--msa-option is for msa, evo-msa, not",
    ),
  ]
  for argv, message in cases:
    try:
      code = cli.main(argv)
    except SystemExit as e:  # argparse's own flag errors exit from parse_args.
      code = e.code
    err = capsys.readouterr().err
    assert code == 2 and err.count("\n") == 1 and message in err, (argv, err)
  assert not (tmp_path / "never").exists()


def test_a_flag_error_comes_before_jax_loads():
  """`solve --solver agent` without --checkpoint is refused before the agent stack is imported."""
  script = (
    "import sys; from malloczero.launch.cli import main; "
    "code = main(['solve', 'missing.json', '--solver', 'agent']); "
    "print(code, 'jax' in sys.modules)"
  )
  result = subprocess.run(
    [sys.executable, "-c", script], capture_output=True, text=True, cwd=REPO, timeout=120
  )
  assert result.stdout.split() == ["1", "False"], result.stderr[-2000:]
  assert "--solver agent needs --checkpoint" in result.stderr


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
def test_sigterm_stops_solve_like_ctrl_c_with_one_line_and_no_output_file(tmp_path):
  workload = os.path.join(REPO, "env", "programs", "data", "workloads", "tiny-vgg-b1-infer.json.gz")
  out = tmp_path / "map.json"
  process = subprocess.Popen(
    [
      sys.executable,
      "-m",
      "malloczero",
      "solve",
      workload,
      "--hardware",
      "nnpi-like",
      "--solver",
      "evo",
      "--evaluations",
      "1000000",
      "--time-limit",
      "60",
      "--out",
      str(out),
    ],
    cwd=REPO,
    stdout=subprocess.PIPE,
    stderr=subprocess.PIPE,
    text=True,
  )
  time.sleep(6)
  process.terminate()
  try:
    _, stderr = process.communicate(timeout=60)
  except subprocess.TimeoutExpired:
    process.kill()
    process.communicate()
    raise
  assert process.returncode == 143, stderr[-2000:]
  assert stderr == "malloczero: terminated\n"
  assert not out.exists() and not list(tmp_path.iterdir())


@pytest.mark.slow
def test_a_bad_demonstrations_file_is_one_line_with_no_native_log_before_it(trained_run, tmp_path):
  """The single-process trainer restores before Reverb starts, and Reverb's C++ lines go to
  WORKDIR/nodes/native.log, not before the error."""
  import shutil

  workdir = tmp_path / "run"
  shutil.copytree(trained_run["workdir"], workdir)
  (workdir / "checkpoints" / "demonstrations.json").write_text("garbage")
  result = _cli(
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
