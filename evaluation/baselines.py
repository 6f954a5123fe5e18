"""The cheap baselines every training run and its report compare the agent with, and their
speed-ups on a run's programs, kept in the work directory's baselines.json beside the user's
baseline cache (evaluation/baseline_cache.py)."""

from __future__ import annotations

import json
import os
from typing import Optional, Sequence

from malloczero.actors.games import GameSpec
from malloczero.common.files import write_text
from malloczero.configs.workdir import WorkDir
from malloczero.env.solvers.registry import BASELINES as BASELINES_REGISTRY
from malloczero.evaluation.baseline_cache import BaselineCache, open_cache

BASELINES = ("msa", "greedy", "bestfit", "random")
# The registry's versions (env/solvers/registry.py): a work directory's speed-ups cached for
# another version of a baseline are computed again (a missing version is 1).
BASELINE_VERSIONS = {b: BASELINES_REGISTRY[b].version for b in BASELINES}


def baseline_speedups(
  specs: Sequence[GameSpec],
  workdir: str | None = None,
  seed: int = 0,
  cache: Optional[BaselineCache] = None,
) -> dict[str, dict[str, float]]:
  """{solver: {program: speed-up}} for the cheap baselines; kept in workdir/baselines.json
  with each baseline's version (`BASELINE_VERSIONS`): a baseline kept at another version is
  computed again. What is computed goes through `cache` (default: the user's baseline cache,
  evaluation/baseline_cache.py), which evaluations share."""
  path = WorkDir(workdir).baselines if workdir else None
  cached: dict[str, dict[str, float]] = {}
  if path and os.path.exists(path):
    with open(path, encoding="utf-8") as f:
      cached = json.load(f)
    versions = cached.pop("versions", {})
    cached = {b: v for b, v in cached.items() if versions.get(b, 1) == BASELINE_VERSIONS.get(b, 1)}
  names = [s.name for s in specs]
  if all(all(n in cached.get(b, {}) for n in names) for b in BASELINES):
    return cached
  result = {b: dict(cached.get(b, {})) for b in BASELINES}
  cache = cache or open_cache()
  for spec in specs:
    for solver in BASELINES:
      if spec.name not in result[solver]:
        options = {"seed": seed} if solver == "random" else {}
        result[solver][spec.name] = cache.solve(
          spec.workload, spec.hardware, solver, **options
        ).speedup
  if path:
    # A Vertex AI run's evaluator can reach here before any node has made the work directory.
    os.makedirs(os.path.dirname(path), exist_ok=True)
    write_text(path, json.dumps(dict(result, versions=BASELINE_VERSIONS), indent=1))
  return result
