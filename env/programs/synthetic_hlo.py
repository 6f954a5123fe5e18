"""Generated HLO modules at the size of real training steps, as compilers lay them out.

`layered_step_hlo(num_buffers)` writes a scheduled HLO module of an MLP training step whose
every layer's forward and backward pass is a called computation (as a GPU command buffer holds
a stretch of a step), with a scan (a `while` loop of known trip count over stacked weights, its
activations saved by in-place dynamic-update-slices) every `SCAN_EVERY` layers, and an SGD
update of every weight at the end. Flattened by the importer it has about `num_buffers`
buffers: what a user's real step looks like after `import-hlo`, for measuring the importer and
the solvers at that size without compiling one (XLA on the CPU would take many minutes for a
module of 100,000 instructions). Widths cycle through 64 to 512 so that buffer sizes spread from
KiB to MiB as in compiled programs.
"""

from __future__ import annotations

import numpy as np

BATCH = 16
WIDTHS = (64, 128, 256, 512)
SCAN_EVERY = 50  # Layers between two scans.
SCAN_TRIPS = (4, 8, 16)
BUFFERS_PER_LAYER = 14  # Two weights, four forward and six backward values, two updated weights.


def _dot(name: str, shape: str, lhs: str, rhs: str, contracting: tuple[int, int]) -> str:
  """One `dot` instruction line of a computation."""
  return (
    f"  %{name} = {shape} dot(%{lhs}, %{rhs}), lhs_contracting_dims={{{contracting[0]}}}, "
    f"rhs_contracting_dims={{{contracting[1]}}}"
  )


def _shape(*dims: int) -> str:
  layout = ",".join(str(i) for i in reversed(range(len(dims))))
  return f"f32[{','.join(map(str, dims))}]{{{layout}}}"


class _Module:
  """The module's text, one computation at a time."""

  def __init__(self) -> None:
    self.computations: list[str] = []
    self.fused: dict[tuple[str, int, int], str] = {}

  def fused_computation(self, kind: str, rows: int, cols: int) -> str:
    """An elementwise fused computation of `kind` over f32[rows, cols], made once per shape."""
    key = (kind, rows, cols)
    if key not in self.fused:
      name = f"fused_{kind}_{rows}x{cols}"
      s = _shape(rows, cols)
      if kind == "act":  # tanh-like activation of one operand.
        body = [f"  %x = {s} parameter(0)", f"  ROOT %y = {s} tanh(%x)"]
        params = f"x: {s}"
      else:  # Two operands: residual add, activation gradient, SGD update.
        op = {"res": "add", "dact": "multiply", "sgd": "subtract"}[kind]
        body = [
          f"  %a = {s} parameter(0)",
          f"  %b = {s} parameter(1)",
          f"  ROOT %y = {s} {op}(%a, %b)",
        ]
        params = f"a: {s}, b: {s}"
      self.computations.append(f"%{name} ({params}) -> {s} {{\n" + "\n".join(body) + "\n}\n")
      self.fused[key] = name
    return self.fused[key]


def layered_step_hlo(num_buffers: int, seed: int = 0) -> str:
  """A scheduled HLO module (text) of a training step with about `num_buffers` buffers once
  flattened; deterministic in `seed`."""
  rng = np.random.default_rng(seed)
  layers = max(2, num_buffers // BUFFERS_PER_LAYER)
  widths = [int(rng.choice(WIDTHS)) for _ in range(layers + 1)]
  m = _Module()
  entry: list[str] = []
  params: list[str] = []
  x = "x"
  params.append(f"x: {_shape(BATCH, widths[0])}")
  entry.append(f"  %x = {_shape(BATCH, widths[0])} parameter(0)")
  saved = []
  for i in range(layers):
    d, f = widths[i], widths[i + 1] * 2
    w1, w2 = f"w1_{i}", f"w2_{i}"
    for w, dims in ((w1, (d, f)), (w2, (f, widths[i + 1]))):
      entry.append(f"  %{w} = {_shape(*dims)} parameter({len(params)})")
      params.append(f"{w}: {_shape(*dims)}")
    out = _forward(m, entry, i, x, w1, w2, d, f, widths[i + 1])
    saved.append((x, out, w1, w2, d, f, widths[i + 1]))
    x = f"y{i}"
    if (i + 1) % SCAN_EVERY == 0:
      x = _scan(m, entry, i, x, widths[i + 1], int(rng.choice(SCAN_TRIPS)))
  d_last = widths[layers]
  entry.append(f"  %dy = {_shape(BATCH, d_last)} negate(%{x})")
  dy = "dy"
  updates = []
  for i in reversed(range(layers)):
    xin, _, w1, w2, d, f, e = saved[i]
    dy = _backward(m, entry, i, dy, xin, w1, w2, d, f, e)
    for w, g, dims in ((w1, f"dw1_{i}", (d, f)), (w2, f"dw2_{i}", (f, e))):
      fused = m.fused_computation("sgd", *dims)
      entry.append(f"  %new_{w} = {_shape(*dims)} fusion(%{w}, %{g}), kind=kLoop, calls=%{fused}")
      updates.append((f"new_{w}", _shape(*dims)))
  result = ", ".join(s for _, s in updates)
  entry.append(f"  ROOT %updated = ({result}) tuple({', '.join('%' + n for n, _ in updates)})")
  header = f"HloModule layered_step_{num_buffers}, is_scheduled=true\n\n"
  main = f"ENTRY %main ({', '.join(params)}) -> ({result}) {{\n" + "\n".join(entry) + "\n}\n"
  return header + "\n".join(m.computations) + "\n" + main


def _forward(
  m: _Module, entry: list[str], i: int, x: str, w1: str, w2: str, d: int, f: int, e: int
):
  """Layer i's forward pass as a called computation: h = x w1, a = act(h), o = a w2, y = o + x
  (projected); returns the call's name (its result holds h and a for the backward pass)."""
  xs, hs, os_ = _shape(BATCH, d), _shape(BATCH, f), _shape(BATCH, e)
  act = m.fused_computation("act", BATCH, f)
  res = m.fused_computation("res", BATCH, e)
  body = [
    f"  %fx_{i} = {xs} parameter(0)",
    f"  %fw1_{i} = {_shape(d, f)} parameter(1)",
    f"  %fw2_{i} = {_shape(f, e)} parameter(2)",
    _dot(f"h_{i}", hs, f"fx_{i}", f"fw1_{i}", (1, 0)),
    f"  %a_{i} = {hs} fusion(%h_{i}), kind=kLoop, calls=%{act}",
    _dot(f"o_{i}", os_, f"a_{i}", f"fw2_{i}", (1, 0)),
    f"  %r_{i} = {os_} fusion(%o_{i}, %o_{i}), kind=kLoop, calls=%{res}",
    f"  ROOT %fwd_out_{i} = ({os_}, {hs}, {hs}) tuple(%r_{i}, %h_{i}, %a_{i})",
  ]
  name = f"layer_{i}_forward"
  m.computations.append(
    f"%{name} (fx_{i}: {xs}, fw1_{i}: {_shape(d, f)}, fw2_{i}: {_shape(f, e)}) -> "
    f"({os_}, {hs}, {hs}) {{\n" + "\n".join(body) + "\n}\n"
  )
  entry += [
    f"  %fwd_{i} = ({os_}, {hs}, {hs}) call(%{x}, %{w1}, %{w2}), to_apply=%{name}",
    f"  %y{i} = {os_} get-tuple-element(%fwd_{i}), index=0",
  ]
  return f"fwd_{i}"


def _backward(
  m: _Module, entry: list[str], i: int, dy: str, x: str, w1: str, w2: str, d: int, f: int, e: int
) -> str:
  """Layer i's backward pass as a called computation; leaves dw1_i and dw2_i in the entry and
  returns the name of dx."""
  xs, hs, os_ = _shape(BATCH, d), _shape(BATCH, f), _shape(BATCH, e)
  dact = m.fused_computation("dact", BATCH, f)
  body = [
    f"  %bdy_{i} = {os_} parameter(0)",
    f"  %bfwd_{i} = ({os_}, {hs}, {hs}) parameter(1)",
    f"  %bx_{i} = {xs} parameter(2)",
    f"  %bw1_{i} = {_shape(d, f)} parameter(3)",
    f"  %bw2_{i} = {_shape(f, e)} parameter(4)",
    f"  %bh_{i} = {hs} get-tuple-element(%bfwd_{i}), index=1",
    f"  %ba_{i} = {hs} get-tuple-element(%bfwd_{i}), index=2",
    _dot(f"da_{i}", hs, f"bdy_{i}", f"bw2_{i}", (1, 1)),
    f"  %dh_{i} = {hs} fusion(%da_{i}, %bh_{i}), kind=kLoop, calls=%{dact}",
    _dot(f"gw2_{i}", _shape(f, e), f"ba_{i}", f"bdy_{i}", (0, 0)),
    _dot(f"dx_{i}", xs, f"dh_{i}", f"bw1_{i}", (1, 1)),
    _dot(f"gw1_{i}", _shape(d, f), f"bx_{i}", f"dh_{i}", (0, 0)),
    f"  ROOT %bwd_out_{i} = ({xs}, {_shape(d, f)}, {_shape(f, e)}) tuple(%dx_{i}, %gw1_{i}, "
    f"%gw2_{i})",
  ]
  name = f"layer_{i}_backward"
  m.computations.append(
    f"%{name} (bdy_{i}: {os_}, bfwd_{i}: ({os_}, {hs}, {hs}), bx_{i}: {xs}, "
    f"bw1_{i}: {_shape(d, f)}, bw2_{i}: {_shape(f, e)}) -> "
    f"({xs}, {_shape(d, f)}, {_shape(f, e)}) {{\n" + "\n".join(body) + "\n}\n"
  )
  entry += [
    f"  %bwd_{i} = ({xs}, {_shape(d, f)}, {_shape(f, e)}) call(%{dy}, %fwd_{i}, %{x}, %{w1}, "
    f"%{w2}), to_apply=%{name}",
    f"  %dxo_{i} = {xs} get-tuple-element(%bwd_{i}), index=0",
    f"  %dw1_{i} = {_shape(d, f)} get-tuple-element(%bwd_{i}), index=1",
    f"  %dw2_{i} = {_shape(f, e)} get-tuple-element(%bwd_{i}), index=2",
  ]
  return f"dxo_{i}"


def _scan(m: _Module, entry: list[str], i: int, x: str, d: int, trips: int) -> str:
  """A scan of `trips` steps over x (a `while` with its trip count printed, as XLA prints it):
  each step transforms the carry and saves it into a stacked buffer in place; returns the name
  of the carry after the loop."""
  xs, stack = _shape(BATCH, d), _shape(trips, BATCH, d)
  state = f"(s32[], {xs}, {stack})"
  act = m.fused_computation("act", BATCH, d)
  cond, body = f"scan_{i}_condition", f"scan_{i}_body"
  m.computations.append(
    f"%{cond} (cp_{i}: {state}) -> pred[] {{\n"
    f"  %cp_{i} = {state} parameter(0)\n"
    f"  %ci_{i} = s32[] get-tuple-element(%cp_{i}), index=0\n"
    f"  %cn_{i} = s32[] constant({trips})\n"
    f"  ROOT %clt_{i} = pred[] compare(%ci_{i}, %cn_{i}), direction=LT\n}}\n"
  )
  m.computations.append(
    f"%{body} (bp_{i}: {state}) -> {state} {{\n"
    f"  %bp_{i} = {state} parameter(0)\n"
    f"  %bi_{i} = s32[] get-tuple-element(%bp_{i}), index=0\n"
    f"  %bc_{i} = {xs} get-tuple-element(%bp_{i}), index=1\n"
    f"  %bs_{i} = {stack} get-tuple-element(%bp_{i}), index=2\n"
    f"  %bone_{i} = s32[] constant(1)\n"
    f"  %bzero_{i} = s32[] constant(0)\n"
    f"  %bnext_{i} = s32[] add(%bi_{i}, %bone_{i})\n"
    f"  %bnew_{i} = {xs} fusion(%bc_{i}), kind=kLoop, calls=%{act}\n"
    f"  %brow_{i} = {_shape(1, BATCH, d)} bitcast(%bnew_{i})\n"
    f"  %bsave_{i} = {stack} dynamic-update-slice(%bs_{i}, %brow_{i}, %bi_{i}, %bzero_{i}, "
    f"%bzero_{i})\n"
    f"  ROOT %bout_{i} = {state} tuple(%bnext_{i}, %bnew_{i}, %bsave_{i})\n}}\n"
  )
  entry += [
    f"  %szero_{i} = s32[] constant(0)",
    f"  %sinit_{i} = {stack} broadcast(%{x}), dimensions={{1,2}}",
    f"  %sstart_{i} = {state} tuple(%szero_{i}, %{x}, %sinit_{i})",
    f"  %scan_{i} = {state} while(%sstart_{i}), condition=%{cond}, body=%{body}, "
    f'backend_config={{"known_trip_count":{{"n":"{trips}"}}}}',
    f"  %scarry_{i} = {xs} get-tuple-element(%scan_{i}), index=1",
  ]
  return f"scarry_{i}"
