"""The wheel: built from a scratch copy of the repository, it holds every module of every package
folder and all the suite data, installs as the one package `malloczero` (no `env`, `system`, ...
at the top level), and the installed copy runs the command line away from the checkout."""

from __future__ import annotations

import glob
import os
import subprocess
import sys
import zipfile

import pytest

from malloczero.env.programs.suites import get_suite
from tests.test_layout import FOLDERS

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
DATA = os.path.join(REPO, "env", "programs", "data")

pytestmark = pytest.mark.slow


def _modules_in_checkout() -> set[str]:
  """Each .py file of each package folder, named as the wheel names it
  (malloczero/env/game/requests_game.py)."""
  paths = set()
  for prefix, folder in [("malloczero", "malloczero")] + [
    (f"malloczero/{name}", folder) for name, folder in FOLDERS.items()
  ]:
    for root, dirs, files in os.walk(os.path.join(REPO, folder)):
      dirs[:] = [d for d in dirs if d != "__pycache__"]
      relative = os.path.relpath(root, os.path.join(REPO, folder))
      for name in files:
        if name.endswith(".py"):
          paths.add(os.path.normpath(os.path.join(prefix, relative, name)).replace(os.sep, "/"))
  return paths


def _suite_data_in_checkout() -> set[str]:
  files = [
    os.path.join("suites", os.path.basename(path))
    for path in glob.glob(os.path.join(DATA, "suites", "*.json"))
  ] + [
    os.path.join("workloads", os.path.basename(path))
    for path in glob.glob(os.path.join(DATA, "workloads", "*.json.gz"))
  ]
  return {f"malloczero/env/programs/data/{name}".replace(os.sep, "/") for name in files}


@pytest.fixture(scope="module")
def installed(tmp_path_factory):
  """(the wheel's file names, the --target directory it was pip-installed into)."""
  from malloczero.system.vertex import build_wheel  # Loads Launchpad: not at collection.

  wheel = build_wheel(str(tmp_path_factory.mktemp("wheel")))
  with zipfile.ZipFile(wheel) as archive:
    names = set(archive.namelist())
  target = tmp_path_factory.mktemp("site")
  result = subprocess.run(
    [
      sys.executable,
      "-m",
      "pip",
      "install",
      "--quiet",
      "--no-deps",
      "--no-index",
      "--target",
      str(target),
      wheel,
    ],
    capture_output=True,
    text=True,
    timeout=300,
  )
  assert result.returncode == 0, result.stderr[-3000:]
  return names, target


def _run_installed(target, tmp_path, *args, timeout=300):
  """`python ARGS` with only the installed copy of malloczero importable: PYTHONPATH names the
  --target directory (ahead of the venv's editable install) and the working directory is outside
  the repository, so the checkout cannot be imported."""
  cwd = tmp_path / "elsewhere"
  cwd.mkdir(exist_ok=True)
  assert not str(cwd).startswith(REPO + os.sep)
  env = dict(os.environ, PYTHONPATH=str(target), COLUMNS="200")
  return subprocess.run(
    [sys.executable, *args], cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout
  )


def test_the_wheel_holds_every_module_and_all_suite_data(installed):
  names, _ = installed
  expected = _modules_in_checkout()
  assert len(expected) > 50 and "malloczero/env/programs/suites.py" in expected
  assert not expected - names, f"modules missing from the wheel: {sorted(expected - names)}"
  data = _suite_data_in_checkout()
  assert "malloczero/env/programs/data/suites/default.json" in data
  assert len(data) > 40  # Each suite's manifest and every committed workload of the suites.
  assert not data - names, f"suite data missing from the wheel: {sorted(data - names)}"
  # XLA's override protos are built from this descriptor (env/msa/xla_proto.py).
  assert "malloczero/env/msa/data/memory_space_assignment.pb" in names
  # Everything the wheel installs lives under malloczero/ or its .dist-info.
  tops = {name.split("/")[0] for name in names}
  assert {top for top in tops if not top.endswith(".dist-info")} == {"malloczero"}, tops


def test_installed_as_one_package_with_nothing_else_at_the_top_level(installed):
  _, target = installed
  entries = set(os.listdir(target))
  assert not entries & set(FOLDERS), f"installed at the top level: {sorted(entries & set(FOLDERS))}"
  assert not entries & {f"{name}.py" for name in FOLDERS}
  assert "malloczero" in entries
  assert {
    e for e in entries if e not in ("malloczero", "bin") and not e.endswith(".dist-info")
  } == set(), entries


def test_the_installed_package_imports_from_the_target_not_the_checkout(installed, tmp_path):
  _, target = installed
  code = (
    "import malloczero, malloczero.launch.cli as cli, malloczero.system.training as t\n"
    "from malloczero.env.programs.suites import WORKLOAD_DIR\n"
    "for name in ('env', 'system', 'configs', 'launch', 'actors', 'learner', 'replay'):\n"
    "  try:\n"
    "    __import__(name)\n"
    "  except ImportError:\n"
    "    pass\n"
    "  else:\n"
    "    raise SystemExit(f'top-level {name} is importable')\n"
    "print(malloczero.__file__, cli.__file__, t.__file__, WORKLOAD_DIR, sep='\\n')\n"
    "print(malloczero.get_suite('tiny').entries[0].name)\n"
  )
  result = _run_installed(target, tmp_path, "-c", code)
  assert result.returncode == 0, result.stderr[-3000:]
  lines = result.stdout.splitlines()
  for path in lines[:4]:
    assert os.path.realpath(path).startswith(os.path.realpath(target) + os.sep), (path, target)
    assert not os.path.realpath(path).startswith(REPO + os.sep), path
  assert lines[4] == get_suite("tiny").entries[0].name


def test_the_installed_command_shows_a_suite_and_solves_a_suite_program(installed, tmp_path):
  _, target = installed
  shown = _run_installed(target, tmp_path, "-m", "malloczero", "suite", "show", "default")
  assert shown.returncode == 0, shown.stderr[-3000:]
  assert "suite 'default'" in shown.stdout
  for entry in get_suite("default").entries:
    assert entry.name in shown.stdout, entry.name

  entry = get_suite("tiny").entries[0]
  workload, hardware = entry.load()
  installed_workload = os.path.join(
    target, "malloczero", "env", "programs", "data", "workloads", f"{entry.program}.json.gz"
  )
  assert os.path.exists(installed_workload)
  out = tmp_path / "map.json"
  capacity = [f"--capacity={lv.name}={lv.capacity_bytes}" for lv in hardware.levels[:-1]]
  solved = _run_installed(
    target,
    tmp_path,
    "-m",
    "malloczero",
    "solve",
    installed_workload,
    "--hardware",
    entry.hardware,
    *capacity,
    "--solver",
    "msa",
    "--out",
    str(out),
  )
  assert solved.returncode == 0, solved.stderr[-3000:]
  assert solved.stdout.startswith("msa: ") and out.exists()
  checked = _run_installed(
    target, tmp_path, "-m", "malloczero", "validate", installed_workload, str(out), *capacity
  )
  assert checked.returncode == 0, checked.stderr[-3000:]
