"""XLA's asynchronous copy resource, copy ordering and outstanding-copy limit
(env/msa/copy_resource.py), on XLA's own `AsynchronousCopyResourceTest` cases and against an
op-by-op FIFO."""

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from malloczero.env.msa import (
  AsyncCopy,
  AsynchronousCopyOrdering,
  AsynchronousCopyResource,
  OutstandingCopyLimit,
)

# XLA's AsynchronousCopyResourceTest cases (memory_space_assignment_test.cc). A copy (s, e, r)
# may use the budgets of ops s+1 .. e-1; the comments draw the budgets left after each step.


def test_async_copy_resource_simple():
  # time:      0 1 2 3 4 5 6 7 8 9
  # resource:  2 3 1 6 7 1 7 2 2 4
  resource = AsynchronousCopyResource([2.0, 3.0, 1.0, 6.0, 7.0, 1.0, 7.0, 2.0, 2.0, 4.0])
  assert resource.has_enough_resource(-1, 3, 5.0)
  resource.add_copy(AsyncCopy(-1, 3, 5.0, 0))  # 0 0 1 6 7 1 7 2 2 4
  np.testing.assert_allclose(resource.current_resources(), [0, 0, 1, 6, 7, 1, 7, 2, 2, 4])
  assert resource.has_enough_resource(1, 4, 4.0)
  resource.add_copy(AsyncCopy(1, 4, 4.0, 1))  # 0 0 0 3 7 1 7 2 2 4
  assert resource.has_enough_resource(5, 9, 10.0)
  resource.add_copy(AsyncCopy(5, 9, 10.0, 2))  # 0 0 0 3 7 1 0 0 1 4
  np.testing.assert_allclose(resource.current_resources(), [0, 0, 0, 3, 7, 1, 0, 0, 1, 4])
  assert not resource.has_enough_resource(4, 9, 3.0)  # would push 5,9 past its end
  assert resource.has_enough_resource(4, 8, 2.0)  # 5,9 shifts right but still fits
  resource.add_copy(AsyncCopy(4, 8, 2.0, 3))
  np.testing.assert_allclose(resource.current_resources(), [0, 0, 0, 3, 7, 0, 0, 0, 0, 4])


def test_async_copy_resource_propagate():
  resource = AsynchronousCopyResource([2.0] * 10)
  assert resource.has_enough_resource(6, 10, 2.0)
  resource.add_copy(AsyncCopy(6, 10, 2.0, 0))
  np.testing.assert_allclose(resource.current_resources(), [2, 2, 2, 2, 2, 2, 2, 0, 2, 2])
  for i, start in enumerate(range(5, 0, -1)):
    assert resource.has_enough_resource(start, start + 4, 2.0)
    resource.add_copy(AsyncCopy(start, start + 4, 2.0, i + 1))
  np.testing.assert_allclose(resource.current_resources(), [2, 2, 0, 0, 0, 0, 0, 0, 2, 2])
  assert resource.has_enough_resource(0, 4, 3.0)
  resource.add_copy(AsyncCopy(0, 4, 3.0, 6))
  np.testing.assert_allclose(resource.current_resources(), [2, 0, 0, 0, 0, 0, 0, 0, 1, 2])
  assert resource.has_enough_resource(0, 4, 3.0)
  resource.add_copy(AsyncCopy(0, 4, 3.0, 7))
  np.testing.assert_allclose(resource.current_resources(), [2, 0, 0, 0, 0, 0, 0, 0, 0, 0])
  assert not resource.has_enough_resource(0, 4, 1.0)


def test_async_copy_resource_cant_propagate():
  resource = AsynchronousCopyResource([2.0] * 10)
  resource.add_copy(AsyncCopy(5, 10, 2.0, 0))
  np.testing.assert_allclose(resource.current_resources(), [2, 2, 2, 2, 2, 2, 0, 2, 2, 2])
  assert resource.has_enough_resource(4, 7, 2.0)
  resource.add_copy(AsyncCopy(4, 7, 2.0, 1))
  np.testing.assert_allclose(resource.current_resources(), [2, 2, 2, 2, 2, 0, 0, 2, 2, 2])
  assert resource.has_enough_resource(4, 8, 4.0)
  resource.add_copy(AsyncCopy(4, 8, 4.0, 2))
  np.testing.assert_allclose(resource.current_resources(), [2, 2, 2, 2, 2, 0, 0, 0, 0, 2])
  assert not resource.has_enough_resource(3, 6, 4.0)


def test_async_copy_resource_nested():
  resource = AsynchronousCopyResource([2.0] * 5)
  resource.add_copy(AsyncCopy(1, 3, 2.0, 0))
  np.testing.assert_allclose(resource.current_resources(), [2, 2, 0, 2, 2])
  assert not resource.has_enough_resource(0, 4, 4.0)


def test_async_copy_resource_remove():
  resource = AsynchronousCopyResource([2.0] * 5)
  copy1, copy2, copy3 = AsyncCopy(2, 5, 2.0, 0), AsyncCopy(-1, 2, 3.0, 1), AsyncCopy(0, 4, 4.0, 2)
  assert resource.has_enough_resource(2, 5, 2.0)
  resource.add_copy(copy1)
  np.testing.assert_allclose(resource.current_resources(), [2, 2, 2, 0, 2])
  assert resource.has_enough_resource(-1, 2, 3.0)
  resource.add_copy(copy2)
  np.testing.assert_allclose(resource.current_resources(), [0, 1, 2, 0, 2])
  assert resource.has_enough_resource(0, 4, 4.0)
  resource.add_copy(copy3)
  np.testing.assert_allclose(resource.current_resources(), [0, 0, 0, 0, 1])
  resource.remove_copy(copy3)
  np.testing.assert_allclose(resource.current_resources(), [0, 1, 2, 0, 2])
  resource.remove_copy(copy1)
  np.testing.assert_allclose(resource.current_resources(), [0, 1, 2, 2, 2])
  resource.remove_copy(copy2)
  np.testing.assert_allclose(resource.current_resources(), [2, 2, 2, 2, 2])
  with pytest.raises(KeyError):
    resource.remove_copy(copy2)


def test_async_copy_resource_nested_remove():
  resource = AsynchronousCopyResource([2.0] * 5)
  copy1, copy2 = AsyncCopy(1, 3, 2.0, 0), AsyncCopy(0, 4, 4.0, 1)
  resource.add_copy(copy1)
  assert not resource.has_enough_resource(0, 4, 4.0)
  with pytest.raises(ValueError):
    resource.add_copy(copy2)  # XLA CHECK-fails; the resource is left unchanged.
  resource.remove_copy(copy1)
  np.testing.assert_allclose(resource.current_resources(), [2, 2, 2, 2, 2])
  assert resource.has_enough_resource(0, 4, 4.0)
  resource.add_copy(copy2)
  np.testing.assert_allclose(resource.current_resources(), [2, 0, 0, 2, 2])
  assert not resource.has_enough_resource(1, 3, 2.0)
  resource.remove_copy(copy2)
  np.testing.assert_allclose(resource.current_resources(), [2, 2, 2, 2, 2])
  assert resource.has_enough_resource(1, 3, 2.0)


def test_async_copy_resource_propagate_remove():
  resource = AsynchronousCopyResource([2.0] * 10)
  for i, start in enumerate(range(6, 0, -1)):
    resource.add_copy(AsyncCopy(start, start + 4, 2.0, i))
  np.testing.assert_allclose(resource.current_resources(), [2, 2, 0, 0, 0, 0, 0, 0, 2, 2])
  copy1, copy2 = AsyncCopy(0, 4, 3.0, 6), AsyncCopy(0, 5, 3.0, 7)
  assert resource.has_enough_resource(0, 4, 3.0)
  resource.add_copy(copy1)
  np.testing.assert_allclose(resource.current_resources(), [2, 0, 0, 0, 0, 0, 0, 0, 1, 2])
  assert resource.has_enough_resource(0, 5, 3.0)
  resource.add_copy(copy2)
  np.testing.assert_allclose(resource.current_resources(), [2, 0, 0, 0, 0, 0, 0, 0, 0, 0])
  resource.remove_copy(copy2)
  np.testing.assert_allclose(resource.current_resources(), [2, 0, 0, 0, 0, 0, 0, 0, 1, 2])
  resource.remove_copy(copy1)
  np.testing.assert_allclose(resource.current_resources(), [2, 2, 0, 0, 0, 0, 0, 0, 2, 2])


def test_async_copy_resource_start_at_zero_and_remove():
  resource = AsynchronousCopyResource([0.0, 0.0, 1.0, 1.0, 2.0])
  copy1 = AsyncCopy(0, 4, 2.0, 0)
  assert resource.has_enough_resource(0, 4, 2.0)
  resource.add_copy(copy1)
  np.testing.assert_allclose(resource.current_resources(), [0, 0, 0, 0, 2])
  resource.remove_copy(copy1)
  np.testing.assert_allclose(resource.current_resources(), [0, 0, 1, 1, 2])
  resource.add_copy(copy1)
  np.testing.assert_allclose(resource.current_resources(), [0, 0, 0, 0, 2])


def test_async_copy_resource_consume_resource_scaled_integer_resource():
  """Budgets of a few nanoseconds that a copy uses exactly: no rounding failure."""
  resource = AsynchronousCopyResource(
    [5.71429e-10, 8.71333e-09, 8.71333e-09, 1.74267e-08, 1.74267e-08]
  )
  copy1 = AsyncCopy(0, 2, 8.71333e-09, 0)
  assert resource.has_enough_resource(0, 2, 8.71333e-09)
  resource.add_copy(copy1)
  assert resource.has_enough_resource(0, 3, 4.35667e-09)
  resource.add_copy(AsyncCopy(0, 3, 4.35667e-09, 1))
  assert resource.has_enough_resource(2, 4, 4.35667e-09)
  resource.add_copy(AsyncCopy(2, 4, 4.35667e-09, 2))
  resource.remove_copy(copy1)
  np.testing.assert_allclose(
    resource.current_resources(),
    [5.71429e-10, 8.71333e-09 - 4.35667e-09, 8.71333e-09, 1.74267e-08 - 4.35667e-09, 1.74267e-08],
    rtol=1e-9,
  )


def test_async_copy_resource_out_of_order_removal_same_start_time():
  resource = AsynchronousCopyResource([2.0] * 5)
  copy1, copy2 = AsyncCopy(1, 3, 1.0, 0), AsyncCopy(1, 4, 2.0, 1)
  resource.add_copy(copy1)
  np.testing.assert_allclose(resource.current_resources(), [2, 2, 1, 2, 2])
  resource.add_copy(copy2)
  np.testing.assert_allclose(resource.current_resources(), [2, 2, 0, 1, 2])
  resource.remove_copy(copy1)
  np.testing.assert_allclose(resource.current_resources(), [2, 2, 0, 2, 2])
  more = [AsyncCopy(1, 5, 1.0, i) for i in (2, 3, 4, 5)]
  after = [[2, 2, 0, 1, 2], [2, 2, 0, 0, 2], [2, 2, 0, 0, 1], [2, 2, 0, 0, 0]]
  for copy, expected in zip(more, after):
    assert resource.has_enough_resource(1, 5, 1.0)
    resource.add_copy(copy)
    np.testing.assert_allclose(resource.current_resources(), expected)
  assert not resource.has_enough_resource(1, 5, 1.0)
  resource.remove_copy(copy2)
  np.testing.assert_allclose(resource.current_resources(), [2, 2, 0, 0, 2])
  for copy, expected in zip(
    more, [[2, 2, 0, 1, 2], [2, 2, 0, 2, 2], [2, 2, 1, 2, 2], [2, 2, 2, 2, 2]]
  ):
    resource.remove_copy(copy)
    np.testing.assert_allclose(resource.current_resources(), expected)


@pytest.mark.parametrize("second, fits", [(3.0, True), (4.0, False)])
def test_async_copy_resource_has_enough_resource_multi_check(second, fits):
  """XLA's HasEnoughResourceMultiCheckSuccess / Failure: two copies checked together, without
  changing the resource (checked four times)."""
  resource = AsynchronousCopyResource([2.0, 1.0, 3.0, 6.0, 7.0, 3.0, 7.0, 2.0, 2.0, 4.0])
  resource.add_copy(AsyncCopy(-1, 3, 5.0, 0))
  resource.add_copy(AsyncCopy(1, 10, 4.0, 1))
  before = resource.current_resources()
  for _ in range(4):
    assert resource.has_enough_resource_multi_check([(0, 6, 4.0), (4, 6, second)]) == fits
  np.testing.assert_array_equal(resource.current_resources(), before)
  assert len(resource.copies) == 2


def test_async_copy_resource_has_enough_resource_multi_check_regression():
  """XLA's HasEnoughResourceMultiCheckRegressionTest: the copy (1, 4) queues behind the existing
  (1, 8) of the same start, so the pair does not fit (XLA notes another design might fit it)."""
  resource = AsynchronousCopyResource(
    [24.0, 0.0, 6.0, 411.0, 3479.0, 0.0, 0.0, 1537.0, 3095.0, 0.0, 26.7]
  )
  resource.add_copy(AsyncCopy(1, 8, 170.8, 1))
  resource.add_copy(AsyncCopy(2, 8, 170.8, 2))
  assert not resource.has_enough_resource_multi_check([(0, 4, 170.8), (1, 4, 170.8)])


def naive_fifo_fits(budgets, copies) -> bool:
  """An independent op-by-op FIFO: each op's budget serves the earliest-started unfinished
  copies that may run at that op; every copy must be done by op end - 1."""
  if any(demand > 0 and end - 1 < start + 1 for start, end, demand in copies):
    return False  # No op strictly between its start and end.
  order = sorted(range(len(copies)), key=lambda i: (copies[i][0], i))
  remaining = [copies[i][2] for i in order]
  for t, budget in enumerate(budgets):
    for k, i in enumerate(order):
      if copies[i][0] + 1 <= t and remaining[k] > 0:
        used = min(budget, remaining[k])
        remaining[k] -= used
        budget -= used
        if remaining[k] > 0:
          break  # FIFO: a later copy waits for this one.
    for k, i in enumerate(order):
      if copies[i][1] - 1 == t and remaining[k] > 1e-9:
        return False
  return all(r <= 1e-9 for r in remaining)


@given(
  st.lists(st.integers(0, 4), min_size=1, max_size=12),
  st.lists(st.tuples(st.integers(-1, 11), st.integers(1, 6), st.integers(0, 6)), max_size=8),
)
def test_copy_resource_agrees_with_an_op_by_op_fifo(budgets, specs):
  budgets = [float(b) for b in budgets]
  resource = AsynchronousCopyResource(budgets)
  accepted = []
  for i, (start, length, demand) in enumerate(specs):
    end = min(start + length, len(budgets))
    if end <= start:
      continue
    fits = resource.has_enough_resource(start, end, float(demand))
    assert fits == naive_fifo_fits(budgets, accepted + [(start, end, float(demand))])
    assert fits == resource.has_enough_resource_multi_check([(start, end, float(demand))])
    if fits:
      resource.add_copy(AsyncCopy(start, end, float(demand), i))
      accepted.append((start, end, float(demand)))
  left = resource.current_resources()
  assert np.all(left >= 0) and np.all(left <= np.array(budgets))
  assert left.sum() == pytest.approx(sum(budgets) - sum(d for _, _, d in accepted))
  for copy in resource.copies:
    resource.remove_copy(copy)
  np.testing.assert_array_equal(resource.current_resources(), budgets)


def test_asynchronous_copy_ordering():
  """XLA's AsynchronousCopyOrderingTest.Simple and SameInterval: a copy strictly inside or around
  an existing one violates the pipelining order; the same start or the same interval does not."""
  ordering = AsynchronousCopyOrdering()
  for start, end in [(3, 11), (1, 8), (5, 14), (7, 14)]:
    assert not ordering.violates_ordering(start, end)
    ordering.add_copy(start, end)
  assert ordering.violates_ordering(2, 16)
  assert ordering.violates_ordering(9, 12)
  assert ordering.violates_ordering(6, 17)
  assert not ordering.violates_ordering(5, 13)
  ordering.add_copy(5, 13)
  assert not ordering.violates_ordering(5, 14)
  same = AsynchronousCopyOrdering()
  assert not same.violates_ordering(1, 5) and not same.violates_ordering(2, 4)
  for _ in range(3):
    same.add_copy(1, 5)
    assert same.violates_ordering(2, 4)
  for _ in range(2):
    same.remove_copy(1, 5)
    assert same.violates_ordering(2, 4)
  same.remove_copy(1, 5)
  assert not same.violates_ordering(2, 4)


@pytest.mark.parametrize("limit", [0, 1, 2])
def test_outstanding_copy_limit(limit):
  """At most `limit` copies over any inclusive interval (EvictAndPrefetchLimitAsyncCopies0/1/2's
  check); a negative limit never refuses; an extra limit raises it for one check."""
  copies = OutstandingCopyLimit(limit)
  added = 0
  for start, end in [(0, 4), (2, 6), (3, 5), (7, 9)]:
    if not copies.violates(start, end):
      copies.add(start, end)
      added += 1
  assert copies.overlapping(0, 9) == added
  assert max(copies.overlapping(t, t) for t in range(10)) <= limit
  assert copies.violates(3, 3) == (copies.overlapping(3, 3) >= limit)
  assert not copies.violates(3, 3, extra_async_copy_limit=3)
  assert not OutstandingCopyLimit(-1).violates(0, 100, num_additional_copies=50)
