"""Cloud runs: the same Launchpad program launched on Google Cloud Vertex AI.

Launchpad's Vertex AI launch builds one Docker image per distinct node requirement (a "worker
pool"; Vertex AI allows at most 4, and the first must hold a single replica), copies a code
directory into it and pip-installs a requirements file. Here:

  learner                     1 replica on an accelerator (A100 by default)
  actor, evaluator            CPU workers (batched search is CPU-bound at our network sizes)
  replay, counter, limiter    one "services" shape with the replay's memory

`vertex_resources` resolves these without importing xmanager, so that the program for any number of
actors can be checked on a laptop; `launch_vertex_ai` needs xmanager and Google Cloud credentials.
"""

from __future__ import annotations

import dataclasses
import glob
import math
import os
import shutil
import subprocess
import sys
import tempfile
import zipfile
from typing import Any, Optional

import launchpad as lp
import numpy as np
import tree

from malloczero.common.errors import MalloczeroError
from malloczero.configs.config import Config
from malloczero.system.distributed import build_program
from malloczero.system.nodes import NodeContext

VERTEX_MAX_WORKER_POOLS = 4
REPO_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
# What a wheel build of the repository does not need (and may be large: runs, the venv).
_NOT_SOURCE = (
  ".git",
  ".venv",
  "build",
  "runs",
  "workdirs",
  "docs",
  "tests",
  "*.egg-info",
  "__pycache__",
  ".pytest_cache",
  ".hypothesis",
)


@dataclasses.dataclass(frozen=True)
class NodeResources:
  """What one replica of a node group asks for; becomes an `xm.JobRequirements`."""

  cpu: float
  ram_gib: float
  accelerator: Optional[str] = None  # xm.JobRequirements keyword, e.g. "A100", "V100", "T4".
  accelerator_count: int = 0

  def job_requirements(self) -> Any:
    from xmanager import xm

    extra = {self.accelerator: self.accelerator_count} if self.accelerator else {}
    return xm.JobRequirements(cpu=self.cpu, ram=self.ram_gib * xm.GiB, **extra)


def replay_ram_gib(config: Config) -> float:
  """Memory for a full replay table: every stored step once, with room for Reverb's chunking."""
  from malloczero.replay.types import step_spec

  step_bytes = sum(
    int(np.prod(s.shape)) * np.dtype(s.dtype).itemsize for s in tree.flatten(step_spec(config.game))
  )
  return float(max(16, math.ceil(3 * config.replay.max_size * step_bytes / 2**30)))


def vertex_resources(
  program: lp.Program, config: Config, learner_accelerator: str = "A100"
) -> dict[str, NodeResources]:
  """Per node group resources for `program`; raises MalloczeroError if Vertex AI cannot host it."""
  worker = NodeResources(cpu=4, ram_gib=8)
  services = NodeResources(cpu=8, ram_gib=replay_ram_gib(config))
  by_group = {
    "learner": NodeResources(
      cpu=8, ram_gib=32, accelerator=learner_accelerator, accelerator_count=1
    ),
    "actor": worker,
    "evaluator": worker,
    "replay": services,
    "counter": services,
    "limiter": services,
  }
  missing = sorted(set(program.groups) - set(by_group))
  if missing:
    raise MalloczeroError(f"no Vertex AI resources for node group(s) {', '.join(missing)}")
  resources = {label: by_group[label] for label in program.groups}
  pools = worker_pools(program, resources)
  if len(pools) > VERTEX_MAX_WORKER_POOLS:
    raise MalloczeroError(
      f"{len(pools)} distinct node shapes; Vertex AI allows {VERTEX_MAX_WORKER_POOLS} worker pools"
    )
  if not any(replicas == 1 for _, _, replicas in pools):
    raise MalloczeroError("Vertex AI needs a worker pool with a single replica (the learner)")
  return resources


def worker_pools(
  program: lp.Program, resources: dict[str, NodeResources]
) -> list[tuple[NodeResources, list[str], int]]:
  """Groups with equal resources share a pool, as Launchpad's Vertex AI launch groups them:
  [(resources, group labels, replicas)], the single-replica pool first."""
  pools: dict[NodeResources, tuple[list[str], int]] = {}
  for label, nodes in program.groups.items():
    labels, replicas = pools.get(resources[label], ([], 0))
    pools[resources[label]] = (labels + [label], replicas + len(nodes))
  ordered = [(r, labels, n) for r, (labels, n) in pools.items()]
  return sorted(ordered, key=lambda pool: pool[2] != 1)


def build_wheel(out_dir: str) -> str:
  """Builds this repository's wheel (pyproject.toml lists its packages and data) into `out_dir`
  from a scratch copy of the sources, so the checkout gains no build/ folder; returns its path."""
  os.makedirs(out_dir, exist_ok=True)
  with tempfile.TemporaryDirectory(prefix="malloczero-src-") as scratch:
    source = os.path.join(scratch, "src")
    shutil.copytree(REPO_ROOT, source, ignore=shutil.ignore_patterns(*_NOT_SOURCE))
    result = subprocess.run(
      [
        sys.executable,
        "-m",
        "pip",
        "wheel",
        "--quiet",
        "--no-deps",
        "--no-build-isolation",
        "--wheel-dir",
        out_dir,
        source,
      ],
      capture_output=True,
      text=True,
      check=False,
    )
  wheels = glob.glob(os.path.join(out_dir, "malloczero-*.whl"))
  if result.returncode or not wheels:
    raise MalloczeroError(
      f"building the malloczero wheel failed: "
      f"{(result.stderr or result.stdout).strip().splitlines()[-1:]}"
    )
  return wheels[0]


def stage_code(directory: str) -> str:
  """Fills `directory` with what the image needs: the `malloczero` package as its wheel installs
  it, Acme (installed here with --no-deps, which a requirements file cannot say) and the pinned
  requirements. Returns the requirements file."""
  import acme

  with tempfile.TemporaryDirectory(prefix="malloczero-wheel-") as wheel_dir:
    with zipfile.ZipFile(build_wheel(wheel_dir)) as wheel:
      wheel.extractall(directory, [n for n in wheel.namelist() if n.startswith("malloczero/")])
  shutil.copytree(
    os.path.dirname(acme.__file__),
    os.path.join(directory, "acme"),
    ignore=shutil.ignore_patterns("__pycache__", "*_test.py"),
  )
  requirements = os.path.join(directory, "requirements-docker.txt")
  with open(os.path.join(REPO_ROOT, "requirements.txt"), encoding="utf-8") as f:
    lines = [line for line in f if line.strip() and not line.startswith("#")]
  with open(requirements, "w", encoding="utf-8") as f:
    f.writelines(lines)
  return requirements


def launch_vertex_ai(
  config: Config,
  workdir: str,
  num_actors: int,
  max_steps: Optional[int] = None,
  learner_accelerator: str = "A100",
) -> Any:
  """Submits the program to Vertex AI. The work directory must be a Cloud Storage FUSE path
  (/gcs/BUCKET/...), which Vertex AI mounts in every node, so nodes share it as files."""
  if not workdir.startswith("/gcs/"):
    raise MalloczeroError(
      f"--workdir {workdir}: on vertex_ai it must be a Cloud Storage path "
      "mounted by Vertex AI, /gcs/BUCKET/..., which every node reads and writes"
    )
  try:
    from xmanager import xm  # noqa: F401  # pylint: disable=unused-import
  except ImportError:
    raise MalloczeroError(
      "--launch vertex_ai needs xmanager and Google Cloud credentials "
      "(pip install xmanager; gcloud auth application-default login); "
      "see the README's 'Cloud runs'"
    ) from None
  program = build_program(
    config, NodeContext(workdir), num_actors, max_steps or config.max_learner_steps
  )
  resources = vertex_resources(program, config, learner_accelerator)
  code = tempfile.mkdtemp(prefix="malloczero-vertex-")
  requirements = stage_code(code)
  xm_resources = {
    label: lp.DockerConfig(code, requirements, r.job_requirements())
    for label, r in resources.items()
  }
  return lp.launch(program, launch_type=lp.LaunchType.VERTEX_AI, xm_resources=xm_resources)
