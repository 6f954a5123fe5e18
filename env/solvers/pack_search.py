"""The jitted (numba) search of `pack` (packing.py): MiniMalloc's SearchSolutions
(github.com/google/minimalloc, src/solver.cc) over one partition of requests, with its canonical
order, dynamic ordering, section inference, dominance and hatless pruning and dynamic
decomposition (packing.py says what each is), bounded by a node count.

`Kernel` holds one packing problem's arrays and runs the search on a partition; `warm_up`
compiles it, or loads it from numba's cache beside this file.
"""

from __future__ import annotations

from typing import NamedTuple

import numba
import numpy as np

# What a run returns.
OK, NOT_FOUND, ABORTED = 0, 1, 2
# Slots of the search's `ctl` counters; FULL is set when the trail had no room for a change.
_NODES_LEFT, _NODES, _TOP, _BEST, _STAMP, _FULL = range(6)
# The fields a preordering heuristic is spelt with: W (window length), A (bytes x time), T
# (bytes live where it is).
FIELD = {"W": 0, "A": 1, "T": 2}


# The search state is one int64 array `mem` so that a single trail (flat index, old value)
# undoes any change: offset [0, n) (-1 = unplaced), min_off [n, 2n), section floor [2n, 2n+S),
# section total (bytes of unplaced requests) [2n+S, 2n+2S), cuts (unplaced requests across the
# boundary s | s+1) [2n+2S, 2n+3S), bytes x time placed [2n+3S]; `_Problem` says where each
# part starts. The jitted functions take named tuples of int64 arrays and integers (numba infers
# their types; they carry no annotations), grouped by how they change: `_Problem` not at all
# during a run, `_Trail` (`mem` and its undo log) on every placement, `_Scratch` per node.


class _Problem(NamedTuple):
  """A packing problem as the jitted search reads it; `Kernel` builds it (int64 arrays)."""

  n: int  # Requests.
  num_sections: int  # S.
  capacity: int  # Bytes of the fastest level.
  size: np.ndarray  # [n] bytes.
  width: np.ndarray  # [n] window length in time.
  lo: np.ndarray  # [n] first section of the window.
  hi: np.ndarray  # [n] the section after its last.
  overlap_ptr: np.ndarray  # [n + 1], CSR with `overlap_idx`: per request, the others whose
  overlap_idx: np.ndarray  # windows overlap its own.
  section_ptr: np.ndarray  # [S + 1], CSR with `section_idx`: per section, the requests live
  section_idx: np.ndarray  # in it, by first section.
  fields: np.ndarray  # The preordering heuristic, as `FIELD` values.
  min_off_at: int  # Where each part of `mem` starts: n, 2n, 2n + S, 2n + 2S, 2n + 3S.
  floor_at: int
  total_at: int
  cuts_at: int
  area_at: int


class _Trail(NamedTuple):
  """`mem`, the log that undoes its changes (one flat index and old value per change) and the
  search's counters (`ctl`: `_NODES_LEFT` ...)."""

  mem: np.ndarray
  index: np.ndarray
  old: np.ndarray
  ctl: np.ndarray


class _Scratch(NamedTuple):
  """The rest of what the search writes."""

  stamp: np.ndarray  # [S] the last placement that touched each section.
  touched: np.ndarray  # [S] the sections the current placement touched.
  rank: np.ndarray  # [n] each request's place in the current static preorder.
  best: np.ndarray  # [n] the offsets of the best partial packing so far.


@numba.njit(cache=True)
def _put(trail, i, value):
  """`mem[i] = value`, logged on the trail."""
  mem, index, old, ctl = trail
  t = ctl[_TOP]
  if t >= len(index):
    ctl[_FULL] = 1  # Not applied: the search aborts, undoes what it logged and is rerun.
    return
  index[t] = i
  old[t] = mem[i]
  ctl[_TOP] = t + 1
  mem[i] = value


@numba.njit(cache=True)
def _undo(trail, mark):
  """Takes back the changes logged after `mark`."""
  mem, index, old, ctl = trail
  t = ctl[_TOP]
  while t > mark:
    t -= 1
    mem[index[t]] = old[t]
  ctl[_TOP] = t


@numba.njit(cache=True)
def _fits(problem, mem, sec_lo, sec_hi, offset):
  """Section inference with the monotonic floor: in every section of the partition, the floor
  (and the offset just chosen: later placements are no lower) plus the unplaced bytes fit."""
  floor_at, total_at, capacity = problem.floor_at, problem.total_at, problem.capacity
  for s in range(sec_lo, sec_hi):
    if max(mem[floor_at + s], offset) + mem[total_at + s] > capacity:
      return False
  return True


@numba.njit(cache=True)
def _preorder(problem, mem, buffers, rank):
  """MiniMalloc's static preorder (PreorderingComparator) of `buffers` into `rank`: each field
  of the heuristic descending (W: window length in time, A: bytes x time, T: the most bytes of
  unplaced requests in a section it spans), ties by index."""
  k = len(buffers)
  values = np.empty((3, k), np.int64)
  for j in range(k):
    b = buffers[j]
    values[0, j] = problem.width[b]
    values[1, j] = problem.width[b] * problem.size[b]
    most = 0
    for s in range(problem.lo[b], problem.hi[b]):
      most = max(most, mem[problem.total_at + s])
    values[2, j] = most
  order = np.argsort(buffers, kind="mergesort")
  fields = problem.fields
  for f in range(len(fields) - 1, -1, -1):
    key = -values[fields[f]][order]
    order = order[np.argsort(key, kind="mergesort")]
  for j in range(k):
    rank[buffers[order[j]]] = j


@numba.njit(cache=True)
def _dynamic_order(problem, mem, rank, buffers):
  """The unplaced requests of `buffers` by minimum offset, then static rank (MiniMalloc's
  dynamic ordering), and the lowest top any of them could reach (the dominance bound)."""
  size, min_off_at, n = problem.size, problem.min_off_at, problem.n
  k = 0
  for b in buffers:
    if mem[b] < 0:
      k += 1
  ordering = np.empty(k, np.int64)
  keys = np.empty(k, np.int64)
  k = 0
  min_height = np.int64(1) << 62
  for b in buffers:
    if mem[b] < 0:
      min_offset = mem[min_off_at + b]
      ordering[k] = b
      keys[k] = min_offset * (n + 1) + rank[b]
      min_height = min(min_height, min_offset + size[b])
      k += 1
  return ordering[np.argsort(keys)], min_height


# Inlined by numba: LLVM leaves it a call (it is the largest step), and a call per placement,
# with the tuples' arrays passed one field at a time, cost the search 5% of its node rate.
@numba.njit(cache=True, inline="always")
def _raise_min_offsets(problem, trail, scratch, b, height):
  """The unplaced requests overlapping placed `b` start no lower than its top (`height`); the
  sections of those raised go to `scratch.touched`. Returns whether nothing unplaced overlaps
  it (hatless) and how many sections it touched."""
  mem, ctl = trail.mem, trail.ctl
  min_off_at, lo, hi = problem.min_off_at, problem.lo, problem.hi
  stamps, touched = scratch.stamp, scratch.touched
  hatless = True
  ctl[_STAMP] += 1
  stamp = ctl[_STAMP]
  num_touched = 0
  for j in range(problem.overlap_ptr[b], problem.overlap_ptr[b + 1]):
    q = problem.overlap_idx[j]
    if mem[q] >= 0:
      continue
    hatless = False
    if mem[min_off_at + q] < height:
      _put(trail, min_off_at + q, height)
      for s in range(lo[q], hi[q]):
        if stamps[s] != stamp:
          stamps[s] = stamp
          touched[num_touched] = s
          num_touched += 1
  return hatless, num_touched


@numba.njit(cache=True)
def _occupy(problem, trail, b, height):
  """`b`'s sections: their floors rise to its top, their unplaced bytes lose its size."""
  mem = trail.mem
  floor_at, total_at, size = problem.floor_at, problem.total_at, problem.size[b]
  for s in range(problem.lo[b], problem.hi[b]):
    _put(trail, floor_at + s, height)
    _put(trail, total_at + s, mem[total_at + s] - size)


@numba.njit(cache=True)
def _unallocated_floors_fit(problem, trail, touched, num_touched, offset):
  """Unallocated floor: no unplaced request of a touched section can start below the lowest
  minimum offset among them, so that is its floor; whether every touched section still fits."""
  mem, no_low = trail.mem, np.int64(1) << 62
  section_ptr, section_idx = problem.section_ptr, problem.section_idx
  min_off_at, floor_at, total_at = problem.min_off_at, problem.floor_at, problem.total_at
  for a in range(num_touched):
    s = touched[a]
    low = no_low
    for j in range(section_ptr[s], section_ptr[s + 1]):
      q = section_idx[j]
      if mem[q] < 0 and mem[min_off_at + q] < low:
        low = mem[min_off_at + q]
    if mem[floor_at + s] < low < no_low:
      _put(trail, floor_at + s, low)
      if max(low, offset) + mem[total_at + s] > problem.capacity:
        return False
  return True


@numba.njit(cache=True)
def _record_area(problem, trail, best, b):
  """Counts `b`'s bytes x time as placed; a new most keeps the offsets as the best partial
  packing."""
  mem, ctl, area_at = trail.mem, trail.ctl, problem.area_at
  _put(trail, area_at, mem[area_at] + problem.size[b] * problem.width[b])
  if mem[area_at] > ctl[_BEST]:
    ctl[_BEST] = mem[area_at]
    best[:] = mem[: problem.n]


@numba.njit(cache=True)
def _cut_points(problem, trail, b, sec_lo, sec_hi):
  """Takes placed `b` off the boundaries inside its window; returns the partition's bounds
  with, between them, each boundary no unplaced request crosses any more (a cut: the sides
  are independent)."""
  mem, lo, hi, cuts_at = trail.mem, problem.lo[b], problem.hi[b], problem.cuts_at
  points = np.empty(hi - lo + 2, np.int64)
  points[0] = sec_lo
  num_points = 1
  for s in range(lo, hi - 1):
    _put(trail, cuts_at + s, mem[cuts_at + s] - 1)
    if mem[cuts_at + s] == 0:
      points[num_points] = s + 1
      num_points += 1
  points[num_points] = sec_hi
  return points[: num_points + 1]


@numba.njit(cache=True)
def _side(problem, mem, ordering, sec_lo, sec_hi):
  """The unplaced requests of `ordering` that live in sections `[sec_lo, sec_hi)`."""
  lo, hi = problem.lo, problem.hi
  inside = np.empty(len(ordering), np.int64)
  count = 0
  for q in ordering:
    if mem[q] < 0 and lo[q] < sec_hi and sec_lo < hi[q]:
      inside[count] = q
      count += 1
  return inside[:count]


@numba.njit(cache=True)
def _search(problem, trail, scratch, buffers, sec_lo, sec_hi, last_offset, last_rank):
  """MiniMalloc's SearchSolutions with DynamicallyDecompose folded in. `buffers` is the parent
  node's ordering of the partition (placed ones are skipped); `(last_offset, last_rank)` the
  canonical bound. A success keeps its changes (only a failing ancestor undoes them)."""
  mem, ctl, rank = trail.mem, trail.ctl, scratch.rank
  if ctl[_NODES_LEFT] <= 0 or ctl[_FULL]:
    return ABORTED
  ctl[_NODES_LEFT] -= 1
  ctl[_NODES] += 1
  ordering, min_height = _dynamic_order(problem, mem, rank, buffers)
  if len(ordering) == 0:
    return OK
  for b in ordering:
    offset = mem[problem.min_off_at + b]
    if offset < last_offset or (offset == last_offset and rank[b] < last_rank):
      continue  # Not canonical: this packing is reached in another order.
    if offset >= min_height:
      break  # Dominated, and so is every later one (the ordering is by offset).
    mark = ctl[_TOP]
    _put(trail, b, offset)
    height = offset + problem.size[b]
    hatless, num_touched = _raise_min_offsets(problem, trail, scratch, b, height)
    _occupy(problem, trail, b, height)
    feasible = _fits(problem, mem, sec_lo, sec_hi, offset)
    if feasible and num_touched:
      # Computed only when the cheaper check passed; it can only tighten it.
      feasible = _unallocated_floors_fit(problem, trail, scratch.touched, num_touched, offset)
    status = NOT_FOUND
    if ctl[_FULL]:
      feasible, status = False, ABORTED
    if feasible:
      _record_area(problem, trail, scratch.best, b)
      cuts = _cut_points(problem, trail, b, sec_lo, sec_hi)
      if ctl[_FULL]:
        status = ABORTED
      elif len(cuts) == 2:
        status = _search(problem, trail, scratch, ordering, sec_lo, sec_hi, offset, rank[b])
      else:  # Dynamic decomposition: the sides of a cut are solved independently.
        status = OK
        for c in range(1, len(cuts)):
          inside = _side(problem, mem, ordering, cuts[c - 1], cuts[c])
          if len(inside) == 0:
            continue
          saved = rank[inside]
          _preorder(problem, mem, inside, rank)
          status = _search(
            problem, trail, scratch, inside, cuts[c - 1], cuts[c], np.int64(0), np.int64(-1)
          )
          rank[inside] = saved
          if status != OK:
            break
    if status == OK:
      return OK
    _undo(trail, mark)
    if status != NOT_FOUND:
      return status
    if hatless:
      break  # Nothing overhead: other choices here fail too (hatless pruning).
  return NOT_FOUND


class Kernel:
  """The jitted search's arrays for one packing problem, and one bounded run of it."""

  def __init__(
    self,
    size: np.ndarray,
    width: np.ndarray,
    lo: np.ndarray,
    hi: np.ndarray,
    starts: np.ndarray,
    ends: np.ndarray,
    num_sections: int,
    capacity: int,
  ):
    n, S = len(size), num_sections
    size, width = size.astype(np.int64), width.astype(np.int64)
    lo, hi = lo.astype(np.int64), hi.astype(np.int64)
    overlap_ptr, overlap_idx = _overlaps(starts, ends)
    section_ptr, section_idx = _section_members(lo, hi, S)
    self.problem = p = _Problem(
      n,
      S,
      capacity,
      size,
      width,
      lo,
      hi,
      overlap_ptr,
      overlap_idx,
      section_ptr,
      section_idx,
      fields=np.zeros(0, np.int64),
      min_off_at=n,
      floor_at=2 * n,
      total_at=2 * n + S,
      cuts_at=2 * n + 2 * S,
      area_at=2 * n + 3 * S,
    )
    self.mem = np.zeros(p.area_at + 1, np.int64)
    self.mem[:n] = -1
    total = np.zeros(S + 1, np.int64)
    np.add.at(total, lo, size)
    np.add.at(total, hi, -size)
    self.mem[p.total_at : p.cuts_at] = np.cumsum(total)[:S]
    cuts = np.zeros(S + 1, np.int64)
    np.add.at(cuts, lo + 1, 1)
    np.add.at(cuts, hi, -1)
    self.mem[p.cuts_at : p.area_at] = np.cumsum(cuts)[1:]
    # The trail's first size: per request on a path, its offset, its overlaps' minimum offsets,
    # floor, total and cut of its sections and the bytes x time placed, plus room for the
    # unallocated floors; `run` doubles it when it fills up.
    trail = int((2 + np.diff(overlap_ptr) + 3 * (hi - lo)).sum()) + 4 * S + 1024
    self.trail_index, self.trail_old = np.zeros(trail, np.int64), np.zeros(trail, np.int64)
    self.ctl = np.zeros(6, np.int64)
    self.stamp = np.zeros(S, np.int64)
    self.touched = np.zeros(S, np.int64)
    self.rank = np.zeros(n, np.int64)
    self.nodes = 0

  @property
  def offset(self) -> np.ndarray:
    return self.mem[: self.problem.n]

  def run(
    self, buffers: np.ndarray, sec_lo: int, sec_hi: int, heuristic: str, nodes: int
  ) -> tuple[int, int, int, np.ndarray]:
    """Searches one partition with at most `nodes` nodes. Returns (status, nodes used, bytes x
    time of its best partial packing, the offsets of that packing). A success stays in `mem`;
    anything else is undone."""
    problem = self.problem._replace(fields=np.array([FIELD[c] for c in heuristic], np.int64))
    ctl = self.ctl
    while True:
      ctl[_NODES_LEFT], ctl[_NODES], ctl[_FULL] = nodes, 0, 0
      ctl[_BEST] = base = self.mem[problem.area_at]
      mark = ctl[_TOP]
      trail = _Trail(self.mem, self.trail_index, self.trail_old, ctl)
      scratch = _Scratch(self.stamp, self.touched, self.rank, self.mem[: problem.n].copy())
      _preorder(problem, self.mem, buffers, self.rank)
      status = _search(problem, trail, scratch, buffers, sec_lo, sec_hi, np.int64(0), np.int64(-1))
      if not ctl[_FULL]:
        break
      _undo(trail, mark)  # Nothing unlogged was applied.
      more = np.zeros(len(self.trail_index), np.int64)  # Doubled.
      self.trail_index = np.concatenate([self.trail_index, more])
      self.trail_old = np.concatenate([self.trail_old, more])
    used = int(ctl[_NODES])
    self.nodes += used
    if status != OK:
      _undo(trail, mark)
    return int(status), used, int(ctl[_BEST] - base), scratch.best


def _overlaps(starts: np.ndarray, ends: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
  """CSR (pointers, indices): per request, the others whose windows overlap its own."""
  rows = [np.flatnonzero((starts < ends[b]) & (starts[b] < ends)) for b in range(len(starts))]
  rows = [r[r != b] for b, r in enumerate(rows)]
  ptr = np.concatenate([[0], np.cumsum([len(r) for r in rows])]).astype(np.int64)
  return ptr, np.concatenate(rows + [np.zeros(0, np.int64)]).astype(np.int64)


def _section_members(
  lo: np.ndarray, hi: np.ndarray, num_sections: int
) -> tuple[np.ndarray, np.ndarray]:
  """CSR (pointers, indices): per section, the requests live in it, by first section."""
  members: list[list[int]] = [[] for _ in range(num_sections)]
  for b in np.argsort(lo, kind="stable").tolist():
    for s in range(int(lo[b]), int(hi[b])):
      members[s].append(b)
  counts = np.array([len(m) for m in members], np.int64)
  ptr = np.concatenate([[0], np.cumsum(counts)]).astype(np.int64)
  return ptr, np.array([b for m in members for b in m], np.int64)


def warm_up() -> None:
  """Compiles (or loads from numba's cache) the search with a two-request problem."""
  one = np.ones(2, np.int64)
  kernel = Kernel(one, one, np.zeros(2, np.int64), one, np.zeros(2, np.int64), one, 1, 2)
  kernel.run(np.arange(2, dtype=np.int64), 0, 1, "WAT", 10)
