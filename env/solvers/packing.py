"""`pack`: a MiniMalloc-style search that tries to place every request in the fastest level.

Reimplemented from the description and sources of MiniMalloc (Moffitt, "MiniMalloc: A
Lightweight Memory Allocator for Hardware-Accelerated Machine Learning", ASPLOS 2024;
github.com/google/minimalloc, src/sweeper.cc and src/solver.cc). It answers the dynamic storage
allocation question (does every buffer fit, each at one offset for its whole fixed window?)
rather than the game's objective, which is what the MiniMalloc challenge instances ask. The
ideas taken from it:

* **Sweep-line sections and partitions** (sweeper.cc): the request windows' distinct endpoints
  cut time into sections, each with a fixed set of live requests; requests that never share a
  section boundary with a live request fall into independent partitions, solved one by one.
* **Canonical solutions** (solver.cc, `canonical_only`): buffers are placed in non-decreasing
  order of offset (ties in the static preorder), each at its *minimum offset*: the top of the
  highest placed request it overlaps in time. So no free-gap query is needed, and each packing
  is visited once.
* **Dynamic ordering**: at every node the unplaced requests are tried by minimum offset, then
  by a static preorder (`WAT`, `TAW`, `TWA`: width = window length in time, area = bytes x
  time, total = the most bytes live in a section it spans), tried round-robin with node limits
  that double each round (`RoundRobin`).
* **Inference and pruning**: section inference (a section's floor plus the bytes of its
  unplaced requests must fit; the floor is at least the highest placed request there, the
  offset just chosen (monotonic floor) and the lowest minimum offset of its unplaced requests
  (unallocated floor)); dominance (a request whose minimum offset is at or above the lowest top
  any unplaced request could reach would leave a needless gap below it); hatless pruning (once
  a request with nothing unplaced over its window has failed, other choices at that node fail
  too).
* **Dynamic decomposition**: when placing a request leaves no unplaced request across a section
  boundary, the two sides are solved independently.

Not taken: buffers with gaps and fixed offsets (the workloads here have neither) and the
minimum-capacity binary search.

When more bytes are live at some time than the fastest level holds (or a request is larger
than it), no full packing exists; that is the usual case for XLA programs, whose suite entries
set the fast levels to a fraction of peak. `pack` then searches a subset that fits everywhere:
the requests that save least per byte are dropped from the overfull sections (saving per byte is
the window length on a MiniMalloc CSV; on an XLA program, the op time the cost model says it
saves alone, per byte). When the search does not pack its requests in the time limit (or proves they
cannot be), or worked on such a subset, `pack` returns the best, by program time, of: the
search's packing or best partial packing (the most bytes x time placed at any node, per
partition) completed greedily, twice (the remaining requests by standalone saving, or by saving
per byte; each where it saves most, best fit, any fast level), and bestfit's mapping (the game's
order, first candidate), so it is never worse than bestfit. `info` says which, and that no full
packing was found or that none exists. The search handles requests, so XLA parameters with
several prefetch windows are several items with disjoint windows; it packs the fastest level
only (the completions use every level).

The search runs jitted (numba): Python-level DFS reached about 1,000 nodes a second on these
instances, the jitted one 100,000-250,000, and instance A needs 116,000. It cannot read a clock,
so it runs with node limits: `time_limit_s` bounds the whole call: bestfit runs first, the search
gets the nodes that fit, at the rate measured so far, in what is left after reserving three
times bestfit's duration (and 0.1 s) for the completions and the final replay. Compiling it
(first use on a machine, about 6 s) or loading it from numba's cache happens inside the limit,
before the rate is measured.
"""

from __future__ import annotations

import time
from typing import Callable

import numba
import numpy as np

from malloczero.common.errors import MalloczeroError
from malloczero.env.placement import Placement
from malloczero.env.requests import Requests

DEFAULT_TIME_LIMIT_S = 10.0
HEURISTICS = ("WAT", "TAW", "TWA")
_OK, _NOT_FOUND, _ABORTED = 0, 1, 2
# Slots of the search's `ctl` counters; FULL is set when the trail had no room for a change.
_NODES_LEFT, _NODES, _TOP, _BEST, _STAMP, _FULL = range(6)
_FIELD = {"W": 0, "A": 1, "T": 2}
_clock = time.perf_counter


# The search state is one int64 array `mem` so that a single trail (flat index, old value)
# undoes any change: offset [0, n) (-1 = unplaced), min_off [n, 2n), section floor [2n, 2n+S),
# section total (bytes of unplaced requests) [2n+S, 2n+2S), cuts (unplaced requests across the
# boundary s | s+1) [2n+2S, 2n+3S), bytes x time placed [2n+3S]. The jitted functions take
# int64 arrays and integers only (numba infers their types; they carry no annotations).


@numba.njit(cache=True)
def _put(mem, tidx, told, ctl, i, value):
  t = ctl[_TOP]
  if t >= len(tidx):
    ctl[_FULL] = 1  # Not applied: the search aborts, undoes what it logged and is rerun.
    return
  tidx[t] = i
  told[t] = mem[i]
  ctl[_TOP] = t + 1
  mem[i] = value


@numba.njit(cache=True)
def _undo(mem, tidx, told, ctl, mark):
  t = ctl[_TOP]
  while t > mark:
    t -= 1
    mem[tidx[t]] = told[t]
  ctl[_TOP] = t


@numba.njit(cache=True)
def _fits(mem, f0, t0, sec_lo, sec_hi, offset, capacity):
  """Section inference with the monotonic floor: in every section of the partition, the floor
  (and the offset just chosen: later placements are no lower) plus the unplaced bytes fit."""
  for s in range(sec_lo, sec_hi):
    if max(mem[f0 + s], offset) + mem[t0 + s] > capacity:
      return False
  return True


@numba.njit(cache=True)
def _preorder(mem, n, num_sections, size, width, lo, hi, buffers, fields, rank):
  """MiniMalloc's static preorder (PreorderingComparator) of `buffers` into `rank`: each field
  of the heuristic descending (W: window length in time, A: bytes x time, T: the most bytes of
  unplaced requests in a section it spans), ties by index."""
  k = len(buffers)
  values = np.empty((3, k), np.int64)
  total0 = 2 * n + num_sections
  for j in range(k):
    b = buffers[j]
    values[0, j] = width[b]
    values[1, j] = width[b] * size[b]
    most = 0
    for s in range(lo[b], hi[b]):
      most = max(most, mem[total0 + s])
    values[2, j] = most
  order = np.argsort(buffers, kind="mergesort")
  for f in range(len(fields) - 1, -1, -1):
    key = -values[fields[f]][order]
    order = order[np.argsort(key, kind="mergesort")]
  for j in range(k):
    rank[buffers[order[j]]] = j


@numba.njit(cache=True)
def _search(mem, tidx, told, ctl, stamp, scratch, rank, best, n, num_sections, capacity, size,
            width, lo, hi, ov_ptr, ov_idx, mem_ptr, mem_idx, fields, buffers, sec_lo, sec_hi,
            last_offset, last_rank):
  """MiniMalloc's SearchSolutions with DynamicallyDecompose folded in. `buffers` is the parent
  node's ordering of the partition (placed ones are skipped); `(last_offset, last_rank)` the
  canonical bound. A success keeps its changes (only a failing ancestor undoes them)."""
  if ctl[_NODES_LEFT] <= 0 or ctl[_FULL]:
    return _ABORTED
  ctl[_NODES_LEFT] -= 1
  ctl[_NODES] += 1
  m0, f0, t0, c0, area = n, 2 * n, 2 * n + num_sections, 2 * n + 2 * num_sections, \
      2 * n + 3 * num_sections
  k = 0
  for b in buffers:
    if mem[b] < 0:
      k += 1
  if k == 0:
    return _OK
  ordering = np.empty(k, np.int64)
  keys = np.empty(k, np.int64)
  k = 0
  min_height = np.int64(1) << 62
  for b in buffers:
    if mem[b] < 0:
      ordering[k] = b
      keys[k] = mem[m0 + b] * (n + 1) + rank[b]
      min_height = min(min_height, mem[m0 + b] + size[b])
      k += 1
  ordering = ordering[np.argsort(keys)]
  for b in ordering:
    o, rb = mem[m0 + b], rank[b]
    if o < last_offset or (o == last_offset and rb < last_rank):
      continue  # Not canonical: this packing is reached in another order.
    if o >= min_height:
      break  # Dominated, and so is every later one (the ordering is by offset).
    mark = ctl[_TOP]
    _put(mem, tidx, told, ctl, b, o)
    height = o + size[b]
    hatless = True
    ctl[_STAMP] += 1
    st = ctl[_STAMP]
    na = 0
    for j in range(ov_ptr[b], ov_ptr[b + 1]):
      q = ov_idx[j]
      if mem[q] >= 0:
        continue
      hatless = False
      if mem[m0 + q] < height:
        _put(mem, tidx, told, ctl, m0 + q, height)
        for s in range(lo[q], hi[q]):
          if stamp[s] != st:
            stamp[s] = st
            scratch[na] = s
            na += 1
    for s in range(lo[b], hi[b]):
      _put(mem, tidx, told, ctl, f0 + s, height)
      _put(mem, tidx, told, ctl, t0 + s, mem[t0 + s] - size[b])
    feasible = _fits(mem, f0, t0, sec_lo, sec_hi, o, capacity)
    if feasible and na:
      # Unallocated floor: no unplaced request of s can start below the lowest minimum offset
      # among them. Computed only when the cheaper check passed; it can only tighten it.
      for a in range(na):
        s = scratch[a]
        low = np.int64(1) << 62
        for j in range(mem_ptr[s], mem_ptr[s + 1]):
          q = mem_idx[j]
          if mem[q] < 0 and mem[m0 + q] < low:
            low = mem[m0 + q]
        if mem[f0 + s] < low < (np.int64(1) << 62):
          _put(mem, tidx, told, ctl, f0 + s, low)
          if max(low, o) + mem[t0 + s] > capacity:
            feasible = False
            break
    status = _NOT_FOUND
    if ctl[_FULL]:
      feasible, status = False, _ABORTED
    if feasible:
      _put(mem, tidx, told, ctl, area, mem[area] + size[b] * width[b])
      if mem[area] > ctl[_BEST]:
        ctl[_BEST] = mem[area]
        best[:] = mem[:n]
      cutpoints = np.empty(hi[b] - lo[b] + 2, np.int64)
      cutpoints[0] = sec_lo
      nc = 1
      for s in range(lo[b], hi[b] - 1):
        _put(mem, tidx, told, ctl, c0 + s, mem[c0 + s] - 1)
        if mem[c0 + s] == 0:
          cutpoints[nc] = s + 1
          nc += 1
      if ctl[_FULL]:
        status = _ABORTED
      elif nc == 1:
        status = _search(mem, tidx, told, ctl, stamp, scratch, rank, best, n, num_sections,
                         capacity, size, width, lo, hi, ov_ptr, ov_idx, mem_ptr, mem_idx, fields,
                         ordering, sec_lo, sec_hi, o, rb)
      else:  # Dynamic decomposition: the sides of a cut are solved independently.
        cutpoints[nc] = sec_hi
        nc += 1
        status = _OK
        for c in range(1, nc):
          a, z = cutpoints[c - 1], cutpoints[c]
          inside = np.empty(k, np.int64)
          ni = 0
          for q in ordering:
            if mem[q] < 0 and lo[q] < z and a < hi[q]:
              inside[ni] = q
              ni += 1
          if ni == 0:
            continue
          inside = inside[:ni]
          saved = rank[inside]
          _preorder(mem, n, num_sections, size, width, lo, hi, inside, fields, rank)
          status = _search(mem, tidx, told, ctl, stamp, scratch, rank, best, n, num_sections,
                           capacity, size, width, lo, hi, ov_ptr, ov_idx, mem_ptr, mem_idx,
                           fields, inside, a, z, np.int64(0), np.int64(-1))
          rank[inside] = saved
          if status != _OK:
            break
    if status == _OK:
      return _OK
    _undo(mem, tidx, told, ctl, mark)
    if status != _NOT_FOUND:
      return status
    if hatless:
      break  # Nothing overhead: other choices here fail too (hatless pruning).
  return _NOT_FOUND


class _Kernel:
  """The jitted search's arrays for one packing problem, and one bounded run of it."""

  def __init__(self, size: np.ndarray, width: np.ndarray, lo: np.ndarray, hi: np.ndarray,
               starts: np.ndarray, ends: np.ndarray, num_sections: int, capacity: int):
    n = len(size)
    self.n, self.num_sections, self.capacity = n, num_sections, capacity
    self.size, self.width = size.astype(np.int64), width.astype(np.int64)
    self.lo, self.hi = lo.astype(np.int64), hi.astype(np.int64)
    rows = [np.flatnonzero((starts < ends[b]) & (starts[b] < ends)) for b in range(n)]
    rows = [r[r != b] for b, r in enumerate(rows)]
    self.ov_ptr = np.concatenate([[0], np.cumsum([len(r) for r in rows])]).astype(np.int64)
    self.ov_idx = np.concatenate(rows + [np.zeros(0, np.int64)]).astype(np.int64)
    order = np.argsort(self.lo, kind="stable")
    counts = np.zeros(num_sections, np.int64)
    members: list[list[int]] = [[] for _ in range(num_sections)]
    for b in order.tolist():
      for s in range(int(self.lo[b]), int(self.hi[b])):
        members[s].append(b)
    counts = np.array([len(m) for m in members], np.int64)
    self.mem_ptr = np.concatenate([[0], np.cumsum(counts)]).astype(np.int64)
    self.mem_idx = np.array([b for m in members for b in m], np.int64)
    S = num_sections
    self.mem = np.zeros(2 * n + 3 * S + 1, np.int64)
    self.mem[:n] = -1
    total = np.zeros(S + 1, np.int64)
    np.add.at(total, self.lo, self.size)
    np.add.at(total, self.hi, -self.size)
    self.mem[2 * n + S:2 * n + 2 * S] = np.cumsum(total)[:S]
    cuts = np.zeros(S + 1, np.int64)
    np.add.at(cuts, self.lo + 1, 1)
    np.add.at(cuts, self.hi, -1)
    self.mem[2 * n + 2 * S:2 * n + 3 * S] = np.cumsum(cuts)[1:]
    # The trail's first size: per request on a path, its offset, its overlaps' minimum offsets,
    # floor, total and cut of its sections and the bytes x time placed, plus room for the
    # unallocated floors; `run` doubles it when it fills up.
    span = self.hi - self.lo
    trail = int((2 + np.diff(self.ov_ptr) + 3 * span).sum()) + 4 * S + 1024
    self.tidx, self.told = np.zeros(trail, np.int64), np.zeros(trail, np.int64)
    self.ctl = np.zeros(6, np.int64)
    self.stamp = np.zeros(S, np.int64)
    self.scratch = np.zeros(S, np.int64)
    self.rank = np.zeros(n, np.int64)
    self.nodes = 0

  @property
  def offset(self) -> np.ndarray:
    return self.mem[:self.n]

  def run(self, buffers: np.ndarray, sec_lo: int, sec_hi: int, heuristic: str,
          nodes: int) -> tuple[int, int, int, np.ndarray]:
    """Searches one partition with at most `nodes` nodes. Returns (status, nodes used, bytes x
    time of its best partial packing, the offsets of that packing). A success stays in `mem`;
    anything else is undone."""
    fields = np.array([_FIELD[c] for c in heuristic], np.int64)
    ctl, area = self.ctl, 2 * self.n + 3 * self.num_sections
    while True:
      ctl[_NODES_LEFT], ctl[_NODES], ctl[_FULL] = nodes, 0, 0
      ctl[_BEST] = base = self.mem[area]
      mark = ctl[_TOP]
      best = self.mem[:self.n].copy()
      _preorder(self.mem, self.n, self.num_sections, self.size, self.width, self.lo, self.hi,
                buffers, fields, self.rank)
      status = _search(self.mem, self.tidx, self.told, ctl, self.stamp, self.scratch, self.rank,
                       best, self.n, self.num_sections, self.capacity, self.size, self.width,
                       self.lo, self.hi, self.ov_ptr, self.ov_idx, self.mem_ptr, self.mem_idx,
                       fields, buffers, sec_lo, sec_hi, np.int64(0), np.int64(-1))
      if not ctl[_FULL]:
        break
      _undo(self.mem, self.tidx, self.told, ctl, mark)  # Nothing unlogged was applied.
      grown = 2 * len(self.tidx)
      self.tidx = np.concatenate([self.tidx, np.zeros(grown - len(self.tidx), np.int64)])
      self.told = np.concatenate([self.told, np.zeros(grown - len(self.told), np.int64)])
    used = int(ctl[_NODES])
    self.nodes += used
    if status != _OK:
      _undo(self.mem, self.tidx, self.told, ctl, mark)
    return int(status), used, int(ctl[_BEST] - base), best


def _warm_up() -> None:
  """Compiles (or loads from numba's cache) the search with a two-request problem."""
  one = np.ones(2, np.int64)
  kernel = _Kernel(one, one, np.zeros(2, np.int64), one, np.zeros(2, np.int64), one, 1, 2)
  kernel.run(np.arange(2, dtype=np.int64), 0, 1, HEURISTICS[0], 10)


def _partitions(lo: np.ndarray, hi: np.ndarray,
                num_sections: int) -> list[tuple[list[int], int, int]]:
  """Independent partitions: maximal runs of sections joined by requests spanning their
  boundaries (MiniMalloc's sweep). Returns (requests, first section, end section)."""
  crossing = np.zeros(num_sections + 1, np.int64)
  np.add.at(crossing, lo + 1, 1)
  np.add.at(crossing, hi, -1)
  cut = np.cumsum(crossing)[1:num_sections] == 0  # cut[s]: nothing spans s | s + 1.
  bounds = [0] + [s + 1 for s in np.flatnonzero(cut).tolist()] + [num_sections]
  out = []
  for a, z in zip(bounds, bounds[1:]):
    inside = np.flatnonzero((lo < z) & (hi > a)).tolist()
    if inside:
      out.append((inside, a, z))
  return out


def _bestfit(placement: Placement) -> None:
  """bestfit's choices without the game: the game's order, best fit in the fastest level with
  room (the game's first candidate)."""
  placement.reset()
  for r in range(len(placement.requests)):
    for level in range(placement.num_fast):
      offset = placement.best_fit(r, level)
      if offset is not None:
        placement.place(r, level, offset)
        break


def _complete(placement: Placement, fixed: list[tuple[int, int]], order: np.ndarray) -> None:
  """`fixed` (request, offset) in level 0, then the rest in `order`, each where it saves most."""
  placement.reset()
  done = np.zeros(len(placement.requests), bool)
  for r, o in fixed:
    placement.place(r, 0, o)
    done[r] = True
  for r in order.tolist():
    if not done[r]:
      placement.place_where_it_saves_most(r, fit="best")


def _sections(req: Requests, subset: np.ndarray, axis: np.ndarray) -> tuple[np.ndarray, ...]:
  """Sections of `subset`'s windows: (points, lo, hi, size, width, live bytes per section)."""
  points = np.unique(np.concatenate([req.start[subset], req.end[subset]]))
  lo = np.searchsorted(points, req.start[subset]).astype(np.int64)
  hi = np.searchsorted(points, req.end[subset]).astype(np.int64)
  num_sections = max(len(points) - 1, 0)
  size = req.size[subset].astype(np.int64)
  width = (axis[req.end[subset]] - axis[req.start[subset]]).astype(np.int64)
  live = np.zeros(num_sections + 1, np.int64)
  np.add.at(live, lo, size)
  np.add.at(live, hi, -size)
  return points, lo, hi, size, width, np.cumsum(live)[:num_sections]


def _reduce(lo: np.ndarray, hi: np.ndarray, size: np.ndarray, live: np.ndarray, capacity: int,
            priority: np.ndarray) -> np.ndarray:
  """Which requests to keep so that no section holds more bytes than `capacity`: lowest
  `priority` first, a request is dropped if it lives in a section that is still overfull."""
  live, keep = live.copy(), np.ones(len(size), bool)
  for b in np.argsort(priority, kind="stable").tolist():
    if live.max(initial=0) <= capacity:
      break
    if live[lo[b]:hi[b]].max() > capacity:
      keep[b] = False
      live[lo[b]:hi[b]] -= size[b]
  return keep


def _search_packing(req: Requests, subset: np.ndarray, axis: np.ndarray, capacity: int,
                    deadline: float, heuristics: tuple[str, ...],
                    info: dict) -> tuple[dict[int, int], str]:
  """Runs the search on requests `subset` (no section overfull) until `deadline`. Returns
  ({request: offset} for the partitions it packed and the best partial packing of the others,
  "packed" | "infeasible" (proven) | "timeout")."""
  points, lo, hi, size, width, live = _sections(req, subset, axis)
  num_sections = len(live)
  # The jitted search is compiled on its first use on a machine (seconds; numba caches it
  # beside this file) and loaded from that cache later (a fraction of a second). A tiny run
  # first keeps that out of the node rate the time limit is turned into.
  t0 = _clock()
  _warm_up()
  info["jit_s"] = _clock() - t0
  kernel = _Kernel(size, width, lo, hi, req.start[subset], req.end[subset], num_sections,
                   capacity)
  parts = _partitions(lo, hi, num_sections)
  pending, proven = list(range(len(parts))), []
  best_partial: dict[int, tuple[int, np.ndarray]] = {}  # partition -> (area, offsets)
  solution: dict[int, int] = {}
  limit, rate, cut_short = len(subset), None, False
  while pending and not cut_short:
    limit *= 2
    for p in list(pending):
      buffers, a, z = parts[p]
      for h in heuristics:
        # The kernel cannot read a clock: it gets the nodes that fit in the time left, at the
        # rate measured so far (a first short run measures it), with a fifth to spare.
        left = deadline - _clock()
        nodes = limit if rate is None else min(limit, int(0.8 * rate * left))
        if left <= 0 or nodes <= 0:
          cut_short = True
          break
        t0 = _clock()
        result, used, area, offsets = kernel.run(np.array(buffers, np.int64), a, z, h, nodes)
        if used >= 64:
          rate = used / max(_clock() - t0, 1e-6)
        if area > best_partial.get(p, (-1, None))[0]:
          best_partial[p] = (area, offsets)
        if result == _OK:
          pending.remove(p)
          solution.update({b: int(kernel.offset[b]) for b in buffers})
          break
        if result == _NOT_FOUND:  # The search is complete: no packing exists.
          pending.remove(p)
          proven.append(p)
          break
        if nodes < limit:
          cut_short = True
          break
      if cut_short:
        break
  info["partitions"] = len(parts)
  info["partitions_packed"] = len(parts) - len(pending) - len(proven)
  info["nodes"] = kernel.nodes
  for p in pending + proven:
    if p in best_partial:
      _, offsets = best_partial[p]
      solution.update({b: int(offsets[b]) for b in parts[p][0] if offsets[b] >= 0})
  status = "infeasible" if proven else "timeout" if pending else "packed"
  if proven:
    info["proven_partitions"] = len(proven)
  return {int(subset[b]): o for b, o in solution.items()}, status


def pack(placement: Placement, time_limit_s: float | None = DEFAULT_TIME_LIMIT_S,
         heuristics: tuple[str, ...] = HEURISTICS) -> dict:
  for h in heuristics:
    if not h or set(h) - set(_FIELD):
      raise MalloczeroError(f"pack: preordering heuristic '{h}' must be letters of W (window "
                            "length), A (bytes x time), T (bytes live where it is)")
  started = _clock()
  deadline = started + float(DEFAULT_TIME_LIMIT_S if time_limit_s is None else time_limit_s)
  req = placement.requests
  num_requests = len(req)

  t0 = _clock()
  _bestfit(placement)
  bestfit_rows, bestfit_time = list(placement.placed), placement.total_time
  reserve = 3 * (_clock() - t0) + 0.1
  search_deadline = deadline - reserve

  capacity = int(placement.capacity[0])
  axis = placement.model.workload.time_axis
  items = np.flatnonzero(req.size <= capacity)
  info: dict = {"requests_in_fastest_level": int(items.size)}
  points, lo, hi, size, _, live = _sections(req, items, axis)
  worst = int(np.argmax(live)) if len(live) else 0
  subset = items
  if items.size < num_requests:
    info["reason"] = (f"{num_requests - items.size} request(s) larger than the fastest level's "
                      f"{capacity} bytes")
  if len(live) and live[worst] > capacity:
    info["reason"] = (f"{int(live[worst])} bytes are live at time {int(axis[points[worst]])}, "
                      f"more than the fastest level's {capacity}")
  if "reason" in info:
    # No full packing exists. Search a subset that fits everywhere instead: the requests that
    # save least per byte are dropped from the sections that are overfull.
    density = req.standalone_saving[items, 0] / req.size[items]
    subset = items[_reduce(lo, hi, size, live, capacity, density)]
    info["searched_requests"] = int(subset.size)
  solution, status = _search_packing(req, subset, axis, capacity, search_deadline, heuristics,
                                     info) if subset.size else ({}, "timeout")
  if "reason" in info:
    info["searched"] = status  # Whether the subset was packed.
    status = "infeasible"
  elif status == "infeasible":
    info["reason"] = (f"the search proved that {info['proven_partitions']} of "
                      f"{info['partitions']} independent partitions cannot be packed")
  info["status"] = status
  info["search_s"] = _clock() - started

  if status == "packed":
    placement.reset()
    for r, o in sorted(solution.items()):
      placement.place(r, 0, o)
    return info

  # No full packing: the best of the completed partial packings and bestfit.
  fixed = sorted(solution.items())
  saving = req.standalone_saving.max(axis=1)
  candidates: list[tuple[float, str, Callable[[], None]]] = []
  replay_bestfit = lambda: [placement.place(r, level, o) for r, level, o in bestfit_rows]
  candidates.append((bestfit_time, "bestfit", replay_bestfit))
  for name, order in (("by saving", np.argsort(-saving, kind="stable")),
                      ("by saving per byte", np.argsort(-saving / req.size, kind="stable"))):
    _complete(placement, fixed, order)
    rows = list(placement.placed)
    candidates.append((placement.total_time, f"search's partial packing completed {name}",
                       lambda rows=rows: [placement.place(*row) for row in rows]))
  best_time, best_name, replay = min(candidates, key=lambda c: c[0])
  placement.reset()
  replay()
  info["returned"] = best_name
  info["partial_requests"] = len(fixed)
  return info


def describe(info: dict) -> str:
  """The CLI's words for a pack result: packed, or why not and what was returned instead."""
  if "status" not in info:
    return ""  # No request at all: solve() said so.
  if info["status"] == "packed":
    return (f"; packed every request ({info.get('partitions', 0)} partitions, "
            f"{info.get('nodes', 0)} search nodes)")
  jit = info.get("jit_s", 0.0)
  search = (f"{info.get('partitions_packed', 0)} of {info.get('partitions', 0)} partitions "
            f"packed, {info.get('nodes', 0)} search nodes"
            + (f"; compiling the search took {jit:.1f} s of it, once per machine" if jit > 1
               else ""))
  if info["status"] == "infeasible" and "searched_requests" in info:
    return (f"; no full packing exists ({info['reason']}); the {info['searched_requests']} "
            f"requests that fit everywhere were searched ({search}); returned "
            f"{info['returned']}")
  if info["status"] == "infeasible":
    return f"; no full packing exists ({info['reason']}; {search}); returned {info['returned']}"
  return (f"; no full packing found in the time limit (none proven impossible either: "
          f"{search}); returned {info['returned']}")
