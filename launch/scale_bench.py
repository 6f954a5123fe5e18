"""`malloczero bench`'s inputs at trace scale: msa and validation on generated programs of
100,000 buffers and a 200,000-row CSV, a flattened HLO step and a scanned transformer imported
and mapped, every baseline under its time limit, and the agent's policy: each measured in a
process of its own, with its peak resident memory (launch/benchmarks.py runs them)."""

from __future__ import annotations

import dataclasses
import json
import os
import subprocess
import sys
import time
from typing import Any, Optional, Sequence

import numpy as np

from malloczero.common.files import write_text
from malloczero.env.hardware import PRESETS, Hardware
from malloczero.env.programs.synthetic import contended
from malloczero.env.workload import Workload


def _scale_hardware(workload: Workload) -> Hardware:
  """tpu-v4i-like at 25% of the program's peak live bytes, its default memory made large enough
  for any program (as `_scale_child`'s: the XLA-like program at trace scale outgrows the
  preset's)."""
  preset = PRESETS["tpu-v4i-like"]
  machine = dataclasses.replace(
    preset,
    levels=(preset.levels[0], dataclasses.replace(preset.levels[1], capacity_bytes=1 << 40)),
  )
  return contended(machine, workload, 0.25)


def _agent_checkpoint(directory: str) -> str:
  """A work directory holding the tiny config's networks, freshly initialised (the agent's speed
  does not depend on training), as `solve --checkpoint` reads them; returns it."""
  import jax

  from malloczero.configs.config import get_config
  from malloczero.configs.workdir import WorkDir
  from malloczero.learner.checkpoint import save_state
  from malloczero.learner.learner import make_initial_state
  from malloczero.learner.networks import make_networks

  config = get_config("tiny")
  networks = make_networks(config.network, config.game)
  state = make_initial_state(networks, config, jax.random.PRNGKey(0))
  os.makedirs(WorkDir(directory).checkpoints, exist_ok=True)
  save_state(WorkDir(directory).learner_state, state, 0, networks)
  return directory


# The agent's solve at trace scale runs for minutes; past this it is reported as failed.
SCALE_AGENT_TIMEOUT_S = 3600.0


def bench_scale_agent(
  hlo_buffers: int = 100_000, timeout_s: float = SCALE_AGENT_TIMEOUT_S
) -> dict[str, Any]:
  """The agent as a solver at trace scale: `malloczero solve STEP.hlo --solver agent
  --simulations 0` (the network's policy alone: its argmax, then samples, and msa's attempt) on
  the generated training step `bench_scale` imports (`layered_step_hlo`, about `hlo_buffers`
  buffers once flattened), tpu-v4i-like at 25% of its peak, with the tiny config's networks, in
  a process of its own. The module is imported here first into an import cache of the bench's
  own (`scale_agent_{N}_buffers_import_s`), so the command reads it from there; its whole wall
  time (the cached workload, loading the checkpoint, compiling, the attempts, msa's attempt) is
  `scale_agent_{N}_buffers_policy_s`, with its mapping's speed-up, or why it failed."""
  import tempfile

  from malloczero.env.programs.import_cache import CACHE_DIR_ENV, import_hlo_file
  from malloczero.env.programs.synthetic_hlo import layered_step_hlo
  from malloczero.launch.hlo_input import hlo_name, hlo_source

  prefix = f"scale_agent_{hlo_buffers}_buffers"
  with tempfile.TemporaryDirectory(prefix="malloczero-bench-agent-") as tmp:
    hlo_path = os.path.join(tmp, f"step{hlo_buffers}.hlo")
    write_text(hlo_path, layered_step_hlo(hlo_buffers, seed=0))
    imports = os.path.join(tmp, "imports")
    started = time.perf_counter()
    imported = import_hlo_file(
      hlo_path, hlo_name(hlo_path), hlo_source(hlo_path), directory=imports
    )
    report: dict[str, Any] = {
      f"{prefix}_import_s": time.perf_counter() - started,
      f"{prefix}_flattened_buffers": len(imported.workload.buffers),
    }
    hardware_path = os.path.join(tmp, "hardware.json")
    write_text(hardware_path, json.dumps(_scale_hardware(imported.workload).to_dict()))
    del imported
    run = _agent_checkpoint(os.path.join(tmp, "run"))
    out = os.path.join(tmp, "mapping.json")
    command = [sys.executable, "-m", "malloczero", "solve", hlo_path, "--hardware"]
    command += [hardware_path, "--solver", "agent", "--checkpoint", run, "--simulations", "0"]
    command += ["--out", out]
    started = time.perf_counter()
    try:
      done = subprocess.run(
        command,
        capture_output=True,
        text=True,
        timeout=timeout_s,
        check=False,
        env={**os.environ, CACHE_DIR_ENV: imports},
      )
    except subprocess.TimeoutExpired:
      return {**report, f"{prefix}_policy_failed": f"timed out after {timeout_s:g} s"}
    seconds = time.perf_counter() - started
    if done.returncode != 0:
      tail = (done.stderr.strip().splitlines() or ["no output"])[-1]
      return {**report, f"{prefix}_policy_failed": f"exit {done.returncode}: {tail}"}
    with open(out, encoding="utf-8") as f:
      mapping = json.load(f)
  return {
    **report,
    f"{prefix}_policy_s": seconds,
    f"{prefix}_policy_speedup_x": mapping["slow_only_time_s"] / mapping["estimated_time_s"],
  }


# Inputs at the scale of real traces: a MiniMalloc CSV of this many rows and an XLA-like program
# of this many buffers (env/programs/synthetic.py), each solved with msa in a process of its own.
SCALE_CSV_ROWS = 200_000
SCALE_XLA_BUFFERS = 100_000
# A training step as HLO text, flattened by the importer to about this many buffers
# (env/programs/synthetic_hlo.py), and the scanned transformer's depth (scanned_transformer.py).
SCALE_HLO_BUFFERS = 100_000
LOOP_LAYERS = 100


def _peak_resident_mb() -> float:
  """This process's peak resident memory in MB: Linux's `VmHWM`, which starts again with the
  program (`ru_maxrss` keeps the peak of the process it was forked from, the bench's own)."""
  import resource

  try:
    with open("/proc/self/status") as status:
      for line in status:
        if line.startswith("VmHWM:"):
          return int(line.split()[1]) / 1024
  except OSError:
    pass
  return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def _scale_child(kind: str, path: str) -> dict[str, Any]:
  """In the measuring subprocess: loads `path` (`hlo` and `loop`: imports the HLO text, the
  import being the load), solves it with msa (which validates), validates the mapping again as
  `malloczero validate` does, and reports each phase's seconds and the peak resident MB reached
  by its end (`load_*`, `msa_*`, `validate_*`); `solve_s` is load and msa together (what a user
  waits for from the file to a validated mapping: at most 5 s for the 100,000-buffer program is
  issue 48's goal), `peak_mb` the whole run's peak. The `loop` program is mapped on tpu-v4 as it
  is, the others on a contended machine at 25% of their peak. An input the memory guard refuses
  reports the refusal's one line and how long it took. The kernels are loaded from numba's cache
  (`_warm_kernels` compiled them first, where they were not)."""
  from malloczero.common.errors import MalloczeroError
  from malloczero.env.solvers import solve
  from malloczero.env.validator import validate_mapping
  from malloczero.env.workload_json import load_workload

  peak_mb = _peak_resident_mb
  started = time.perf_counter()
  report: dict[str, Any] = {}
  try:
    if kind in ("hlo", "loop"):  # HLO text: imported (flattened) here, the import is the load.
      from malloczero.env.programs.hlo_import import import_hlo_text

      with open(path, encoding="utf-8") as f:
        workload = import_hlo_text(f.read(), os.path.basename(path)).workload
      report["buffers"], report["ops"] = workload.num_buffers, workload.num_ops
    else:
      workload = load_workload(path)
    _ = workload.arrays  # Built lazily: part of loading, not of the solver.
    report["load_s"] = time.perf_counter() - started
    report["load_peak_mb"] = peak_mb()
    if kind == "csv":
      machine = PRESETS["minimalloc"]
    elif kind == "loop":  # A real machine that holds the step, with its own on-chip memory.
      machine = PRESETS["tpu-v4"]
      report["hardware"] = machine.name
      report["peak_live_gib"] = workload.peak_live_bytes / 2**30
    else:
      machine = dataclasses.replace(
        PRESETS["tpu-v4i-like"],
        levels=(
          PRESETS["tpu-v4i-like"].levels[0],
          dataclasses.replace(PRESETS["tpu-v4i-like"].levels[1], capacity_bytes=1 << 40),
        ),
      )
    if kind != "loop":
      machine = contended(machine, workload, 0.25)
    solving = time.perf_counter()
    result = solve(workload, machine, "msa")
    report["msa_s"] = time.perf_counter() - solving
    report["msa_peak_mb"] = peak_mb()
    report["solve_s"] = time.perf_counter() - started
    checked = time.perf_counter()
    validate_mapping(workload, machine, result.mapping)
    report["validate_s"] = time.perf_counter() - checked
    report["validate_peak_mb"] = peak_mb()
    report["total_s"] = time.perf_counter() - started
    report["speedup_x"] = result.mapping.speedup
  except MalloczeroError as e:
    report["refused_s"] = time.perf_counter() - started
    report["refusal"] = str(e)
  report["peak_mb"] = peak_mb()
  return report


def _measure_in_subprocess(kind: str, path: str) -> dict[str, Any]:
  """`_scale_child` in a fresh interpreter, so that the peak resident memory is its own."""
  code = (
    "import json, sys; from malloczero.launch.scale_bench import _scale_child; "
    "print(json.dumps(_scale_child(sys.argv[1], sys.argv[2])))"
  )
  done = subprocess.run(
    [sys.executable, "-c", code, kind, path], capture_output=True, text=True, check=False
  )
  if done.returncode != 0:
    tail = (done.stderr.strip().splitlines() or ["no output"])[-1]
    return {"failed": f"exit {done.returncode}: {tail}"}
  return json.loads(done.stdout.strip().splitlines()[-1])


def _warm_kernels() -> None:
  """Compiles (into numba's cache) what the measured processes run: msa's jitted loop and the
  validator's jitted sweep, on a small program, so that a first bench on a machine measures
  loading them, not compiling them (a minute or two), as every later run does."""
  from malloczero.env import validator
  from malloczero.env.programs.synthetic import xla_like_workload
  from malloczero.env.solvers import solve

  workload = xla_like_workload(400, seed=0)
  solve(workload, contended(PRESETS["tpu-v4i-like"], workload, 0.25), "msa")
  rectangles = np.arange(4, dtype=np.int64)
  validator._kernels().any_overlap(
    np.repeat(rectangles, 2), np.tile([True, False], 4), rectangles, rectangles + 1, rectangles
  )


def bench_scale(
  csv_rows: int = SCALE_CSV_ROWS,
  xla_buffers: int = SCALE_XLA_BUFFERS,
  hlo_buffers: int = SCALE_HLO_BUFFERS,
  loop_layers: int = LOOP_LAYERS,
) -> dict[str, Any]:
  """msa (and validation) on a generated MiniMalloc CSV and XLA-like program at trace scale; a
  generated training step as HLO text, imported (flattened) and mapped; and a scanned
  transformer of `loop_layers` layers compiled by XLA (its compile time reported apart),
  imported and mapped on tpu-v4. Each is generated deterministically here and measured in its
  own process (seconds, peak MB). `scale_xla_{N}_buffers_msa_solve_s` is the file's loading and
  msa's solve together."""
  import tempfile

  from malloczero.env.programs.scanned_transformer import TransformerShape, scanned_transformer_hlo
  from malloczero.env.programs.synthetic import minimalloc_csv_text, xla_like_workload
  from malloczero.env.programs.synthetic_hlo import layered_step_hlo
  from malloczero.env.workload_json import save_workload

  _warm_kernels()
  report: dict[str, Any] = {}
  with tempfile.TemporaryDirectory(prefix="malloczero-bench-scale-") as tmp:
    csv_path = os.path.join(tmp, f"csv{csv_rows}.csv")
    write_text(csv_path, minimalloc_csv_text(csv_rows, seed=0))
    xla_path = os.path.join(tmp, f"xla{xla_buffers}.json")
    save_workload(xla_like_workload(xla_buffers, seed=0), xla_path)
    hlo_path = os.path.join(tmp, f"step{hlo_buffers}.hlo")
    write_text(hlo_path, layered_step_hlo(hlo_buffers, seed=0))
    loop_path = os.path.join(tmp, f"transformer{loop_layers}.hlo")
    compiling = time.perf_counter()
    write_text(loop_path, scanned_transformer_hlo(TransformerShape(layers=loop_layers)))
    report[f"loop_transformer_{loop_layers}_layers_xla_compile_s"] = time.perf_counter() - compiling
    for prefix, kind, path in (
      (f"scale_csv_{csv_rows}_rows_msa", "csv", csv_path),
      (f"scale_xla_{xla_buffers}_buffers_msa", "xla", xla_path),
      (f"scale_hlo_{hlo_buffers}_buffers_import_msa", "hlo", hlo_path),
      (f"loop_transformer_{loop_layers}_layers_import_msa", "loop", loop_path),
    ):
      for key, value in _measure_in_subprocess(kind, path).items():
        report[f"{prefix}_{key}"] = value
  return report


# Every baseline on an XLA-like program of this many buffers, each with this time limit.
SOLVERS_AT_SCALE_BUFFERS = 100_000
SOLVERS_AT_SCALE_LIMIT_S = 10.0
_SOLVE_CHILD = (
  "import json, sys\n"
  "from malloczero.launch.cli import main\n"
  "from malloczero.launch.scale_bench import _peak_resident_mb\n"
  "code = main(sys.argv[1:])\n"
  "print(json.dumps({'exit': code, 'peak_mb': _peak_resident_mb()}))\n"
)


def bench_solvers_at_scale(
  buffers: int = SOLVERS_AT_SCALE_BUFFERS,
  time_limit_s: float = SOLVERS_AT_SCALE_LIMIT_S,
  solvers: Optional[Sequence[str]] = None,
) -> dict[str, Any]:
  """Every baseline (`solvers`, default all) as `malloczero solve PROGRAM --solver S
  --time-limit T` in a process of its own, on the XLA-like program of `buffers` buffers,
  tpu-v4i-like at 25% of its peak: the command's wall seconds, start to exit (what a user
  waits; the time limit covers the solve, not the interpreter's start and the file's loading),
  its peak resident MB and the mapping's speed-up (`solvers_{N}_buffers_{solver}_*`)."""
  import tempfile

  from malloczero.env.programs.synthetic import xla_like_workload
  from malloczero.env.solvers.registry import SOLVERS
  from malloczero.env.workload_json import save_workload

  report: dict[str, Any] = {f"solvers_{buffers}_buffers_time_limit_s": time_limit_s}
  with tempfile.TemporaryDirectory(prefix="malloczero-bench-solvers-") as tmp:
    workload = xla_like_workload(buffers, seed=0)
    workload_path = os.path.join(tmp, "program.json")
    save_workload(workload, workload_path)
    hardware_path = os.path.join(tmp, "hardware.json")
    write_text(hardware_path, json.dumps(_scale_hardware(workload).to_dict()))
    del workload
    for solver in solvers or SOLVERS:
      prefix = f"solvers_{buffers}_buffers_{solver.replace('-', '_')}"
      out = os.path.join(tmp, f"{solver}.json")
      argv = ["solve", workload_path, "--hardware", hardware_path, "--solver", solver]
      argv += ["--time-limit", f"{time_limit_s:g}", "--out", out]
      started = time.perf_counter()
      done = subprocess.run(
        [sys.executable, "-c", _SOLVE_CHILD, *argv], capture_output=True, text=True, check=False
      )
      seconds = time.perf_counter() - started
      lines = done.stdout.strip().splitlines()
      try:
        child = json.loads(lines[-1])
      except (IndexError, ValueError):
        child = {"exit": done.returncode}
      if child.get("exit") != 0:
        tail = (done.stderr.strip().splitlines() or ["no output"])[-1]
        report[f"{prefix}_failed"] = f"exit {child.get('exit')}: {tail}"
        continue
      with open(out, encoding="utf-8") as f:
        mapping = json.load(f)
      report[f"{prefix}_wall_s"] = seconds
      report[f"{prefix}_peak_mb"] = child["peak_mb"]
      report[f"{prefix}_speedup_x"] = mapping["slow_only_time_s"] / mapping["estimated_time_s"]
  return report
