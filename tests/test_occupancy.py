"""The msa game's occupancy feature (env/game/observation_kernels.py's `occupancy`) against the
plain scan it replaced, bit for bit: every chunk live in the window, in handle order, its fraction
of each bin summed and clipped at 1. Heaps above the scan limit are read through their time index
and summed out of order first (the bins that order could change summed again in order), or, in
long windows with many live chunks, from the bins' lists in handle order until a bin is full."""

import numpy as np
import pytest

from malloczero.env.game import observation_kernels
from malloczero.env.msa.chunks import ChunkHeap


def scanned(heap: ChunkHeap, first_op: int, last_op: int, capacity: float, bins: int) -> np.ndarray:
  """The feature as a plain loop over every committed chunk, in handle order."""
  rects, alive, count, _ = heap.kernel_state()
  out = np.zeros(bins)
  width = capacity / bins
  for i in range(count):
    if not alive[i] or rects[0, i] > last_op or rects[1, i] <= first_op:
      continue
    low, high = rects[2, i] / width, (rects[2, i] + rects[3, i]) / width
    b = int(low)
    while b < bins and b < high:
      covered = min(high, b + 1.0) - max(low, float(b))
      if covered > 0:
        out[b] += covered
      b += 1
  return np.minimum(out, 1.0)


def random_heap(rng: np.random.Generator, chunks: int, num_ops: int, capacity: int) -> ChunkHeap:
  """Chunks at random places (they may overlap: the feature's sums do not care), some removed;
  sizes from a few bytes to a few bins, so that bins fill up in some windows and not in others."""
  heap = ChunkHeap(alignment=8)
  handles = []
  for _ in range(chunks):
    start = int(rng.integers(0, num_ops))
    end = start + 1 + int(rng.exponential(num_ops / 50))
    size = int(np.exp(rng.uniform(np.log(8), np.log(capacity / 8))))
    offset = int(rng.integers(0, capacity - size)) // 8 * 8
    handles.append(heap.add(start, end, offset, size))
  for handle in rng.choice(handles, size=len(handles) // 10, replace=False):
    heap.remove(int(handle))
  return heap


def bin_lists(heap: ChunkHeap, capacity: float, bins: int) -> tuple:
  """The bins' lists of every chunk committed (a `BinLists`' fields), grown as `MsaGame` does."""
  room = 8
  while True:
    lists = (
      np.zeros((bins, room, 3), np.int64),
      np.zeros((bins, room)),
      np.zeros(bins, np.int64),
      np.zeros(1, np.int64),
    )
    if observation_kernels.mirror(lists, heap.kernel_state(), capacity / bins):
      return lists
    room *= 2


@pytest.mark.parametrize("chunks", [300, observation_kernels.SCAN_LIMIT + 2000])
def test_occupancy_is_the_plain_scans_bit_for_bit(chunks):
  rng = np.random.default_rng(chunks)
  num_ops, capacity, bins = 2000, 1 << 20, 32
  heap = random_heap(rng, chunks, num_ops, capacity)
  lists = bin_lists(heap, float(capacity), bins)
  filled, many = 0, 0
  for window in range(200):
    first_op = int(rng.integers(0, num_ops))
    last_op = min(num_ops - 1, first_op + int(rng.exponential(num_ops / (8 if window % 2 else 1))))
    index, _, chunk_state, scratch = heap.search_state()
    out = np.zeros(bins)
    observation_kernels.occupancy(
      out,
      index,
      chunk_state,
      scratch[0],
      lists,
      first_op,
      last_op,
      float(capacity),
      (observation_kernels.SCAN_LIMIT, observation_kernels.COLLECT_LIMIT),
    )
    want = scanned(heap, first_op, last_op, float(capacity), bins)
    assert out.tobytes() == want.tobytes(), (first_op, last_op)
    filled += int((want == 1.0).sum() > 0) + int(((want > 0) & (want < 1.0)).sum() > 0)
    live = heap.overlapping(first_op, last_op + 1)
    long = last_op - first_op + 1 >= observation_kernels.LONG_WINDOW
    many += long and len(live) > observation_kernels.COLLECT_LIMIT
  assert filled > 200, "windows should both fill bins and leave some partly free"
  if chunks > observation_kernels.SCAN_LIMIT:
    assert 20 < many < 180, "windows should be read from the index and from the lists"


@pytest.mark.parametrize("preset", ["tpu-v4i-like", "nnpi-like"])
def test_the_games_observations_do_not_depend_on_how_occupancy_reads_the_heaps(preset):
  """A game that reads every heap through its index (and every window of more than 8 live chunks
  from the bins' lists) observes what a game that scans them does, step by step."""
  from malloczero.env.game.game import MsaGame
  from malloczero.env.hardware import PRESETS
  from malloczero.env.programs.synthetic import contended, random_workload

  workload = random_workload(3, 200)
  hardware = contended(PRESETS[preset], workload, 0.25)
  plain = MsaGame(workload, hardware)
  indexed = MsaGame(workload, hardware, reference=plain.reference)
  indexed._occupancy_limits = (0, 8)
  rng = np.random.default_rng(0)
  a, b = plain.reset(), indexed.reset()
  steps = 0
  while not a.last():
    for key in a.observation:
      assert a.observation[key].tobytes() == b.observation[key].tobytes(), (steps, key)
    legal = np.flatnonzero(a.observation["legal_actions"])
    action = legal[rng.integers(len(legal))]
    a, b = plain.step(action), indexed.step(action)
    steps += 1
  assert b.last() and steps > 100
  assert indexed._bin_lists[0][2].sum() > 0, "the bins' lists should have been read"
