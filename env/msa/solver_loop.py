"""msa's own run (the `msa` solver) as one jitted loop: `MsaAlgorithm.run` without a Python step
per decision.

`MsaAlgorithm.steps(msa_only=True)` answered with msa's own choice at every step is the `msa`
solver (algorithm.py). As Python, that loop cost about 27 us a step on top of its kernels (a
program of 100,000 buffers makes 185,000 steps: 5 of its 9 seconds), in the decision and option
objects, the generator's protocol and the calls into the kernels. `run_loop` makes the same
steps in one kernel (kernels/solver_loop.py): the same plans (`SegmentAllocator`'s `plan_keep`,
`plan_eviction`, `plan_all_prefetches` with one start: msa's own choice) and commits
(`apply_keep`, `apply_eviction`, `apply_prefetch`), against the same chunk heaps and
copy-resource trees, through the same search kernels, in the same order, so that every
floating-point operation is the Python loop's and the segments are identical (tests/
test_msa_solver_loop.py compares the two on random programs under every option it runs).

What it does not run, the Python loop does (`supported`): the outstanding-copy limits and the
FIFO order (Python lists per start; the only way an eviction is refused and a buffer
uncommitted), and a copy resource that must rebuild its queue (`AsynchronousCopyResource.exact`,
never in msa's use). After the loop the heaps and the copy resources' trees are msa's final
state; the resources' lists of copies are not kept (nothing reads them after `run`).

Room. The heap's arrays grow in Python (`ChunkHeap.reserve`); the loop checks before each
buffer that every level has room for what the buffer can add (`ROOM_ROWS` free rows and three
chunks a use), and returns to Python to make it when not, then goes on from that buffer. A
buffer that still finds an array full (one buffer filling more than `ROOM_ROWS` rows) ends the
loop (`ABORTED`, as does anything the loop does not expect: a refused eviction, a copy that
does not fit); `MsaAlgorithm.run` then runs the Python loop from the start, on a fresh state.

Arrays travel as tuples of at most four arrays in the order of the named tuples here (the
kernels' convention, kernels/__init__.py).
"""

from __future__ import annotations

from typing import NamedTuple

import numpy as np

from malloczero.common.lazy import lazy_module
from malloczero.env.cost_model import Allocations
from malloczero.env.msa.copy_resource import AsynchronousCopyResource
from malloczero.env.msa.settings import MsaOptions

_kernels = lazy_module("malloczero.env.msa.kernels.solver_loop")

# `run_loop`'s kernel returns one of these.
DONE, NEEDS_ROOM, ABORTED = 0, 1, 2
# Free rows each of a heap's row arrays (the time index's pool, the live lists' rows) must have
# before a buffer, and per chunk the buffer may add: far more than one buffer's searches and
# commits use (a union of a few thousand ranges, a list moved to the end of its rows).
ROOM_ROWS = 1 << 16
ROOM_ROWS_PER_CHUNK = 64
# `LoopOutput.state`'s entries: the next buffer, segments written, `COUNTS` from STATE_COUNTS
# on, the chunks the next buffer needs room for, the room asked before a buffer (`ROOM_ROWS`,
# `ROOM_ROWS_PER_CHUNK`: read when the loop runs, not when it compiles).
STATE_NEXT, STATE_ROWS, STATE_COUNTS, STATE_NEEDED, STATE_ROOM = 0, 1, 2, 6, 7
STATE_SIZE = 9
COUNTS = ("kept", "prefetches", "evictions", "default_uses")
NO_VALUE = -(1 << 62)  # An op the Python loop holds as None (no eviction, no default copy yet).


class LoopProgram(NamedTuple):
  """The buffers as the loop reads them: msa's order (outputs and empty buffers left out, as
  `steps` skips them), per buffer its aligned size and definition op `[2, N]`, the CSR bounds of
  its uses `[N + 1]`, and the uses' ops and incidences `[2, U]` (`MsaAlgorithm._uses`)."""

  order: np.ndarray
  buffers: np.ndarray
  use_bounds: np.ndarray
  uses: np.ndarray


class LoopCosts(NamedTuple):
  """Per buffer its copy's elapsed time (the picker's) and what it charges the copy resource
  `[2, N]`; per fast level and incidence the use's elapsed reduction `[L, E]`; the levels'
  capacities `[L]`; whether prefetches are checked against the copy resource."""

  copy: np.ndarray
  reductions: np.ndarray
  capacity: np.ndarray
  use_copy_resource: bool


class LoopPickers(NamedTuple):
  """The pickers of the fast levels: per level the prefix sums of the ops' elapsed times `[L, T +
  1]`, the longest interval kept without a copy `[L]` and whether no op's elapsed time is
  negative `[L]`; the min and preferred overlap ratios and the earlier side's thinning; or the
  instruction-count picker and its bounds; the program's loops (the pickers' `nest_state()`,
  the same at every level: a `WhileNest`'s fields, None without loops)."""

  prefix: np.ndarray
  max_elapsed: np.ndarray
  monotone: np.ndarray
  min_ratio: float
  preferred_ratio: float
  num_explored: int
  count_picker: bool
  count_min: int
  count_max: int
  nest: tuple | None


class LoopOutput(NamedTuple):
  """The segments committed, in allocation order `[8, S]` (`Allocations`' columns); the loop's
  state `[STATE_SIZE]` (`STATE_*`); the copy resources' budget and demand sums `[2, 2]`; and a
  buffer's segments as it makes them `[8, W]`."""

  segments: np.ndarray
  state: np.ndarray
  sums: np.ndarray
  scratch: np.ndarray


def supported(options: MsaOptions, resources: tuple[AsynchronousCopyResource, ...]) -> bool:
  """Whether `run_loop` makes the Python loop's steps for these options (the module docstring)."""
  return (
    options.max_outstanding_prefetches < 0
    and options.max_outstanding_evictions < 0
    and not options.enforce_prefetch_fifo_order
    and not options.preferred_prefetch_overrides  # A use's preferred start is the Python loop's.
    and not any(r.exact for r in resources)
  )


def _heap_state(heap) -> tuple:
  """A chunk heap as the loop takes it: its index's, live lists', chunk arrays' and scratch's
  tuples (`ChunkHeap.search_state()` without the count, which the loop keeps)."""
  index, lists, chunks, scratch = heap.search_state()
  return (index, lists, (chunks[0], chunks[1]), scratch)


def run_loop(algorithm) -> tuple[Allocations, dict[str, int]] | None:
  """msa's segments (in allocation order) and the loop's counts, made by the jitted loop on
  `algorithm`'s fresh state; None when the loop gave up (`ABORTED`: the caller runs the Python
  loop on a new state)."""
  workload, hardware, allocator = algorithm.workload, algorithm.hardware, algorithm.allocator
  options = algorithm.options
  a = workload.arrays
  num_ops, levels = workload.num_ops, allocator.num_fast
  order = np.asarray(algorithm.allocation_order(), np.int64)
  order = order[~a.is_output[order] & (a.sizes[order] != 0)]
  bounds, use_ops, use_incidences, _ = algorithm.use_table
  bounds = np.asarray(bounds, np.int64)
  program = LoopProgram(
    order,
    np.stack([np.asarray(hardware.align(a.sizes), np.int64), a.def_op.astype(np.int64)]),
    bounds,
    np.stack([use_ops, use_incidences]).astype(np.int64),
  )
  costs = LoopCosts(
    allocator.copy_arrays(),
    np.stack([ca.use_elapsed_reduction for ca in allocator.analyses]).astype(np.float64),
    np.asarray(allocator.capacity, np.int64),
    bool(options.use_copy_resource),
  )
  pickers = allocator.pickers
  if options.picker == "cost":
    picker_state = LoopPickers(
      np.stack([p.prefix for p in pickers]),
      np.array([p.max_async_copy_elapsed for p in pickers], np.float64),
      np.array([p.monotone for p in pickers], bool),
      float(options.min_overlap_to_async_copy_ratio),
      float(options.preferred_overlap_to_async_copy_ratio),
      int(pickers[0].options.num_explored_decreasing_intervals),
      False,
      0,
      0,
      pickers[0].nest_state(),
    )
  else:
    picker_state = LoopPickers(
      np.zeros((levels, num_ops + 1)),
      np.zeros(levels),
      np.ones(levels, bool),
      0.0,
      0.0,
      1,
      True,
      int(options.instruction_count_min),
      int(options.instruction_count_max),
      None,
    )
  resources = (allocator.prefetch_resource, allocator.eviction_resource)
  widest = int(np.diff(bounds).max(initial=0)) + 2  # A buffer's segments: one a use, at most.
  state = np.zeros(STATE_SIZE, np.int64)
  state[STATE_ROOM : STATE_ROOM + 2] = ROOM_ROWS, ROOM_ROWS_PER_CHUNK
  output = LoopOutput(
    np.zeros((8, len(use_ops) + len(order) + 1), np.int64),
    state,
    np.array([[r.budget_sum, r.demand_sum] for r in resources], np.float64),
    np.zeros((8, widest), np.int64),
  )
  heaps = allocator.heaps
  for heap in heaps:
    heap.cover_starts(num_ops + 1)  # Every chunk starts by the last op: no index rebuilt below.
  scalars = np.array([[h.chunk_count, h.heap_size, h.alignment] for h in heaps], np.int64)
  trees = tuple(r.kernel_state() for r in resources)
  kernel = _kernels().run_loop
  while True:
    status = kernel(
      tuple(program),
      tuple(costs),
      tuple(picker_state),
      tuple(_heap_state(h) for h in heaps),
      scalars,
      trees,
      tuple(output),
    )
    for heap, (count, heap_size, _) in zip(heaps, scalars.tolist()):
      heap.set_counts(count, heap_size)
    if status == DONE:
      break
    if status == ABORTED:
      return None
    chunks = int(output.state[STATE_NEEDED])
    for heap in heaps:
      heap.reserve(chunks, 2 * (ROOM_ROWS + ROOM_ROWS_PER_CHUNK * chunks))
  for r, (_, demand) in zip(resources, output.sums.tolist()):
    r.set_demand_sum(demand)
  rows = int(output.state[STATE_ROWS])
  table = output.segments[:, :rows]
  allocations = Allocations(*(np.ascontiguousarray(column) for column in table))
  counts = output.state[STATE_COUNTS : STATE_COUNTS + len(COUNTS)].tolist()
  return allocations, dict(zip(COUNTS, counts), uncommitted_buffers=0)


__all__ = ["run_loop", "supported"]
