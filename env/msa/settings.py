"""msa's settings (`MsaOptions`): XLA's memory-space-assignment `Options`, the ones this
reimplementation reads (openxla/xla `xla/service/memory_space_assignment/options.h`; the
defaults of `memory_space_assignment_test_base.h` where XLA's tests set them).

Apart from the allocation loop (algorithm.py) so that its parts (allocate_segment.py) read the
same settings without importing the loop.
"""

from __future__ import annotations

import dataclasses
import math

from malloczero.env.msa.interval_picker import PrefetchIntervalOptions

PICKERS = ("cost", "instruction_count")
COPY_BUDGETS = ("elapsed", "idle")


@dataclasses.dataclass(frozen=True)
class MsaOptions:
  """msa's options; defaults are XLA's test values (`memory_space_assignment_test_base.h`) where
  XLA's tests set them, else XLA's `Options` defaults.

  min_overlap_to_async_copy_ratio: 0.8. A prefetch start is accepted while the ops between it
    and the use, plus the use's own saving, cover this x the copy time.
  preferred_overlap_to_async_copy_ratio: 1.5. The first start tried covers this x the copy time.
  max_overlap_to_mem_size_async_copy_ratio: 10. The earliest start, and the longest segment
    kept without a copy, cover at most this x the time to copy the whole fast memory.
  max_outstanding_prefetches / max_outstanding_evictions: XLA's `Options` default -1 (no limit).
  use_copy_resource: check each prefetch against `AsynchronousCopyResource` (XLA always does;
    False lets copies overlap freely, for comparison).
  enforce_prefetch_fifo_order: XLA's option (default false): no prefetch nested in another.
  picker: "cost" (`CostAnalysisPrefetchIntervalPicker`, what XLA runs with a cost analysis) or
    "instruction_count" (`InstructionCountPrefetchIntervalPicker`, most of XLA's unit tests).
  instruction_count_min / instruction_count_max: that picker's bounds (XLA's tests: 2 and 10).
  copy_budget: what each op lends the copy resources. "elapsed" (XLA: `MsaAlgorithm`'s
    constructor budgets each op its default-memory elapsed time) or "idle" (not XLA: the op's
    default-memory idle time with everything in default memory, max(0, compute - memory), the
    time in which the cost model's copy engine, like XLA's `RuntimeSimulator`, advances). With
    "elapsed", msa believes a copy hides behind a memory-bound op that the simulator gives no
    room to, and the copy stalls the program (docs/msa.md's open question). Only with the cost
    picker (the instruction-count picker budgets 1 per op, as XLA without a cost analysis).
  while_execution_count: 5. How many times msa assumes a loop body runs, per nest level, in its
    benefits and prefetch intervals (XLA's flag `xla_tpu_memory_space_assignment_while_execution_
    count`, whose default is 5; `CostAnalysisOptions`, cost_analysis.py's "Loops"); at least 1.
  sort_order_overrides / preferred_prefetch_overrides: text files of XLA's
    `MsaSortOrderOverrides` / `PreferredPrefetchOverrides` (XLA's `Options` fields of those
    messages), matched by the module's instruction names as XLA matches them (overrides.py).
    Empty: none.
  """

  min_overlap_to_async_copy_ratio: float = 0.8
  preferred_overlap_to_async_copy_ratio: float = 1.5
  max_overlap_to_mem_size_async_copy_ratio: float = 10.0
  max_outstanding_prefetches: int = -1
  max_outstanding_evictions: int = -1
  use_copy_resource: bool = True
  enforce_prefetch_fifo_order: bool = False
  picker: str = "cost"
  instruction_count_min: int = 2
  instruction_count_max: int = 10
  copy_budget: str = "elapsed"
  while_execution_count: float = 5.0
  sort_order_overrides: str = ""
  preferred_prefetch_overrides: str = ""

  def __post_init__(self):
    for name in (
      "min_overlap_to_async_copy_ratio",
      "preferred_overlap_to_async_copy_ratio",
      "max_overlap_to_mem_size_async_copy_ratio",
    ):
      value = getattr(self, name)
      if not math.isfinite(value) or value <= 0:
        raise ValueError(f"{name} must be a positive number, got {value}")
    for name in ("max_outstanding_prefetches", "max_outstanding_evictions"):
      if getattr(self, name) < -1:
        raise ValueError(f"{name} must be -1 (no limit) or a count >= 0, got {getattr(self, name)}")
    if not 0 <= self.instruction_count_min <= self.instruction_count_max:
      raise ValueError(
        f"the instruction-count picker needs 0 <= instruction_count_min <= "
        f"instruction_count_max, got {self.instruction_count_min} and "
        f"{self.instruction_count_max}"
      )
    if not 1.0 <= self.while_execution_count < math.inf:
      raise ValueError(
        f"while_execution_count must be a finite number >= 1, got {self.while_execution_count}"
      )
    if self.picker not in PICKERS:
      raise ValueError(f"unknown picker '{self.picker}' (choose from {', '.join(PICKERS)})")
    if self.copy_budget not in COPY_BUDGETS:
      raise ValueError(
        f"unknown copy budget '{self.copy_budget}' (choose from {', '.join(COPY_BUDGETS)})"
      )

  @property
  def interval_options(self) -> PrefetchIntervalOptions:
    return PrefetchIntervalOptions(
      self.min_overlap_to_async_copy_ratio,
      self.preferred_overlap_to_async_copy_ratio,
      self.max_overlap_to_mem_size_async_copy_ratio,
    )
