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
"""

from __future__ import annotations

import time

import numpy as np
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
BOUND_NOTE = "bound of the model without copy contention: not a bound on the simulated program time"


def cpsat(
  placement: Placement,
  time_limit_s: float = DEFAULT_TIME_LIMIT_S,
  workers: int = DEFAULT_WORKERS,
  seed: int = 0,
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

  def fallback(why: str, variables: int = 0) -> dict:
    built = time.perf_counter() - t0
    return {
      "status": "unknown",
      "bound_s": 0.0,
      "bound_note": BOUND_NOTE,
      "model_build_s": built,
      "model_build_and_solve_s": built,
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
  status = solver.Solve(m)
  info = {
    "status": solver.StatusName(status).lower(),
    "bound_s": float(solver.BestObjectiveBound()) * unit,
    "bound_note": BOUND_NOTE,
    "model_build_s": built,
    "model_build_and_solve_s": time.perf_counter() - t0,
    "variables": len(choices),
  }
  if status in (cp_model.OPTIMAL, cp_model.FEASIBLE):
    placement.reset()
    for r, level, present, slot in choices:
      if solver.Value(present):
        placement.place(r, level, int(solver.Value(slot)) * align)
    info["objective_s"] = float(solver.ObjectiveValue()) * unit
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
