"""The proposer's view of one of evo's requests: features in units that do not grow with the
program, and nothing of any mapping (msa's included), so that what the network proposes is its own.
"""

from __future__ import annotations

import numpy as np

from malloczero.env.cost_model import NO_COPY, CostModel
from malloczero.env.hardware import Hardware
from malloczero.env.requests import Requests
from malloczero.env.workload import Workload

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
  "is a span or cut of its buffer's groups",
)


def requests_of(workload: Workload, hardware: Hardware) -> tuple[CostModel, Requests]:
  """evo's cost model and requests of a program: the `evo` baseline's, whose priorities the
  proposer proposes."""
  from malloczero.env.solvers import get_solver

  model = CostModel(workload, hardware)
  return model, get_solver("evo").requests(model)


def request_saving(requests: Requests) -> np.ndarray:
  """`[R]` the seconds each request saves placed alone in its best fast level, all else slow."""
  return requests.standalone_saving.max(axis=1)


def _rank_share(x: np.ndarray, among: np.ndarray) -> np.ndarray:
  """`[R]` each value's rank among the values `x[among]` (`among` `[R]` bool), in [0, 1]: a
  value of `among` is ranked as among them alone, any other where it would fall among them."""
  reference = np.sort(x[among], kind="stable")
  share = np.empty(len(x))
  ranks = np.argsort(np.argsort(x[among], kind="stable"), kind="stable")
  share[among] = (ranks + 0.5) / max(1, len(reference))
  share[~among] = np.searchsorted(reference, x[~among]) / max(1, len(reference))
  return share


def window_max(series: np.ndarray, start: np.ndarray, end: np.ndarray) -> np.ndarray:
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


def window_demand(
  model: CostModel, requests: Requests, weight: np.ndarray
) -> tuple[np.ndarray, np.ndarray]:
  """`[R]` the mean and the peak over each request's window of the bytes live at each op, over
  the fast capacity, where each request holds `weight` `[R]` bytes over its own window (its size
  for the demand the mapping shares out; a network's expectation for what it will place)."""
  num_ops = model.workload.num_ops
  change = np.zeros(num_ops + 1)
  np.add.at(change, requests.start, weight)
  np.add.at(change, requests.end, -np.asarray(weight, float))
  demand = np.cumsum(change)[:num_ops] / float(model.hardware.fast_capacity_bytes)
  prefix = np.concatenate([[0.0], np.cumsum(demand)])
  window = np.maximum(1.0, (requests.end - requests.start).astype(float))
  mean = (prefix[requests.end] - prefix[requests.start]) / window
  return mean, window_max(demand, requests.start, requests.end)


def request_features(model: CostModel, requests: Requests) -> np.ndarray:
  """`[R, len(FEATURES)]` float32 features of each request, independent of the program's size and
  of any mapping."""
  workload, hardware = model.workload, model.hardware
  num_ops = workload.num_ops
  capacity = float(hardware.fast_capacity_bytes)
  saving = request_saving(requests)
  window = (requests.end - requests.start).astype(float)
  # The program's own requests, a weight's spans and cuts (`reshaped`, last in the order) left
  # out: counts, ranks and demand are then those of the program whatever variants it is offered.
  base = ~requests.reshaped
  num_requests = int(base.sum())
  # Bytes live in requests' windows at each op: the demand the mapping shares out.
  mean_demand, peak_demand = window_demand(model, requests, requests.size * base)
  per_buffer = np.bincount(requests.buffer[base], minlength=len(workload.buffers))
  per_buffer = np.maximum(per_buffer[requests.buffer], 1)
  uses = np.diff(requests.incidence_start).astype(float)
  # Base requests by their place in msa's order; the others, after them, by theirs.
  position = np.arange(len(requests)) - np.where(base, 0, num_requests)
  position = position / np.maximum(1, np.where(base, num_requests, len(requests) - num_requests))
  columns = (
    np.log2(requests.size / capacity),
    _rank_share(saving / requests.size, base),
    _rank_share(saving, base),
    np.log10(saving / model.slow_only_time + 1e-12),
    window / num_ops,
    requests.start / num_ops,
    requests.end / num_ops,
    requests.is_prefetch.astype(float),
    requests.exposed_copy_time / np.maximum(saving, 1e-15),
    (requests.evict_start != NO_COPY).astype(float),
    position,
    np.log2(uses + 1),
    mean_demand,
    peak_demand,
    np.log10(mean_demand + 1e-9),
    requests.size * window / (capacity * num_ops),
    np.full(len(requests), np.log10(max(1, num_requests))),
    np.full(len(requests), hardware.num_fast_levels),
    np.log2(per_buffer),
    requests.reshaped.astype(float),
  )
  return np.stack(columns, 1).astype(np.float32)
