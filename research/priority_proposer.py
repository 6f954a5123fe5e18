"""A network that proposes evo's request priorities, decoded once: the network's own play in
evo's request space.

REGAL (Paliwal et al., "Reinforced Genetic Algorithm Learning for Optimizing Computation
Graphs", ICLR 2020, section 3) lets a network propose per-node parameters that a heuristic
decodes, and refines around the proposals with a genetic algorithm; EGRL seeds its evolutionary
population with its policy's proposals. Here a small MLP sees one of evo's requests at a time
(`request_features`: its size, saving, window and the memory demand over it, in units that do not
grow with the program, and nothing of msa's mapping) and predicts whether evo's best mapping
places it. The labels come from the search itself (`collect`: evo seeded with msa's mapping,
`--seconds` per program, on the training corpus), as expert iteration's apprentice learns from
its expert (Anthony et al., "Thinking Fast and Slow with Deep Learning and Tree Search", NeurIPS
2017). Its play is one decode of the genome it proposes (`proposal_genome`: the requests it
expects placed first, each group in msa's buffer order), no search and no msa mapping.

Why: the msa game's network, fitted to exact one-move advantages, plays msa on programs it did
not train on (docs/results/README.md, "What limits the network's own play"); evo's decode, given
msa's mapping as priorities, already beats msa's own mapping on large programs ("evo's decode,
jitted"). What the network adds over that decoder is measured against the decoder's other inputs:
msa's mapping (`mapping_genomes`) and the greedy's saving-per-byte order.

  .venv/bin/python scripts/priority_proposer.py collect --suite corpus --out data/corpus
  .venv/bin/python scripts/priority_proposer.py fit --data data/corpus --seed 1 --out p1.npz
  .venv/bin/python scripts/priority_proposer.py decode --params p1.npz --suite realistic
  .venv/bin/python scripts/priority_proposer.py search --params p1.npz --suite realistic
"""

from __future__ import annotations

import argparse
import csv
import dataclasses
import glob
import os
import sys
import time
from typing import Optional, Sequence

import numpy as np

from malloczero.env.cost_model import NO_COPY, CostModel
from malloczero.env.placement import Placement
from malloczero.env.requests import Requests, build_requests
from malloczero.env.solvers.evo import _rank, decode, evo, greedy_priorities, mapping_genomes

# The request features, in `request_features`'s column order.
FEATURES = (
  "log2 size over fast capacity",
  "saving per byte, rank in the program",
  "saving, rank in the program",
  "log10 saving over the all-slow time",
  "window over the program",
  "window start over the program",
  "window end over the program",
  "is a prefetch",
  "exposed copy time over saving",
  "evicts",
  "position in msa's order",
  "log2 uses in the window",
  "mean demand over the window, over fast capacity",
  "peak demand over the window, over fast capacity",
  "log10 mean demand",
  "size times window over capacity times program",
  "log10 requests",
  "fast levels",
  "log2 requests of the buffer",
)
HIDDEN = (128, 128)
# A request is proposed (put first) where the network gives it at least this chance of being
# placed.
PROPOSE_AT = 0.5


def _rank_share(x: np.ndarray) -> np.ndarray:
  """`[R]` each value's rank among `x`, in (0, 1)."""
  ranks = np.argsort(np.argsort(x, kind="stable"), kind="stable")
  return (ranks + 0.5) / max(1, len(x))


def _window_max(series: np.ndarray, start: np.ndarray, end: np.ndarray) -> np.ndarray:
  """`[R]` the max of `series[start:end]` per window (0 where empty), by a sparse table."""
  table = [series]
  while 2 ** len(table) <= len(series):
    prev, half = table[-1], 2 ** (len(table) - 1)
    table.append(np.maximum(prev[:-half], prev[half:]))
  length = np.maximum(end - start, 1)
  level = np.floor(np.log2(length)).astype(np.int64)
  out = np.zeros(len(start))
  for k in np.unique(level):
    rows = np.flatnonzero(level == k)
    lo, hi = start[rows], end[rows] - 2**k
    out[rows] = np.maximum(table[k][lo], table[k][np.maximum(hi, lo)])
  return np.where(end > start, out, 0.0)


def request_features(model: CostModel, requests: Requests) -> np.ndarray:
  """`[R, len(FEATURES)]` float32 features of each request, independent of the program's size and
  of any mapping."""
  workload, hardware = model.workload, model.hardware
  num_requests, num_ops = len(requests), workload.num_ops
  capacity = float(hardware.fast_capacity_bytes)
  saving = requests.standalone_saving.max(axis=1)
  window = (requests.end - requests.start).astype(float)
  # Bytes live in requests' windows at each op: the demand msa and evo share out.
  change = np.zeros(num_ops + 1)
  np.add.at(change, requests.start, requests.size)
  np.add.at(change, requests.end, -requests.size.astype(float))
  demand = np.cumsum(change)[:num_ops] / capacity
  prefix = np.concatenate([[0.0], np.cumsum(demand)])
  mean_demand = (prefix[requests.end] - prefix[requests.start]) / np.maximum(1.0, window)
  peak_demand = _window_max(demand, requests.start, requests.end)
  per_buffer = np.bincount(requests.buffer, minlength=len(workload.buffers))[requests.buffer]
  uses = np.diff(requests.incidence_start).astype(float)
  columns = (
    np.log2(requests.size / capacity),
    _rank_share(saving / requests.size),
    _rank_share(saving),
    np.log10(saving / model.slow_only_time + 1e-12),
    window / num_ops,
    requests.start / num_ops,
    requests.end / num_ops,
    requests.is_prefetch.astype(float),
    requests.exposed_copy_time / np.maximum(saving, 1e-15),
    (requests.evict_start != NO_COPY).astype(float),
    np.arange(num_requests) / max(1, num_requests),
    np.log2(uses + 1),
    mean_demand,
    peak_demand,
    np.log10(mean_demand + 1e-9),
    requests.size * window / (capacity * num_ops),
    np.full(num_requests, np.log10(max(1, num_requests))),
    np.full(num_requests, hardware.num_fast_levels),
    np.log2(per_buffer),
  )
  return np.stack(columns, 1).astype(np.float32)


def proposal_genome(placed_chance: np.ndarray) -> np.ndarray:
  """`[R]` evo priorities from the network's `[R]` chances: the requests it expects placed
  first, each group in msa's buffer order (the requests' order)."""
  return (placed_chance >= PROPOSE_AT) + 1e-3 * _rank(np.arange(len(placed_chance)))


def requests_of(workload, hardware) -> tuple[CostModel, Requests]:
  """evo's cost model and requests of a program (the `evo` baseline's)."""
  from malloczero.env.solvers import get_solver

  model = CostModel(workload, hardware)
  return model, build_requests(model, get_solver("evo").split_activations)


def collect_one(workload, hardware, seconds: float, seed: int = 0) -> dict[str, np.ndarray]:
  """One program's features `[R, F]` and labels `[R]`: whether evo's best mapping, evo seeded
  with msa's mapping and run for `seconds`, places each request; with msa's and evo's speed-ups
  over all-slow."""
  from malloczero.env.solvers import solve

  model, requests = requests_of(workload, hardware)
  msa = solve(workload, hardware, "msa").mapping
  placement = Placement(model, requests)
  info = evo(
    placement,
    evaluations=10**9,
    time_limit_s=seconds,
    seed=seed,
    initial=mapping_genomes(requests, msa, workload),
  )
  placed = np.zeros(len(requests), bool)
  placed[placement.request_indices()] = True
  return {
    "features": request_features(model, requests),
    "placed": placed,
    "msa": np.float64(msa.speedup),
    "evo": np.float64(model.slow_only_time / placement.total_time),
    "evaluations": np.int64(info["evaluations"]),
  }


@dataclasses.dataclass(frozen=True)
class Proposer:
  """The fitted network: Haiku parameters of an MLP `HIDDEN` -> 1 logit, over features
  standardised by `mean` and `std` `[F]`."""

  params: dict
  mean: np.ndarray
  std: np.ndarray

  def placed_chance(self, features: np.ndarray) -> np.ndarray:
    """`[R]` the chance that evo's best mapping places each request, from `[R, F]` features."""
    import jax

    standard = ((features - self.mean) / self.std).astype(np.float32)
    return np.asarray(jax.nn.sigmoid(_network().apply(self.params, standard)))

  def save(self, path: str) -> None:
    flat = {f"params|{m}|{n}": np.asarray(v) for m, p in self.params.items() for n, v in p.items()}
    tmp = path + ".tmp.npz"
    np.savez(tmp, mean=self.mean, std=self.std, **flat)
    os.replace(tmp, path)

  @classmethod
  def load(cls, path: str) -> "Proposer":
    with np.load(path) as saved:
      params: dict = {}
      for key in saved.files:
        if key.startswith("params|"):
          _, module, name = key.split("|")
          params.setdefault(module, {})[name] = saved[key]
      return cls(params, saved["mean"], saved["std"])


def _network():
  import haiku as hk

  return hk.without_apply_rng(
    hk.transform(lambda x: hk.nets.MLP([*HIDDEN, 1], name="proposer")(x)[..., 0])
  )


def fit(
  programs: Sequence[dict[str, np.ndarray]],
  seed: int = 0,
  steps: int = 6000,
  batch: int = 4096,
  learning_rate: float = 1e-3,
) -> Proposer:
  """Fits a `Proposer` to `collect_one`'s programs: cross-entropy on the placed flags, each program
  weighing the same whatever its size."""
  import jax
  import jax.numpy as jnp
  import optax

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

    grads = jax.grad(loss)(params)
    updates, state = optimiser.update(grads, state)
    return optax.apply_updates(params, updates), state

  rng = np.random.default_rng(seed)
  for _ in range(steps):
    rows = rng.integers(len(standard), size=batch)
    params, state = update(params, state, standard[rows], placed[rows], weight[rows])
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


def decode_once(
  workload, hardware, proposer: Proposer
) -> tuple[dict[str, float], Placement, np.ndarray]:
  """One decode each of the network's proposal and of the decoder's other inputs (msa's mapping
  as priorities, the better of `mapping_genomes`; the greedy's saving-per-byte order), as speed-ups
  over all-slow; msa's own mapping's too. The placement holds the proposal's mapping; with the
  network's `[R]` chances."""
  from malloczero.env.solvers import solve

  model, requests = requests_of(workload, hardware)
  msa = solve(workload, hardware, "msa").mapping
  placement = Placement(model, requests)
  slow = model.slow_only_time
  result = {"msa": msa.speedup}
  result["msa_genome"] = max(
    slow / decode(placement, g) for g in mapping_genomes(requests, msa, workload)
  )
  result["greedy_order"] = slow / decode(placement, greedy_priorities(requests))
  started = time.perf_counter()
  chance = proposer.placed_chance(request_features(model, requests))
  result["proposer"] = slow / decode(placement, proposal_genome(chance))
  result["proposer_s"] = time.perf_counter() - started
  return result, placement, chance


def search_from_proposal(
  workload, hardware, proposer: Proposer, seconds: float, seed: int = 0
) -> dict[str, float]:
  """evo at `seconds` seeded with msa's mapping (`msa_seeded`: the guided search without a
  network, scripts/guided_search_without_network.py) and with the network's proposal first, then
  msa's mapping (`proposer_seeded`), as speed-ups over all-slow, with each one's decodes and
  seconds. Each search's time includes building its requests (and the proposal), as a baseline's
  time limit includes building its model; msa's solve is outside both."""
  from malloczero.env.solvers import solve

  msa = solve(workload, hardware, "msa").mapping
  result: dict[str, float] = {"msa": msa.speedup}
  for arm in ("msa_seeded", "proposer_seeded"):
    started = time.perf_counter()
    model, requests = requests_of(workload, hardware)
    initial = mapping_genomes(requests, msa, workload)
    if arm == "proposer_seeded":
      chance = proposer.placed_chance(request_features(model, requests))
      initial.insert(0, proposal_genome(chance))
    placement = Placement(model, requests)
    info = evo(
      placement,
      evaluations=10**9,
      time_limit_s=max(0.0, seconds - (time.perf_counter() - started)),
      seed=seed,
      initial=initial,
      initial_first=True,
      grace_s=0.0,
    )
    result[arm] = model.slow_only_time / placement.total_time
    result[f"{arm}_decodes"] = info["evaluations"]
    result[f"{arm}_s"] = time.perf_counter() - started
  return result


def _entries(suite: str, split: str):
  from malloczero.env.programs.suites import get_suite

  return get_suite(suite).split(split).entries


def _file_of(directory: str, name: str) -> str:
  return os.path.join(directory, name.replace("/", "_") + ".npz")


def _collect(args) -> int:
  os.makedirs(args.out, exist_ok=True)
  entries = _entries(args.suite, args.split)
  for k, entry in enumerate(entries):
    path = _file_of(args.out, entry.name)
    if k % args.shards != args.shard or os.path.exists(path):
      continue
    workload, hardware = entry.load()
    started = time.perf_counter()
    _, requests = requests_of(workload, hardware)
    if not 0 < len(requests) <= args.max_requests:
      print(f"{entry.name}: skipped ({len(requests)} requests)", flush=True)
      continue
    data = collect_one(workload, hardware, args.seconds, args.seed)
    tmp = path + ".tmp.npz"
    np.savez(tmp, model=entry.model, **data)
    os.replace(tmp, path)  # A killed run leaves no half-written program.
    print(
      f"{entry.name}: {len(requests)} requests, {data['placed'].mean():.3f} placed, evo "
      f"{data['evo'] / data['msa']:.4f}x msa in {data['evaluations']} decodes, "
      f"{time.perf_counter() - started:.1f} s",
      flush=True,
    )
  return 0


def load_collected(directory: str) -> list[dict[str, np.ndarray]]:
  """The programs `collect` wrote to `directory`, with their file's name."""
  programs = []
  for path in sorted(glob.glob(os.path.join(directory, "*.npz"))):
    with np.load(path) as saved:
      programs.append({"name": os.path.basename(path)[:-4], **{k: saved[k] for k in saved.files}})
  return programs


def _fit(args) -> int:
  programs = load_collected(args.data)
  if not programs:
    raise ValueError(f"no collected programs in {args.data} (run `collect` first)")
  started = time.perf_counter()
  proposer = fit(programs, seed=args.seed, steps=args.steps)
  proposer.save(args.out)
  scores = [auc(p["placed"], proposer.placed_chance(p["features"])) for p in programs]
  print(
    f"fitted to {len(programs)} programs ({sum(len(p['placed']) for p in programs)} requests) "
    f"in {time.perf_counter() - started:.0f} s; training AUC {np.nanmean(scores):.3f}; "
    f"saved {args.out}",
    flush=True,
  )
  return 0


def _decode(args) -> int:
  from malloczero.env.validator import validate_mapping
  from malloczero.evaluation.suite import geomean

  proposer = Proposer.load(args.params)
  rows = []
  for entry in _entries(args.suite, args.split):
    workload, hardware = entry.load()
    result, placement, _ = decode_once(workload, hardware, proposer)
    validate_mapping(workload, hardware, placement.mapping("proposer"))
    rows.append({"entry": entry.name, **result})
    print(
      f"{entry.name}: x msa proposer {result['proposer'] / result['msa']:.4f}, msa's mapping "
      f"decoded {result['msa_genome'] / result['msa']:.4f}, greedy order "
      f"{result['greedy_order'] / result['msa']:.4f}",
      flush=True,
    )
  print(f"{args.suite} {args.split}, {len(rows)} programs, one decode each, x msa:")
  for key in ("proposer", "msa_genome", "greedy_order"):
    ratio = np.array([r[key] / r["msa"] for r in rows])
    print(
      f"  {key:13s} {geomean(ratio):.4f}  W/T/L {int((ratio > 1.0005).sum())}/"
      f"{int((abs(ratio - 1) <= 5e-4).sum())}/{int((ratio < 0.9995).sum())}  worst "
      f"{ratio.min():.3f}"
    )
  if args.out:
    _write_csv(args.out, rows)
  return 0


def _search(args) -> int:
  from malloczero.evaluation.suite import geomean

  proposer = Proposer.load(args.params)
  rows = []
  for entry in _entries(args.suite, args.split):
    workload, hardware = entry.load()
    rows.append(
      {
        "entry": entry.name,
        **search_from_proposal(workload, hardware, proposer, args.seconds, args.seed),
      }
    )
    r = rows[-1]
    print(
      f"{entry.name}: x msa seeded with msa's mapping {r['msa_seeded'] / r['msa']:.4f}, with the "
      f"proposal {r['proposer_seeded'] / r['msa']:.4f}, {r['proposer_seeded_s']:.2f} s",
      flush=True,
    )
  gain = np.array([r["proposer_seeded"] / r["msa_seeded"] for r in rows])
  print(
    f"{args.suite} {args.split}, {len(rows)} programs, evo at {args.seconds:g} s, x msa: seeded "
    f"with msa's mapping {geomean([r['msa_seeded'] / r['msa'] for r in rows]):.4f}, with the "
    f"proposal {geomean([r['proposer_seeded'] / r['msa'] for r in rows]):.4f} "
    f"({100 * (geomean(gain) - 1):+.2f}%, better/worse {int((gain > 1.0005).sum())}/"
    f"{int((gain < 1 / 1.0005).sum())})"
  )
  if args.out:
    _write_csv(args.out, rows)
  return 0


def _write_csv(path: str, rows: list[dict]) -> None:
  with open(path, "w", newline="") as f:
    writer = csv.DictWriter(f, fieldnames=list(rows[0]))
    writer.writeheader()
    writer.writerows(rows)


def main(argv: Optional[Sequence[str]] = None) -> int:
  """The command (`scripts/priority_proposer.py`): `collect`, `fit` or `decode`; returns the exit
  status."""
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  commands = parser.add_subparsers(dest="command", required=True)
  collect = commands.add_parser("collect", help="features and evo's placed flags per program")
  collect.add_argument("--suite", default="corpus")
  collect.add_argument("--split", default="all", choices=("train", "heldout", "all"))
  collect.add_argument("--seconds", type=float, default=4.0, help="evo's time per program")
  collect.add_argument("--max-requests", type=int, default=8000)
  collect.add_argument("--seed", type=int, default=0)
  collect.add_argument("--shard", type=int, default=0)
  collect.add_argument("--shards", type=int, default=1)
  collect.add_argument("--out", required=True, help="a directory: one .npz per program")
  fit_ = commands.add_parser("fit", help="fit the proposer to collected programs")
  fit_.add_argument("--data", required=True)
  fit_.add_argument("--seed", type=int, default=0)
  fit_.add_argument("--steps", type=int, default=6000)
  fit_.add_argument("--out", required=True, help="the proposer's .npz")
  decode_ = commands.add_parser("decode", help="one decode of the proposal per program")
  decode_.add_argument("--params", required=True)
  decode_.add_argument("--suite", default="realistic")
  decode_.add_argument("--split", default="all", choices=("train", "heldout", "all"))
  decode_.add_argument("--out", help="write one CSV row per program here")
  search = commands.add_parser(
    "search", help="evo at a time limit seeded with the proposal, against seeded with msa's"
  )
  search.add_argument("--params", required=True)
  search.add_argument("--suite", default="realistic")
  search.add_argument("--split", default="all", choices=("train", "heldout", "all"))
  search.add_argument("--seconds", type=float, default=10.0)
  search.add_argument("--seed", type=int, default=0)
  search.add_argument("--out", help="write one CSV row per program here")
  args = parser.parse_args(argv)
  if args.command == "collect" and (args.seconds <= 0 or not 0 <= args.shard < args.shards):
    parser.error("--seconds must be positive and 0 <= --shard < --shards")
  if args.command == "search" and args.seconds <= 0:
    parser.error("--seconds must be positive")
  if args.command == "fit" and args.steps < 1:
    parser.error("--steps must be positive")

  from malloczero.common.errors import MalloczeroError

  run = {"collect": _collect, "fit": _fit, "decode": _decode, "search": _search}[args.command]
  try:
    return run(args)
  except (MalloczeroError, ValueError, OSError, KeyError) as e:
    print(f"error: {e}", file=sys.stderr)
    return 2
