"""Building blocks of a faithful reimplementation of XLA's memory-space assignment (docs/msa.md).

Each module reimplements one part of openxla/xla's `xla/service/memory_space_assignment/` (and
the heap simulator's chunk search), with XLA's own tests reproduced in tests/test_msa_*.py:

* `cost_analysis`: `CostAnalysis` (op elapsed times, alternate-memory benefits,
  memory-boundedness, copy times).
* `buffer_order`: `MemoryBoundednessBufferIntervalComparator` (the order buffers are allocated).
* `interval_picker`: `CostAnalysisPrefetchIntervalPicker` (prefetch start times, the "live range
  too long" rule) and `InstructionCountPrefetchIntervalPicker` (the one most XLA tests use).
* `chunks`: best-fit chunk search in time x address (`FindChunkCandidate`,
  `FindBestChunkCandidates`).
* `copy_resource`: `AsynchronousCopyResource`, the outstanding-copy limit, copy ordering.

`algorithm` assembles them into msa's allocation loop (`AllocateAllocationValues`), the `msa`
solver, run as a decision process (`MsaDecisions`: each segment's options and msa's choice);
docs/msa.md. Beside it: `allocate_segment` (`AllocateSegment`'s steps and the state they commit
to), `decision` (a decision point, its options and their slots in the msa game) and `settings`
(`MsaOptions`).
"""

from malloczero.env.msa.buffer_order import buffer_order
from malloczero.env.msa.chunks import ChunkCandidate, ChunkHeap, find_best_chunk_candidate
from malloczero.env.msa.copy_resource import (
  AsyncCopy,
  AsynchronousCopyOrdering,
  AsynchronousCopyResource,
  OutstandingCopyLimit,
)
from malloczero.env.msa.cost_analysis import CostAnalysis, CostAnalysisOptions
from malloczero.env.msa.interval_picker import (
  CostAnalysisPrefetchIntervalPicker,
  InstructionCountPrefetchIntervalPicker,
  PrefetchIntervalOptions,
  PrefetchWindow,
)

__all__ = [
  "AsyncCopy",
  "AsynchronousCopyOrdering",
  "AsynchronousCopyResource",
  "ChunkCandidate",
  "ChunkHeap",
  "CostAnalysis",
  "CostAnalysisOptions",
  "CostAnalysisPrefetchIntervalPicker",
  "InstructionCountPrefetchIntervalPicker",
  "OutstandingCopyLimit",
  "PrefetchIntervalOptions",
  "PrefetchWindow",
  "buffer_order",
  "find_best_chunk_candidate",
]
