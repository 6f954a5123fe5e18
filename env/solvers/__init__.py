"""Baseline solvers. msa builds its own segments (XLA's loop); random plays the msa game's
decision points; the others place the requests game's requests through the same `Placement`
rules. Every mapping is timed by the same cost model and checked by the independent validator
before it is returned. Each solver is one record of `registry.BASELINES`."""

from __future__ import annotations

import dataclasses
import time
from typing import Any

from malloczero.common.errors import MalloczeroError
from malloczero.env.cost_model import CostModel
from malloczero.env.game import REQUESTS_GAME, GameConfig, make_game
from malloczero.env.hardware import Hardware, check_fits
from malloczero.env.mapping import Mapping
from malloczero.env.placement import Placement
from malloczero.env.solvers.cpsat import cpsat
from malloczero.env.solvers.evo import evo
from malloczero.env.solvers.evo_msa import evo_msa
from malloczero.env.solvers.heuristics import bestfit_play, greedy, msa_simple, random_play
from malloczero.env.solvers.registry import BASELINES, SOLVERS, Solver
from malloczero.env.validator import validate_mapping
from malloczero.env.workload import Workload


def pack(placement: Placement, **options: Any) -> dict:
  """The MiniMalloc-style packer (`packing.py`), imported on first use so that importing the
  solvers does not load numba, which its jitted search needs."""
  return BASELINES["pack"].run(placement, **options)


def msa(model: CostModel, **options: Any) -> tuple[Mapping, dict]:
  """XLA's memory-space assignment (env/msa/algorithm.py): its own segments, prefetches at the
  picker's starts and evictions, outside the game's request space. `options` are `MsaOptions`
  fields; a time limit is accepted and not needed (msa is one greedy pass)."""
  return BASELINES["msa"].run(model, **options)


@dataclasses.dataclass(frozen=True)
class SolveResult:
  mapping: Mapping
  solve_time_s: float
  info: dict[str, Any]

  @property
  def speedup(self) -> float:
    """All-slow time over the mapping's time."""
    return self.mapping.speedup


def get_solver(name: str) -> Solver:
  if name not in BASELINES:
    raise MalloczeroError(f"unknown solver '{name}' (choose from {', '.join(SOLVERS)})")
  return BASELINES[name]


def solve(
  workload: Workload,
  hardware: Hardware,
  solver: str,
  game_config: GameConfig = REQUESTS_GAME,
  **options: Any,
) -> SolveResult:
  """Runs a baseline; the returned mapping has passed `validate_mapping`.

  `solve_time_s` is the whole solve as a user waits for it: building the cost model, the
  requests (and the game, for the game's players) and the solver's own model, then solving;
  only the validation after it is left out. A `time_limit_s` option bounds that same span: what
  building took is taken from the solver's share."""
  spec = get_solver(solver)
  check_fits(hardware, workload.peak_live_bytes, workload.name)
  started = time.perf_counter()
  limit = options.get("time_limit_s")
  deadline = None if limit is None else started + float(limit)

  def left() -> None:  # What building the solver's inputs left of its time limit.
    if deadline is not None:
      options["time_limit_s"] = max(0.0, deadline - time.perf_counter())

  model = CostModel(workload, hardware)
  requests = spec.requests(model)
  left()
  if spec.kind == "model":
    mapping, info = spec.run(model, **options)
  elif spec.kind == "game":
    try:
      game = make_game(
        workload, hardware, dataclasses.replace(game_config, decisions=spec.game_config.decisions)
      )
    except MalloczeroError:
      game = None  # Nothing to play (no request; no decision for msa): the empty mapping below.
    if game is not None:
      left()
      info = spec.run(game, **options)
      mapping = game.mapping(solver)
    else:
      info = {"note": "no request fits in fast memory and saves time there"}
      mapping = Placement(model, requests).mapping(solver)
  else:
    placement = Placement(model, requests)
    info = (
      spec.run(placement, **options)
      if len(requests)
      else {"note": "no request fits in fast memory and saves time there"}
    )
    mapping = placement.mapping(solver)
  elapsed = time.perf_counter() - started
  validate_mapping(workload, hardware, mapping)
  return SolveResult(mapping, elapsed, dict(info, requests=len(requests)))


__all__ = [
  "BASELINES",
  "SOLVERS",
  "Solver",
  "SolveResult",
  "get_solver",
  "solve",
  "msa",
  "msa_simple",
  "greedy",
  "evo",
  "evo_msa",
  "cpsat",
  "pack",
  "random_play",
  "bestfit_play",
]
