"""Refusals leave nothing behind and stay one line: a training run refused writes nothing in its
work directory (no config, no locks), an output that is an input or another output is refused
before any work, control characters in a message are shown escaped, and SIGHUP ends a command
with its own line."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

import pytest

from malloczero.env.programs.hlo_import.text_parser import parse_text
from malloczero.env.programs.synthetic import random_workload
from malloczero.env.workload_json import save_workload
from tests.command_line import REPO, run_main


@pytest.fixture
def workload_file(tmp_path):
  path = tmp_path / "prog.json"
  save_workload(random_workload(3, 30), path)
  return path


@pytest.mark.parametrize("launch", ["local_mp", "single"])
def test_a_refused_training_run_writes_nothing_in_its_work_directory(capsys, tmp_path, launch):
  fresh = tmp_path / "fresh"
  code, _, err = run_main(
    capsys, "train", "--suite", "foreign", "--workdir", fresh, "--launch", launch
  )
  assert code == 1 and "is for evaluation only" in err
  assert not fresh.exists()
  garbage = tmp_path / "garbage"
  garbage.mkdir()
  (garbage / "config.json").write_text("garbage")
  code, _, err = run_main(capsys, "train", "--workdir", garbage, "--launch", launch)
  assert code == 1 and "config.json is unreadable" in err and err.count("\n") == 1
  assert sorted(os.listdir(garbage)) == ["config.json"]  # No train.lock, no nodes.lock.


def test_an_output_that_is_an_input_or_another_output_is_refused(capsys, workload_file, tmp_path):
  before = workload_file.read_bytes()
  code, _, err = run_main(
    capsys, "solve", workload_file, "--hardware", "tpu-v4i-like", "--out", workload_file
  )
  assert code == 1 and "is an input of this command" in err
  assert workload_file.read_bytes() == before
  picture = tmp_path / "x.png"
  code, _, err = run_main(
    capsys,
    "solve",
    workload_file,
    "--hardware",
    "tpu-v4i-like",
    "--out",
    picture,
    "--plot",
    picture,
  )
  assert code == 1 and "--out and --plot are the same file" in err
  assert not picture.exists()
  hlo = tmp_path / "m.hlo"
  hlo.write_text("HloModule m\n\nENTRY main {\n  ROOT p = f32[4] parameter(0)\n}\n")
  code, _, err = run_main(capsys, "import-hlo", hlo, "--out", hlo)
  assert code == 1 and "is an input of this command" in err
  assert hlo.read_text().startswith("HloModule m")


def test_control_characters_in_a_message_are_shown_escaped(capsys, tmp_path):
  name = "mo\ndel\x1b[2J"
  code, _, err = run_main(capsys, "import-jax", name, "--out", tmp_path / "w.json")
  assert code == 1 and err.count("\n") == 1 and "\x1b" not in err
  assert "mo\\ndel\\x1b[2J" in err
  code, _, err = run_main(capsys, "solve", tmp_path / "a\nb.json", "--hardware", "tpu-v4i-like")
  assert code == 1 and err.count("\n") == 1 and "a\\nb.json" in err


def test_jaxs_short_computation_headers_are_read():
  """`as_hlo_text()` prints `ENTRY main.22 {` and `region_0.15 {`, without a signature."""
  text = (
    "HloModule jit_f\n\n"
    "region_0.3 {\n  a = f32[] parameter(0)\n  b = f32[] parameter(1)\n"
    "  ROOT add = f32[] add(a, b)\n}\n\n"
    "ENTRY main.9 {\n  x = f32[8] parameter(0)\n  zero = f32[] constant(0)\n"
    "  ROOT r = f32[] reduce(x, zero), dimensions={0}, to_apply=region_0.3\n}\n"
  )
  module = parse_text(text, "short")
  assert module.entry.name == "main.9" and [i.name for i in module.entry.instrs][-1] == "r"


@pytest.mark.slow  # A command in a process of its own, run for seconds.
def test_sighup_ends_a_command_with_its_own_line(workload_file):
  """evo-msa given two minutes, hung up after its start: it says so and exits 129 at once."""
  process = subprocess.Popen(
    [sys.executable, "-m", "malloczero", "solve", str(workload_file), "--hardware"]
    + ["tpu-v4i-like", "--solver", "evo-msa", "--time-limit", "120"],
    cwd=REPO,
    stdout=subprocess.PIPE,
    stderr=subprocess.PIPE,
    text=True,
  )
  time.sleep(8)
  assert process.poll() is None, "the solve ended before it was hung up"
  started = time.monotonic()
  process.send_signal(signal.SIGHUP)
  _, err = process.communicate(timeout=60)
  assert process.returncode == 129, err
  assert err.strip().splitlines()[-1] == "malloczero: hung up (the terminal closed)"
  assert time.monotonic() - started < 5
