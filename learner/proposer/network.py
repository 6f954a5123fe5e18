"""The proposer network: an MLP over one request's features that gives the chance that evo's best
mapping places the request, fitted by cross-entropy to the labels of labels.py, each program
weighing the same whatever its size; its proposal is a priority genome for evo's decode."""

from __future__ import annotations

import dataclasses
import functools
import os
from typing import Callable, Optional, Sequence

import numpy as np

from malloczero.common.errors import MalloczeroError

HIDDEN = (128, 128)
# A request is proposed (put first) where the network gives it at least this chance of being
# placed.
PROPOSE_AT = 0.5


def _network():
  import haiku as hk

  return hk.without_apply_rng(
    hk.transform(lambda x: hk.nets.MLP([*HIDDEN, 1], name="proposer")(x)[..., 0])
  )


@functools.lru_cache(maxsize=1)
def _chance():
  """The network's chances `[N]` of `[N, F]` standardised features, jitted once per process."""
  import jax

  network = _network()
  return jax.jit(lambda params, x: jax.nn.sigmoid(network.apply(params, x)))


@dataclasses.dataclass(frozen=True)
class Proposer:
  """The fitted network: Haiku parameters of an MLP `HIDDEN` -> 1 logit, over features
  standardised by `mean` and `std` `[F]`."""

  params: dict
  mean: np.ndarray
  std: np.ndarray

  def placed_chance(self, features: np.ndarray) -> np.ndarray:
    """`[R]` the chance that evo's best mapping places each request, from `[R, F]` features."""
    rows = len(features)
    # Padded to a power of two: one compile per size class and process, where every program's
    # own row count would compile again (0.3-0.6 s each on 2 cores, against 10 ms a call).
    standard = np.zeros((1 << max(0, rows - 1).bit_length(), features.shape[1]), np.float32)
    standard[:rows] = (features - self.mean) / self.std
    return np.asarray(_chance()(self.params, standard))[:rows]

  def save(self, path: str) -> None:
    """A plain `.npz` (no pickle), written whole or not at all."""
    flat = {f"params|{m}|{n}": np.asarray(v) for m, p in self.params.items() for n, v in p.items()}
    tmp = path + ".tmp.npz"
    np.savez(tmp, mean=self.mean, std=self.std, **flat)
    os.replace(tmp, path)

  @classmethod
  def load(cls, path: str) -> "Proposer":
    """`save`'s file; anything else is a one-line MalloczeroError."""
    try:
      with np.load(path, allow_pickle=False) as saved:
        params: dict = {}
        for key in saved.files:
          if key.startswith("params|"):
            _, module, name = key.split("|")
            params.setdefault(module, {})[name] = saved[key]
        proposer = cls(params, saved["mean"], saved["std"])
    except (OSError, ValueError, KeyError) as e:
      raise MalloczeroError(f"cannot read the proposer '{path}' ({e})".replace("\n", " ")) from None
    widths = [params.get(f"proposer/~/linear_{k}", {}).get("b") for k in range(len(HIDDEN) + 1)]
    if any(w is None for w in widths) or [len(w) for w in widths] != [*HIDDEN, 1]:
      raise MalloczeroError(f"'{path}' is not a proposer of layers {[*HIDDEN, 1]}")
    return proposer


def proposal_genome(placed_chance: np.ndarray) -> np.ndarray:
  """`[R]` evo priorities from the network's `[R]` chances: the requests it expects placed
  first, each group in msa's buffer order (the requests' order)."""
  rows = len(placed_chance)
  # Within a group, evo's priorities of msa's order: (R - i) / R for the i-th request.
  return (placed_chance >= PROPOSE_AT) + 1e-3 * ((rows - np.arange(rows)) / max(1, rows))


def fit(
  programs: Sequence[dict[str, np.ndarray]],
  seed: int = 0,
  steps: int = 6000,
  batch: int = 4096,
  learning_rate: float = 1e-3,
  progress: Optional[Callable[[int, float], None]] = None,
) -> Proposer:
  """A `Proposer` fitted to programs' `features` `[R, F]` and `placed` `[R]`: cross-entropy on
  the placed flags, each program weighing the same whatever its size. `progress(step, loss)` is
  called every 500 steps and at the last."""
  import jax
  import jax.numpy as jnp
  import optax

  if not programs:
    raise MalloczeroError("the proposer has no labelled programs to fit")
  features = np.concatenate([p["features"] for p in programs])
  placed = np.concatenate([p["placed"] for p in programs]).astype(np.float32)
  weight = np.concatenate([np.full(len(p["placed"]), 1.0 / len(p["placed"])) for p in programs])
  weight = (weight / weight.mean()).astype(np.float32)
  mean, std = features.mean(0), features.std(0) + 1e-6
  standard = ((features - mean) / std).astype(np.float32)
  network, optimiser = _network(), optax.adam(learning_rate)
  params = network.init(jax.random.PRNGKey(seed), standard[:1])
  state = optimiser.init(params)

  @jax.jit
  def update(params, state, x, target, w):
    def loss(p):
      return jnp.mean(w * optax.sigmoid_binary_cross_entropy(network.apply(p, x), target))

    value, grads = jax.value_and_grad(loss)(params)
    updates, state = optimiser.update(grads, state)
    return optax.apply_updates(params, updates), state, value

  rng = np.random.default_rng(seed)
  for step in range(1, steps + 1):
    rows = rng.integers(len(standard), size=batch)
    params, state, value = update(params, state, standard[rows], placed[rows], weight[rows])
    if progress is not None and (step % 500 == 0 or step == steps):
      progress(step, float(value))
  params = jax.tree_util.tree_map(np.asarray, params)
  return Proposer({m: dict(p) for m, p in params.items()}, mean, std)


def auc(placed: np.ndarray, score: np.ndarray) -> float:
  """The chance that a placed request scores above an unplaced one (ties count half); nan when
  one class is empty."""
  positives = int(placed.sum())
  negatives = len(placed) - positives
  if not positives or not negatives:
    return float("nan")
  # Each score's rank among all (1-based), a tied group's the mean of its ranks.
  _, group, counts = np.unique(score, return_inverse=True, return_counts=True)
  ranks = (np.cumsum(counts) - (counts - 1) / 2)[group]
  return float((ranks[placed].sum() - positives * (positives + 1) / 2) / (positives * negatives))
