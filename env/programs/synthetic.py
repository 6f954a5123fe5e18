"""Generated programs: random ones for property tests and the bench, and one analytic built-in.

These are not compiler output (the XLA importer provides real programs); `source` says so.
"""

from __future__ import annotations

import numpy as np

from malloczero.env.hardware import Hardware, check_fits
from malloczero.env.workload import Workload
from malloczero.env.workload_json import workload_from_ops


def random_workload(
  seed: int,
  num_ops: int = 40,
  num_parameters: int | None = None,
  max_operands: int = 3,
  name: str | None = None,
) -> Workload:
  """A random DAG in schedule order: each op reads recent activations (and now and then an old
  one, like a skip connection) plus some parameters, and writes one activation. Sizes are
  log-uniform from 256 B to 4 MiB and flops vary so that some ops are compute bound."""
  rng = np.random.default_rng(seed)
  num_parameters = max(1, num_ops // 3) if num_parameters is None else num_parameters
  sizes = lambda n: np.exp(rng.uniform(np.log(256), np.log(4 << 20), n)).astype(np.int64)
  act_size = sizes(num_ops)
  param_size = sizes(num_parameters)
  input_size = sizes(2)
  act_uses: list[list[int]] = [[] for _ in range(num_ops)]
  param_uses: list[list[int]] = [[] for _ in range(num_parameters)]
  input_uses: list[list[int]] = [[] for _ in range(2)]
  flops = np.zeros(num_ops)
  for t in range(num_ops):
    touched = act_size[t]
    if t == 0 or rng.random() < 0.05:
      i = int(rng.integers(2))
      input_uses[i].append(t)
      touched += input_size[i]
    for _ in range(int(rng.integers(1, max_operands + 1)) if t else 0):
      back = 1 + int(rng.geometric(0.5)) if rng.random() < 0.85 else int(rng.integers(1, t + 1))
      src = max(0, t - back)
      if t not in act_uses[src]:
        act_uses[src].append(t)
        touched += act_size[src]
    if rng.random() < 0.6:
      p = int(rng.integers(num_parameters))
      if t not in param_uses[p]:
        param_uses[p].append(t)
        touched += param_size[p]
    # Arithmetic intensity from 0.05 to 200 flops per byte touched.
    flops[t] = float(touched) * float(np.exp(rng.uniform(np.log(0.05), np.log(200.0))))
  buffers = []
  for t in range(num_ops):
    kind = "output" if t == num_ops - 1 else "activation"
    buffers.append(
      {
        "id": t,
        "name": f"act{t}",
        "size": int(act_size[t]),
        "def": t,
        "uses": act_uses[t],
        "kind": kind,
      }
    )
  for p in range(num_parameters):
    buffers.append(
      {
        "id": num_ops + p,
        "name": f"param{p}",
        "size": int(param_size[p]),
        "def": None,
        "uses": param_uses[p],
        "kind": "parameter",
      }
    )
  for i in range(2):
    buffers.append(
      {
        "id": num_ops + num_parameters + i,
        "name": f"input{i}",
        "size": int(input_size[i]),
        "def": None,
        "uses": input_uses[i],
        "kind": "input",
      }
    )
  return workload_from_ops(
    name or f"random-{seed}-{num_ops}", "synthetic-random", flops.tolist(), buffers
  )


def mlp_training_step(
  layers: int = 6, batch: int = 256, width: int = 2048, dtype_bytes: int = 4
) -> Workload:
  """An MLP training step with a hand-derived schedule (forward, backward, SGD update).

  Built from the algebra rather than compiled, so it is available before any XLA import; the
  per-op flops and tensor sizes are those of the dense layers it describes."""
  ops: list[float] = []
  buffers: list[dict] = []

  def buf(name, size, kind, def_op=None):
    buffers.append(
      {
        "id": len(buffers),
        "name": name,
        "size": int(size) * dtype_bytes,
        "def": def_op,
        "uses": [],
        "kind": kind,
      }
    )
    return len(buffers) - 1

  def op(flops, reads, writes_name, writes_size, kind="activation"):
    t = len(ops)
    ops.append(float(flops))
    for r in reads:
      buffers[r]["uses"].append(t)
    return buf(writes_name, writes_size, kind, t) if writes_name else None

  x = buf("input/x", batch * width, "input")
  weights = [buf(f"param/w{i}", width * width, "parameter") for i in range(layers)]
  pre, post = [], [x]
  for i, w in enumerate(weights):
    h = op(2 * batch * width * width, [post[-1], w], f"fwd/matmul{i}", batch * width)
    pre.append(h)
    post.append(op(batch * width, [h], f"fwd/relu{i}", batch * width))
  grad = op(3 * batch * width, [post[-1]], "loss/grad", batch * width)
  for i in reversed(range(layers)):
    g_pre = op(batch * width, [grad, pre[i]], f"bwd/relu{i}", batch * width)
    g_w = op(2 * batch * width * width, [post[i], g_pre], f"bwd/dW{i}", width * width)
    if i:
      grad = op(2 * batch * width * width, [g_pre, weights[i]], f"bwd/dx{i}", batch * width)
    op(2 * width * width, [weights[i], g_w], f"update/w{i}", width * width, kind="output")
  return workload_from_ops(
    f"mlp-train-l{layers}-b{batch}-w{width}", "analytic (hand-derived)", ops, buffers
  )


def contended(hardware: Hardware, workload: Workload, fraction: float) -> Hardware:
  """The hardware with its fast capacity set to `fraction` of the workload's peak live bytes; a
  machine that cannot hold the program is refused naming the presets that can (`check_fits`)."""
  check_fits(hardware, workload.peak_live_bytes, workload.name)
  align = hardware.alignment_bytes
  return hardware.with_fast_capacity(
    max(align, int(fraction * workload.peak_live_bytes) // align * align)
  )


def minimalloc_csv_text(num_rows: int, seed: int = 0, horizon: int = 1 << 20) -> str:
  """A MiniMalloc CSV (`id,lower,upper,size`) of `num_rows` buffers, shaped like the challenge
  instances (times on `[0, horizon)`, sizes 1 KiB to 640 KiB) but with lifetimes of 0.01% to 3%
  of the horizon, so that the live set stays a few hundred buffers however many rows there are:
  the input that shows whether reading and solving a CSV cost memory linear in its rows."""
  rng = np.random.default_rng(seed)
  length = np.maximum(
    1, (horizon * np.exp(rng.uniform(np.log(1e-4), np.log(3e-2), num_rows))).astype(np.int64)
  )
  lower = rng.integers(0, horizon, num_rows)
  upper = np.minimum(lower + length, horizon)
  lower = np.minimum(lower, upper - 1)
  size = (
    np.exp(rng.uniform(np.log(1 << 10), np.log(640 << 10), num_rows)).astype(np.int64)
    // 1024
    * 1024
  )
  lines = ["id,lower,upper,size"]
  lines += [
    f"{i},{lo},{hi},{s}"
    for i, (lo, hi, s) in enumerate(zip(lower.tolist(), upper.tolist(), size.tolist()))
  ]
  return "\n".join(lines) + "\n"


def xla_like_workload(num_buffers: int, seed: int = 0) -> Workload:
  """`random_workload` with about `num_buffers` buffers (one activation per op, a parameter per
  three ops, two inputs), for measuring solvers at the size of real traces."""
  num_ops = max(2, (num_buffers - 2) * 3 // 4)
  return random_workload(seed, num_ops, name=f"xla-like-{num_buffers}")
