"""XLA's msa test setting, shared by the msa tests: the hardware of XLA's
`memory_space_assignment_test_base.h` (alternate memory 128 B at 1000 B/s, default memory at 100
B/s, copies at 100 B/s, 1000 flop/s, alignment 8), its shapes (f32[4,3] = 48 B, f32[2,4] = 32 B;
a negate is 1 flop per element, a tanh 100: XLA's transcendentals at 10/s) and hand-written
programs on it.
"""

from malloczero.env.hardware import Hardware, MemoryLevel
from malloczero.env.workload import Workload
from malloczero.env.workload_json import workload_from_dict

XLA_HW = Hardware(
  "xla-test",
  (MemoryLevel("alternate", 128, 1000.0), MemoryLevel("default", 1 << 30, 100.0)),
  peak_flops_per_s=1000.0,
  copy_bandwidth_bytes_per_s=100.0,
  alignment_bytes=8,
)
F32_4_3 = 48
NEGATE, TANH = 12.0, 1200.0  # flops of f32[4,3] negate / tanh


def program(ops: list[tuple[str, float]], buffers: list[dict]) -> Workload:
  return workload_from_dict(
    {
      "name": "hand",
      "source": "hand",
      "ops": [{"name": n, "flops": f} for n, f in ops],
      "buffers": [{"id": i, **b} for i, b in enumerate(buffers)],
    }
  )


def tanh_negate_chains() -> Workload:
  """XLA's MemoryBoundednessBufferIntervalCompare: p0 -> tanh0..tanh4 and p1 -> negate0..negate4,
  interleaved (tanh0, negate0, tanh1, ...), the two last ones program outputs. Buffers: p0, p1,
  tanh0, negate0, ..., tanh4, negate4 (positions 0..11)."""
  ops, buffers = (
    [],
    [
      {"name": "p0", "size": F32_4_3, "def": None, "uses": [0], "kind": "parameter"},
      {"name": "p1", "size": F32_4_3, "def": None, "uses": [1], "kind": "parameter"},
    ],
  )
  for i in range(5):
    ops += [(f"tanh{i}", TANH), (f"negate{i}", NEGATE)]
    last = i == 4
    for j, name in enumerate(("tanh", "negate")):
      buffers.append(
        {
          "name": f"{name}{i}",
          "size": F32_4_3,
          "def": 2 * i + j,
          "uses": [] if last else [2 * i + j + 2],
          "kind": "output" if last else "activation",
        }
      )
  return program(ops, buffers)
