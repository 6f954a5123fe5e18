"""The package layout, read from the sources with `ast` (nothing is imported): every import of the
project's code is spelled `malloczero.`, the sub-packages import each other in one direction
only, with no cycles, and the game core needs neither JAX nor Haiku.

The direction (docs/design.md, README "Layout"):

  launch -> research -> system -> evaluation -> actors -> learner -> replay -> configs -> env
    -> common

A package may import any package to its right, never one to its left. `evaluation` (suite
evaluations, the learning curve, reports, pictures, console tables) sits below the Launchpad
wiring that records a learning curve and above the actors it plays with; `research` (analyses of
trained networks, run by scripts/) sits above the wiring, which never imports it. `configs` is
readable by every package but `env` and imports only `env` and `common`; `env` imports nothing
of the agent, and `common` (errors, file output, lazy imports) nothing of the project. The root
package `malloczero` (its `__init__` re-exports the Python API, `__main__` is the command) sits
above them all, and no sub-package imports it. The system draws no picture itself and no
baseline command loads it (`test_solve_with_a_picture_does_not_load_the_training_system`, the
one test here that runs code); no module is longer than one concept needs.

Inside `env` the areas import in one direction too (`ENV_ORDER`): the program and machine model
(the modules at env/'s top level), then programs/, msa/ (the game's rules), game/ and solvers/ (the
baselines). Imports inside functions and under `TYPE_CHECKING` count like the others, so a lazy
import cannot hide a cycle.
"""

from __future__ import annotations

import ast
import os
import re

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

# Sub-package -> its folder at the repository root (pyproject.toml's package-dir).
FOLDERS = {
  "common": "common",
  "env": "env",
  "configs": "configs",
  "replay": "replay",
  "learner": "learner",
  "actors": "actors",
  "evaluation": "evaluation",
  "system": "system",
  "research": "research",
  "launch": "launch",
}
# Right (imported) to left (importing): a package may import only those of lower rank.
ORDER = [
  "common",
  "env",
  "configs",
  "replay",
  "learner",
  "actors",
  "evaluation",
  "system",
  "research",
  "launch",
]
RANK = {name: rank for rank, name in enumerate(ORDER)}
# Top-level names that would be the project's folders imported without the package prefix.
BARE = set(FOLDERS) | {"programs", "solvers", "game", "msa"}
# The areas of env/, bottom first: "model" is the modules at env/'s top level.
ENV_ORDER = ["model", "programs", "msa", "game", "solvers"]
# The game core (env/ but env/programs/, which compiles the zoo with XLA) runs without these.
AGENT_LIBRARIES = {"jax", "jaxlib", "haiku", "mctx", "optax", "rlax", "reverb", "launchpad", "acme"}


def _python_files(folder: str) -> list[str]:
  found = []
  for root, dirs, files in os.walk(os.path.join(REPO, folder)):
    dirs[:] = sorted(d for d in dirs if d != "__pycache__")
    found += [os.path.join(root, f) for f in sorted(files) if f.endswith(".py")]
  return found


def _imports(path: str) -> list[tuple[int, str, int]]:
  """(line, imported module, relative level) for every import statement in the file, including
  imports inside functions."""
  with open(path, encoding="utf-8") as f:
    tree = ast.parse(f.read(), filename=path)
  found = []
  for node in ast.walk(tree):
    if isinstance(node, ast.Import):
      found += [(node.lineno, alias.name, 0) for alias in node.names]
    elif isinstance(node, ast.ImportFrom):
      module = node.module or ""
      if module == "malloczero" and not node.level:  # `from malloczero import env`
        found += [(node.lineno, f"malloczero.{alias.name}", 0) for alias in node.names]
      else:
        found.append((node.lineno, module, node.level))
  return found


def _where(path: str, line: int) -> str:
  return f"{os.path.relpath(path, REPO)}:{line}"


def _sub_package(module: str) -> str | None:
  """'malloczero.env.game' -> 'env'; 'malloczero' -> '' (the root package); else None."""
  parts = module.split(".")
  if parts[0] != "malloczero":
    return None
  return parts[1] if len(parts) > 1 and parts[1] in FOLDERS else ""


def _package_edges() -> dict[tuple[str, str], list[str]]:
  """(importing, imported) sub-package -> where, for imports between different sub-packages."""
  edges: dict[tuple[str, str], list[str]] = {}
  for package, folder in FOLDERS.items():
    for path in _python_files(folder):
      for line, module, level in _imports(path):
        target = _sub_package(module) if not level else None
        if target is not None and target != package:
          edges.setdefault((package, target), []).append(_where(path, line))
  return edges


def test_the_project_is_imported_as_malloczero_everywhere():
  offending = []
  folders = list(FOLDERS.values()) + ["malloczero", "tests", "scripts"]
  for folder in folders:
    for path in _python_files(folder):
      for line, module, level in _imports(path):
        if level:
          offending.append(
            f"{_where(path, line)}: relative import {'.' * level}{module} (spell it malloczero.)"
          )
        elif module.split(".")[0] in BARE:
          offending.append(f"{_where(path, line)}: `{module}` is not spelled malloczero.")
  assert not offending, "imports of the project's code without `malloczero.`:\n" + "\n".join(
    offending
  )


def test_sub_packages_import_in_one_direction():
  offending = []
  for (package, target), places in sorted(_package_edges().items()):
    if target == "":
      offending += [
        f"{where}: malloczero.{package} imports the root package `malloczero` "
        f"(import the sub-package that defines the name)"
        for where in places
      ]
    elif RANK[target] > RANK[package]:
      offending += [
        f"{where}: malloczero.{package} imports malloczero.{target} "
        f"(against {' -> '.join(reversed(ORDER))})"
        for where in places
      ]
  assert not offending, "imports against the layering:\n" + "\n".join(offending)


def test_no_import_cycles_between_sub_packages():
  graph: dict[str, set[str]] = {package: set() for package in FOLDERS}
  edges = _package_edges()
  for package, target in edges:
    if target:
      graph[package].add(target)
  cycles = []

  def visit(package: str, path: list[str]) -> None:
    for target in sorted(graph[package]):
      if target in path:
        loop = path[path.index(target) :]
        start = loop.index(min(loop))  # Each cycle once, whichever package it was found from.
        cycle = loop[start:] + loop[:start] + [min(loop)]
        cycles.append(
          " -> ".join(cycle)
          + "  ("
          + ", ".join(edges[(a, b)][0] for a, b in zip(cycle, cycle[1:]))
          + ")"
        )
      else:
        visit(target, path + [target])

  for package in sorted(graph):
    visit(package, [package])
  cycles = sorted(set(cycles))
  assert not cycles, "import cycles between sub-packages:\n" + "\n".join(cycles)


def test_env_imports_nothing_of_the_agent_and_its_core_needs_no_jax():
  agent = set(ORDER) - {"common", "env"}
  offending = []
  for path in _python_files("env"):
    in_programs = os.path.relpath(path, REPO).startswith(os.path.join("env", "programs") + os.sep)
    for line, module, level in _imports(path):
      target = _sub_package(module) if not level else None
      if target in agent or target == "":
        offending.append(f"{_where(path, line)}: env imports {module}")
      if not in_programs and module.split(".")[0] in AGENT_LIBRARIES:
        offending.append(
          f"{_where(path, line)}: the game core imports {module} "
          f"(only env/programs/ may use JAX / Haiku)"
        )
  assert not offending, "\n".join(offending)


def test_configs_imports_only_env():
  offending = [
    f"{where}: malloczero.configs imports malloczero.{target or '(root)'}"
    for (package, target), places in _package_edges().items()
    if package == "configs" and target not in ("env", "common")
    for where in places
  ]
  assert not offending, "\n".join(offending)


def test_common_imports_nothing_of_the_project():
  offending = [
    f"{where}: malloczero.common imports malloczero.{target or '(root)'}"
    for (package, target), places in _package_edges().items()
    if package == "common"
    for where in places
  ]
  assert not offending, "\n".join(offending)


def _env_area(module: str) -> str | None:
  """'malloczero.env.game.config' -> 'game'; 'malloczero.env.workload' -> 'model'; None outside
  env and for env's own __init__ (which re-exports every area)."""
  parts = module.split(".")
  if parts[:2] != ["malloczero", "env"] or len(parts) == 2:
    return None
  return parts[2] if parts[2] in ENV_ORDER else "model"


def _env_module(path: str) -> str:
  relative = os.path.relpath(path, REPO)[: -len(".py")].split(os.sep)
  if relative[-1] == "__init__":
    relative = relative[:-1]
  return ".".join(["malloczero"] + relative)


def test_env_areas_import_in_one_direction_and_its_modules_have_no_cycles():
  """Every import counts, also inside functions and under `TYPE_CHECKING`: a cycle hidden behind
  a lazy import is still a cycle."""
  offending, graph = [], {}
  for path in _python_files("env"):
    importer = _env_module(path)
    area = _env_area(importer)
    for line, module, _ in _imports(path):
      target = _env_area(module)
      if target is None or area is None:
        continue
      graph.setdefault(importer, set()).add(module)
      if ENV_ORDER.index(target) > ENV_ORDER.index(area):
        offending.append(
          f"{_where(path, line)}: env's {area} imports {module} "
          f"(against {' -> '.join(reversed(ENV_ORDER))})"
        )
  seen, on_path = set(), []

  def visit(module: str) -> None:
    if module in on_path:
      offending.append("cycle: " + " -> ".join(on_path[on_path.index(module) :] + [module]))
      return
    if module in seen:
      return
    seen.add(module)
    on_path.append(module)
    for target in sorted(graph.get(module, ())):
      visit(target)
    on_path.pop()

  for module in sorted(graph):
    visit(module)
  assert not offending, "imports against env's order:\n" + "\n".join(offending)


def _pyproject_packages() -> tuple[list[str], dict[str, str]]:
  """[tool.setuptools] packages and package-dir, read with a few regular expressions (Python 3.10
  has no tomllib and the venv may not hold tomli)."""
  with open(os.path.join(REPO, "pyproject.toml"), encoding="utf-8") as f:
    text = f.read()
  listed = re.search(r"^\[tool\.setuptools\]\s*\npackages\s*=\s*\[(.*?)\]", text, re.S | re.M)
  assert listed, "pyproject.toml has no [tool.setuptools] packages list"
  packages = re.findall(r'"([\w.]+)"', listed.group(1))
  table = re.search(r"^\[tool\.setuptools\.package-dir\]\s*\n(.*?)(?:^\[|\Z)", text, re.S | re.M)
  assert table, "pyproject.toml has no [tool.setuptools.package-dir] table"
  package_dir = dict(re.findall(r'^"([\w.]+)"\s*=\s*"([\w./]+)"', table.group(1), re.M))
  return packages, package_dir


def test_pyproject_lists_every_package_folder():
  """pyproject.toml's list is the wheel's list: a folder with an __init__.py it misses would be
  left out of the installed package."""
  packages, package_dir = _pyproject_packages()
  assert package_dir == {
    "malloczero": "malloczero",
    **{f"malloczero.{name}": folder for name, folder in FOLDERS.items()},
  }
  folders = {}
  for package, folder in package_dir.items():
    for root, dirs, files in os.walk(os.path.join(REPO, folder)):
      dirs[:] = [d for d in dirs if d != "__pycache__"]
      if "__init__.py" in files:
        relative = os.path.relpath(root, os.path.join(REPO, folder))
        name = package if relative == "." else f"{package}.{relative.replace(os.sep, '.')}"
        folders[name] = os.path.relpath(root, REPO)
  assert sorted(packages) == sorted(folders), (
    f"pyproject.toml lists {sorted(set(packages) - set(folders))} without a folder, and "
    f"misses {sorted(set(folders) - set(packages))}"
  )


# Presentation and research sit above the wiring: the Launchpad system draws nothing itself and
# knows nothing of the analyses, so neither can slow or break a training run's imports.
PLOTTING_AND_RESEARCH = ("matplotlib", "malloczero.evaluation.plots", "malloczero.research")


def test_system_imports_no_plotting_or_research_code():
  offending = [
    f"{_where(path, line)}: malloczero.system imports {module}"
    for path in _python_files("system")
    for line, module, _ in _imports(path)
    if any(module == m or module.startswith(m + ".") for m in PLOTTING_AND_RESEARCH)
  ]
  assert not offending, "\n".join(offending)


def test_solve_with_a_picture_does_not_load_the_training_system(tmp_path):
  """`solve --plot` is a baseline's command: it draws with malloczero.evaluation.plots and never
  imports malloczero.system (the Launchpad wiring), checked in a fresh interpreter."""
  import subprocess
  import sys

  program = tmp_path / "program.csv"
  program.write_text("id,lower,upper,size\n0,0,4,300\n1,1,3,500\n2,3,6,400\n3,2,5,200\n")
  script = (
    "import sys\n"
    "from malloczero.launch import cli\n"
    f"code = cli.main(['solve', {str(program)!r}, '--capacity', '800', '--out', "
    f"{str(tmp_path / 'map.json')!r}, '--plot', {str(tmp_path / 'map.png')!r}])\n"
    "loaded = sorted(m for m in sys.modules if m.startswith('malloczero.system'))\n"
    "print('loaded:', loaded)\n"
    "sys.exit(code or (3 if loaded else 0))\n"
  )
  done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, cwd=REPO)
  assert done.returncode == 0, done.stdout + done.stderr
  assert "loaded: []" in done.stdout
  assert (tmp_path / "map.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


# A module past these sizes holds more than one concept; the model zoo is a declarative table.
MAX_SOURCE_LINES = 700
MAX_COMMAND_LINES = 300
LONG_BY_NATURE = {os.path.join("env", "programs", "zoo.py")}


def test_no_source_file_outgrows_one_concept():
  offending = []
  for folder in list(FOLDERS.values()) + ["malloczero", "tests", "scripts"]:
    for path in _python_files(folder):
      relative = os.path.relpath(path, REPO)
      with open(path, encoding="utf-8") as f:
        lines = sum(1 for _ in f)
      limit = (
        MAX_COMMAND_LINES
        if relative.startswith(os.path.join("launch", "commands") + os.sep)
        else MAX_SOURCE_LINES
      )
      if lines > limit and relative not in LONG_BY_NATURE:
        offending.append(f"{relative}: {lines} lines (at most {limit})")
  assert not offending, "split these by concept:\n" + "\n".join(offending)
