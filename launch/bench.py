"""`malloczero bench`: speed of the game and the cost model, written as JSON and a table.

Every key names its unit. Timings are taken in this process on one core; nothing here is
asserted by the tests (they only check that the report is well formed).
"""

from __future__ import annotations

import json
import os
import platform
import time
from typing import Any, Callable

import numpy as np

from env.game import MallocGame
from env.hardware import PRESETS
from env.synthetic import contended, random_workload

# ~1,000 requests on tpu-v4i-like at 25% of peak live bytes; ~2,000 buffers for evaluation.
GAME_PROGRAM_OPS = 700
EVAL_PROGRAM_OPS = 1500


def _rate(fn: Callable[[], int], seconds: float) -> tuple[float, int]:
  """Calls `fn` (which returns how many units it did) until `seconds` pass; units per second."""
  done, t0 = 0, time.perf_counter()
  while True:
    done += fn()
    elapsed = time.perf_counter() - t0
    if elapsed >= seconds:
      return done / elapsed, done


def _random_episode(game: MallocGame, rng: np.random.Generator) -> int:
  ts = game.reset()
  steps = 0
  while not ts.last():
    legal = np.flatnonzero(ts.observation["legal_actions"])
    ts = game.step(legal[rng.integers(len(legal))])
    steps += 1
  return steps


def bench_game(seconds: float, hardware: str = "tpu-v4i-like") -> dict[str, Any]:
  workload = random_workload(7, GAME_PROGRAM_OPS)
  game = MallocGame(workload, contended(PRESETS[hardware], workload, 0.25))
  rng = np.random.default_rng(0)
  _random_episode(game, rng)  # warm-up
  steps_per_s, steps = _rate(lambda: _random_episode(game, rng), seconds)
  return {"game_program": workload.name, "game_hardware": hardware,
          "game_requests_per_episode": len(game.requests), "game_steps_measured": steps,
          "game_steps_per_s": steps_per_s, "game_step_us": 1e6 / steps_per_s}


def bench_cost_model(seconds: float) -> dict[str, Any]:
  workload = random_workload(11, EVAL_PROGRAM_OPS, num_parameters=500)
  game = MallocGame(workload, contended(PRESETS["tpu-v4i-like"], workload, 0.25))
  _random_episode(game, np.random.default_rng(1))
  allocations, model = game.allocations(), game.cost_model
  evals_per_s, _ = _rate(lambda: (model.evaluate(allocations), 1)[1], seconds)
  # The incremental update of one placement, on the all-slow state.
  memory = model.slow_memory_time.copy()
  op_time = np.maximum(model.compute_time, memory)
  req = game.requests
  def updates() -> int:
    for r in range(len(req)):
      ops, nbytes = req.ops(r)
      model.placement_delta(memory, op_time, ops, nbytes, 0, float(req.exposed_copy_time[r]))
    return len(req)
  updates_per_s, _ = _rate(updates, seconds)
  return {"eval_program_buffers": workload.num_buffers, "eval_program_ops": workload.num_ops,
          "eval_mapping_allocations": len(allocations),
          "cost_model_full_evaluations_per_s": evals_per_s,
          "cost_model_full_evaluation_ms": 1e3 / evals_per_s,
          "cost_model_incremental_updates_per_s": updates_per_s,
          "cost_model_incremental_update_us": 1e6 / updates_per_s}


def run_bench(quick: bool) -> dict[str, Any]:
  seconds = 1.5 if quick else 6.0
  report: dict[str, Any] = {
      "quick": quick, "python": platform.python_version(), "numpy": np.__version__,
      "cpu_count": os.cpu_count(), "machine": platform.machine(),
      "note": "single process, one core; game steps include building the observation"}
  report.update(bench_game(seconds))
  if not quick:
    three_level = bench_game(seconds, "nnpi-like")
    report.update({f"nnpi_{k}": v for k, v in three_level.items()})
  report.update(bench_cost_model(seconds))
  return report


def write_report(report: dict[str, Any], path: str | None) -> None:
  if path:
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    with open(path, "w", encoding="utf-8") as f:
      json.dump(report, f, indent=1)
