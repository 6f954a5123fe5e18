"""malloczero: memory mapping of compiled ML programs, learnt by a distributed MuZero agent.

The Python API a user needs, in one place (the command line, `malloczero ...`, is built on it)::

  import malloczero as mz

  entry = mz.get_suite("tiny").entries[0]
  workload, hardware = entry.load()
  game = mz.MsaGame(workload, hardware)             # a dm_env.Environment (msa's decisions)
  result = mz.solve(workload, hardware, "msa")       # a validated baseline mapping
  mz.validate_mapping(workload, hardware, result.mapping)

Sub-packages, one concern each (`docs/design.md` describes how they fit together):
  malloczero.env      mallocGame: workloads, hardware, cost model, requests, game, mapping,
                      validator; env.solvers (the baselines); env.programs (XLA import, model
                      zoo, suites and their data)
  malloczero.configs  the tiny / small / large presets
  malloczero.actors   batched mctx search, self-play and evaluation play, the agent as a solver
  malloczero.learner  Haiku networks, the MuZero loss, the optax learner, checkpoints
  malloczero.replay   the Reverb table, sequence writer and batch sampler
  malloczero.system   the builder, the Launchpad program and single-process trainer, evaluation
  malloczero.launch   the `malloczero` command line and bench

Importing this package loads numpy, dm_env and OR-Tools; the agent's entry points (`load_agent`,
`solve_with_agent`) load JAX and Haiku only when first used.
"""

from __future__ import annotations

import importlib
import warnings
from typing import Any

from malloczero.configs import Config, get_config
from malloczero.env import (
  PRESETS,
  CostModel,
  GameConfig,
  Hardware,
  HardwareError,
  MalloczeroError,
  Mapping,
  MappingError,
  MsaGame,
  RequestsGame,
  Workload,
  WorkloadError,
  load_hardware,
  load_mapping,
  load_workload,
  make_game,
  save_workload,
  validate_mapping,
)
from malloczero.env.programs.suites import Suite, SuiteEntry, get_suite, suite_names
from malloczero.env.solvers import SOLVERS, SolveResult, solve

__version__ = "0.1.0"

# name -> module: loaded on first use, so `import malloczero` does not pay for JAX.
_LAZY = {
  "Agent": "malloczero.actors.agent",
  "load_agent": "malloczero.actors.agent",
  "solve_with_agent": "malloczero.actors.agent",
}


# Old name -> new name: kept for one release, each use warned about.
_RENAMED = {"MallocGame": "RequestsGame"}


def __getattr__(name: str) -> Any:
  if name in _LAZY:
    return getattr(importlib.import_module(_LAZY[name]), name)
  if name in _RENAMED:
    warnings.warn(
      f"malloczero.{name} is now malloczero.{_RENAMED[name]}; the old name goes in the next "
      "release",
      DeprecationWarning,
      stacklevel=2,
    )
    return globals()[_RENAMED[name]]
  raise AttributeError(f"module 'malloczero' has no attribute '{name}'")


__all__ = [
  "Agent",
  "Config",
  "CostModel",
  "GameConfig",
  "Hardware",
  "HardwareError",
  "RequestsGame",
  "Mapping",
  "MappingError",
  "MalloczeroError",
  "MsaGame",
  "PRESETS",
  "SOLVERS",
  "SolveResult",
  "Suite",
  "SuiteEntry",
  "Workload",
  "WorkloadError",
  "get_config",
  "get_suite",
  "load_agent",
  "load_hardware",
  "load_mapping",
  "load_workload",
  "make_game",
  "save_workload",
  "solve",
  "solve_with_agent",
  "suite_names",
  "validate_mapping",
]
