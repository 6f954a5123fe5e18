"""`malloczero bench`: speed of the game, the cost model and the agent, as JSON and a table.

Every key names its unit. The game and cost model run in this process on one core; the agent's
search, acting and learner figures use the CPU through XLA (all cores) and exclude compilation,
which is reported separately. Nothing here is asserted by the tests (they only check that the
report is well formed).
"""

from __future__ import annotations

import dataclasses
import json
import os
import platform
import time
from typing import Any, Callable

import dm_env
import numpy as np
from rich.table import Table

from malloczero.common.files import write_text
from malloczero.env.cost_model import CostModel
from malloczero.env.game import RequestsGame, make_game
from malloczero.env.game.game import MsaGame
from malloczero.env.hardware import PRESETS, Hardware
from malloczero.env.placement import Placement
from malloczero.env.programs.synthetic import contended, random_workload
from malloczero.env.simulator import total_stall, total_stall_loop
from malloczero.env.solvers import get_solver
from malloczero.env.solvers.evo import decode
from malloczero.env.workload import Workload
from malloczero.launch.scale_bench import (
  bench_scale,
  bench_scale_agent,
  bench_solvers_at_scale,
)

NOTE = (
  "single process; game steps include building the observation and re-simulating the "
  "copy queue; agent figures use all "
  "cores through XLA and exclude compilation"
)
# Text longer than this is printed under the table, wrapped, so the table stays ~100 columns.
LONGEST_CELL = 30

# ~1,000 requests (~1,700 msa decisions) on tpu-v4i-like at 25% of peak live bytes; ~2,000
# buffers for evaluation.
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


def _random_episode(game: dm_env.Environment, rng: np.random.Generator) -> int:
  ts = game.reset()
  steps = 0
  while not ts.last():
    legal = np.flatnonzero(ts.observation["legal_actions"])
    ts = game.step(legal[rng.integers(len(legal))])
    steps += 1
  return steps


def _game_program(hardware: str = "tpu-v4i-like") -> tuple[Workload, Hardware]:
  """The ~1,000-request program the game, search and acting figures are measured on."""
  workload = random_workload(7, GAME_PROGRAM_OPS)
  return workload, contended(PRESETS[hardware], workload, 0.25)


def _initial_agent(config: Any) -> tuple[Any, Any]:
  """(networks, freshly initialised params) of a config; speed does not depend on training."""
  import jax

  from malloczero.learner.learner import make_initial_state
  from malloczero.learner.networks import make_networks

  networks = make_networks(config.network, config.game)
  return networks, make_initial_state(networks, config, jax.random.PRNGKey(0)).params


def bench_game(seconds: float, hardware: str = "tpu-v4i-like") -> dict[str, Any]:
  """Random legal play of the game every config plays by default (msa's decision points,
  env/game/game.py), and of the requests game (env/game/requests_game.py), on the same program."""
  workload, machine = _game_program(hardware)
  report: dict[str, Any] = {"game_program": workload.name, "game_hardware": hardware}
  for prefix, game in (
    ("game", MsaGame(workload, machine)),
    ("requests_game", RequestsGame(workload, machine)),
  ):
    rng = np.random.default_rng(0)
    moves = _random_episode(game, rng)  # warm-up (and numba's first call)
    steps_per_s, steps = _rate(lambda: _random_episode(game, rng), seconds)
    report.update(
      {
        f"{prefix}_steps_per_episode": moves,
        f"{prefix}_steps_measured": steps,
        f"{prefix}_steps_per_s": steps_per_s,
        f"{prefix}_step_us": 1e6 / steps_per_s,
      }
    )
  return report


def bench_cost_model(seconds: float) -> dict[str, Any]:
  workload = random_workload(11, EVAL_PROGRAM_OPS, num_parameters=500)
  game = RequestsGame(workload, contended(PRESETS["tpu-v4i-like"], workload, 0.25))
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
  # The copy queue of the whole mapping re-simulated, as the game does after a placement.
  resolved = model.resolve(allocations)
  copies = model.copies(resolved)
  evaluation = model.evaluate(resolved)
  slow = model.slow_memory_time  # The idle times themselves do not change the simulation's cost.
  idle = model.idle_time(evaluation.op_time_s, slow)
  simulations_per_s, _ = _rate(lambda: (total_stall(idle, copies), 1)[1], seconds)
  total_stall_loop(idle, copies)  # numba: compile or load from its cache first
  loops_per_s, _ = _rate(lambda: (total_stall_loop(idle, copies), 1)[1], seconds)
  return {
    **bench_evo_decode(model, seconds),
    "eval_program_buffers": workload.num_buffers,
    "eval_program_ops": workload.num_ops,
    "eval_mapping_allocations": len(allocations),
    "eval_mapping_copies": len(copies),
    "copy_simulations_per_s": simulations_per_s,
    "copy_simulation_us": 1e6 / simulations_per_s,
    "copy_stall_loop_us": 1e6 / loops_per_s,  # The msa game's per-step re-simulation.
    "cost_model_full_evaluations_per_s": evals_per_s,
    "cost_model_full_evaluation_ms": 1e3 / evals_per_s,
    "cost_model_incremental_updates_per_s": updates_per_s,
    "cost_model_incremental_update_us": 1e6 / updates_per_s,
  }


def bench_evo_decode(model: CostModel, seconds: float) -> dict[str, Any]:
  """evo's decode of a random genome over `model`'s program's requests (evo's: activations
  split, late prefetches offered): jitted (`Placement.place_in_order`, what evo runs) and one
  request at a time in Python (what it replaced, the same placements)."""
  requests = get_solver("evo").requests(model)
  placement = Placement(model, requests)
  genome = np.random.default_rng(2).random(len(requests))
  order = np.argsort(-genome, kind="stable")
  decode(placement, genome)  # numba: compile or load from its cache first
  jitted_per_s, _ = _rate(lambda: (decode(placement, genome), 1)[1], seconds)

  def one_at_a_time() -> int:
    placement.reset()
    for r in order:
      placement.place_where_it_saves_most(int(r), fit="best")
    return 1

  python_per_s, _ = _rate(one_at_a_time, seconds)
  return {
    "evo_decode_requests": len(requests),
    "evo_decode_ms": 1e3 / jitted_per_s,
    "evo_decode_one_request_at_a_time_ms": 1e3 / python_per_s,
  }


def _game_observations(
  game: dm_env.Environment, count: int, seed: int
) -> list[dict[str, np.ndarray]]:
  """`count` observations from a random-policy episode of `game`, spread over the episode."""
  rng = np.random.default_rng(seed)
  observations = []
  ts = game.reset()
  while not ts.last():
    observations.append(ts.observation)
    legal = np.flatnonzero(ts.observation["legal_actions"])
    ts = game.step(legal[rng.integers(len(legal))])
  picks = np.linspace(0, len(observations) - 1, count).astype(int)
  return [observations[i] for i in picks]


def bench_search(preset: str, batch: int, simulations: int, calls: int) -> dict[str, Any]:
  """One jitted Gumbel MuZero search over `batch` real observations with the preset's networks."""

  import jax

  from malloczero.actors.actor import stack_observations
  from malloczero.actors.search import make_search_fn
  from malloczero.configs.config import get_config

  config = get_config(preset)
  search_config = dataclasses.replace(config.search, num_simulations=simulations)
  networks, params = _initial_agent(config)
  game = make_game(*_game_program(), config.game)
  observation = stack_observations(_game_observations(game, batch, seed=0))
  search = make_search_fn(networks, search_config)
  key = jax.random.PRNGKey(1)
  start = time.perf_counter()
  jax.block_until_ready(search(params, key, observation))
  compile_s = time.perf_counter() - start
  start = time.perf_counter()
  for _ in range(calls):
    key, sub = jax.random.split(key)
    output = search(params, sub, observation)
  jax.block_until_ready(output)
  per_call = (time.perf_counter() - start) / calls
  return {
    f"search_{preset}_batch": batch,
    f"search_{preset}_simulations": simulations,
    f"search_{preset}_compile_s": compile_s,
    f"search_{preset}_ms_per_call": 1e3 * per_call,
    f"search_{preset}_moves_per_s": batch / per_call,
    f"search_{preset}_simulations_per_s": batch * simulations / per_call,
  }


def bench_acting(preset: str, batch: int, steps: int) -> dict[str, Any]:
  """The batched actor end to end (search + game steps + observation stacking), no replay."""

  from malloczero.actors.actor import BatchedActor, acting_moves_per_s
  from malloczero.actors.games import GamePool, GameSpec
  from malloczero.actors.variable_client import VariableClient
  from malloczero.configs.config import get_config

  config = get_config(preset)
  config = dataclasses.replace(config, actor=dataclasses.replace(config.actor, num_games=batch))
  networks, params = _initial_agent(config)

  class _Fixed:
    def get_variables(self):
      return params

  workload, machine = _game_program()
  spec = GameSpec(workload.name, workload, machine)
  actor = BatchedActor(
    networks,
    config,
    GamePool([spec], config.game, batch),
    VariableClient(_Fixed(), update_period=10**9),
  )
  return {
    f"acting_{preset}_batch": batch,
    f"acting_{preset}_simulations": config.search.num_simulations,
    f"acting_{preset}_moves_per_s": acting_moves_per_s(actor, steps),
  }


def learner_updates_per_s(config: Any, num_updates: int = 20, num_batches: int = 4) -> float:
  """Learner SGD steps per second on in-memory random batches (no Reverb), after compilation.

  Goes through `MuZeroLearner.step()`, so host-to-device transfer, importance weights and the
  metrics' device-to-host copy are included (and reanalyse, where the config has it on);
  sampling from replay is not."""
  from malloczero.learner.fakes import random_batch
  from malloczero.learner.learner import MuZeroLearner
  from malloczero.learner.networks import make_networks
  from malloczero.system.builder import make_reanalyse_search

  batch_size = config.learner.batch_size
  batches = [random_batch(config, batch_size, seed) for seed in range(num_batches)]
  counter = iter(range(1 << 62))
  networks = make_networks(config.network, config.game)
  learner = MuZeroLearner(
    networks,
    config,
    lambda: batches[next(counter) % num_batches],
    seed=config.seed,
    reanalyse_search=make_reanalyse_search(networks, config),
  )
  learner.step()  # Compiles.
  learner.step()
  start = time.perf_counter()
  for _ in range(num_updates):
    learner.step()
  return num_updates / (time.perf_counter() - start)


def bench_learner(preset: str, batch: int, unroll: int, updates: int) -> dict[str, Any]:

  from malloczero.configs.config import get_config

  config = get_config(preset)
  config = dataclasses.replace(
    config, learner=dataclasses.replace(config.learner, batch_size=batch, unroll_steps=unroll)
  )
  rate = learner_updates_per_s(config, num_updates=updates)
  return {
    f"learner_{preset}_batch": batch,
    f"learner_{preset}_unroll": unroll,
    f"learner_{preset}_td_steps": config.learner.td_steps,
    f"learner_{preset}_updates_per_s": rate,
    f"learner_{preset}_samples_per_s": rate * batch,
  }


def run_agent_bench(quick: bool) -> dict[str, Any]:
  """The agent's speed on CPU: search (B = 64, 32 simulations), acting, learner (B = 256, K = 5)."""
  report: dict[str, Any] = {}
  presets = ("small",) if quick else ("tiny", "small", "large")
  for preset in presets:
    report.update(bench_search(preset, batch=64, simulations=32, calls=5 if quick else 30))
  report.update(bench_acting("small", batch=64, steps=5 if quick else 40))
  for preset in presets:
    report.update(bench_learner(preset, batch=256, unroll=5, updates=3 if quick else 20))
  return report


def bench_distributed(
  num_actors: int,
  seconds: float,
  config_name: str = "small",
) -> dict[str, float]:
  """A short local_mp training run (its own work directory, deleted after); rates over the part
  of the run in which the learner was stepping, from the launcher's periodic samples."""
  import shutil
  import tempfile

  from malloczero.configs.config import get_config
  from malloczero.system.distributed import launch_training

  config = get_config(config_name)
  workdir = tempfile.mkdtemp(prefix=f"malloczero-bench-{num_actors}-")
  try:
    result = launch_training(
      config,
      workdir,
      launch="local_mp",
      num_actors=num_actors,
      max_steps=10**9,
      max_seconds=seconds,
      final_report=False,
      print_fn=lambda _: None,
    )
  finally:
    shutil.rmtree(workdir, ignore_errors=True)
  steady = [s for s in result.samples if s.learner_steps > 0]
  if len(steady) < 2:
    return {
      "learner_updates_per_s": 0.0,
      "actor_moves_per_s": 0.0,
      "actor_probes_per_s": 0.0,
      "samples_per_insert": 0.0,
    }
  first, last = steady[0], steady[-1]
  elapsed = last.elapsed_s - first.elapsed_s
  return {
    "learner_updates_per_s": (last.learner_steps - first.learner_steps) / elapsed,
    "actor_moves_per_s": (last.actor_moves - first.actor_moves) / elapsed,
    # The actors' probes (the `small` preset gives them 0.6 of their time): fewer moves per second.
    "actor_probes_per_s": (last.probes - first.probes) / elapsed,
    "samples_per_insert": (last.samples - first.samples) / max(1, last.inserts - first.inserts),
    "startup_s": first.elapsed_s,
  }


def run_distributed_bench(seconds: float = 150.0) -> dict[str, Any]:
  """End-to-end scaling: local_mp runs of the small config with 1, 2 (and 4 where there are at
  least 8 cores) actors."""
  counts = [1, 2] + ([4] if (os.cpu_count() or 1) >= 8 else [])
  report: dict[str, Any] = {"e2e_config": "small", "e2e_seconds": seconds}
  for n in counts:
    for key, value in bench_distributed(n, seconds).items():
      report[f"e2e_{n}_actors_{key}"] = value
  return report


def run_bench(quick: bool, agent: bool = True, scale: bool = True) -> dict[str, Any]:
  """Every figure `bench` reports: the game and the cost model; inputs at scale unless `scale`
  is off (about 25 s, in --quick too: msa at 100,000 buffers is a figure to keep an eye on); the
  agent unless `agent` is off; `quick` shortens the measurements and leaves out the slower
  presets, the 3-level game and the end-to-end runs."""
  seconds = 1.5 if quick else 6.0
  report: dict[str, Any] = {
    "quick": quick,
    "python": platform.python_version(),
    "numpy": np.__version__,
    "cpu_count": os.cpu_count(),
    "machine": platform.machine(),
    "note": NOTE,
  }
  report.update(bench_game(seconds))
  if not quick:
    three_level = bench_game(seconds, "nnpi-like")
    report.update({f"nnpi_{k}": v for k, v in three_level.items()})
  report.update(bench_cost_model(seconds))
  if scale:
    report.update(bench_scale())
    if not quick:
      report.update(bench_solvers_at_scale())
  if agent:
    report.update(run_agent_bench(quick))
    if not quick:
      report.update(bench_scale_agent())
      report.update(run_distributed_bench())
  return report


def report_table(report: dict[str, Any], title: str) -> Table:
  """The console table: a row per figure (numbers with thousands separators); text too long for
  a cell (the note) goes under the table as its caption, wrapped to the table's width."""
  table = Table(title=title, caption_justify="left")
  table.add_column("metric", no_wrap=True)
  table.add_column("value", justify="right", max_width=LONGEST_CELL)
  captions = []
  for key, value in report.items():
    if isinstance(value, float):
      value = f"{value:,.1f}" if abs(value) >= 100 else f"{value:.4g}"
    if len(str(value)) > LONGEST_CELL:
      captions.append(f"{key}: {value}")
    else:
      table.add_row(key, str(value))
  table.caption = "\n".join(captions) or None
  return table


def write_report(report: dict[str, Any], path: str | None) -> None:
  if path:
    write_text(path, json.dumps(report, indent=1))
