"""Jitted (numba) kernels of the game's per-step work: the copy queue's total stall, a fast
level's occupancy over a window, and the candidate rows of the msa game's observation.

Why: the game steps thousands of times a second (at least 5,000 with observation and
contention, `malloczero bench`); as numpy expressions these cost mostly numpy's per-call overhead
on arrays of a
few to a few hundred entries. Loaded on first use (`kernels()` in env/simulator.py), so that
`import malloczero` does not load numba; compiled on a machine's first use and read from
numba's cache beside this file after that (`cache=True`). Flat arguments only: numba's dispatch
types a tuple element by element in Python.
"""

from __future__ import annotations

import numba
import numpy as np


@numba.njit(cache=True)
def stall_loop(idle_s, start, done, work_s):
  """env/simulator.py's clamps as one pass over the boundaries, after a stable sort of the copies
  by (start, done): O(K log K + T), the total stall only."""
  num_ops = len(idle_s)
  span = num_ops + 2
  order = np.argsort(start * span + done, kind="mergesort")
  issued = np.zeros(num_ops + 1)  # work issued at each boundary
  due = np.zeros(num_ops + 1)  # W_d: queue work up to the last copy due at d
  cumulative = 0.0
  for k in order:
    cumulative += work_s[k]
    issued[start[k]] += work_s[k]
    if cumulative > due[done[k]]:
      due[done[k]] = cumulative
  x = 0.0
  issued_so_far = 0.0
  stall = 0.0
  for t in range(num_ops + 1):
    issued_so_far += issued[t]
    if due[t] > x:
      stall += due[t] - x
      x = due[t]
    if t == num_ops:
      break
    x = min(x + idle_s[t], issued_so_far)
  return stall


@numba.njit(cache=True)
def occupancy(out, starts, ends, offsets, sizes, alive, count, first_op, last_op, capacity):
  """Fills `out` [bins] with the fraction of each address bin of a level taken by the chunks
  live at some op of `[first_op, last_op]` (chunks may overlap in time only where they do not
  in address, so the fractions add up)."""
  bins = len(out)
  width = capacity / bins
  for i in range(count):
    if not alive[i] or starts[i] > last_op or ends[i] <= first_op:
      continue
    low = offsets[i] / width
    high = (offsets[i] + sizes[i]) / width
    b = int(low)
    while b < bins and b < high:
      covered = min(high, b + 1.0) - max(low, float(b))
      if covered > 0:
        out[b] += covered
      b += 1
  for b in range(bins):
    if out[b] > 1.0:
      out[b] = 1.0


@numba.njit(cache=True)
def candidate_rows(
  out,
  rows,
  level,
  start,
  end,
  offset,
  saving,
  prefetch,
  evicts,
  msa_row,
  positions,
  last_op,
  capacity,
  saving_scale,
  slow_op_prefix,
  use,
  segment_start,
  copy_time,
  num_starts,
  columns,
):
  """Fills the candidates observation `out` [C, F] (rows `rows` [n], one per option after
  option 0); `columns` holds the feature columns in `MsaGame`'s `_Columns.candidate_order`."""
  (
    valid,
    keep,
    fetch,
    rank,
    start_col,
    lead,
    hold,
    offset_col,
    saving_col,
    hide_ratio,
    evicts_col,
    msa_col,
    level_col,
  ) = (
    columns[0],
    columns[1],
    columns[2],
    columns[3],
    columns[4],
    columns[5],
    columns[6],
    columns[7],
    columns[8],
    columns[9],
    columns[10],
    columns[11],
    columns[12],
  )
  window = max(use - segment_start + 1, 1)
  for i in range(len(rows)):
    r = rows[i]
    out[r, valid] = 1.0
    out[r, level_col + level[i]] = 1.0
    s = positions[start[i] + 1]
    out[r, start_col] = s
    out[r, hold] = positions[min(end[i], last_op) + 1] - s
    out[r, offset_col] = offset[i] / capacity[level[i]]
    out[r, saving_col] = saving[i] / saving_scale
    if prefetch[i]:
      out[r, fetch] = 1.0
      out[r, rank] = ((r - 1) % num_starts) / num_starts
      hidden = slow_op_prefix[use] - slow_op_prefix[max(start[i], 0)]
      out[r, hide_ratio] = min(hidden / max(copy_time, 1e-30), 10.0)
      out[r, lead] = (use - start[i]) / window
      out[r, evicts_col] = 1.0 if evicts[i] else 0.0
    else:
      out[r, keep] = 1.0
  if msa_row >= 0:
    out[msa_row, msa_col] = 1.0
