"""Constructive baselines in the game's request space: msa-simple (the project's first, simplified
XLA memory-space assignment; the faithful one is env/msa/algorithm.py), a greedy, and
random play.

They choose with the requests' estimates (op time saved, a prefetch's copy time not hidden
behind the reference time of the ops before its use, no contention); the mappings they build are
timed by the cost model's copy simulation like every other (`Placement.total_time`)."""

from __future__ import annotations

from typing import Optional

import dm_env
import numpy as np

from malloczero.env.game import RequestsGame
from malloczero.env.placement import Placement
from malloczero.env.solvers.time_limit import now


def msa_simple(placement: Placement, deadline: Optional[float] = None) -> dict:
  """The project's first, simplified msa, over the game's requests (solver "msa-simple").

  Kept because CP-SAT (cpsat.py) needs a hint in its own decision space, the game's requests,
  which the faithful msa (env/msa/algorithm.py, solver "msa") does not play in: its
  segments, prefetch starts and evictions have no request. It is also the "old msa" that the
  faithful one is measured against.

  * Order: the game's request order is already MSA's (memory-boundedness = time saved /
    sqrt(size) descending, then size, then live-range length).
  * Activations: no-copy allocation over the whole live range.
  * Parameters and inputs: the prefetch window of the cost-based interval picker (the latest
    start whose overlapped op time hides the copy); a use whose copy cannot be hidden even from
    program start gets no prefetch (the picker's minimum overlap ratio of 1).
  * Chunk: best fit (smallest free gap that holds the buffer over its window, lowest offset on
    ties) in the fastest level that has one.
  Not modelled: eviction, re-trying shorter prefetch windows when space runs out, and
  cross-program prefetch. The requests not reached by `deadline` (the solvers' clock; CP-SAT's
  hint on a program too large for its limit) stay in slow memory.
  """
  req = placement.requests
  for r in range(len(req)):
    if deadline is not None and r % CLOCK_EVERY == 0 and now() > deadline:
      return {"cut_short": f"time limit: {r} of {len(req)} requests considered"}
    if not (req.is_prefetch[r] and req.exposed_copy_time[r] > 0):
      place_best_fit(placement, r)
  return {}


def place_best_fit(placement: Placement, r: int) -> bool:
  """Places request `r` at the best fit of the fastest level that has room for it, the
  requests game's first candidate; whether one had room."""
  for level in range(placement.num_fast):
    offset = placement.best_fit(r, level)
    if offset is not None:
      placement.place(r, level, offset)
      return True
  return False


# Requests placed (or steps played) between two looks at the clock under a time limit, and how
# far past its share of a time limit a pass that later work depends on (pack's bestfit, CP-SAT's
# hint) may run: whole on any program it can finish in time, cut only on one too large.
CLOCK_EVERY = 64
CUT_GRACE_S = 1.0


def bestfit(placement: Placement, deadline: Optional[float] = None) -> dict:
  """`bestfit_play`'s mapping without the game (no observations to build): every request in
  the game's order at its first candidate, from an empty placement; the requests not reached by
  `deadline` (the solvers' clock) stay in slow memory."""
  placement.reset()
  for r in range(len(placement.requests)):
    if deadline is not None and r % CLOCK_EVERY == 0 and now() > deadline:
      return {"cut_short": f"time limit: {r} of {len(placement.requests)} requests considered"}
    place_best_fit(placement, r)
  return {}


def _deadline(time_limit_s: Optional[float]) -> float:
  return float("inf") if time_limit_s is None else now() + float(time_limit_s)


def greedy(placement: Placement, time_limit_s: Optional[float] = None) -> dict:
  """Benefit density, first fit: requests by standalone time saved per byte (descending); each
  goes, if it still saves time, to the level where it saves most that has room, at the lowest
  free offset. Under `time_limit_s` the requests not reached by then stay in slow memory (said in
  `cut_short`: how many were placed or passed over)."""
  req = placement.requests
  density = req.standalone_saving.max(axis=1) / req.size
  deadline = _deadline(time_limit_s)
  order = np.argsort(-density, kind="stable")
  for i, r in enumerate(order):
    if i % CLOCK_EVERY == 0 and now() > deadline:
      return {"cut_short": f"time limit: {i} of {len(order)} requests considered"}
    placement.place_where_it_saves_most(int(r), fit="first")
  return {}


def random_play(
  game: dm_env.Environment, seed: int = 0, time_limit_s: Optional[float] = None
) -> dict:
  """Uniformly random legal actions (action 0 included) in either game; the `random` solver
  plays the msa game. Under `time_limit_s` the game stops where the limit finds it: the buffers
  not reached stay in slow memory (`cut_short`)."""
  rng = np.random.default_rng(seed)
  deadline = _deadline(time_limit_s)
  ts = game.reset()
  steps = 0
  while not ts.last():
    if steps % CLOCK_EVERY == 0 and now() > deadline:
      return {"seed": seed, "cut_short": f"time limit: stopped after {steps} decisions"}
    legal = np.flatnonzero(ts.observation["legal_actions"])
    ts = game.step(legal[rng.integers(len(legal))])
    steps += 1
  return {"seed": seed}


def bestfit_play(game: RequestsGame, time_limit_s: Optional[float] = None) -> dict:
  """The game's own request order (XLA MSA's memory-boundedness order) with the first candidate
  whenever one exists: best fit in the fastest level that has room. A one-line policy the agent
  must beat; it needs no search and no learning. Under `time_limit_s` the game stops where the
  limit finds it: the requests not reached stay in slow memory (`cut_short`)."""
  deadline = _deadline(time_limit_s)
  ts = game.reset()
  steps = 0
  while not ts.last():
    if steps % CLOCK_EVERY == 0 and now() > deadline:
      return {"cut_short": f"time limit: stopped after {steps} requests"}
    ts = game.step(1 if ts.observation["legal_actions"][1] else 0)
    steps += 1
  return {}
