"""Jitted (numba) kernels of the msa game's observation (env/game/game.py's `MsaGame`): a fast
level's occupancy over a window, and the candidate rows of the options.

Why: the game observes after every step (thousands a second, `malloczero bench`); as numpy
expressions these cost mostly numpy's per-call overhead on arrays of a few to a few hundred
entries. Loaded on first use (`lazy_module` in game.py), so that `import malloczero` does not load
numba; compiled on a machine's first use and read from numba's cache beside this file after that
(`cache=True`). A group of arguments travels as one plain tuple in the order of a named tuple
(the heap's `Chunks`, game.py's `CandidatePlacements`, `CandidateValues` and `CandidateFrame`),
of at most four arrays each (env/msa/kernels/__init__.py says why).
"""

from __future__ import annotations

from malloczero.env.game.game import CandidateFrame, CandidatePlacements, CandidateValues
from malloczero.env.kernel_cache import njit
from malloczero.env.msa.chunks import Chunks


@njit
def occupancy(out, chunks, first_op, last_op, capacity):
  """Fills `out` [bins] with the fraction of each address bin of a level taken by the chunks
  (`ChunkHeap.kernel_state()`: a `Chunks`' fields) live at some op of `[first_op, last_op]`
  (chunks may overlap in time only where they do not in address, so the fractions add up)."""
  c = Chunks(*chunks)
  starts, ends, offsets, sizes, alive = c.rects[0], c.rects[1], c.rects[2], c.rects[3], c.alive
  bins = len(out)
  width = capacity / bins
  for i in range(c.count):
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


@njit
def candidate_rows(out, rows, placements, values, frame, msa_row, use, segment_start, copy_time):
  """Fills the candidates observation `out` [C, F] (rows `rows` [n], one per option after
  option 0; `placements` and `values`: a `CandidatePlacements`' and a `CandidateValues`' fields,
  `frame`: a `CandidateFrame`'s, whose `columns` holds the feature columns in `MsaGame`'s
  `_Columns.candidate_order`)."""
  p, o, f = CandidatePlacements(*placements), CandidateValues(*values), CandidateFrame(*frame)
  level, start, end, offset, saving = p.level, p.start, p.end, p.offset, o.saving
  positions, capacity, last_op, num_starts = f.positions, f.capacity, f.last_op, f.num_starts
  columns = f.columns
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
    out[r, saving_col] = saving[i] / f.saving_scale
    if o.prefetch[i]:
      out[r, fetch] = 1.0
      out[r, rank] = ((r - 1) % num_starts) / num_starts
      hidden = f.slow_op_prefix[use] - f.slow_op_prefix[max(start[i], 0)]
      out[r, hide_ratio] = min(hidden / max(copy_time, 1e-30), 10.0)
      out[r, lead] = (use - start[i]) / window
      out[r, evicts_col] = 1.0 if o.evicts[i] else 0.0
    else:
      out[r, keep] = 1.0
  if msa_row >= 0:
    out[msa_row, msa_col] = 1.0
