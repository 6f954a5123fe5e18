"""`malloczero` run in a subprocess from the repository root, for the command-line tests."""

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
