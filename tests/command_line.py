"""`malloczero` run from the command-line tests: in a subprocess from the repository root
(`run_cli`), or in this process (`run_main`)."""

import os
import subprocess
import sys

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def run_cli(*args: str, timeout: float = 300) -> subprocess.CompletedProcess:
  return subprocess.run(
    [sys.executable, "-m", "malloczero", *args],
    capture_output=True,
    text=True,
    timeout=timeout,
    cwd=REPO,
  )


def run_main(capsys, *argv) -> tuple[int, str, str]:
  """`malloczero ARGV` in this process: (exit code, stdout, stderr), a flag error's exit
  included."""
  from malloczero.launch import cli

  try:
    code = cli.main([str(a) for a in argv])
  except SystemExit as e:  # argparse's flag errors.
    code = e.code
  captured = capsys.readouterr()
  return code, captured.out, captured.err
