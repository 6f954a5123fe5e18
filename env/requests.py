"""The requests mallocGame steps over, built once per (workload, hardware).

* An activation gets one request for its whole live range `[def, last_use + 1)`: its producer
  writes it straight into fast memory, so there is no copy.
* A parameter or input gets one request per group of nearby uses. The window of a use starts
  as late as possible while a copy at the copy bandwidth still hides behind the ops before the
  use (reference times, see cost_model); a use whose window would overlap the previous group
  joins that group (the buffer simply stays in fast memory). A window that cannot hide the copy
  even from program start starts at 0 and its leftover copy time is charged when placed.
* Program outputs get no request: they must end the program in default memory.

`exposed_copy_time` and `standalone_saving` are estimates, copies judged alone against the
reference time; the program time itself simulates copy contention (env/simulator.py).

Requests that can never pay off are dropped: those larger than every fast level, and those
whose saving is not positive at any level even from the all-slow state (a request's saving can
only shrink as other buffers move to fast memory, since op time is a max of compute and a sum).

Requests are ordered as XLA's memory-space-assignment orders buffers: memory-boundedness
(time saved / sqrt(size)) descending, then size descending, then live-range length descending.
"""

from __future__ import annotations

import dataclasses

import numpy as np

from malloczero.env.cost_model import CostModel


@dataclasses.dataclass(frozen=True)
class Requests:
  """R requests in game order; per-request arrays are `[R]`, savings `[R, F]` for F fast levels."""

  buffer: np.ndarray  # [R] buffer position in workload.buffers
  start: np.ndarray  # [R] window start (op index)
  end: np.ndarray  # [R] window end (exclusive)
  size: np.ndarray  # [R] aligned bytes
  is_prefetch: np.ndarray  # [R] bool
  first_use: np.ndarray  # [R] op the copy must finish before (== start for activations)
  exposed_copy_time: np.ndarray  # [R] seconds charged if placed (0 for activations)
  incidence_start: np.ndarray  # [R + 1] CSR offsets
  incidence_op: (
    np.ndarray
  )  # [E_r] ops whose operand/result this request serves (unique per request)
  incidence_bytes: np.ndarray  # [E_r]
  standalone_saving: np.ndarray  # [R, F] seconds saved if placed alone in level f, all else slow

  def __len__(self) -> int:
    return len(self.buffer)

  def ops(self, r: int) -> tuple[np.ndarray, np.ndarray]:
    lo, hi = self.incidence_start[r], self.incidence_start[r + 1]
    return self.incidence_op[lo:hi], self.incidence_bytes[lo:hi]


def build_requests(model: CostModel) -> Requests:
  workload, hw = model.workload, model.hardware
  a = workload.arrays
  (buffer, start, end, first_use, counts), served = _request_rows(model)
  if not len(buffer):
    return _empty_requests(hw.num_fast_levels)
  inc_start = np.concatenate([[0], np.cumsum(counts)])
  inc_op = a.incidence_op[served].astype(np.int64)
  inc_bytes = a.incidence_bytes[served].astype(np.float64)
  size = np.asarray(hw.align(a.sizes[buffer]), np.int64)
  exposed = model.exposed_copy_time(buffer, start, first_use)
  saving = _standalone_saving(model, inc_op, inc_bytes, inc_start) - exposed[:, None]

  fits = size[:, None] <= hw.capacities[None, :-1]
  keep = np.any(fits & (saving > 0), axis=1)
  boundedness = np.max(np.where(fits, saving, 0.0), axis=1) / np.sqrt(size)
  # np.lexsort sorts by the last key first; negate for descending.
  axis = workload.time_axis  # Live-range length in program time, whatever the ops' weights.
  order = np.lexsort((buffer, -(axis[end] - axis[start]), -size, -boundedness))
  order = order[keep[order]]
  counts_kept = counts[order]
  # Each kept request's incidences, in the new order: [inc_start[r], inc_start[r + 1]) per r.
  gather = np.repeat(inc_start[order] - np.cumsum(counts_kept) + counts_kept, counts_kept)
  gather += np.arange(len(gather))
  return Requests(
    buffer=buffer[order],
    start=start[order],
    end=end[order],
    size=size[order],
    is_prefetch=a.is_prefetched[buffer[order]],
    first_use=first_use[order],
    exposed_copy_time=exposed[order],
    incidence_start=np.concatenate([[0], np.cumsum(counts_kept)]).astype(np.int64),
    incidence_op=inc_op[gather],
    incidence_bytes=inc_bytes[gather],
    standalone_saving=saving[order],
  )


def _request_rows(
  model: CostModel,
) -> tuple[tuple[np.ndarray, ...], np.ndarray]:
  """The requests before filtering, by buffer then window, as `[R]` arrays (buffer, start, end,
  first use, incidence count), and which incidences they serve `[E]` (in order, each request's
  a run of its buffer's: all but those of outputs). An activation's one request spans its live
  range; a parameter's incidences are grouped where a use's window starts after the previous
  use."""
  a = model.workload.arrays
  num_buffers = model.workload.num_buffers
  bounds = a.buffer_incidence_start
  per_buffer = np.diff(bounds)
  owner = np.repeat(np.arange(num_buffers), per_buffer)  # [E] each incidence's buffer
  ops = a.incidence_op.astype(np.int64)
  # Latest start s with reference time of [s, use) >= copy time; 0 if impossible.
  ref_prefix = model.reference_prefix
  targets = ref_prefix[ops] - model.copy_time[owner]
  window_start = np.maximum(np.searchsorted(ref_prefix, targets, side="right") - 1, 0)
  prefetched = a.is_prefetched[owner] & ~a.is_output[owner]
  first_of_buffer = np.zeros(len(ops), bool)
  first_of_buffer[bounds[:-1][per_buffer > 0]] = True
  opens = first_of_buffer.copy()
  opens[1:] |= window_start[1:] > ops[:-1]
  group_first = np.flatnonzero(prefetched & opens)  # [G] each group's first incidence
  group_last = np.flatnonzero(prefetched & np.append(opens[1:], True))  # [G] and its last
  activation = np.flatnonzero(~a.is_output & ~a.is_prefetched)
  # Rows in buffer order, a buffer's groups in incidence order.
  keys = np.concatenate([bounds[activation], group_first])
  row_order = np.argsort(keys, kind="stable")
  live_start = a.live_start.astype(np.int64)
  columns = (
    np.concatenate([activation, owner[group_first]]),
    np.concatenate([live_start[activation], window_start[group_first]]),
    np.concatenate([a.live_end.astype(np.int64)[activation], ops[group_last] + 1]),
    np.concatenate([live_start[activation], ops[group_first]]),
    np.concatenate([per_buffer[activation], group_last - group_first + 1]),
  )
  served = ~a.is_output[owner]
  return tuple(np.asarray(c, np.int64)[row_order] for c in columns), served


def _standalone_saving(
  model: CostModel, inc_op: np.ndarray, inc_bytes: np.ndarray, inc_start: np.ndarray
) -> np.ndarray:
  """[R, F] op-time decrease of each request alone in each fast level (copy cost excluded)."""
  inv_bw = model.inverse_bandwidth
  slow_time = np.maximum(model.compute_time, model.slow_memory_time)
  request_of = np.repeat(np.arange(len(inc_start) - 1), np.diff(inc_start))
  out = []
  for level in range(len(inv_bw) - 1):
    new_mem = model.slow_memory_time[inc_op] - inc_bytes * (inv_bw[-1] - inv_bw[level])
    gain = slow_time[inc_op] - np.maximum(model.compute_time[inc_op], new_mem)
    out.append(np.bincount(request_of, gain, minlength=len(inc_start) - 1))
  return np.stack(out, axis=1)


def _empty_requests(num_fast: int) -> Requests:
  z = np.zeros(0, np.int64)
  return Requests(
    z,
    z,
    z,
    z,
    np.zeros(0, bool),
    z,
    np.zeros(0),
    np.zeros(1, np.int64),
    z,
    np.zeros(0),
    np.zeros((0, num_fast)),
  )
