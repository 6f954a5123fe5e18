"""Hypothesis strategies: arbitrary valid programs and hardware for property tests."""

import numpy as np
from hypothesis import strategies as st

from malloczero.env.hardware import Hardware, MemoryLevel
from malloczero.env.workload import Op, Workload
from malloczero.env.workload_json import workload_from_ops


@st.composite
def workloads(draw, max_ops: int = 24, max_buffers: int = 40) -> Workload:
  """Any valid workload: every kind, zero-flop ops, unused parameters, long and short ranges."""
  num_ops = draw(st.integers(1, max_ops))
  flops = draw(
    st.lists(st.one_of(st.just(0.0), st.floats(1.0, 1e12)), min_size=num_ops, max_size=num_ops)
  )
  num_buffers = draw(st.integers(1, max_buffers))
  buffers = []
  for i in range(num_buffers):
    kind = draw(st.sampled_from(["activation", "activation", "parameter", "input", "output"]))
    size = draw(st.integers(1, 1 << 22))
    if kind in ("parameter", "input"):
      def_op = None
      uses = sorted(draw(st.lists(st.integers(0, num_ops - 1), max_size=5, unique=True)))
    else:
      def_op = draw(st.integers(0, num_ops - 1))
      uses = (
        draw(st.lists(st.integers(def_op + 1, num_ops), max_size=4, unique=True))
        if def_op + 1 < num_ops
        else []
      )
      uses = sorted(u for u in uses if u < num_ops)
    buffers.append(
      {"id": 1000 + 7 * i, "name": f"b{i}", "size": size, "def": def_op, "uses": uses, "kind": kind}
    )
  return workload_from_ops(f"hyp-{num_ops}-{num_buffers}", "hypothesis", flops, buffers)


@st.composite
def loop_workloads(draw, max_ops: int = 24, max_buffers: int = 40) -> Workload:
  """A `workloads()` program whose ops sit in loops as the HLO importer flattens them: up to three
  spans of consecutive ops one loop level deeper than the ops around them (nested or one after
  another), each op weighted by the trip counts of its loops; some ops outside loops keep a
  weight of merged steps."""
  workload = draw(workloads(max_ops, max_buffers))
  n = workload.num_ops
  depths, weights = [0] * n, [draw(st.sampled_from([1, 1, 3])) for _ in range(n)]
  in_loop = [False] * n
  for _ in range(draw(st.integers(1, 3))):
    first = draw(st.integers(0, n - 1))
    last = draw(st.integers(first, n - 1))
    trips = draw(st.integers(1, 200))
    for t in range(first, last + 1):
      weights[t] = trips * (weights[t] if in_loop[t] else 1)
      depths[t] += 1
      in_loop[t] = True
  ops = tuple(
    Op(o.name, o.flops, weight, depth) for o, weight, depth in zip(workload.ops, weights, depths)
  )
  return Workload(workload.name, workload.source, ops, workload.buffers)


@st.composite
def hardware_for(draw, workload: Workload) -> Hardware:
  """Two or three levels; fast capacity a fraction of the workload's peak live bytes."""
  num_fast = draw(st.integers(1, 2))
  alignment = draw(st.sampled_from([1, 64, 512]))
  peak = max(workload.peak_live_bytes, 1)
  levels = []
  bandwidth = draw(st.floats(1e11, 1e13))
  for f in range(num_fast):
    capacity = max(alignment, int(peak * draw(st.floats(0.05, 1.2))))
    levels.append(MemoryLevel(f"fast{f}", capacity, bandwidth))
    bandwidth /= draw(st.floats(1.5, 20.0))
  levels.append(MemoryLevel("slow", 1 << 40, bandwidth / draw(st.floats(1.5, 20.0))))
  return Hardware(
    name="hyp",
    levels=tuple(levels),
    peak_flops_per_s=draw(st.floats(1e11, 1e15)),
    copy_bandwidth_bytes_per_s=draw(st.floats(1e9, 1e12)),
    alignment_bytes=alignment,
  )


def counting_actor(policy):
  """An Acme actor that plays `policy(observation) -> action` and counts the timesteps it
  observes (Acme is imported here, when a test needs it)."""
  from acme import core

  class CountingActor(core.Actor):
    def __init__(self):
      self.observed = 0

    def select_action(self, observation):
      return np.int32(policy(observation))

    def observe_first(self, timestep):
      self.observed += 1

    def observe(self, action, next_timestep):
      self.observed += 1

    def update(self, wait=False):
      pass

  return CountingActor()
