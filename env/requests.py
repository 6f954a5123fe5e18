"""The requests mallocGame steps over, built once per (workload, hardware).

* A parameter or input gets one request per group of nearby uses. The window of a use starts
  as late as possible while a copy at the copy bandwidth still hides behind the ops before the
  use (reference times, see cost_model); a use whose window would overlap the previous group
  joins that group (the buffer simply stays in fast memory). A window that cannot hide the copy
  even from program start starts at 0 and its leftover copy time is charged when placed.
* An activation gets one request for its whole live range `[def, last_use + 1)`: its producer
  writes it straight into fast memory, so there is no copy.
* With `split_activations`, an activation read again long after its definition also gets a
  request per group of uses, grouped as a parameter's are from its definition on: the first
  produced in place, the later ones prefetched. The first evicts: later uses read the value
  from default memory or prefetch it from there, so it must be copied back, as XLA's msa evicts
  a value it kept in alternate memory before it prefetches it again
  (xla/service/memory_space_assignment/algorithm.cc, `AllocateSegment`'s eviction step). The
  eviction is issued after the defining op, the first window reaching as far as it needs to
  hide it behind reference time; a use opens a later group only where its prefetch window
  starts after that (and after the previous use). Requests of one buffer that overlap in time
  exclude each other (`Placement`): the whole range, or its groups. A training step's forward
  activations, read again only in the backward pass, thus need not hold fast memory across the
  whole step. A group per gap makes a ResNet101 training step 13,674 requests against 3,027
  without the split; evo's jitted decode (env/placement_kernels.py) places them in 0.1 s.
* With `late_prefetches`, the copies are also timed as XLA's msa times them: its
  prefetch-interval picker measures the ops before a use by their elapsed time with every
  operand in default memory (xla/service/memory_space_assignment/cost_analysis.cc,
  `GetInstructionElapsed`; prefetch_interval_picker.cc, `CostAnalysisPrefetchIntervalPicker`),
  where the windows above hide copies behind all-fast reference time. Each prefetched group gets
  a late variant (its uses, its window starting as late as the copy hides behind all-slow
  time), and the uses are grouped again with all-slow windows: shorter, so an activation read
  twice in the forward pass and once in the backward is evicted and prefetched between its
  forward uses, as msa does, where the reference windows keep it through both. On a program of
  ops cheap in fast memory (a GRU step) a weight's reference window starts at program start and
  holds fast memory for most of it; msa copies it a few ops before its use. A request equal to
  another is dropped; those of one buffer that overlap exclude each other (`Placement`), so a
  decode places the early window where it fits and a late one where only that does.
* With `reshaped_groups`, a weight's groups are also offered as msa's allocations shape them. A
  prefetched buffer with several groups gets a span: all its uses from its first group's window
  on, as msa keeps a weight fast through every step of an unrolled loop where a copy per step
  would contend for the copy engine. Each prefetched group or span of n >= 2 uses gets cuts to
  its first n - 2^j and 2^j uses: msa extends a weight's allocation use by use and serves the
  rest from default memory once the memory is taken (`AllocateSegment`), as where a
  bidirectional GRU's backward kernel arrives. With `late_prefetches` each gets its late
  variant too. These `reshaped` requests follow all others in the order, so msa's order and the
  genomes of a mapping (env/solvers/evo.py) reach them only after the groups; they exclude the
  groups they overlap (`Placement`).
* Program outputs get no request: they must end the program in default memory.

`exposed_copy_time` and `standalone_saving` are estimates, copies judged alone against the
reference time; the program time itself simulates copy contention (env/simulator.py).

Requests that can never pay off are dropped: those larger than every fast level, and those
whose saving is not positive at any level even from the all-slow state (a request's saving can
only shrink as other buffers move to fast memory, since op time is a max of compute and a sum).

Requests are ordered as XLA's memory-space-assignment orders buffers: memory-boundedness
(time saved / sqrt(size)) descending, then size descending, then live-range length descending
(the `reshaped` requests after all others).
"""

from __future__ import annotations

import dataclasses

import numpy as np

from malloczero.env.cost_model import NO_COPY, CostModel


@dataclasses.dataclass(frozen=True)
class Requests:
  """R requests in game order; per-request arrays are `[R]`, savings `[R, F]` for F fast levels."""

  buffer: np.ndarray  # [R] buffer position in workload.buffers
  start: np.ndarray  # [R] window start (op index)
  end: np.ndarray  # [R] window end (exclusive)
  size: np.ndarray  # [R] aligned bytes
  is_prefetch: np.ndarray  # [R] bool
  first_use: np.ndarray  # [R] op the prefetch must finish before (== start when produced in place)
  evict_start: np.ndarray  # [R] boundary the eviction is issued at, NO_COPY when none
  evict_done: np.ndarray  # [R] boundary it is due at (== end), NO_COPY when none
  exposed_copy_time: np.ndarray  # [R] seconds of the request's copy not hidden (estimate)
  incidence_start: np.ndarray  # [R + 1] CSR offsets
  incidence_op: (
    np.ndarray
  )  # [E_r] ops whose operand/result this request serves (unique per request)
  incidence_bytes: np.ndarray  # [E_r]
  standalone_saving: np.ndarray  # [R, F] seconds saved if placed alone in level f, all else slow
  reshaped: np.ndarray  # [R] bool: a span or cut of a buffer's groups (`reshaped_groups`)

  def __len__(self) -> int:
    return len(self.buffer)

  def ops(self, r: int) -> tuple[np.ndarray, np.ndarray]:
    lo, hi = self.incidence_start[r], self.incidence_start[r + 1]
    return self.incidence_op[lo:hi], self.incidence_bytes[lo:hi]


def build_requests(
  model: CostModel,
  split_activations: bool = False,
  late_prefetches: bool = False,
  reshaped_groups: bool = False,
) -> Requests:
  """The requests of `model`'s program; `split_activations` adds an activation's per-group
  requests beside its whole live range's, `late_prefetches` the groups timed as msa times its
  copies beside them, `reshaped_groups` weights' spans and cuts (at most one of a buffer's
  requests overlapping in time is placed: `Placement`)."""
  workload, hw = model.workload, model.hardware
  a = workload.arrays
  buffer, start, end, first_use, in_place, evict_start, first_incidence, counts, reshaped = (
    _request_rows(model, split_activations, late_prefetches, reshaped_groups)
  )
  if not len(buffer):
    return _empty_requests(hw.num_fast_levels)
  is_prefetch = in_place == 0
  evicts = evict_start != NO_COPY
  inc_start = np.concatenate([[0], np.cumsum(counts)])
  served = np.repeat(first_incidence - inc_start[:-1], counts) + np.arange(inc_start[-1])
  inc_op = a.incidence_op[served].astype(np.int64)
  inc_bytes = a.incidence_bytes[served].astype(np.float64)
  size = np.asarray(hw.align(a.sizes[buffer]), np.int64)
  copy_start = np.where(evicts, evict_start, start)
  copy_due = np.where(evicts, end, first_use)
  exposed = np.where(
    is_prefetch | evicts, model.exposed_copy_time(buffer, copy_start, copy_due), 0.0
  )
  saving = _standalone_saving(model, inc_op, inc_bytes, inc_start) - exposed[:, None]

  fits = size[:, None] <= hw.capacities[None, :-1]
  keep = np.any(fits & (saving > 0), axis=1)
  boundedness = np.max(np.where(fits, saving, 0.0), axis=1) / np.sqrt(size)
  # np.lexsort sorts by the last key first; negate for descending.
  axis = workload.time_axis  # Live-range length in program time, whatever the ops' weights.
  order = np.lexsort((buffer, -(axis[end] - axis[start]), -size, -boundedness, reshaped))
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
    is_prefetch=is_prefetch[order],
    first_use=first_use[order],
    evict_start=evict_start[order],
    evict_done=np.where(evicts, end, NO_COPY)[order],
    exposed_copy_time=exposed[order],
    incidence_start=np.concatenate([[0], np.cumsum(counts_kept)]).astype(np.int64),
    incidence_op=inc_op[gather],
    incidence_bytes=inc_bytes[gather],
    standalone_saving=saving[order],
    reshaped=reshaped[order].astype(bool),
  )


def has_rivals(requests: Requests) -> bool:
  """Whether some buffer has requests whose windows overlap (an activation's whole range and
  its groups, the groups of either timing of `late_prefetches`, a span and the groups it
  covers): `Placement` places at most one of those."""
  order = np.lexsort((requests.start, requests.buffer))
  b, s, e = (x[order] for x in (requests.buffer, requests.start, requests.end))
  # Sorted by start, a window that overlaps any of its buffer's overlaps the next one.
  return bool(np.any((b[1:] == b[:-1]) & (s[1:] < e[:-1])))


def _request_rows(
  model: CostModel,
  split_activations: bool,
  late_prefetches: bool = False,
  reshaped_groups: bool = False,
) -> tuple[np.ndarray, ...]:
  """The requests before filtering, by buffer, as `[R]` arrays: buffer, start, end, first use,
  produced in place (0/1), eviction start, first incidence and incidence count (each request
  serves a run of its buffer's incidences, in workload order; outputs get none): the groups of
  `_groups` at reference time, an activation's whole live range, with `late_prefetches` each
  prefetched group's late variant and the groups at all-slow time, and with `reshaped_groups`
  the spans and cuts (see the module docstring), then a ninth column: 1 for those."""
  a = model.workload.arrays
  bounds = a.buffer_incidence_start
  per_buffer = np.diff(bounds)
  rows = _groups(model, model.reference_prefix, split_activations)
  reshaped = np.zeros(len(rows[0]), np.int64)
  if late_prefetches or reshaped_groups:
    base = [rows]
    if late_prefetches:
      base += [_late_variants(model, rows), _groups(model, model.slow_prefix, split_activations)]
    changed = []
    if reshaped_groups:
      spans = _spans(rows, a.is_prefetched)
      changed = [spans, _cuts(_distinct(rows, spans), a.incidence_op.astype(np.int64))]
      if late_prefetches:
        changed += [_late_variants(model, c) for c in changed]
    # Tagged 0/1 after the columns: a row equal to a group's stays the group.
    tagged = [(*r, np.full(len(r[0]), k)) for k, sets in enumerate((base, changed)) for r in sets]
    *rows, reshaped = _distinct(*tagged)
  whole = np.flatnonzero(~a.is_output & ~a.is_prefetched & (per_buffer > 0))
  live_start = a.live_start.astype(np.int64)[whole]
  wholes = (
    whole,
    live_start,
    a.live_end.astype(np.int64)[whole],
    live_start,
    np.ones(len(whole), np.int64),
    np.full(len(whole), NO_COPY),
    bounds[whole],
    per_buffer[whole],
    np.zeros(len(whole), np.int64),
  )
  rows = [np.concatenate([c, w]).astype(np.int64) for c, w in zip((*rows, reshaped), wholes)]
  order = np.lexsort((rows[1], rows[0]))  # By buffer, then window start.
  return tuple(c[order] for c in rows)


def _late_variants(model: CostModel, rows: tuple[np.ndarray, ...]) -> tuple[np.ndarray, ...]:
  """The prefetched rows of `rows` whose copy hides behind all-slow time from a later start,
  started there."""
  buffer, start, _, first_use, in_place = rows[:5]
  late_start = _latest_hiding_start(model.slow_prefix, first_use, model.copy_time[buffer])
  late = (in_place == 0) & (late_start > start)
  variants = [c[late] for c in rows]
  variants[1] = late_start[late]
  return tuple(variants)


def _latest_hiding_start(prefix: np.ndarray, use: np.ndarray, copy_time: np.ndarray) -> np.ndarray:
  """`[K]` the latest op boundary s with `prefix` time of `[s, use)` at least `copy_time` (0 if
  none)."""
  return np.maximum(np.searchsorted(prefix, prefix[use] - copy_time, "right") - 1, 0)


def _groups(
  model: CostModel, prefix: np.ndarray, split_activations: bool
) -> tuple[np.ndarray, ...]:
  """The groups of uses as `_request_rows`' columns, their copies hidden behind the ops' time of
  `prefix` `[T + 1]` (cumulative). A buffer's incidences are grouped where a use's window
  starts after the previous incidence; an activation's only where it also starts after its
  eviction could be done. With `split_activations`, an activation with several groups gets one
  request per group, the first produced in place and evicting; without, none (its whole live
  range serves it)."""
  a = model.workload.arrays
  bounds = a.buffer_incidence_start
  per_buffer = np.diff(bounds)
  owner = np.repeat(np.arange(model.workload.num_buffers), per_buffer)  # [E] incidence's buffer
  ops = a.incidence_op.astype(np.int64)
  def_op = a.def_op.astype(np.int64)[owner]
  activation = ~a.is_prefetched[owner]
  copy_time = model.copy_time[owner]
  window_start = _latest_hiding_start(prefix, ops, copy_time)
  # An activation reaches default memory through an eviction issued after its definition: a
  # use's prefetch can start only once that eviction hid (boundary `evicted_by`), so only a use
  # whose window starts after it opens a group of its own.
  evicted_by = np.searchsorted(prefix, prefix[np.minimum(def_op + 1, model.num_ops)] + copy_time)
  served = ~a.is_output[owner]
  opens = np.zeros(len(ops), bool)
  opens[bounds[:-1][per_buffer > 0]] = True
  later = np.zeros(len(ops), bool)
  later[1:] = (window_start[1:] > ops[:-1]) & (window_start[1:] >= evicted_by[1:])
  later[bounds[:-1][per_buffer > 0]] = False  # A buffer's first incidence opens a group anyway.
  opens[1:] |= np.where(activation[1:], later[1:], window_start[1:] > ops[:-1])
  first = np.flatnonzero(served & opens)  # [G] each group's first incidence
  last = np.flatnonzero(served & np.append(opens[1:], True))  # [G] and its last
  buffer = owner[first]
  in_place = activation[first] & (ops[first] == def_op[first])
  start = np.where(in_place, ops[first], window_start[first])
  end = ops[last] + 1
  first_use = np.where(in_place, start, ops[first])
  # A group produced in place with a later group of its buffer evicts, due at the end of its
  # window, which reaches as far as the eviction needs to hide (the next group starts later).
  evicts = in_place & np.append(buffer[1:] == buffer[:-1], False)
  end = np.where(evicts, np.maximum(end, evicted_by[first]), end)
  evict_start = np.where(evicts, start + 1, NO_COPY)
  split = activation[first] & (np.bincount(buffer, minlength=len(per_buffer))[buffer] > 1)
  kept = ~activation[first] | (split & split_activations)
  columns = (buffer, start, end, first_use, in_place, evict_start, first, last - first + 1)
  return tuple(np.asarray(c[kept], np.int64) for c in columns)


def _spans(rows: tuple[np.ndarray, ...], is_prefetched: np.ndarray) -> tuple[np.ndarray, ...]:
  """One request per prefetched buffer with several groups in `rows` (`_request_rows`' columns,
  by buffer in incidence order): all its uses, from its first group's window on."""
  buffer, start, end, first_use, in_place, evict_start, first, count = rows
  rows_of = np.flatnonzero(is_prefetched[buffer])
  owners, at, groups = np.unique(buffer[rows_of], return_index=True, return_counts=True)
  at, owners = rows_of[at[groups > 1]], owners[groups > 1]
  last = at + groups[groups > 1] - 1
  return (
    owners,
    start[at],
    end[last],
    first_use[at],
    in_place[at],
    evict_start[at],
    first[at],
    first[last] + count[last] - first[at],
  )


def _cuts(rows: tuple[np.ndarray, ...], incidence_op: np.ndarray) -> tuple[np.ndarray, ...]:
  """Each prefetched row of `rows` with n >= 2 uses cut to its first n - 2^j and 2^j uses (< n):
  msa serves a weight's later uses from default memory once its allocation cannot extend to
  them (`AllocateSegment`)."""
  buffer, start, _, first_use, in_place, evict_start, first, count = rows
  cut_rows, kept = [], []
  for j in range(int(np.log2(max(2, count.max(initial=2)))) + 1):
    for keep in (count - 2**j, np.full(len(count), 2**j)):
      rows_of = np.flatnonzero((in_place == 0) & (keep >= 1) & (keep < count))
      cut_rows.append(rows_of)
      kept.append(keep[rows_of])
  at, keep = np.concatenate(cut_rows), np.concatenate(kept)
  return (
    buffer[at],
    start[at],
    incidence_op[first[at] + keep - 1] + 1,
    first_use[at],
    in_place[at],
    evict_start[at],
    first[at],
    keep,
  )


def _distinct(*row_sets: tuple[np.ndarray, ...]) -> tuple[np.ndarray, ...]:
  """The rows of `row_sets` (each a tuple of `[K]` columns) concatenated, each distinct row once,
  first occurrences in order; rows are compared on `_request_rows`' columns only (a further
  column is a tag)."""
  columns = tuple(np.concatenate(c) for c in zip(*row_sets))
  _, first = np.unique(np.stack(columns[:8], 1), axis=0, return_index=True)
  keep = np.sort(first)
  return tuple(c[keep] for c in columns)


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
    z,
    z,
    np.zeros(0),
    np.zeros(1, np.int64),
    z,
    np.zeros(0),
    np.zeros((0, num_fast)),
    np.zeros(0, bool),
  )
