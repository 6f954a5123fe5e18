"""An evolutionary search over request priorities (the baseline family EGRL builds on).

A genome is one priority per request. Decoding places requests in priority order, each where it
saves most among the fast levels that have room (best fit), skipping those that no longer save
time. The population is seeded with the orders of msa and of the greedy (as EGRL seeds its
evolutionary population with partial solutions) plus random genomes; each generation keeps the
elite and refills with mutated tournament winners (Gaussian noise on priorities and a few random
swaps). The budget is a fixed number of decodes (full-mapping evaluations), optionally capped in
seconds.

Its requests offer an activation's groups beside its whole live range (`build_requests`'s
`split_activations`): a value kept fast near its producer, evicted, and prefetched again before a
later use, as msa maps a training step's forward activations. Without them a genome cannot decode
toward msa's mapping of a training step (docs/results, "evo's request space"). They also time
copies as msa does (`late_prefetches`): without, a GRU's weights each held fast memory from
program start, and msa's own mapping decoded to 0.43x msa (docs/results, "Late prefetches").
And they keep a weight across all its uses, or cut a group's later uses off, as msa's
allocations do (`reshaped_groups`): without, an unrolled GRU's weights were copied in again for
each step, or held past the step where msa hands their memory to the next layer's, and msa's own
mapping decoded to 0.30-0.48x msa (docs/results, "Spans and cuts of weights").

The time limit bounds the whole call, the final decode of the best genome included
(time_limit.py's `DecodeBudget`; the first decode, msa's order or with `initial_first` the first
of `initial`, always runs, so there is a mapping; on a program too large for one decode in the
limit, it stops `grace_s` past the limit, the requests not reached left in slow memory).
"""

from __future__ import annotations

from typing import Optional, Sequence

import numpy as np

from malloczero.env.cost_model import NO_COPY
from malloczero.env.mapping import Mapping
from malloczero.env.placement import Placement
from malloczero.env.requests import Requests, has_rivals
from malloczero.env.solvers.time_limit import DecodeBudget, now
from malloczero.env.workload import Workload

DEFAULT_EVALUATIONS = 120  # The budget: full mappings decoded.
# The share of an activation's live range a mapping must keep fast for `mapping_priorities` to
# put its whole-range request first (beside the groups of one it evicts).
WHOLE_KEPT = 0.9


# Requests placed between two looks at the clock while decoding under a deadline, and how far
# past its time limit a decode may run before it stops where it is: the first decode always runs
# (so that there is a mapping), whole unless the program is too large for the limit.
CLOCK_EVERY = 64
DECODE_GRACE_S = 1.0


def decode(placement: Placement, priority: np.ndarray) -> float:
  """Builds the mapping for `priority` [R] into `placement` (reset first); returns program time."""
  return decode_until(placement, priority, None)[0]


def decode_until(
  placement: Placement, priority: np.ndarray, deadline: float | None
) -> tuple[float, bool]:
  """`decode`, stopping at `deadline` (the solvers' clock; None: none): the requests not reached
  by then stay in slow memory (a decode of a program of 100,000 buffers may take longer than a
  time limit has). Returns the program time and whether every request was reached. The requests
  are placed by `Placement.place_in_order`, jitted, `CLOCK_EVERY` at a time."""
  placement.reset()
  order = np.argsort(-priority, kind="stable")
  if deadline is None:
    placement.place_in_order(order)
    return placement.total_time, True
  for i in range(0, len(order), CLOCK_EVERY):
    if now() > deadline:
      return placement.total_time, False
    placement.place_in_order(order[i : i + CLOCK_EVERY])
  return placement.total_time, True


def mapping_priorities(
  requests: Requests, mapping: Mapping, workload: Workload, whole_kept: Optional[float] = None
) -> np.ndarray:
  """A genome `[R]` that decodes toward `mapping`: the requests whose buffer the mapping keeps in
  a fast level at some point of the request's window first, the others after, each group in
  msa's order (values in (0, 2]). With `whole_kept`, an activation's whole live range offered
  beside its groups counts as kept only where the mapping keeps at least that share of it
  without a copy: one the mapping evicts and prefetches again is then its groups (the whole
  range, placed first, would exclude them); without, any overlap counts, which suits a mapping
  that keeps most of them whole. Why: a mapping found elsewhere (the agent's play in the msa game,
  actors/agent.py) seeds evo's population, as EGRL seeds its population with its policy's
  proposals."""
  num_requests = len(requests)
  position = {b.id: i for i, b in enumerate(workload.buffers)}
  evicting = set(requests.buffer[requests.evict_start != NO_COPY].tolist())
  whole = ~requests.is_prefetch & (requests.evict_start == NO_COPY)
  kept = np.zeros(num_requests, bool)
  by_buffer: dict[int, list[tuple[int, int, bool]]] = {}
  for a in mapping.allocations:
    copied = "prefetch" in a or "eviction" in a
    by_buffer.setdefault(position[a["buffer"]], []).append((a["start"], a["end"], copied))
  for r in range(num_requests):
    lo, hi = int(requests.start[r]), int(requests.end[r])
    spans = [s for s in by_buffer.get(int(requests.buffer[r]), ()) if s[0] < hi and s[1] > lo]
    if whole_kept is not None and whole[r] and int(requests.buffer[r]) in evicting:
      covered = sum(min(hi, end) - max(lo, start) for start, end, _ in spans)
      kept[r] = covered >= whole_kept * (hi - lo) and not any(c for _, _, c in spans)
    else:
      kept[r] = bool(spans)
  return kept + _rank(np.arange(num_requests))


def matched_priorities(requests: Requests, mapping: Mapping, workload: Workload) -> np.ndarray:
  """A genome `[R]` that decodes toward `mapping` where a buffer has requests that overlap in
  time (an activation's whole range and its groups, the groups of either timing and the late
  variants of build_requests' `late_prefetches`): for each of the mapping's allocations, the
  request of its buffer whose window matches it best (intersection over union) first, the
  others after, each group in msa's order. msa's copy of a GRU's weight a few ops before its
  use is then the late window, not the early one that, placed first, would hold the memory the
  other weights need."""
  position = {b.id: i for i, b in enumerate(workload.buffers)}
  order = np.argsort(requests.buffer, kind="stable")
  bounds = np.searchsorted(requests.buffer[order], np.arange(len(workload.buffers) + 1))
  kept = np.zeros(len(requests), bool)
  for a in mapping.allocations:
    b = position[a["buffer"]]
    candidates = order[bounds[b] : bounds[b + 1]]
    if not len(candidates):
      continue
    lo, hi = requests.start[candidates], requests.end[candidates]
    overlap = np.minimum(hi, a["end"]) - np.maximum(lo, a["start"])
    union = np.maximum(hi, a["end"]) - np.minimum(lo, a["start"])
    best = int(np.argmax(overlap / union))
    if overlap[best] > 0:
      kept[candidates[best]] = True
  return kept + _rank(np.arange(len(requests)))


def mapping_genomes(requests: Requests, mapping: Mapping, workload: Workload) -> list[np.ndarray]:
  """The genomes that decode toward `mapping`: `mapping_priorities` with any overlap and, where
  the requests offer evicting groups, with `WHOLE_KEPT` (each is better on some programs: on
  `realistic` one decode of msa's mapping is 1.017x msa with the first alone, 1.050x with the
  second alone, 1.062x with the better of the two; docs/results, "evo's request space"); where
  a buffer has requests that overlap in time, `matched_priorities` too."""
  genomes = [mapping_priorities(requests, mapping, workload)]
  if np.any(requests.evict_start != NO_COPY):
    genomes.append(mapping_priorities(requests, mapping, workload, whole_kept=WHOLE_KEPT))
  if has_rivals(requests):
    genomes.append(matched_priorities(requests, mapping, workload))
  return genomes


def greedy_priorities(requests: Requests) -> np.ndarray:
  """A genome `[R]` in the greedy's order: most saving per byte first."""
  saving_per_byte = requests.standalone_saving.max(axis=1) / requests.size
  return _rank(np.argsort(-saving_per_byte, kind="stable"))


def _rank(order: np.ndarray) -> np.ndarray:
  """Priorities `[R]` in (0, 1] that decode requests in `order` (a permutation of range(R))."""
  return (len(order) - np.argsort(order, kind="stable")) / len(order)


def evo(
  placement: Placement,
  evaluations: int = DEFAULT_EVALUATIONS,
  population: int = 12,
  elite: int = 3,
  sigma: float = 0.3,
  time_limit_s: float | None = None,
  seed: int = 0,
  initial: Sequence[np.ndarray] = (),
  initial_first: bool = False,
  grace_s: float = DECODE_GRACE_S,
) -> dict:
  """Leaves the best mapping found in `placement`; an info dict (evaluations, the best time per
  generation, whether the time limit stopped it). `initial`: genomes `[R]` decoded after msa's
  and the greedy's orders (`initial_first`: before them), in place of as many random ones (e.g.
  `mapping_genomes` of the agent's play); the info's `initial_best` says whether one of them
  was the first population's fastest. `grace_s`: how far past the time limit a decode may run
  before it stops where it is (a caller with a mapping of its own to fall back on, as the agent
  has msa's, gives 0)."""
  req = placement.requests
  num_requests = len(req)
  rng = np.random.default_rng(seed)
  budget = DecodeBudget(time_limit_s)
  cut_short: list[int] = []  # id() of each genome whose decode the limit stopped.

  cut_at = None if budget.deadline is None else budget.deadline + grace_s

  def decode_within(placement: Placement, priority: np.ndarray) -> float:
    time_s, whole = decode_until(placement, priority, cut_at)
    cut_short.extend([] if whole else [id(priority)])
    return time_s

  orders = [_rank(np.arange(num_requests)), greedy_priorities(req)]  # msa's, the greedy's
  given = [np.asarray(g, float) for g in initial]
  seeds = given + orders if initial_first else orders + given
  first_given = 0 if initial_first else len(orders)
  genomes = seeds + [rng.random(num_requests) for _ in range(max(0, population - len(seeds)))]
  genomes = genomes[: max(population, len(seeds))]
  evaluated, fitness = [], []
  for g in genomes:
    if evaluated and (len(evaluated) >= evaluations or not budget.time_for_another()):
      break
    evaluated.append(g)
    fitness.append(budget.decode(decode_within, placement, g))
  genomes = evaluated
  used = len(genomes)
  first_best = int(np.argmin(fitness))
  initial_best = first_given <= first_best < first_given + len(initial)
  last = used - 1  # The genome whose mapping `placement` holds.
  history = [min(fitness)]
  stopped = used < min(population, evaluations)
  while not stopped and used < evaluations:
    order = np.argsort(fitness)
    next_genomes = [genomes[i] for i in order[:elite]]
    next_fitness = [fitness[i] for i in order[:elite]]
    last = -1
    while len(next_genomes) < population and used < evaluations:
      if not budget.time_for_another():
        stopped = True
        break
      a, b = rng.integers(len(genomes), size=2)
      parent = genomes[a] if fitness[a] <= fitness[b] else genomes[b]
      child = parent + sigma * rng.standard_normal(num_requests) * rng.random()
      for _ in range(int(rng.integers(0, 4))):
        i, j = rng.integers(num_requests, size=2)
        child[i], child[j] = child[j], child[i]
      next_genomes.append(child)
      next_fitness.append(budget.decode(decode_within, placement, child))
      last = len(next_genomes) - 1
      used += 1
    genomes, fitness = next_genomes, next_fitness
    history.append(min(fitness))
  best = int(np.argmin(fitness))
  if best != last:
    # Leave the best mapping in `placement`. Its decode was whole unless the limit stopped it, and
    # the budget kept time for it: a clock late by a moment must not cut it short (without grace,
    # as in the agent's guided search, that left every request in slow memory).
    stopped_before = id(genomes[best]) in cut_short
    decode_until(placement, genomes[best], cut_at if stopped_before else None)
  return {
    "evaluations": used,
    "best_time_per_generation_s": history,
    **({"initial_best": initial_best} if len(initial) else {}),
    **({"stopped_by_time_limit": True} if stopped or cut_short else {}),
    **({"cut_short": "time limit: a decode stopped before every request"} if cut_short else {}),
  }
