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
)


def requests_of(workload: Workload, hardware: Hardware) -> tuple[CostModel, Requests]:
  """evo's cost model and requests of a program: the `evo` baseline's, whose priorities the
  proposer proposes."""
  from malloczero.env.solvers import get_solver

  model = CostModel(workload, hardware)
  return model, get_solver("evo").requests(model)


def _rank_share(x: np.ndarray) -> np.ndarray:
  """`[R]` each value's rank among `x`, in (0, 1)."""
  ranks = np.argsort(np.argsort(x, kind="stable"), kind="stable")
  return (ranks + 0.5) / max(1, len(x))


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


def request_features(model: CostModel, requests: Requests) -> np.ndarray:
  """`[R, len(FEATURES)]` float32 features of each request, independent of the program's size and
  of any mapping."""
  workload, hardware = model.workload, model.hardware
  num_requests, num_ops = len(requests), workload.num_ops
  capacity = float(hardware.fast_capacity_bytes)
  saving = requests.standalone_saving.max(axis=1)
  window = (requests.end - requests.start).astype(float)
  # Bytes live in requests' windows at each op: the demand the mapping shares out.
  change = np.zeros(num_ops + 1)
  np.add.at(change, requests.start, requests.size)
  np.add.at(change, requests.end, -requests.size.astype(float))
  demand = np.cumsum(change)[:num_ops] / capacity
  prefix = np.concatenate([[0.0], np.cumsum(demand)])
  mean_demand = (prefix[requests.end] - prefix[requests.start]) / np.maximum(1.0, window)
  peak_demand = window_max(demand, requests.start, requests.end)
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
