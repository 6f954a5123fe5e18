"""Shared fixtures and hypothesis profiles (CI: derandomised so a red run reproduces)."""

import atexit
import os
import shutil
import subprocess
import sys
import tempfile

import hypothesis
import pytest

# One JAX compilation cache for this test session, its in-process tests and the `malloczero`
# processes they start (they inherit it), and never the user's: the tiny networks' searches and
# learner step are otherwise compiled again by every training test. Set before JAX is imported.
_COMPILATION_CACHE = tempfile.mkdtemp(prefix="malloczero-tests-jax-cache-")
os.environ["JAX_COMPILATION_CACHE_DIR"] = _COMPILATION_CACHE
atexit.register(shutil.rmtree, _COMPILATION_CACHE, ignore_errors=True)
# Baseline results (evaluation/baseline_cache.py) are kept for this test session only, never read
# from or left in the user's cache.
_BASELINE_CACHE = tempfile.mkdtemp(prefix="malloczero-tests-baselines-")
os.environ["MALLOCZERO_BASELINE_CACHE_DIR"] = _BASELINE_CACHE
atexit.register(shutil.rmtree, _BASELINE_CACHE, ignore_errors=True)
# Likewise the HLO modules `solve`, `validate` and `train --workload` import
# (env/programs/import_cache.py); a test of the cache itself points it at its own directory.
_IMPORT_CACHE = tempfile.mkdtemp(prefix="malloczero-tests-hlo-imports-")
os.environ["MALLOCZERO_IMPORT_CACHE_DIR"] = _IMPORT_CACHE
atexit.register(shutil.rmtree, _IMPORT_CACHE, ignore_errors=True)

hypothesis.settings.register_profile(
  "ci", max_examples=40, deadline=None, derandomize=True, print_blob=True
)
hypothesis.settings.register_profile("dev", max_examples=40, deadline=None)
hypothesis.settings.register_profile("thorough", max_examples=1000, deadline=None)
hypothesis.settings.load_profile(
  os.environ.get("HYPOTHESIS_PROFILE", "ci" if os.environ.get("CI") else "dev")
)


def pytest_sessionstart(session):
  """Under pytest-xdist (`make test`), before the workers start: numba's kernels compiled into
  their on-disk cache once (tests/kernels_warmup.py), in two processes side by side, rather than
  again by every worker and test process. A warm-up that fails is left to the tests to show."""
  if hasattr(session.config, "workerinput") or not session.config.getoption("numprocesses", 0):
    return
  from tests.kernels_warmup import PARTS

  repo = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
  parts = [
    subprocess.Popen(
      [sys.executable, "-m", "tests.kernels_warmup", part],
      cwd=repo,
      stdout=subprocess.DEVNULL,
      stderr=subprocess.DEVNULL,
    )
    for part in PARTS
  ]
  for part in parts:
    try:
      part.wait(timeout=600)
    except subprocess.TimeoutExpired:
      part.kill()


@pytest.fixture(scope="session")
def trained_run(tmp_path_factory):
  """The tiny training run every test that needs a trained checkpoint shares, built once per test
  session (about a minute on 2 CPU cores; tests/trained.py): a dict with its `workdir` (a str,
  named `run`), the trainer's `result`, its learning curve's last evaluation `latest`,
  `baselines`, `learner_log`, `curve_rows` and `checkpoint_steps`, read right after training.

  The work directory is shared: a test that changes a checkpoint copies the directory first. Its
  checkpoints are checked unchanged at the end of the session."""
  from tests import trained  # Loads JAX, Reverb and Launchpad: only when a test needs the run.

  if os.environ.get("PYTEST_XDIST_WORKER"):
    run = _shared_across_workers(tmp_path_factory, trained.train_tiny_run)
  else:
    run = trained.train_tiny_run(str(tmp_path_factory.mktemp("trained") / "run"))
  workdir = run["workdir"]
  digests = trained.checkpoint_digests(workdir)
  yield run
  after = trained.checkpoint_digests(workdir)
  changed = sorted(
    name for name in set(digests) | set(after) if digests.get(name) != after.get(name)
  )
  assert not changed, (
    f"a test changed the shared trained run's {changed}: copy {workdir} before changing it"
  )


def _shared_across_workers(tmp_path_factory, train_tiny_run) -> dict:
  """Under pytest-xdist (`make test`), the first worker to need the run trains it in the
  directory all workers share and saves what it returned; the others wait on a lock and read it,
  so the run is trained once per session, not once per worker. The file is this session's own
  (a temporary directory of this test run), never an input from elsewhere."""
  import fcntl
  import pickle

  shared = tmp_path_factory.getbasetemp().parent / "trained"
  shared.mkdir(exist_ok=True)
  saved = shared / "run.pkl"
  with open(shared / "lock", "w") as lock:
    fcntl.flock(lock, fcntl.LOCK_EX)
    if not saved.exists():
      run = train_tiny_run(str(shared / "run"))
      saved.write_bytes(pickle.dumps(run))
    return pickle.loads(saved.read_bytes())
