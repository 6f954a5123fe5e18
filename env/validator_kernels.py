"""The validator's jitted (numba) overlap sweep (env/validator.py's `_any_rectangle_overlap` for
large mappings): whether two rectangles `[start, end) x [lo, hi)` of one level overlap.

Why: the validator's sweep in Python keeps the live address ranges in a sorted list, a bisect
and an insert or a delete per event; on a mapping of 100,000 allocations that was 0.4 s, most of
validating it. Here the sweep keeps, over the rectangles' address bounds, how many live ranges
cover each elementary range (a segment tree with range add and range maximum, bottom-up: a
recursive kernel crashed when loaded from numba's cache): a range that opens where the maximum
over it is not zero meets a live one. Loaded on first use by the
validator, only for large mappings (`validator.JIT_SWEEP_MIN`), so that validating a small one
does not load numba; compiled on a machine's first use and read from numba's cache after that.
"""

from __future__ import annotations

import numpy as np

from malloczero.env.kernel_cache import njit


@njit
def _apply(tree, adds, node, amount, leaves):
  tree[node] += amount
  if node < leaves:
    adds[node] += amount


@njit
def _push_path(tree, adds, leaf, leaves, height):
  """Moves the pending adds on the path from the root to `leaf` down to its children."""
  for level in range(height, 0, -1):
    node = leaf >> level
    if adds[node] != 0:
      _apply(tree, adds, 2 * node, adds[node], leaves)
      _apply(tree, adds, 2 * node + 1, adds[node], leaves)
      adds[node] = 0


@njit
def _rebuild(tree, adds, node):
  """Recomputes the ancestors of `node` from their children."""
  while node > 1:
    node >>= 1
    tree[node] = max(tree[2 * node], tree[2 * node + 1]) + adds[node]


@njit
def _add(tree, adds, leaves, first, last, amount):
  """Adds `amount` to elementary ranges `first` .. `last` (inclusive), bottom-up."""
  lo, hi = first + leaves, last + leaves + 1
  lo0, hi0 = lo, hi - 1
  while lo < hi:
    if lo & 1:
      _apply(tree, adds, lo, amount, leaves)
      lo += 1
    if hi & 1:
      hi -= 1
      _apply(tree, adds, hi, amount, leaves)
    lo >>= 1
    hi >>= 1
  _rebuild(tree, adds, lo0)
  _rebuild(tree, adds, hi0)


@njit
def _max(tree, adds, leaves, height, first, last):
  """The largest cover count of elementary ranges `first` .. `last` (inclusive)."""
  lo, hi = first + leaves, last + leaves + 1
  _push_path(tree, adds, lo, leaves, height)
  _push_path(tree, adds, hi - 1, leaves, height)
  best = 0
  while lo < hi:
    if lo & 1:
      best = max(best, tree[lo])
      lo += 1
    if hi & 1:
      hi -= 1
      best = max(best, tree[hi])
    lo >>= 1
    hi >>= 1
  return best


@njit
def any_overlap(order, opening, lo, hi, bounds):
  """Whether a rectangle meets one live before it. `order` `[2n]`: the events in time order,
  ends before starts at the same op (`opening` `[2n]` says which are starts), each the index of
  its rectangle; `lo`, `hi` `[n]`: each rectangle's address range as indices into `bounds` (the
  distinct address bounds, sorted), elementary range j being `[bounds[j], bounds[j + 1])`."""
  ranges = max(len(bounds) - 1, 1)
  leaves, height = 1, 0
  while leaves < ranges:
    leaves *= 2
    height += 1
  tree = np.zeros(2 * leaves, np.int64)  # A node's cover: the max over its leaves, own adds in.
  adds = np.zeros(2 * leaves, np.int64)
  for e in range(len(order)):
    i = order[e]
    first, last = lo[i], hi[i] - 1
    if not opening[e]:
      _add(tree, adds, leaves, first, last, -1)
      continue
    if _max(tree, adds, leaves, height, first, last) > 0:
      return True
    _add(tree, adds, leaves, first, last, 1)
  return False
