"""The simulator's jitted (numba) copy-queue loop: the total stall of a set of copies
(env/simulator.py's `total_stall_loop`), which the game re-simulates after every copy it adds.

Why: the game steps thousands of times a second (at least 5,000 with observation and contention,
`malloczero bench`); rebuilding a `CopyQueue` per step in numpy costs mostly numpy's per-call
overhead. Loaded on first use (`lazy_module` in env/simulator.py and env/game/game.py), so that
`import malloczero` does not load numba; compiled on a machine's first use and read from numba's
cache beside this file after that (`cache=True`).
"""

from __future__ import annotations

import numpy as np

from malloczero.env.kernel_cache import njit


@njit
def stall_loop(idle_s, start, done, work_s):
  """env/simulator.py's clamps as one pass over the boundaries, after a stable sort of the copies
  by (start, done): O(K log K + T), the total stall only."""
  num_ops = len(idle_s)
  span = num_ops + 2
  order = np.argsort(start * span + done, kind="mergesort")
  issued = np.zeros(num_ops + 1)  # work issued at each boundary
  due = np.zeros(num_ops + 1)  # W_d: queue work up to the last copy due at d
  cumulative = 0.0
  for k in order:
    cumulative += work_s[k]
    issued[start[k]] += work_s[k]
    if cumulative > due[done[k]]:
      due[done[k]] = cumulative
  x = 0.0
  issued_so_far = 0.0
  stall = 0.0
  for t in range(num_ops + 1):
    issued_so_far += issued[t]
    if due[t] > x:
      stall += due[t] - x
      x = due[t]
    if t == num_ops:
      break
    x = min(x + idle_s[t], issued_so_far)
  return stall
