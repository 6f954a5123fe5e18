"""XLA's memory-space-assignment cost analysis over a workload and a hardware, vectorised.

Reimplements the pieces of `CostAnalysis` (openxla/xla,
`xla/service/memory_space_assignment/cost_analysis.cc`) that msa's decisions read:

* `GetInstructionElapsedDueToCompute`: an op's compute time, flops / peak.
* `GetInstructionElapsedDueToMemory`: bytes read from the alternate memory / its bandwidth, plus
  bytes written there / its bandwidth, plus every other byte / the default memory's bandwidth.
* `GetDefaultMemoryAccessOverhead`: the pipeline overhead of default-memory bytes (zero unless
  `pipeline_overhead_window_size_mib` is set; XLA's default is 0 as well).
* `GetInstructionElapsed` / `GetInstructionElapsedInAlternateMemory`: max(compute, memory +
  overhead), with everything in default memory or with some positions in the alternate memory.
* `GetAlternateMemoryBenefit` for a position (the definition, an output in alternate memory) and
  for each use (an operand in alternate memory): on a memory-bound op the memory time saved
  (not capped at the compute time), on a compute-bound op memory - compute (<= 0: how far the op
  is from being memory bound).
* `GetMemoryBoundedness`: the definition's benefit combined with every use's (added while both
  are positive, else the larger kept) over sqrt(size).
* `GetAsyncCopyElapsed`: bytes / (default bandwidth x `async_copy_bandwidth_scaling_factor`).

Why: the buffer order (`buffer_order.py`), the prefetch interval picker (`interval_picker.py`)
and the copy resource (`copy_resource.py`) all read these numbers, and XLA's choices follow from
them; today's `msa` (heuristics.py) approximates them with the game's own savings.

Mapping to this project. XLA's default memory is the hardware's slow level; its one alternate
memory is the fast level `alternate_level` (0, the fastest, by default; see docs/msa.md for three
levels). An op's bytes are the workload's incidences (`WorkloadArrays.incidence_bytes`: per-use
`use_bytes` and `def_bytes`, as `HloCostAnalysis` charges a gather less than its table; one
iteration's for a loop's op, below), so a position's "bytes accessed" is its incidence's bytes.
Alternate read and write bandwidths are the level's one bandwidth. The copy bandwidth defaults
to the hardware's own (`copy_bandwidth_bytes_per_s`), i.e. XLA's scaling factor = copy / default
bandwidth.

Loops (cost_analysis.cc's while-nest multiplier). The HLO importer flattens a while loop's
condition and body onto the schedule once, each op weighted by the loop's trip count and carrying
its `loop_depth` (env/workload.py `Op`). The cost model charges the weighted times, which is
right for scoring a mapping; XLA's msa decides instead with per-invocation costs (one iteration
of a body op: `GetInstructionElapsed` and its friends carry no loop factor) and with
`GetWhileNestMultiplier(level)` = `while_execution_count` ** level (XLA's flag
`xla_tpu_memory_space_assignment_while_execution_count`, 5) where a loop's weight matters:
`GetAlternateMemoryBenefit` multiplies a memory-bound benefit by it (a compute-bound one is left
as it is), and the prefetch interval picker multiplies each op's elapsed time by it
(interval_picker.py). So here an op with `loop_depth > 0` counts one step: its flops and bytes
divided by its weight, which for such an op is its loop factor (the product of the enclosing
trip counts). An op at depth 0 keeps its weight whole: there the weight is identical steps merged
(a compressed MiniMalloc interval), which XLA would see as separate instructions. A program
without loops (every depth 0) gets exactly the arrays it always did. `while_nest_level` `[T]`
is the ops' depth, XLA's `CalculateComputationNestLevel(inst, while_only=true)`, which counts a
loop's condition ops as well as its body's, as the importer does.

Not modelled, and why: ops XLA excludes from elapsed time (async starts/dones, copy-start/done:
the importer folds them into ops that already carry their bytes; the while instruction itself,
which the importer gives no op); HLO tuples and aliasing (a buffer here is one HloBuffer with one
value, so `GetMemoryBoundedness` folds the benefits of all of a loop-carried buffer's incidences,
inside the loop and out, as XLA does through the HloBuffer's values; there are no while uses to
skip). XLA computes in float32; this module in float64, so two values XLA would round to a tie
may compare unequal here (buffer_order.py compares in float32).
"""

from __future__ import annotations

import dataclasses

import numpy as np

from malloczero.env.hardware import Hardware
from malloczero.env.workload import PROGRAM_START, Workload


@dataclasses.dataclass(frozen=True)
class CostAnalysisOptions:
  """Options of XLA's `CostAnalysisOptions` that matter here.

  alternate_level: which fast level plays XLA's alternate memory (0 = fastest).
  async_copy_bandwidth_scaling_factor: copies run at default bandwidth x this factor; None takes
    the hardware's copy bandwidth (copy_bandwidth_bytes_per_s / default bandwidth).
  pipeline_overhead_window_size_mib: XLA's `pipeline_overhead_window_size_mib` (default 0: no
    overhead).
  while_execution_count: how many times msa assumes a loop runs, per nest level (XLA's
    `xla_tpu_memory_space_assignment_while_execution_count`, default 5; at least 1, so that a
    wider interval never counts less time).
  """

  alternate_level: int = 0
  async_copy_bandwidth_scaling_factor: float | None = None
  pipeline_overhead_window_size_mib: float = 0.0
  while_execution_count: float = 5.0

  def __post_init__(self):
    if not 1.0 <= self.while_execution_count < float("inf"):
      raise ValueError(
        f"while_execution_count must be a finite number >= 1, got {self.while_execution_count}"
      )


def while_multipliers(while_execution_count: float, max_level: int) -> np.ndarray:
  """`[max_level + 1]` `GetWhileNestMultiplier(level)` of each level, W ** level (XLA: `IPow`),
  one multiplication a level, exact for an integer W (5 ** 22 < 2 ** 53). The picker divides by
  the same numbers its ops were multiplied by, so an interval inside one loop body is exactly the
  sum of its per-iteration times."""
  multipliers = np.ones(max_level + 1)
  for level in range(1, max_level + 1):
    multipliers[level] = multipliers[level - 1] * float(while_execution_count)
  return multipliers


class CostAnalysis:
  """Per-op and per-incidence costs of one (workload, hardware) pair, precomputed with numpy.

  Every time and byte count is per invocation (one iteration of a loop's op; the module
  docstring); only the benefits count a loop `while_execution_count` ** depth times.

  Attributes (T ops, E incidences, N buffers):
    while_nest_level `[T]` int64: each op's `loop_depth` (XLA's while nest level).
    while_multiplier `[T]`: `GetWhileNestMultiplier` of each op, W ** level (all 1 without loops).
    incidence_bytes `[E]`: the bytes each incidence moves in one invocation of its op.
    compute_elapsed `[T]`: `GetInstructionElapsedDueToCompute`.
    memory_elapsed `[T]`: `GetInstructionElapsedDueToMemory` with everything in default memory.
    elapsed `[T]`: `GetInstructionElapsed` (everything in default memory).
    incidence_is_def `[E]`: the incidence is its buffer's definition (an output position).
    incidence_memory_elapsed_in_alternate `[E]`: the op's memory time with only this incidence
      in the alternate memory.
    incidence_elapsed_in_alternate `[E]`: `GetInstructionElapsedInAlternateMemory` for the same.
    incidence_benefit `[E]`: `GetAlternateMemoryBenefit` of the position or use (a memory-bound
      one x the op's while multiplier).
    use_elapsed_reduction `[E]`: elapsed - elapsed in alternate (the interval picker's
      `inst_elapsed_reduction` for a use).
    memory_boundedness `[N]`: `GetMemoryBoundedness` of each buffer.
  """

  def __init__(
    self,
    workload: Workload,
    hardware: Hardware,
    options: CostAnalysisOptions = CostAnalysisOptions(),
  ):
    if not 0 <= options.alternate_level < hardware.num_fast_levels:
      raise ValueError(
        f"alternate_level {options.alternate_level} is not a fast level of "
        f"'{hardware.name}' ({hardware.num_fast_levels} fast levels)"
      )
    self.workload = workload
    self.hardware = hardware
    self.options = options
    a = workload.arrays
    t = workload.num_ops
    self.default_bandwidth = float(hardware.levels[-1].bandwidth_bytes_per_s)
    self.alternate_bandwidth = float(hardware.levels[options.alternate_level].bandwidth_bytes_per_s)
    scaling = options.async_copy_bandwidth_scaling_factor
    if scaling is None:
      scaling = hardware.copy_bandwidth_bytes_per_s / self.default_bandwidth
    self.copy_bandwidth = self.default_bandwidth * float(scaling)
    self.while_nest_level = np.fromiter(
      (o.loop_depth for o in workload.ops), np.int64, count=t
    )  # [T]
    self.has_loops = bool(self.while_nest_level.any())
    flops, self.incidence_bytes = a.flops, a.incidence_bytes
    self.while_multiplier = np.ones(t)  # [T]
    if self.has_loops:
      in_loop = self.while_nest_level > 0
      # A loop's op counts one iteration; its weight is its loop factor (the module docstring).
      loop_factor = np.where(in_loop, [float(o.weight) for o in workload.ops], 1.0)
      step_flops = np.fromiter((o.flops for o in workload.ops), np.float64, count=t)
      flops = np.where(in_loop, step_flops, a.flops)
      self.incidence_bytes = a.incidence_bytes / loop_factor[a.incidence_op]
      self.while_multiplier = while_multipliers(
        options.while_execution_count, int(self.while_nest_level.max())
      )[self.while_nest_level]
    self.compute_elapsed = flops / hardware.peak_flops_per_s  # [T]
    self.bytes_accessed = np.bincount(a.incidence_op, self.incidence_bytes, minlength=t)  # [T]
    self.memory_elapsed = self.bytes_accessed / self.default_bandwidth  # [T]
    self.elapsed = np.maximum(
      self.compute_elapsed, self.memory_elapsed + self._overhead(None, None)
    )
    ops, nbytes = a.incidence_op, self.incidence_bytes
    self.incidence_is_def = ops == a.def_op[a.incidence_buffer]  # [E]
    # One position in alternate memory: its bytes move at the alternate bandwidth instead.
    self.incidence_memory_elapsed_in_alternate = (
      self.memory_elapsed[ops] - nbytes / self.default_bandwidth + nbytes / self.alternate_bandwidth
    )
    overhead = self._overhead(ops, nbytes)
    self.incidence_elapsed_in_alternate = np.maximum(
      self.compute_elapsed[ops], self.incidence_memory_elapsed_in_alternate + overhead
    )
    self.use_elapsed_reduction = self.elapsed[ops] - self.incidence_elapsed_in_alternate
    memory_bound = self.memory_elapsed[ops] > self.compute_elapsed[ops]
    saved = self.memory_elapsed[ops] - self.incidence_memory_elapsed_in_alternate
    if self.has_loops:  # GetAlternateMemoryBenefit: only a memory-bound benefit is multiplied.
      saved = saved * self.while_multiplier[ops]
    self.incidence_benefit = np.where(
      memory_bound, saved, self.memory_elapsed[ops] - self.compute_elapsed[ops]
    )
    self.memory_boundedness = self._memory_boundedness()

  def _overhead(self, ops: np.ndarray | None, alternate_bytes: np.ndarray | None) -> np.ndarray:
    """`GetDefaultMemoryAccessOverhead` per op (`alternate_bytes` None: nothing in alternate
    memory, `[T]`), else per incidence with that incidence's bytes in alternate memory `[E]`."""
    window = self.options.pipeline_overhead_window_size_mib * 1024 * 1024
    if window == 0:
      return np.zeros(len(self.compute_elapsed) if alternate_bytes is None else len(ops))
    total = self.bytes_accessed if alternate_bytes is None else self.bytes_accessed[ops]
    compute = self.compute_elapsed if alternate_bytes is None else self.compute_elapsed[ops]
    default_bytes = total if alternate_bytes is None else total - alternate_bytes
    with np.errstate(divide="ignore", invalid="ignore"):
      return np.where(total > 0, np.minimum(window, default_bytes) / total * compute, 0.0)

  def _memory_boundedness(self) -> np.ndarray:
    """`[N]`. XLA folds the benefits in use order: added while the running value and the new
    one are both positive, else the larger kept. That fold is order-independent: the sum of the
    positive benefits if there is one, else the largest. A buffer without a defining op (a
    parameter or input) starts from its parameter instruction's benefit, which is 0 (no bytes,
    no flops: the compute-bound branch, 0 - 0)."""
    a = self.workload.arrays
    n = self.workload.num_buffers
    b = self.incidence_benefit
    positive = b > 0
    positive_sum = np.bincount(a.incidence_buffer, np.where(positive, b, 0.0), minlength=n)
    any_positive = np.bincount(a.incidence_buffer, positive, minlength=n) > 0
    largest = np.full(n, -np.inf)
    np.maximum.at(largest, a.incidence_buffer, b)
    largest = np.where(a.def_op == PROGRAM_START, np.maximum(largest, 0.0), largest)
    benefit = np.where(any_positive, positive_sum, largest)
    benefit = np.where(np.isfinite(benefit), benefit, 0.0)  # A buffer no op touches.
    # A zero-byte buffer would divide by zero in XLA; it is ranked as if it had one byte.
    return benefit / np.sqrt(np.maximum(a.sizes, 1).astype(np.float64))

  def op_elapsed_with_alternate_bytes(
    self, read_bytes: np.ndarray, write_bytes: np.ndarray | None = None
  ) -> np.ndarray:
    """`[T]` `GetInstructionElapsedInAlternateMemory` of every op when it reads `read_bytes`
    `[T]` and writes `write_bytes` `[T]` (default none) from/to the alternate memory."""
    write_bytes = (
      np.zeros_like(read_bytes, dtype=np.float64) if write_bytes is None else write_bytes
    )
    alternate = read_bytes + write_bytes
    memory = (
      read_bytes / self.alternate_bandwidth
      + write_bytes / self.alternate_bandwidth
      + (self.bytes_accessed - alternate) / self.default_bandwidth
    )
    window = self.options.pipeline_overhead_window_size_mib * 1024 * 1024
    overhead = 0.0
    if window:
      with np.errstate(divide="ignore", invalid="ignore"):
        overhead = np.where(
          self.bytes_accessed > 0,
          np.minimum(window, self.bytes_accessed - alternate)
          / self.bytes_accessed
          * self.compute_elapsed,
          0.0,
        )
    return np.maximum(self.compute_elapsed, memory + overhead)

  def async_copy_elapsed(self, size_bytes: np.ndarray | int | float) -> np.ndarray | float:
    """`GetAsyncCopyElapsed`: seconds to copy `size_bytes` between default and alternate."""
    return (
      np.asarray(size_bytes, np.float64) / self.copy_bandwidth
      if np.ndim(size_bytes)
      else (float(size_bytes) / self.copy_bandwidth)
    )

  def buffer_incidences(self, buffer: int) -> slice:
    """The slice of the incidence arrays `[E]` that belongs to `buffer` (its def and uses)."""
    start = self.workload.arrays.buffer_incidence_start
    return slice(int(start[buffer]), int(start[buffer + 1]))
