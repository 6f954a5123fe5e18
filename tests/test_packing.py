"""`pack`, the MiniMalloc-style search: it finds full packings the heuristics miss, says when it
has none (proven impossible or not found in time) and then returns no worse than bestfit, and
on XLA programs (capacity below peak) proves at once that no full packing exists."""

import pathlib
import random

import pytest

from malloczero.env import MalloczeroError, load_workload
from malloczero.env.hardware import PRESETS
from malloczero.env.minimalloc_csv import workload_from_minimalloc_csv
from malloczero.env.programs.suites import get_suite
from malloczero.env.solvers import solve
from malloczero.env.solvers.packing import describe
from malloczero.env.validator import validate_mapping
from malloczero.launch.cli import main

INSTANCE_A = pathlib.Path(__file__).parent / "data" / "minimalloc_A.1048576.csv"
# Five buffers (lower, upper, size) in 6 bytes: exactly one packing and its mirror image;
# bestfit's order strands one of them.
ROWS = [(2, 3, 3), (1, 5, 3), (5, 6, 4), (3, 4, 3), (4, 6, 2)]
CAPACITY = 6
# Generous: the first search on a machine compiles the jitted kernel inside the limit.
SEARCH_LIMIT_S = 300.0


def csv(rows: list[tuple[int, int, int]]) -> str:
  return "id,lower,upper,size\n" + "".join(
    f"{i},{lo},{hi},{s}\n" for i, (lo, hi, s) in enumerate(rows)
  )


def all_packings(rows: list[tuple[int, int, int]], capacity: int) -> list[tuple[int, ...]]:
  """Every offset assignment that packs `rows` (brute force: the instance is tiny)."""
  found, offsets = [], [0] * len(rows)

  def place(i: int) -> None:
    if i == len(rows):
      found.append(tuple(offsets))
      return
    lo, hi, size = rows[i]
    for o in range(capacity - size + 1):
      if all(
        not (
          lo < rows[j][1]
          and rows[j][0] < hi
          and o < offsets[j] + rows[j][2]
          and offsets[j] < o + size
        )
        for j in range(i)
      ):
        offsets[i] = o
        place(i + 1)

  place(0)
  return found


def offsets_of(mapping) -> tuple[int, ...]:
  by_buffer = {a["buffer"]: a["offset"] for a in mapping.allocations}
  return tuple(by_buffer.get(b, -1) for b in range(len(ROWS)))


def test_pack_finds_the_only_packing_that_bestfit_misses():
  w = workload_from_minimalloc_csv(csv(ROWS), name="hand")
  hw = PRESETS["minimalloc"].with_fast_capacity(CAPACITY)
  packings = all_packings(ROWS, CAPACITY)
  assert len(packings) == 2  # One packing and its mirror image.
  assert len(solve(w, hw, "bestfit").mapping.allocations) < len(ROWS)
  result = solve(w, hw, "pack", time_limit_s=SEARCH_LIMIT_S)
  assert result.info["status"] == "packed"
  assert offsets_of(result.mapping) in packings
  assert describe(result.info).startswith("; packed every request")


@pytest.mark.slow  # Integration-sized: subprocesses, compiles or every solver.
def test_pack_packs_every_small_random_instance_that_can_be_packed():
  """Against brute force on 150 random instances whose live bytes never exceed capacity: the
  search is complete, so it packs each one that has a packing."""
  rng = random.Random(0)
  checked = 0
  while checked < 150:
    capacity = rng.choice([4, 5, 6])
    rows = []
    for _ in range(rng.randint(4, 7)):
      lo = rng.randint(0, 6)
      rows.append((lo, rng.randint(lo + 1, min(lo + 4, 8)), rng.randint(1, capacity - 1)))
    if max(sum(s for lo, hi, s in rows if lo <= t < hi) for t in range(8)) > capacity:
      continue
    checked += 1
    w = workload_from_minimalloc_csv(csv(rows), name=f"random{checked}")
    hw = PRESETS["minimalloc"].with_fast_capacity(capacity)
    result = solve(w, hw, "pack", time_limit_s=SEARCH_LIMIT_S)
    assert (result.info["status"] == "packed") == bool(all_packings(rows, capacity)), rows
    if result.info["status"] == "packed":
      assert len(result.mapping.allocations) == len(rows)


def test_pack_on_an_overfull_instance_returns_a_partial_packing_and_says_none_exists():
  rows = ROWS + [(0, 2, 5)]  # 8 bytes live on [1, 2): no full packing in 6 bytes.
  w = workload_from_minimalloc_csv(csv(rows), name="overfull")
  hw = PRESETS["minimalloc"].with_fast_capacity(CAPACITY)
  result = solve(w, hw, "pack")
  assert result.info["status"] == "infeasible"
  assert result.info["reason"] == "8 bytes are live at time 1, more than the fastest level's 6"
  assert 0 < len(result.mapping.allocations) < len(rows)
  assert result.mapping.estimated_time_s <= solve(w, hw, "bestfit").mapping.estimated_time_s
  assert describe(result.info).startswith("; no full packing exists (8 bytes are live")


def test_pack_out_of_time_returns_no_worse_than_bestfit_and_says_it_found_no_packing():
  w = load_workload(INSTANCE_A)
  hw = PRESETS["minimalloc"].with_fast_capacity(1 << 20)
  result = solve(w, hw, "pack", time_limit_s=1e-9)  # Spent before the search starts.
  assert result.info["status"] == "timeout"
  assert len(result.mapping.allocations) < w.num_buffers
  assert result.mapping.estimated_time_s <= solve(w, hw, "bestfit").mapping.estimated_time_s
  assert "no full packing found in the time limit" in describe(result.info)


@pytest.mark.slow  # Integration-sized: subprocesses, compiles or every solver.
def test_pack_places_every_buffer_of_challenge_instance_a(capsys):
  """Instance A: msa, bestfit and CP-SAT place 76% of its bytes x time, evo 88% in 60 s."""
  assert (
    main(
      [
        "solve",
        str(INSTANCE_A),
        "--capacity",
        "1048576",
        "--solver",
        "pack",
        "--time-limit",
        str(SEARCH_LIMIT_S),
      ]
    )
    == 0
  )
  line = capsys.readouterr().out.splitlines()[-1]
  assert line.startswith("pack: 154 of 154 requests placed")
  assert "speed-up 1000.000x" in line and "packed every request" in line


@pytest.mark.parametrize("index", [0, 1])
def test_pack_on_tiny_xla_programs_proves_no_full_packing_and_is_no_worse_than_bestfit(index):
  """On XLA programs the fast levels hold a fraction of peak, so the first inference proves
  that not every request fits in the fastest level; pack returns the best of bestfit and its
  greedy completions."""
  w, hw = get_suite("tiny").entries[index].load()
  result = solve(w, hw, "pack")
  assert result.info["status"] == "infeasible"
  assert (
    "more than the fastest level's" in result.info["reason"]
    or "larger than the fastest level's" in result.info["reason"]
  )
  validate_mapping(w, hw, result.mapping)
  assert result.speedup >= solve(w, hw, "bestfit").speedup


@pytest.mark.slow  # Integration-sized: two pack searches on instance A take seconds each.
def test_pack_on_an_overfull_csv_searches_what_fits_everywhere_and_beats_bestfit():
  """Instance A in 900,000 bytes (its peak is 2**20): the requests that save least per byte
  leave the overfull sections, the search packs the rest, and the greedy completion of that
  packing is never slower than bestfit (on a CSV every byte saves the same, a write and a read,
  so there it ties bestfit's greedy); in 1,000,000 bytes the search's best partial packing,
  completed greedily, saves far more than bestfit (2.5x less time here)."""
  w = load_workload(INSTANCE_A)
  hw = PRESETS["minimalloc"].with_fast_capacity(900_000)
  result = solve(w, hw, "pack", time_limit_s=SEARCH_LIMIT_S)
  assert result.info["status"] == "infeasible"
  assert result.info["reason"].startswith("1048576 bytes are live at time")
  assert 0 < result.info["searched_requests"] < w.num_buffers
  assert result.info["searched"] == "packed"
  assert (
    f"the {result.info['searched_requests']} requests that fit everywhere were searched "
    "(1 of 1 partitions packed"
  ) in describe(result.info)
  assert result.mapping.estimated_time_s <= solve(w, hw, "bestfit").mapping.estimated_time_s
  roomier = PRESETS["minimalloc"].with_fast_capacity(1_000_000)
  packed = solve(w, roomier, "pack", time_limit_s=SEARCH_LIMIT_S).mapping.estimated_time_s
  assert packed < 0.8 * solve(w, roomier, "bestfit").mapping.estimated_time_s


def test_the_search_grows_its_trail_when_it_fills_up():
  """A trail too short for one path is doubled and the run repeated: same packing."""
  from malloczero.env.solvers import pack_search

  w = workload_from_minimalloc_csv(csv(ROWS), name="hand")
  hw = PRESETS["minimalloc"].with_fast_capacity(CAPACITY)
  full = solve(w, hw, "pack", time_limit_s=SEARCH_LIMIT_S)
  original = pack_search.Kernel.__init__

  def short_trail(self, *args, **kwargs):
    original(self, *args, **kwargs)
    self.trail_index, self.trail_old = self.trail_index[:2].copy(), self.trail_old[:2].copy()

  try:
    pack_search.Kernel.__init__ = short_trail
    grown = solve(w, hw, "pack", time_limit_s=SEARCH_LIMIT_S)
  finally:
    pack_search.Kernel.__init__ = original
  assert grown.info["status"] == "packed"
  assert offsets_of(grown.mapping) == offsets_of(full.mapping)


def test_a_bad_preordering_heuristic_is_a_one_line_error():
  w = workload_from_minimalloc_csv(csv(ROWS), name="hand")
  hw = PRESETS["minimalloc"].with_fast_capacity(CAPACITY)
  with pytest.raises(
    MalloczeroError,
    match=r"^pack: preordering heuristic 'WAX' must be letters "
    r"of W \(window length\), A \(bytes x time\), T \(bytes live where it is\)$",
  ):
    solve(w, hw, "pack", heuristics=("WAT", "WAX"))
