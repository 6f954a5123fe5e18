"""The game's incremental copy queue (env/simulator.py's `StallTracker`) against the jitted loop it
replaces: after any sequence of copies added, copies taken back and idle times changed, its stall
is `total_stall_loop`'s over the same copies (in the order they were added), bit for bit."""

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from malloczero.env.simulator import Copies, StallTracker, total_stall_loop


def loop_stall(idle: np.ndarray, live: dict[int, tuple[int, int, float]]) -> float:
  if not live:
    return 0.0
  copies = [live[i] for i in sorted(live)]  # The order they were added.
  start, done, work = (np.array(column) for column in zip(*copies))
  return total_stall_loop(idle.copy(), Copies(start.astype(np.int64), done.astype(np.int64), work))


def play(tracker: StallTracker, idle: np.ndarray, rng: np.random.Generator, moves: int) -> int:
  """Random changes, each followed (most of the time) by the comparison; returns how many were
  compared with a stall above 0."""
  num_ops = len(idle)
  live: dict[int, tuple[int, int, float]] = {}
  stalled = 0
  for _ in range(moves):
    kind = rng.uniform()
    if kind < 0.45:
      if live and rng.uniform() < 0.3:  # Ties in (start, done), with other work.
        start, done, _ = live[list(live)[rng.integers(len(live))]]
      else:
        start = int(rng.integers(0, num_ops + 1))
        done = int(rng.integers(start, num_ops + 1))
      work = float(rng.uniform(0.0, 2.0)) if rng.uniform() < 0.9 else 0.0
      live[tracker.add(start, done, work)] = (start, done, work)
    elif kind < 0.6 and live:
      copy_id = list(live)[rng.integers(len(live))]
      start, done, _ = live.pop(copy_id)
      tracker.remove(copy_id, start, done)
    else:
      op = int(rng.integers(num_ops))
      idle[op] = float(rng.uniform(0.0, 1.0)) if rng.uniform() < 0.8 else 0.0
      tracker.set_idle(op, idle[op])
    if rng.uniform() < 0.7:
      got = tracker.stall()
      assert got == loop_stall(idle, live)  # Exactly: the same sums in the same order.
      assert len(tracker) == len(live)
      stalled += got > 0
  return stalled


@given(st.integers(1, 40), st.integers(0, 2**32 - 1))
def test_the_tracked_stall_is_the_loops_bit_for_bit(num_ops, seed):
  rng = np.random.default_rng(seed)
  idle = rng.uniform(0.0, 1.0, num_ops) * (rng.uniform(size=num_ops) < 0.7)
  play(StallTracker(idle, capacity=1), idle.copy(), rng, 60)


def test_long_random_sequences_stall_and_agree():
  """Longer programs and sequences (the tracker's arrays grow), where most states stall."""
  stalled = 0
  for seed in range(6):
    rng = np.random.default_rng(seed)
    idle = rng.uniform(0.0, 0.3, 200) * (rng.uniform(size=200) < 0.5)
    stalled += play(StallTracker(idle, capacity=4), idle.copy(), rng, 400)
  assert stalled > 500, "the cases should make copies wait, or the check is too easy"


def test_a_copy_not_tracked_cannot_be_removed():
  tracker = StallTracker(np.ones(4))
  copy_id = tracker.add(1, 3, 2.0)
  with pytest.raises(KeyError):
    tracker.remove(copy_id, 1, 2)
  with pytest.raises(KeyError):
    tracker.remove(copy_id + 1, 1, 3)
  tracker.remove(copy_id, 1, 3)
  assert len(tracker) == 0 and tracker.stall() == 0.0
