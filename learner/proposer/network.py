"""The proposer network: MLPs over one request's features that give the chance that evo's best
mapping places the request, fitted by cross-entropy to the labels of labels.py; its proposal is a
priority genome for evo's decode.

Each program weighs the same whatever its size. Within a program, a share `saving_weight` of its
weight goes to its requests in proportion to what each saves placed alone, the rest evenly: with
even weights the few requests that decide a recurrent program (a weight read at every step, a
handful of its hundreds of requests) weigh nothing in the loss, and the fit proposes none of them
(docs/results/README.md, "Saving-weighted labels and an ensemble"). The proposer is an ensemble
of `members` such fits, from different seeds, whose chances it averages: one fit's proposal of a
few large requests turns on its seed."""

from __future__ import annotations

import dataclasses
import functools
import os
from typing import Callable, Optional, Sequence

import numpy as np

from malloczero.common.errors import MalloczeroError
from malloczero.configs.config import ProposerConfig

HIDDEN = (128, 128)
# Haiku's names of the MLP's linear layers, input first: the keys of a member's parameters.
LAYERS = tuple(f"proposer/~/linear_{k}" for k in range(len(HIDDEN) + 1))
# A request is proposed (put first) where the network gives it at least this chance of being
# placed.
PROPOSE_AT = 0.5
# Proposed requests decode surest first, in bands this many to a chance of 1: a request proposed
# at 0.55 then takes only the room that those proposed at 0.9 leave. Bands rather than the chance
# itself, so that msa's order still decides among requests the network holds about as likely.
CHANCE_BANDS = 5
# How the proposed requests are ordered among themselves (`proposal_genome`): by bands of the
# chance (surest band first, msa's order within a band), by the chance itself, or in msa's order.
ORDERS = ("bands", "chance", "msa")
# The genomes beside the proposal that the guided search also starts from (`neighbour_genomes`),
# as (threshold, order): the proposal at every threshold from 0.1 to 0.9 and in every order,
# ordered by what each adds to the best of one decode of those before it, on the training corpus
# with chances from fits that had not seen the program's model: the first the limit reaches on a
# program where one decode takes a second are those worth most (docs/results/README.md, "The
# proposal's neighbours in the guided search").
NEIGHBOURS = (
  (0.9, "bands"),
  (0.3, "chance"),
  (0.7, "chance"),
  (0.2, "bands"),
  (0.5, "msa"),
  (0.6, "bands"),
  (0.8, "bands"),
  (0.7, "bands"),
  (0.3, "bands"),
  (0.5, "chance"),
  (0.4, "bands"),
  (0.1, "bands"),
)


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
  """The fitted networks: `members`, each the Haiku parameters of an MLP `HIDDEN` -> 1 logit,
  over features standardised by `mean` and `std` `[F]`."""

  members: tuple[dict, ...]
  mean: np.ndarray
  std: np.ndarray

  def placed_chance(self, features: np.ndarray) -> np.ndarray:
    """`[R]` the chance that evo's best mapping places each request, from `[R, F]` features: the
    members' mean."""
    rows = len(features)
    # Padded to a power of two: one compile per size class and process, where every program's
    # own row count would compile again (0.3-0.6 s each on 2 cores, against 10 ms a call).
    standard = np.zeros((1 << max(0, rows - 1).bit_length(), features.shape[1]), np.float32)
    standard[:rows] = (features - self.mean) / self.std
    chances = [np.asarray(_chance()(params, standard))[:rows] for params in self.members]
    return np.mean(chances, axis=0)

  def save(self, path: str) -> None:
    """A plain `.npz` (no pickle), written whole or not at all."""
    flat = {
      f"member{k}|{m}|{n}": np.asarray(v)
      for k, params in enumerate(self.members)
      for m, p in params.items()
      for n, v in p.items()
    }
    tmp = path + ".tmp.npz"
    np.savez(tmp, mean=self.mean, std=self.std, **flat)
    os.replace(tmp, path)

  @classmethod
  def load(cls, path: str) -> "Proposer":
    """`save`'s file (or a single network's, whose keys start `params|`); anything else is a
    one-line MalloczeroError."""
    try:
      with np.load(path, allow_pickle=False) as saved:
        members: dict[str, dict] = {}
        for key in saved.files:
          if key.startswith(("params|", "member")):
            member, module, name = key.split("|")
            members.setdefault(member, {}).setdefault(module, {})[name] = saved[key]
        mean, std = saved["mean"], saved["std"]
    except (OSError, ValueError, KeyError) as e:
      raise MalloczeroError(f"cannot read the proposer '{path}' ({e})".replace("\n", " ")) from None
    for params in members.values() or [{}]:
      widths = [params.get(layer, {}).get("b") for layer in LAYERS]
      if any(w is None for w in widths) or [len(w) for w in widths] != [*HIDDEN, 1]:
        raise MalloczeroError(f"'{path}' is not a proposer of layers {[*HIDDEN, 1]}")
    # member10 after member9: by number, not by name.
    order = sorted(members, key=lambda m: (len(m), m))
    return cls(tuple(members[m] for m in order), mean, std)


def proposal_genome(
  placed_chance: np.ndarray, propose_at: float = PROPOSE_AT, order: str = "bands"
) -> np.ndarray:
  """`[R]` evo priorities from the network's `[R]` chances: the requests it gives at least
  `propose_at` first, among them (`order`) the surer (by bands of `1 / CHANCE_BANDS`) before the
  less sure, or by the chance itself, or in msa's order; then the rest; within a band and among
  the rest, msa's buffer order (the requests' order)."""
  if order not in ORDERS:
    raise MalloczeroError(f"unknown order of the proposed '{order}' (choose from {ORDERS})")
  rows = len(placed_chance)
  proposed = placed_chance >= propose_at
  rank = np.zeros(rows)
  if order != "msa":
    rank = np.floor(placed_chance * CHANCE_BANDS) / CHANCE_BANDS
  if order == "chance":
    rank = rank + placed_chance
  # Within a group, evo's priorities of msa's order: (R - i) / R for the i-th request, below
  # the bands' spacing.
  return proposed * (1.0 + rank) + 1e-3 * ((rows - np.arange(rows)) / max(1, rows))


def neighbour_genomes(placed_chance: np.ndarray) -> list[np.ndarray]:
  """`[R]` genomes beside the proposal, for the guided search's first population: the proposal
  at each of `NEIGHBOURS`' thresholds and orders. Which of them decodes fastest differs from
  program to program."""
  return [proposal_genome(placed_chance, at, order) for at, order in NEIGHBOURS]


def request_weights(programs: Sequence[dict[str, np.ndarray]], saving_weight: float) -> np.ndarray:
  """`[sum R]` each request's share of the fit, summing to 1: each program `1/P`, of which
  `saving_weight` in proportion to its requests' `saving` `[R]` and the rest evenly."""
  if not 0.0 <= saving_weight <= 1.0:
    raise MalloczeroError(f"the proposer's saving weight must be in [0, 1], not {saving_weight}")
  if saving_weight and any("saving" not in p for p in programs):
    raise MalloczeroError("a saving-weighted fit needs each program's `saving` (labelled_programs)")
  shares = []
  for p in programs:
    rows = len(p["placed"])
    saving = np.asarray(p["saving"], np.float64) if saving_weight else np.zeros(rows)
    total = saving.sum()
    by_saving = saving / total if total > 0 else np.full(rows, 1.0 / rows)
    shares.append(((1.0 - saving_weight) / rows + saving_weight * by_saving) / len(programs))
  return np.concatenate(shares)


def fit(
  programs: Sequence[dict[str, np.ndarray]],
  seed: int = 0,
  steps: int = 6000,
  batch: int = 4096,
  learning_rate: float = 1e-3,
  members: int = ProposerConfig.members,
  saving_weight: float = ProposerConfig.saving_weight,
  progress: Optional[Callable[[int, float], None]] = None,
) -> Proposer:
  """A `Proposer` of `members` networks fitted to programs' `features` `[R, F]` and `placed`
  `[R]` (and `saving` `[R]`, the seconds each request saves placed alone, where `saving_weight`
  > 0): cross-entropy on the placed flags over batches drawn by `request_weights`, each member
  from its own seed. `progress(step, loss)` is called every 500 steps of each member and at its
  last, `step` counting over all members' `steps`."""
  import jax
  import jax.numpy as jnp
  import optax

  if not programs:
    raise MalloczeroError("the proposer has no labelled programs to fit")
  if members < 1:
    raise MalloczeroError(f"the proposer needs at least one member network, not {members}")
  features = np.concatenate([p["features"] for p in programs])
  placed = np.concatenate([p["placed"] for p in programs]).astype(np.float32)
  cumulative = np.cumsum(request_weights(programs, saving_weight))
  mean, std = features.mean(0), features.std(0) + 1e-6
  standard = ((features - mean) / std).astype(np.float32)
  network, optimiser = _network(), optax.adam(learning_rate)

  @jax.jit
  def update(params, state, x, target):
    def loss(p):
      return jnp.mean(optax.sigmoid_binary_cross_entropy(network.apply(p, x), target))

    value, grads = jax.value_and_grad(loss)(params)
    updates, state = optimiser.update(grads, state)
    return optax.apply_updates(params, updates), state, value

  fitted = []
  for member in range(members):
    params = network.init(jax.random.PRNGKey(seed * members + member), standard[:1])
    state = optimiser.init(params)
    rng = np.random.default_rng([seed, member])
    for step in range(1, steps + 1):
      # Drawn by weight rather than weighted in the loss: a recurrent program's few decisive
      # requests then appear in most batches, not as rare rows of outsized weight.
      rows = np.minimum(
        np.searchsorted(cumulative, rng.random(batch) * cumulative[-1]), len(standard) - 1
      )
      params, state, value = update(params, state, standard[rows], placed[rows])
      if progress is not None and (step % 500 == 0 or step == steps):
        progress(member * steps + step, float(value))
    params = jax.tree_util.tree_map(np.asarray, params)
    fitted.append({m: dict(p) for m, p in params.items()})
  return Proposer(tuple(fitted), mean, std)


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
