"""OR-Tools CP-SAT over the game's requests: the cost model without copy contention, time-limited.

Variables: for each request r and each fast level l where it fits, a presence literal x[r,l] and an
aligned offset; a fixed time interval (the request's window) and an address interval, both
optional on x[r,l]; at most one level per request; NoOverlap2D per level. Objective: the program
time itself, sum over ops of y_t with y_t >= compute_t and y_t >= slow memory time_t - sum of
the memory time saved by the requests placed that touch op t, plus exposed copy time of placed
prefetches. Times are integers in units of 1e-9 of the all-slow time, so the objective and the
proven bound are exact up to that rounding; the returned mapping is re-evaluated exactly.

Offsets are free (any aligned address), a superset of the game's gap-start candidates. The
msa-simple mapping (the request-space msa, heuristics.py) is given as a hint.

Copy contention is not modelled: a prefetch costs its exposed copy time against the reference
time of the ops before its use, alone on the copy engine, as the cost model charged before copy
contention. The returned mapping is evaluated (and validated) with the contended simulator, but
the objective and the proven bound are of the uncontended model: they bound neither the
simulated program time nor what a game player can reach, and `info["bound_note"]` says so.

`time_limit_s` bounds the whole call: the msa-simple hint and building the model are taken from it
and
CP-SAT searches for what is left (`solve()` has already taken out building the requests). A
limit spent before the search starts returns the msa-simple hint, said so in `fallback`.

CP-SAT searches in a child process (`_SolveProcess`): its native search holds the calling thread
and heeds neither a signal nor, in presolve, its own `StopSearch`, so a SIGTERM or Ctrl-C would
wait for its time limit. The child is killed at once when the command stops, and at the time limit
plus `OVERRUN_GRACE_S` if CP-SAT overruns it; the hint is then the answer, said so in `fallback`.
"""

from __future__ import annotations

import os
import struct
import subprocess
import sys
import time

import numpy as np
from ortools.sat import cp_model_pb2
from ortools.sat.python import cp_model

from malloczero.env.placement import Placement
from malloczero.env.solvers.heuristics import CUT_GRACE_S, msa_simple

UNITS_PER_SLOW_ONLY_TIME = 1e9
DEFAULT_TIME_LIMIT_S = 10.0
DEFAULT_WORKERS = 2  # Search threads.
# On a program too large for the time limit: the share of it the hint (msa-simple) may take, and
# the requests added to the model between two looks at the clock.
HINT_SHARE = 0.5
BUILD_CLOCK_EVERY = 256
# How long past its time limit CP-SAT may take to return before its process is killed.
OVERRUN_GRACE_S = 1.0
BOUND_NOTE = "bound of the model without copy contention: not a bound on the simulated program time"


# The child: reads two length-prefixed messages (SatParameters, CpModelProto) from stdin, writes
# the CpSolverResponse to stdout. It dies with its parent (PR_SET_DEATHSIG, Linux) and leaves
# Ctrl-C to the parent, which kills it.
_CHILD_CODE = """
import ctypes, os, signal, struct, sys
signal.signal(signal.SIGINT, signal.SIG_IGN)
try:
  ctypes.CDLL(None).prctl(1, signal.SIGKILL)
except (AttributeError, OSError):
  pass
if os.getppid() != int(sys.argv[1]):
  sys.exit(1)
from ortools.sat.python import swig_helper
def read():
  (n,) = struct.unpack("<Q", sys.stdin.buffer.read(8))
  return sys.stdin.buffer.read(n)
parameters, model = read(), read()
wrapper = swig_helper.SolveWrapper()
swig_helper.SolveWrapper.SetSerializedParameters(parameters, wrapper)
sys.stdout.buffer.write(swig_helper.SolveWrapper.SerializedSolve(model, wrapper))
"""


class _SolveProcess:
  """One CP-SAT solve in a child process, started early so that its import overlaps building the
  model; `close()` kills it if it still runs."""

  def __init__(self):
    self._process = subprocess.Popen(
      [sys.executable, "-c", _CHILD_CODE, str(os.getpid())],
      stdin=subprocess.PIPE,
      stdout=subprocess.PIPE,
      stderr=subprocess.PIPE,
    )

  def solve(
    self, model: cp_model.CpModel, solver: cp_model.CpSolver, wait_s: float
  ) -> cp_model_pb2.CpSolverResponse | None:
    """The response, or None if the child did not answer within `wait_s` seconds (then killed)
    or died (its last line of stderr is not a result worth reporting: the hint stands in)."""
    message = b"".join(
      struct.pack("<Q", len(part)) + part
      for part in (solver.parameters.SerializeToString(), model.Proto().SerializeToString())
    )
    try:
      out, _ = self._process.communicate(message, timeout=wait_s)
    except subprocess.TimeoutExpired:
      self.close()
      return None
    if self._process.returncode != 0:
      return None
    return cp_model_pb2.CpSolverResponse.FromString(out)

  def close(self) -> None:
    if self._process.poll() is None:
      self._process.kill()
    self._process.wait()
    for stream in (self._process.stdin, self._process.stdout, self._process.stderr):
      stream.close()


def cpsat(
  placement: Placement,
  time_limit_s: float = DEFAULT_TIME_LIMIT_S,
  workers: int = DEFAULT_WORKERS,
  seed: int = 0,
) -> dict:
  """Places `placement`'s requests by CP-SAT within `time_limit_s`; returns the solve's details
  (status, bound, build time, and `fallback` when the msa-simple hint is the answer)."""
  process = _SolveProcess()
  try:
    return _cpsat(placement, time_limit_s, workers, seed, process)
  finally:
    process.close()


def _cpsat(
  placement: Placement, time_limit_s: float, workers: int, seed: int, process: _SolveProcess
) -> dict:
  model_cost, req, hw = placement.model, placement.requests, placement.hardware
  unit = model_cost.slow_only_time / UNITS_PER_SLOW_ONLY_TIME
  align = hw.alignment_bytes
  inv = model_cost.inverse_bandwidth
  cap = placement.capacity
  t0 = time.perf_counter()

  deadline = t0 + float(time_limit_s)
  placement.reset()
  # On a program too large for the limit (100,000 buffers), the hint takes half of it at most.
  msa_simple(placement, t0 + HINT_SHARE * float(time_limit_s) + CUT_GRACE_S)
  hint = {(r, level): offset for r, level, offset in placement.placed}
  hint_time = placement.total_time
  # The hint stays in `placement` until CP-SAT has a solution: a fallback has nothing to replay.

  def fallback(why: str, variables: int = 0, built_s: float | None = None) -> dict:
    spent = time.perf_counter() - t0
    return {
      "status": "unknown",
      "bound_s": 0.0,
      "bound_note": BOUND_NOTE,
      "model_build_s": spent if built_s is None else built_s,
      "model_build_and_solve_s": spent,
      "variables": variables,
      "fallback": f"msa-simple ({why})",
    }

  m = cp_model.CpModel()
  choices: list[tuple[int, int, cp_model.IntVar, cp_model.IntVar]] = []
  time_intervals = [[] for _ in range(placement.num_fast)]
  address_intervals = [[] for _ in range(placement.num_fast)]
  op_terms: dict[int, list[tuple[int, cp_model.IntVar]]] = {}
  exposed_terms = []
  for r in range(len(req)):
    if r % BUILD_CLOCK_EVERY == 0 and time.perf_counter() > deadline:
      return fallback(f"building the model reached the time limit at request {r} of {len(req)}")
    size, start, end = int(req.size[r]), int(req.start[r]), int(req.end[r])
    ops, nbytes = req.ops(r)
    here = []
    for level in range(placement.num_fast):
      if size > cap[level]:
        continue
      present = m.NewBoolVar(f"x{r}_{level}")
      slot = m.NewIntVar(0, int((cap[level] - size) // align), f"k{r}_{level}")
      time_intervals[level].append(
        m.NewOptionalFixedSizeIntervalVar(start, end - start, present, f"t{r}_{level}")
      )
      address_intervals[level].append(
        m.NewOptionalFixedSizeIntervalVar(slot * align, size, present, f"a{r}_{level}")
      )
      saved = nbytes * (inv[-1] - inv[level]) / unit
      for t, s in zip(ops.tolist(), np.rint(saved).astype(np.int64).tolist()):
        if s > 0:
          op_terms.setdefault(t, []).append((s, present))
      exposed = int(round(float(req.exposed_copy_time[r]) / unit))
      if exposed:
        exposed_terms.append((exposed, present))
      hinted = hint.get((r, level))
      m.AddHint(present, hinted is not None)
      m.AddHint(slot, (hinted or 0) // align)
      choices.append((r, level, present, slot))
      here.append(present)
    if len(here) > 1:
      m.AddAtMostOne(here)
  for level in range(placement.num_fast):
    m.AddNoOverlap2D(time_intervals[level], address_intervals[level])

  compute = np.rint(model_cost.compute_time / unit).astype(np.int64)
  slow = np.rint(model_cost.slow_memory_time / unit).astype(np.int64)
  constant = int(
    sum(
      max(c, s)
      for t, (c, s) in enumerate(zip(compute.tolist(), slow.tolist()))
      if t not in op_terms
    )
  )
  op_vars = []
  for t, terms in op_terms.items():
    low, high = int(compute[t]), int(max(compute[t], slow[t]))
    y = m.NewIntVar(low, high, f"y{t}")
    m.Add(y + sum(c * v for c, v in terms) >= int(slow[t]))
    op_vars.append(y)
  m.Minimize(sum(op_vars) + sum(c * v for c, v in exposed_terms) + constant)

  solver = cp_model.CpSolver()
  solver.parameters.num_search_workers = int(workers)
  solver.parameters.random_seed = int(seed)
  built = time.perf_counter() - t0
  remaining = float(time_limit_s) - built
  if remaining <= 0:
    return fallback(
      f"building the model took {built:.2f} s, all of the {float(time_limit_s):.2f} s left of "
      "the time limit",
      len(choices),
    )
  solver.parameters.max_time_in_seconds = remaining
  response = process.solve(m, solver, remaining + OVERRUN_GRACE_S)
  if response is None:
    return fallback(
      f"CP-SAT did not return within {OVERRUN_GRACE_S:.0f} s of the time limit",
      len(choices),
      built,
    )
  status = response.status
  info = {
    "status": cp_model_pb2.CpSolverStatus.Name(status).lower(),
    "bound_s": float(response.best_objective_bound) * unit,
    "bound_note": BOUND_NOTE,
    "model_build_s": built,
    "model_build_and_solve_s": time.perf_counter() - t0,
    "variables": len(choices),
  }
  if status in (cp_model.OPTIMAL, cp_model.FEASIBLE):
    placement.reset()
    for r, level, present, slot in choices:
      if response.solution[present.Index()]:
        placement.place(r, level, int(response.solution[slot.Index()]) * align)
    info["objective_s"] = float(response.objective_value) * unit
    if placement.total_time > hint_time:
      # Its model ignores contention: the hint may simulate faster. Return the faster one.
      placement.reset()
      for (r, level), offset in hint.items():
        placement.place(r, level, offset)
      info["kept"] = "msa-simple hint (faster than CP-SAT's solution under copy contention)"
  else:
    # No solution within the time limit: the hint (msa-simple), still in place, and say so.
    info["fallback"] = "msa-simple (CP-SAT found no solution in the time limit)"
  return info
