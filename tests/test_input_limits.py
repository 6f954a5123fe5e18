"""Inputs read whole are regular files within a size limit (common/inputs.py), and every count
and time a user can give is bounded: each refused in one line with exit 1 or 2, before any work
or any output, never a traceback, a hang or memory read without end."""

from __future__ import annotations

import gzip
import os
import threading

import pytest

from malloczero.common.errors import MalloczeroError, WorkloadError
from malloczero.common.inputs import MAX_INPUT_ENV, read_input_bytes
from malloczero.env.hardware import PRESETS
from malloczero.env.programs.synthetic import random_workload
from malloczero.env.solvers import solve
from malloczero.env.workload_json import save_workload, workload_from_ops
from tests.command_line import run_main

PROGRAM = random_workload(3, 30)


@pytest.fixture
def workload_file(tmp_path):
  path = tmp_path / "prog.json"
  save_workload(PROGRAM, path)
  return path


@pytest.fixture
def fifo(tmp_path):
  """A FIFO with no writer: reading it blocks. A thread writes to it after 30 s, so that a reader
  that blocks ends (and its test fails on what it read) rather than hanging the suite."""
  path = tmp_path / "pipe.json"
  os.mkfifo(path)
  done = threading.Event()

  def unblock():
    if not done.wait(30):
      with open(path, "w") as f:
        f.write("{}")

  thread = threading.Thread(target=unblock, daemon=True)
  thread.start()
  yield path
  done.set()


@pytest.mark.parametrize("role", ["workload", "mapping", "hardware", "hlo", "checkpoint"])
def test_a_fifo_is_refused_without_waiting_for_a_writer(
  capsys, fifo, workload_file, tmp_path, role
):
  if role == "workload":
    argv = ["solve", fifo, "--hardware", "tpu-v4i-like"]
  elif role == "mapping":
    argv = ["validate", workload_file, fifo, "--hardware", "tpu-v4i-like"]
  elif role == "hardware":
    argv = ["solve", workload_file, "--hardware", fifo]
  elif role == "hlo":
    hlo = tmp_path / "pipe.hlo"
    os.rename(fifo, hlo)
    fifo = hlo
    argv = ["import-hlo", hlo, "--out", tmp_path / "w.json"]
  else:
    argv = ["solve", workload_file, "--hardware", "tpu-v4i-like", "--solver", "agent"]
    argv += ["--checkpoint", fifo]
  code, out, err = run_main(capsys, *argv)
  assert code == 1 and err.count("\n") == 1, err
  assert str(fifo) in err and ("a FIFO, not a file" in err or "no learner checkpoint" in err)
  assert not (tmp_path / "w.json").exists()


def test_a_device_is_refused_before_reading(capsys):
  for path in ("/dev/zero", "/dev/urandom"):
    code, _, err = run_main(capsys, "solve", path, "--hardware", "tpu-v4i-like")
    assert code == 1 and err.count("\n") == 1
    assert f"{path}: a character device, not a file: give a regular file" in err


def test_a_file_over_the_limit_is_refused_naming_the_setting(monkeypatch, capsys, workload_file):
  size = workload_file.stat().st_size
  monkeypatch.setenv(MAX_INPUT_ENV, str(size - 1))
  code, _, err = run_main(capsys, "solve", workload_file, "--hardware", "tpu-v4i-like")
  assert code == 1 and err.count("\n") == 1
  assert f"{size:,} bytes, more than {size - 1:,} bytes" in err and MAX_INPUT_ENV in err
  monkeypatch.setenv(MAX_INPUT_ENV, str(size))
  code, out, err = run_main(capsys, "solve", workload_file, "--hardware", "tpu-v4i-like")
  assert code == 0, err


def test_a_gzip_bomb_stops_decompressing_at_the_limit(monkeypatch, tmp_path):
  bomb = tmp_path / "bomb.json.gz"
  with gzip.open(bomb, "wb") as f:
    for _ in range(64):
      f.write(b" " * (1 << 20))  # 64 MB of spaces, 64 KB compressed.
  monkeypatch.setenv(MAX_INPUT_ENV, str(4 << 20))
  with pytest.raises(WorkloadError, match="it decompresses to more than 4,194,304 bytes"):
    read_input_bytes(bomb, WorkloadError)


def test_the_limit_setting_itself_is_checked(monkeypatch, tmp_path):
  path = tmp_path / "x.json"
  path.write_text("{}")
  for bad in ("0", "-5", "lots"):
    monkeypatch.setenv(MAX_INPUT_ENV, bad)
    with pytest.raises(MalloczeroError, match=f"{MAX_INPUT_ENV}=.*a positive integer"):
      read_input_bytes(path, WorkloadError)


@pytest.mark.parametrize(
  "argv, flag, bound",
  [
    (
      ["--solver", "agent", "--checkpoint", "x", "--simulations", "1000000"],
      "simulations",
      "1,024",
    ),
    (["--solver", "agent", "--checkpoint", "x", "--attempts", "100000"], "attempts", "64"),
    (["--solver", "agent", "--checkpoint", "x", "--search-seconds", "1e9"], "search-seconds", None),
    (
      ["--solver", "agent", "--checkpoint", "x", "--agent-time-limit", "1e9"],
      "agent-time-limit",
      None,
    ),
    (["--solver", "pack", "--time-limit", "1e308"], "time-limit", "86,400"),
    (["--solver", "cpsat", "--workers", "100000"], "workers", None),
    (["--solver", "evo", "--evaluations", "10000000000"], "evaluations", "1,000,000,000"),
    (["--solver", "evo-msa", "--decodes", "10000000000"], "decodes", "1,000,000,000"),
  ],
)
def test_every_count_and_time_is_bounded_and_says_its_bound(
  capsys, workload_file, argv, flag, bound
):
  code, out, err = run_main(capsys, "solve", workload_file, "--hardware", "tpu-v4i-like", *argv)
  assert code == 2 and out == "" and err.count("\n") == 1, err
  assert f"argument --{flag}: at most {bound or ''}" in err
  _, help_text, _ = run_main(capsys, "solve", "--help")
  entry = help_text.split(f"\n  --{flag} ")[1].split("\n  -")[0]
  assert "at most" in " ".join(entry.split())


def test_import_jax_batch_is_bounded_before_building_the_model(capsys, tmp_path):
  for batch in ("1000000000000", str(2**70)):
    code, _, err = run_main(
      capsys, "import-jax", "mlp", "--batch", batch, "--out", tmp_path / "w.json"
    )
    assert code == 2 and "argument --batch: at most 1,024" in err
  assert not (tmp_path / "w.json").exists()


def test_a_program_with_no_request_is_solved_trivially_and_says_so(capsys, tmp_path):
  """Every buffer larger than the fast capacity: no request at all. cpsat and pack say the
  program was solved trivially instead of reading details of a search that did not run."""
  buffers = [
    {"id": 0, "name": "x", "size": 1 << 20, "def": None, "uses": [0, 1], "kind": "parameter"},
    {"id": 1, "name": "y", "size": 1 << 20, "def": 0, "uses": [1], "kind": "activation"},
  ]
  path = tmp_path / "big.json"
  save_workload(workload_from_ops("big", "hand", [1e9, 1e9], buffers), path)
  for solver in ("cpsat", "pack", "greedy"):
    code, out, err = run_main(
      capsys, "solve", path, "--hardware", "tpu-v4i-like", "--capacity", "4096", "--solver", solver
    )
    assert code == 0, err
    assert "solved trivially: no request fits in fast memory" in out


def test_pack_takes_a_time_limit_too_large_for_its_clock():
  hardware = PRESETS["tpu-v4i-like"]
  from malloczero.env.programs.synthetic import contended

  result = solve(PROGRAM, contended(hardware, PROGRAM, 0.3), "pack", time_limit_s=1e308)
  assert result.mapping.speedup >= 1.0


def test_train_wall_time_is_bounded(capsys):
  code, _, err = run_main(capsys, "train", "--max-seconds", "1e12")
  assert code == 2 and "argument --max-seconds: at most 2,592,000, got 1,000,000,000,000" in err
