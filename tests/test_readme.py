"""The README's Python API example, run exactly as the README shows it, so that it cannot rot."""

import os
import re
import subprocess
import sys

import pytest

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _python_api_example() -> str:
  """The first ```python block of the README's "## Python API" section."""
  with open(os.path.join(REPO, "README.md"), encoding="utf-8") as f:
    readme = f.read()
  section = re.search(r"^## Python API\n(.*?)(?=^## )", readme, re.S | re.M)
  assert section, "README.md has no '## Python API' section"
  block = re.search(r"^```python\n(.*?)^```$", section.group(1), re.S | re.M)
  assert block, "the README's Python API section has no ```python block"
  return block.group(1)


def test_the_readme_python_api_example_runs(capsys):
  code = _python_api_example()
  namespace = {"__name__": "__readme__"}
  exec(compile(code, "README.md (Python API)", "exec"), namespace)  # pylint: disable=exec-used
  lines = capsys.readouterr().out.splitlines()
  entry = namespace["entry"]
  assert len(lines) == 3, lines
  assert lines[1].startswith("msa but one: ") and lines[2].startswith("msa: ")
  assert lines[0] == (
    f"{entry.name}: {namespace['workload'].num_ops} ops, "
    f"{namespace['workload'].num_buffers} buffers"
  )
  # What the README says about it: the rewards sum to the advantage over msa, (msa's time - its
  # time) / msa's time, the game is over, and the solver's mapping is the validated one.
  played, msa = namespace["played"], namespace["result"].mapping
  assert namespace["game"].done and played.speedup > 1
  assert namespace["episode_return"] == pytest.approx(
    1 - played.estimated_time_s / msa.estimated_time_s, rel=1e-6
  )
  assert namespace["checked"].speedup == pytest.approx(
    namespace["result"].mapping.speedup, rel=1e-6
  )
  # The game kept its first buffer out of fast memory, as the comment says.
  first_id = namespace["workload"].buffers[namespace["first_buffer"]].id
  held = [row["buffer"] for row in namespace["game"].mapping("again").allocations]
  assert held and first_id not in held


def test_importing_malloczero_loads_no_agent_library():
  """The README's promise: `import malloczero` loads the game, the baselines and the suites, and
  the agent's libraries only when the agent is first used."""
  libraries = ("jax", "haiku", "mctx", "reverb", "launchpad", "tensorflow")
  code = f"import sys, malloczero\nprint(' '.join(m for m in {libraries!r} if m in sys.modules))\n"
  result = subprocess.run(
    [sys.executable, "-c", code], capture_output=True, text=True, timeout=120, cwd=REPO
  )
  assert result.returncode == 0, result.stderr[-2000:]
  assert result.stdout.strip() == "", f"import malloczero loaded {result.stdout.strip()}"
