"""The command line as a whole: bench writes a well-formed report, compiled programs are cached,
every command's flag errors are one line (exit 2) before anything runs or JAX loads, log lines
stay one line, SIGTERM stops a command as Ctrl-C does, and setup is idempotent."""

import json
import os
import subprocess
import sys
import time

import pytest

from tests.command_line import REPO, run_cli


def bench_quick(tmp_path, *flags):
  """`bench --quick FLAGS --out ...`: (the finished command, its JSON report)."""
  out = tmp_path / "bench.json"
  result = run_cli("bench", "--quick", *flags, "--out", str(out))
  assert result.returncode == 0, result.stderr
  return result, json.loads(out.read_text())


@pytest.mark.slow
def test_bench_quick_writes_json_with_units_in_keys(tmp_path):
  # The inputs at trace scale are the next test's: the two run side by side under xdist.
  result, report = bench_quick(tmp_path, "--no-scale")
  for key in (
    "game_steps_per_s",
    "cost_model_full_evaluations_per_s",
    "cost_model_incremental_updates_per_s",
    "evo_decode_ms",
    "evo_decode_one_request_at_a_time_ms",
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
  assert report["evo_decode_requests"] >= report["eval_program_buffers"] // 2
  assert report["search_small_batch"] == 64 and report["search_small_simulations"] == 32
  assert report["learner_small_batch"] == 256 and report["learner_small_unroll"] == 5
  assert not [key for key in report if key.startswith("scale_")]


@pytest.mark.slow
def test_bench_quick_measures_the_inputs_at_scale_and_no_agent_leaves_the_agent_out(
  monkeypatch,
):
  """`--quick` measures the inputs at scale too (`--no-scale` leaves them out, the test above);
  here at hundreds to thousands of buffers, not the trace scale the bench itself measures."""
  import functools

  from malloczero.launch import benchmarks

  small = functools.partial(
    benchmarks.bench_scale, csv_rows=200, xla_buffers=200, hlo_buffers=2000, loop_layers=2
  )
  monkeypatch.setattr(benchmarks, "bench_scale", small)
  report = benchmarks.run_bench(quick=True, agent=False)
  json.dumps(report)
  assert report["game_steps_per_s"] > 0 and "search_small_moves_per_s" not in report
  prefixes = (
    "scale_csv_200_rows_msa",
    "scale_xla_200_buffers_msa",
    "scale_hlo_2000_buffers_import_msa",
    "loop_transformer_2_layers_import_msa",
  )
  for prefix in prefixes:
    assert f"{prefix}_failed" not in report and f"{prefix}_refusal" not in report, report
    assert report[f"{prefix}_solve_s"] > 0 and report[f"{prefix}_validate_s"] >= 0
    assert report[f"{prefix}_peak_mb"] > 10 and report[f"{prefix}_speedup_x"] >= 1
    for phase in ("load", "msa", "validate"):
      assert report[f"{prefix}_{phase}_s"] >= 0
      assert 10 < report[f"{prefix}_{phase}_peak_mb"] <= report[f"{prefix}_peak_mb"]
  # The importer flattens the generated step to about the buffers asked for.
  assert 1000 <= report["scale_hlo_2000_buffers_import_msa_buffers"] <= 4000
  assert report["loop_transformer_2_layers_xla_compile_s"] > 0
  assert report["loop_transformer_2_layers_import_msa_hardware"] == "tpu-v4"


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


def test_unknown_command_and_flag_are_one_line_errors():
  for args in (("frobnicate",), ("bench", "--quik")):
    result = run_cli(*args)
    assert result.returncode == 2
    assert result.stderr.startswith("malloczero: error: ") and result.stderr.count("\n") == 1


def test_make_setup_is_idempotent():
  assert os.path.exists(os.path.join(REPO, ".venv", ".malloczero-installed")), (
    "run the tests through `make test`, which builds .venv"
  )
  result = subprocess.run(["make", "-q", "setup"], cwd=REPO, capture_output=True, text=True)
  assert result.returncode == 0, "make setup would reinstall although nothing changed"


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


def _children(pid: int) -> list[int]:
  with open(f"/proc/{pid}/task/{pid}/children") as f:
    return [int(c) for c in f.read().split()]


# evo searches in Python; CP-SAT in a child process, since its native search heeds no signal.
# CP-SAT finds no solution on resnet50-b8-train within minutes: it is still searching at the signal.
@pytest.mark.slow
@pytest.mark.parametrize(
  "solver, workload",
  [
    ("evo", "tiny-vgg-b1-infer.json.gz"),
    ("cpsat", "resnet50-b8-train.json.gz"),
  ],
)
def test_sigterm_stops_solve_like_ctrl_c_with_one_line_and_no_output_file(
  tmp_path, solver, workload
):
  workload = os.path.join(REPO, "env", "programs", "data", "workloads", workload)
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
      solver,
      "--evaluations",
      "1000000",
      "--time-limit",
      "600",
      "--out",
      str(out),
    ],
    cwd=REPO,
    stdout=subprocess.PIPE,
    stderr=subprocess.PIPE,
    text=True,
  )
  time.sleep(8)
  children = _children(process.pid)
  assert process.poll() is None and len(children) == (solver == "cpsat")
  process.terminate()
  try:
    _, stderr = process.communicate(timeout=60)  # A tenth of the time limit.
  except subprocess.TimeoutExpired:
    process.kill()
    process.communicate()
    raise
  assert process.returncode == 143, stderr[-2000:]
  assert stderr == "malloczero: terminated\n"
  assert not out.exists() and not list(tmp_path.iterdir())
  for child in children:  # CP-SAT's process went with it.
    assert not os.path.exists(f"/proc/{child}") or "Z" in open(f"/proc/{child}/stat").read()
