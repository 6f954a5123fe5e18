"""The order in which XLA's msa allocates buffers: `MemoryBoundednessBufferIntervalComparator`.

Reimplements `MemoryBoundednessBufferIntervalComparator::GetTuple` (openxla/xla,
`xla/service/memory_space_assignment/buffer_interval_comparator.cc`): buffers are sorted by the
tuple

  (override priority, -memory boundedness, -size, -(end - start), latest use time, start, id)

ascending, so the most memory-bound buffer comes first, then the larger, then the longer-lived,
then the one whose last use is earlier, then the one that starts earlier, then the lower id. Why:
msa is greedy, so this order decides who gets fast memory when it is contended; every later piece
(the allocation loop, the msa game's step order: env/game/game.py) follows it.

Mapping to this project: a buffer's interval is its live range (`WorkloadArrays.live_start`,
`live_end`; XLA's inclusive end is `live_end - 1`, and the duration `end - start` is the same in
both conventions); the latest use time is the largest op that uses it (0 when it has no use, as
in XLA); the id is the buffer's position in `workload.buffers` (XLA's HloValue id is its
creation order, which is schedule order for an imported program). Memory-boundedness is compared
in float32, as XLA stores it, so values that differ only below float32 precision tie and fall
through to the size.

Not modelled: `MsaSortOrderOverrides` matching by instruction name or size (an explicit
`override_priority` array `[N]` stands in for it); colocations (a buffer here is one value, so
XLA's "whole buffer with its colocations" is the buffer itself); the cross-program-prefetch
comparator (cross-program prefetch is not modelled, see docs/msa.md).
"""

from __future__ import annotations

import numpy as np

from malloczero.env.workload import Workload


def latest_use_times(workload: Workload) -> np.ndarray:
  """`[N]` int64: each buffer's last using op (`GetLatestUseTime`), 0 when it has no use."""
  a = workload.arrays
  latest = np.zeros(workload.num_buffers, np.int64)
  is_use = a.incidence_op != a.def_op[a.incidence_buffer]
  np.maximum.at(latest, a.incidence_buffer[is_use], a.incidence_op[is_use])
  return latest


def sort_keys(
  workload: Workload, memory_boundedness: np.ndarray, override_priority: np.ndarray | None = None
) -> tuple[np.ndarray, ...]:
  """Each buffer's comparison tuple as seven `[N]` arrays in XLA's field order (smaller sorts
  first): override priority, -memory-boundedness (float32), -size, -(end - start), latest use
  time, start, id. Sizes stay int64 (a float key would merge sizes above 2**53).

  `memory_boundedness` `[N]` is `CostAnalysis.memory_boundedness`; `override_priority` `[N]`
  (default all 0) sorts before everything else, as XLA's sort-order overrides do."""
  a = workload.arrays
  n = workload.num_buffers
  if override_priority is None:
    override_priority = np.zeros(n, np.int64)
  boundedness = np.asarray(memory_boundedness, np.float64).astype(np.float32)
  return (
    np.asarray(override_priority, np.int64),
    -boundedness,
    -a.sizes,
    -(a.live_end - a.live_start),
    latest_use_times(workload),
    a.live_start.copy(),
    np.arange(n, dtype=np.int64),
  )


def buffer_order(
  workload: Workload, memory_boundedness: np.ndarray, override_priority: np.ndarray | None = None
) -> np.ndarray:
  """`[N]` int64: buffer positions in the order msa allocates them (XLA's sorted intervals).

  The last key (the buffer id) is unique, so the order is total and does not depend on the
  sort's stability."""
  keys = sort_keys(workload, memory_boundedness, override_priority)
  return np.lexsort(keys[::-1]).astype(np.int64)
