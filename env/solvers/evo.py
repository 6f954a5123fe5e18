"""An evolutionary search over request priorities (the baseline family EGRL builds on).

A genome is one priority per request. Decoding places requests in priority order, each where it
saves most among the fast levels that have room (best fit), skipping those that no longer save
time. The population is seeded with the orders of msa and of the greedy (as EGRL seeds its
evolutionary population with partial solutions) plus random genomes; each generation keeps the
elite and refills with mutated tournament winners (Gaussian noise on priorities and a few random
swaps). The budget is a fixed number of decodes (full-mapping evaluations), optionally capped in
seconds.

The time limit bounds the whole call, the final decode of the best genome included: a decode
starts only if it and that final decode, each at the longest decode seen so far, still end
before the deadline (the first decode, msa's order, always runs, so there is a mapping).
"""

from __future__ import annotations

import time

import numpy as np

from malloczero.env.placement import Placement

DEFAULT_EVALUATIONS = 120  # The budget: full mappings decoded.
_clock = time.perf_counter  # Tests replace it with a clock of their own.


def decode(placement: Placement, priority: np.ndarray) -> float:
  """Builds the mapping for `priority` [R] into `placement` (reset first); returns program time."""
  placement.reset()
  for r in np.argsort(-priority, kind="stable"):
    placement.place_where_it_saves_most(int(r), fit="best")
  return placement.total_time


def evo(placement: Placement, evaluations: int = DEFAULT_EVALUATIONS, population: int = 12, elite: int = 3,
        sigma: float = 0.3, time_limit_s: float | None = None, seed: int = 0) -> dict:
  req = placement.requests
  num_requests = len(req)
  rng = np.random.default_rng(seed)
  deadline = None if time_limit_s is None else _clock() + float(time_limit_s)
  longest = 0.0  # The longest decode so far, in seconds.

  def timed_decode(genome: np.ndarray) -> float:
    nonlocal longest
    started = _clock()
    result = decode(placement, genome)
    longest = max(longest, _clock() - started)
    return result

  def time_for_another() -> bool:
    # This decode and, if it is not the best, the final decode of the best one.
    return deadline is None or _clock() + 2 * longest <= deadline

  rank = lambda order: (num_requests - np.argsort(order, kind="stable")) / num_requests
  density = req.standalone_saving.max(axis=1) / req.size
  seeds = [rank(np.arange(num_requests)),                          # msa's order
           rank(np.argsort(-density, kind="stable"))]              # greedy's order
  genomes = seeds + [rng.random(num_requests) for _ in range(max(0, population - len(seeds)))]
  genomes = genomes[:population]
  evaluated, fitness = [], []
  for g in genomes:
    if evaluated and (len(evaluated) >= evaluations or not time_for_another()):
      break
    evaluated.append(g)
    fitness.append(timed_decode(g))
  genomes = evaluated
  used = len(genomes)
  last = used - 1  # The genome whose mapping `placement` holds.
  history = [min(fitness)]
  stopped = used < min(population, evaluations)
  while not stopped and used < evaluations:
    order = np.argsort(fitness)
    next_genomes = [genomes[i] for i in order[:elite]]
    next_fitness = [fitness[i] for i in order[:elite]]
    last = -1
    while len(next_genomes) < population and used < evaluations:
      if not time_for_another():
        stopped = True
        break
      a, b = rng.integers(len(genomes), size=2)
      parent = genomes[a] if fitness[a] <= fitness[b] else genomes[b]
      child = parent + sigma * rng.standard_normal(num_requests) * rng.random()
      for _ in range(int(rng.integers(0, 4))):
        i, j = rng.integers(num_requests, size=2)
        child[i], child[j] = child[j], child[i]
      next_genomes.append(child)
      next_fitness.append(timed_decode(child))
      last = len(next_genomes) - 1
      used += 1
    genomes, fitness = next_genomes, next_fitness
    history.append(min(fitness))
  best = int(np.argmin(fitness))
  if best != last:
    decode(placement, genomes[best])  # Leave the best mapping in `placement`.
  return {"evaluations": used, "best_time_per_generation_s": history,
          **({"stopped_by_time_limit": True} if stopped else {})}
