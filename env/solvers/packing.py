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

The search runs jitted (numba, pack_search.py): Python-level DFS reached about 1,000 nodes a
second on these instances, the jitted one 100,000-250,000, and instance A needs 116,000. It
cannot read a clock, so it runs with node limits: `time_limit_s` bounds the whole call: bestfit
runs first, the search gets the nodes that fit, at the rate measured so far, in what is left
after reserving three times bestfit's duration (and 0.1 s) for the completions and the final
replay. Compiling it (first use on a machine, about 6 s) or loading it from numba's cache
happens inside the limit, before the rate is measured.
"""

from __future__ import annotations

from typing import Callable

import numpy as np

from malloczero.common.errors import MalloczeroError
from malloczero.env.placement import Placement
from malloczero.env.requests import Requests
from malloczero.env.solvers.heuristics import CLOCK_EVERY, CUT_GRACE_S, bestfit
from malloczero.env.solvers.pack_search import FIELD, NOT_FOUND, OK, Kernel, warm_up
from malloczero.env.solvers.time_limit import now

DEFAULT_TIME_LIMIT_S = 10.0
HEURISTICS = ("WAT", "TAW", "TWA")
# Section memberships the search's instance is built at per second (measured about 4 million,
# taken at a quarter for a slower machine).
INSTANCE_ENTRIES_PER_S = 1_000_000
# The share of the time limit bestfit (run first, the floor pack never falls below) may take.
BESTFIT_SHARE = 1 / 3


def _partitions(
  lo: np.ndarray, hi: np.ndarray, num_sections: int
) -> list[tuple[list[int], int, int]]:
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


def _complete(
  placement: Placement, fixed: list[tuple[int, int]], order: np.ndarray, deadline: float
) -> None:
  """`fixed` (request, offset) in level 0, then the rest in `order`, each where it saves most,
  until `deadline` (the solvers' clock: the rest stay in slow memory)."""
  placement.reset()
  done = np.zeros(len(placement.requests), bool)
  for r, o in fixed:
    placement.place(r, 0, o)
    done[r] = True
  for i, r in enumerate(order.tolist()):
    if i % CLOCK_EVERY == 0 and now() > deadline:
      return
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


def _reduce(
  lo: np.ndarray,
  hi: np.ndarray,
  size: np.ndarray,
  live: np.ndarray,
  capacity: int,
  priority: np.ndarray,
) -> np.ndarray:
  """Which requests to keep so that no section holds more bytes than `capacity`: lowest
  `priority` first, a request is dropped if it lives in a section that is still overfull."""
  live, keep = live.copy(), np.ones(len(size), bool)
  for b in np.argsort(priority, kind="stable").tolist():
    if live.max(initial=0) <= capacity:
      break
    if live[lo[b] : hi[b]].max() > capacity:
      keep[b] = False
      live[lo[b] : hi[b]] -= size[b]
  return keep


def _search_packing(
  req: Requests,
  subset: np.ndarray,
  axis: np.ndarray,
  capacity: int,
  deadline: float,
  heuristics: tuple[str, ...],
  info: dict,
) -> tuple[dict[int, int], str]:
  """Runs the search on requests `subset` (no section overfull) until `deadline`. Returns
  ({request: offset} for the partitions it packed and the best partial packing of the others,
  "packed" | "infeasible" (proven) | "timeout")."""
  points, lo, hi, size, width, live = _sections(req, subset, axis)
  num_sections = len(live)
  # Building the search's instance (its overlap and section lists, in Python) grows with the
  # requests' section memberships: at 100,000 buffers, 112 million of them, 80 s. Past what the
  # time left can build, the search is skipped and the completions get the time.
  entries = int(np.sum(hi - lo))
  if entries > INSTANCE_ENTRIES_PER_S * max(0.0, deadline - now()):
    info["search_skipped"] = (
      f"its instance ({entries:,} section memberships) would not be built in the time left"
    )
    return {}, "timeout"
  # The jitted search is compiled on its first use on a machine (seconds; numba caches it
  # beside pack_search.py) and loaded from that cache later (a fraction of a second). A tiny run
  # first keeps that out of the node rate the time limit is turned into.
  t0 = now()
  warm_up()
  info["jit_s"] = now() - t0
  kernel = Kernel(size, width, lo, hi, req.start[subset], req.end[subset], num_sections, capacity)
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
        left = deadline - now()
        nodes = limit if rate is None else int(min(limit, 0.8 * rate * left))  # inf-safe
        if left <= 0 or nodes <= 0:
          cut_short = True
          break
        t0 = now()
        result, used, area, offsets = kernel.run(np.array(buffers, np.int64), a, z, h, nodes)
        if used >= 64:
          rate = used / max(now() - t0, 1e-6)
        if area > best_partial.get(p, (-1, None))[0]:
          best_partial[p] = (area, offsets)
        if result == OK:
          pending.remove(p)
          solution.update({b: int(kernel.offset[b]) for b in buffers})
          break
        if result == NOT_FOUND:  # The search is complete: no packing exists.
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


def pack(
  placement: Placement,
  time_limit_s: float | None = DEFAULT_TIME_LIMIT_S,
  heuristics: tuple[str, ...] = HEURISTICS,
) -> dict:
  """The `pack` solver (above): leaves its mapping in `placement`; an info dict (the status,
  why no full packing, what was returned instead; `describe` words it)."""
  for h in heuristics:
    if not h or set(h) - set(FIELD):
      raise MalloczeroError(
        f"pack: preordering heuristic '{h}' must be letters of W (window "
        "length), A (bytes x time), T (bytes live where it is)"
      )
  started = now()
  deadline = started + float(DEFAULT_TIME_LIMIT_S if time_limit_s is None else time_limit_s)
  req = placement.requests
  num_requests = len(req)

  t0 = now()
  # On a program too large for the limit (100,000 buffers: minutes), bestfit stops a third of the
  # way into it (and a grace second): elsewhere it runs whole, so pack is never worse than it.
  bestfit(placement, started + BESTFIT_SHARE * (deadline - started) + CUT_GRACE_S)
  bestfit_rows, bestfit_time = list(placement.placed), placement.total_time
  reserve = 3 * (now() - t0) + 0.1
  search_deadline = deadline - reserve

  capacity = int(placement.capacity[0])
  axis = placement.model.workload.time_axis
  items = np.flatnonzero(req.size <= capacity)
  info: dict = {"requests_in_fastest_level": int(items.size)}
  points, lo, hi, size, _, live = _sections(req, items, axis)
  worst = int(np.argmax(live)) if len(live) else 0
  subset = items
  if items.size < num_requests:
    info["reason"] = (
      f"{num_requests - items.size} request(s) larger than the fastest level's {capacity} bytes"
    )
  if len(live) and live[worst] > capacity:
    info["reason"] = (
      f"{int(live[worst])} bytes are live at time {int(axis[points[worst]])}, "
      f"more than the fastest level's {capacity}"
    )
  if "reason" in info:
    # No full packing exists. Search a subset that fits everywhere instead: the requests that
    # save least per byte are dropped from the sections that are overfull.
    density = req.standalone_saving[items, 0] / req.size[items]
    subset = items[_reduce(lo, hi, size, live, capacity, density)]
    info["searched_requests"] = int(subset.size)
  solution, status = (
    _search_packing(req, subset, axis, capacity, search_deadline, heuristics, info)
    if subset.size
    else ({}, "timeout")
  )
  if "reason" in info:
    info["searched"] = status  # Whether the subset was packed.
    status = "infeasible"
  elif status == "infeasible":
    info["reason"] = (
      f"the search proved that {info['proven_partitions']} of "
      f"{info['partitions']} independent partitions cannot be packed"
    )
  info["status"] = status
  info["search_s"] = now() - started

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
  for half, (name, order) in enumerate(
    (
      ("by saving", np.argsort(-saving, kind="stable")),
      ("by saving per byte", np.argsort(-saving / req.size, kind="stable")),
    )
  ):
    # Each completion ends by its share of what is left: half of it, then the rest.
    left = max(0.0, deadline - now())
    _complete(placement, fixed, order, now() + left / (2 - half))
    rows = list(placement.placed)
    candidates.append(
      (
        placement.total_time,
        f"search's partial packing completed {name}",
        lambda rows=rows: [placement.place(*row) for row in rows],
      )
    )
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
    return (
      f"; packed every request ({info.get('partitions', 0)} partitions, "
      f"{info.get('nodes', 0)} search nodes)"
    )
  jit = info.get("jit_s", 0.0)
  search = (
    f"no search: {info['search_skipped']}"
    if "search_skipped" in info
    else f"{info.get('partitions_packed', 0)} of {info.get('partitions', 0)} partitions "
    f"packed, {info.get('nodes', 0)} search nodes"
    + (f"; compiling the search took {jit:.1f} s of it, once per machine" if jit > 1 else "")
  )
  if info["status"] == "infeasible" and "searched_requests" in info:
    return (
      f"; no full packing exists ({info['reason']}); the {info['searched_requests']} "
      f"requests that fit everywhere were searched ({search}); returned "
      f"{info['returned']}"
    )
  if info["status"] == "infeasible":
    return f"; no full packing exists ({info['reason']}; {search}); returned {info['returned']}"
  return (
    f"; no full packing found in the time limit (none proven impossible either: "
    f"{search}); returned {info['returned']}"
  )
