"""Tuning the proposer on what its play is judged by: one decode's speed over msa.

The fit (network.py) predicts evo's placed flags by cross-entropy, a proxy: a flag per request
says nothing of the order among the proposed, and a fit that is never wrong about the flags
still decodes 0.9% below the labels (docs/results/README.md, "What bounds the proposer's own
play"). Here the members' last layers (`[H] + 1` each) are moved by evolution strategies on the
decoded speed itself: OpenAI-ES (Salimans et al., "Evolution Strategies as a Scalable
Alternative to Reinforcement Learning", 2017, section 2): antithetic Gaussian perturbations,
fitness shaped to centred ranks, the estimated gradient followed with Adam. A decode is not
differentiable in the chances (a threshold, bands, a greedy decoder), which is why the search
is over parameters. Each perturbation is judged on one minibatch of labelled programs, the same
for all of a step's perturbations (common random numbers), by the mean over them of the log of
one decode's speed-up over msa's mapping: each program weighs the same whatever its size, as in
the fit. The hidden layers stay as fitted, so their activations are computed once per program
and a perturbation costs a `[R, H]` product and a decode.
"""

from __future__ import annotations

import dataclasses
import multiprocessing
import time
import warnings
from typing import Callable, Optional, Sequence

import numpy as np

from malloczero.common.errors import MalloczeroError
from malloczero.env.placement import Placement
from malloczero.env.solvers.evo import decode
from malloczero.learner.proposer.network import HIDDEN, LAYERS, Proposer, proposal_genome

_WIDTH = HIDDEN[-1] + 1  # One member's last layer: its weights `[H]` and bias.


@dataclasses.dataclass(frozen=True)
class TuningSettings:
  """OpenAI-ES over the members' last layers. `sigma` and `learning_rate` are in units of each
  member's last-layer weight scale (their root mean square), so they do not depend on the fit."""

  steps: int = 100
  pairs: int = 8  # Antithetic pairs of perturbations per step.
  batch: int = 48  # Labelled programs each perturbation is decoded on.
  sigma: float = 0.1
  learning_rate: float = 0.03

  def __post_init__(self):
    for name in ("pairs", "batch"):
      if getattr(self, name) < 1:
        raise MalloczeroError(f"the proposer's tuning needs a positive {name}")
    if self.steps < 0 or self.sigma <= 0 or self.learning_rate <= 0:
      raise MalloczeroError("the proposer's tuning needs steps >= 0, sigma > 0, learning rate > 0")


@dataclasses.dataclass(frozen=True)
class TuningTarget:
  """One labelled program as the tuning decodes it: the fitted members' last hidden activations
  `hidden` `[M][R, H]`, its `placement` (evo's requests) and msa's speed-up over all-slow."""

  hidden: tuple[np.ndarray, ...]
  placement: Placement
  msa_speedup: float


def hidden_activations(proposer: Proposer, features: np.ndarray) -> tuple[np.ndarray, ...]:
  """`[M][R, H]` each member's last hidden layer for `[R, F]` features (Haiku's MLP: ReLU between
  layers, none after the last)."""
  standard = ((features - proposer.mean) / proposer.std).astype(np.float32)
  hidden = []
  for params in proposer.members:
    h = standard
    for layer in LAYERS[:-1]:
      h = np.maximum(h @ params[layer]["w"] + params[layer]["b"], 0.0)
    hidden.append(h.astype(np.float32))
  return tuple(hidden)


def last_layers(proposer: Proposer) -> np.ndarray:
  """`[M * (H + 1)]` the members' last layers, weights then bias, member by member."""
  return np.concatenate(
    [np.append(p[LAYERS[-1]]["w"][:, 0], p[LAYERS[-1]]["b"]) for p in proposer.members]
  ).astype(np.float64)


def with_last_layers(proposer: Proposer, theta: np.ndarray) -> Proposer:
  """`proposer` with its members' last layers `theta` `[M * (H + 1)]` (`last_layers`' order)."""
  members = []
  for k, params in enumerate(proposer.members):
    layer = np.asarray(theta[k * _WIDTH : (k + 1) * _WIDTH], np.float32)
    members.append({**params, LAYERS[-1]: {"w": layer[:-1, None], "b": layer[-1:]}})
  return dataclasses.replace(proposer, members=tuple(members))


def target_chance(target: TuningTarget, theta: np.ndarray) -> np.ndarray:
  """`[R]` the members' mean chance with last layers `theta`, from the stored activations."""
  total = np.zeros(len(target.hidden[0]))
  for k, hidden in enumerate(target.hidden):
    layer = theta[k * _WIDTH : (k + 1) * _WIDTH]
    logit = np.clip(hidden @ layer[:-1] + layer[-1], -50.0, 50.0)
    total += 1.0 / (1.0 + np.exp(-logit))
  return total / len(target.hidden)


def log_speedup_over_msa(target: TuningTarget, theta: np.ndarray) -> float:
  """The log of one decode of the proposal's speed-up over msa's: the tuning's fitness."""
  placement = target.placement
  time = decode(placement, proposal_genome(target_chance(target, theta)))
  return float(np.log(placement.model.slow_only_time / time / target.msa_speedup))


def mean_fitness(targets: Sequence[TuningTarget], theta: np.ndarray) -> float:
  """The mean over `targets` of `log_speedup_over_msa`: exp of it is the geomean over msa."""
  return float(np.mean([log_speedup_over_msa(t, theta) for t in targets]))


def centred_ranks(values: np.ndarray) -> np.ndarray:
  """`[N]` ranks scaled to [-0.5, 0.5] (ties broken by position): the fitness shaping of
  OpenAI-ES, so that a step does not depend on the fitness's scale or its outliers."""
  if len(values) < 2:
    return np.zeros(len(values))
  return np.argsort(np.argsort(values, kind="stable"), kind="stable") / (len(values) - 1) - 0.5


def es_search(
  fitness: Callable[[np.ndarray, np.ndarray], np.ndarray],
  start: np.ndarray,
  scale: np.ndarray,
  settings: TuningSettings,
  num_items: int,
  seed: int = 0,
  progress: Optional[Callable[[int, np.ndarray, float], None]] = None,
  deadline: Optional[float] = None,
) -> np.ndarray:
  """OpenAI-ES from `start` `[D]`: each step draws `settings.batch` of `num_items` items (all
  when fewer) and `settings.pairs` antithetic perturbations `scale * sigma * eps` (`scale` `[D]`),
  scores them together by `fitness(thetas [2 * pairs, D], items) -> [2 * pairs]`, and moves
  along the centred ranks' estimate of the gradient with Adam. Returns the last parameters;
  `progress(step, theta, fitness)` after each step, with the mean fitness of its perturbations.
  With a `deadline` (`time.monotonic()`), no step starts after it."""
  rng = np.random.default_rng(seed)
  offset, first, second = (np.zeros_like(start) for _ in range(3))
  beta1, beta2 = 0.9, 0.999
  for step in range(1, settings.steps + 1):
    if deadline is not None and time.monotonic() > deadline:
      break
    items = rng.choice(num_items, min(settings.batch, num_items), replace=False)
    eps = rng.standard_normal((settings.pairs, len(start)))
    # Rows 2k and 2k + 1: the k-th perturbation and its mirror.
    signed = np.repeat(eps, 2, axis=0) * np.tile([1.0, -1.0], settings.pairs)[:, None]
    scores = np.asarray(fitness(start + scale * (offset + settings.sigma * signed), items))
    ranks = centred_ranks(scores)
    gradient = (ranks[0::2] - ranks[1::2]) @ eps / (2 * settings.pairs * settings.sigma)
    first = beta1 * first + (1 - beta1) * gradient
    second = beta2 * second + (1 - beta2) * gradient**2
    corrected = first / (1 - beta1**step), second / (1 - beta2**step)
    offset = offset + settings.learning_rate * corrected[0] / (np.sqrt(corrected[1]) + 1e-8)
    if progress is not None:
      progress(step, start + scale * offset, float(np.mean(scores)))
  return start + scale * offset


# The targets a forked worker decodes: set before the pool forks, so that each worker has them
# without pickling gigabytes of activations.
_WORKER_TARGETS: Sequence[TuningTarget] = ()


def _worker_fitness(task: tuple[np.ndarray, np.ndarray]) -> list[float]:
  theta, items = task
  return [log_speedup_over_msa(_WORKER_TARGETS[i], theta) for i in items]


def tune(
  proposer: Proposer,
  targets: Sequence[TuningTarget],
  settings: TuningSettings = TuningSettings(),
  seed: int = 0,
  progress: Optional[Callable[[int, Proposer, float], None]] = None,
  workers: int = 1,
  deadline: Optional[float] = None,
) -> Proposer:
  """`proposer` with its members' last layers tuned by `es_search` on `targets` (built from this
  proposer's activations, `tuning_targets`); `progress(step, proposer, fitness)` after each step,
  `fitness` the mean log speed-up over msa of the step's perturbations. With `workers` > 1 the
  decodes run in that many forked processes, at most one per program of a step (numpy and the
  jitted decoder only: nothing of JAX), where the platform forks; the result does not depend on
  `workers`. With a `deadline` (`time.monotonic()`), no step starts after it (the steps made
  are those `progress` reports)."""
  global _WORKER_TARGETS
  if not targets:
    raise MalloczeroError("the proposer's tuning has no labelled programs to decode")
  start = last_layers(proposer)
  # Each member's weight scale, its bias included, so that one sigma moves every member alike.
  scale = np.concatenate(
    [
      np.full(_WIDTH, np.sqrt(np.mean(start[k * _WIDTH : (k + 1) * _WIDTH - 1] ** 2)) + 1e-8)
      for k in range(len(proposer.members))
    ]
  )
  report = None
  if progress is not None:
    report = lambda step, theta, score: progress(step, with_last_layers(proposer, theta), score)

  def in_process(thetas: np.ndarray, items: np.ndarray) -> np.ndarray:
    return np.array([mean_fitness([targets[i] for i in items], theta) for theta in thetas])

  workers = min(workers, settings.batch)
  if workers <= 1 or "fork" not in multiprocessing.get_all_start_methods() or not settings.steps:
    theta = es_search(in_process, start, scale, settings, len(targets), seed, report, deadline)
    return with_last_layers(proposer, theta)
  _WORKER_TARGETS = targets
  try:
    with warnings.catch_warnings():
      # JAX warns of any fork once it has run (the fit did): a forked child that used JAX could
      # deadlock on a lock one of its threads held. These workers never touch JAX.
      warnings.filterwarnings("ignore", message="os.fork", category=RuntimeWarning)
      pool = multiprocessing.get_context("fork").Pool(workers)
    with pool:

      def forked(thetas: np.ndarray, items: np.ndarray) -> np.ndarray:
        parts = np.array_split(items, workers)
        scores = pool.map(_worker_fitness, [(theta, part) for theta in thetas for part in parts])
        scores = [sum(scores[k : k + workers], []) for k in range(0, len(scores), workers)]
        return np.array(scores).mean(axis=1)

      theta = es_search(forked, start, scale, settings, len(targets), seed, report, deadline)
  finally:
    _WORKER_TARGETS = ()
  return with_last_layers(proposer, theta)


def tuning_targets(proposer: Proposer, programs: Sequence[dict]) -> list[TuningTarget]:
  """`TuningTarget`s of `labelled_programs(..., placements=True)`'s programs for `proposer`."""
  missing = [k for k in ("placement", "msa") if programs and k not in programs[0]]
  if missing:
    raise MalloczeroError(f"the proposer's tuning needs each program's {missing} (placements=True)")
  return [
    TuningTarget(hidden_activations(proposer, p["features"]), p["placement"], float(p["msa"]))
    for p in programs
  ]
