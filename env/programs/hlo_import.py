"""Import a program compiled by XLA: optimised, scheduled HLO text -> `Workload`.

The input is the post-optimisation module as printed by
`jax.jit(f).lower(*args).compile().as_text()`: it has `is_scheduled=true`, fusion (and other
called) computations, and an ENTRY computation whose instructions are printed in schedule order.
Only the ENTRY computation becomes the schedule; called computations only contribute flops.

Conversion rules
----------------
Ops
  The ENTRY instructions in printed (= schedule) order, except the ones that create no data of
  their own: `parameter`, `constant`, `get-tuple-element`, `bitcast`, `tuple`, `copy-start`,
  `copy-done`, `add-dependency`, `opt-barrier`, `domain` and `after-all`. Every other
  instruction (fusion, dot, convolution, custom-call, reduce, copy, while, call, conditional,
  ...) is one op, named after the instruction.

Flops per op
  * `dot`: 2 * prod(output dims) * prod(lhs contracting dims).
  * `convolution`: 2 * prod(output dims) * prod(kernel spatial dims) * input features per
    group, read from `dim_labels` and `window`, except that kernel taps which fall on padding
    or on the holes of `lhs_dilate` (transposed convolutions, input gradients of strided
    convolutions) are not counted, exactly as XLA's own cost analysis does. (Without that, a
    stride-2 input gradient would count 4x its real work.)
  * `reduce`: prod(input dims), summed over the reduced inputs of a variadic reduce.
  * `reduce-window`: prod(output dims) * prod(window size).
  * Data movement (broadcast, reshape, transpose, copy, slice, concatenate, pad, gather, iota,
    dynamic-(update-)slice, collectives that only move data, ...): 0.
  * Any other instruction (elementwise, compare, select, convert, scatter, sort, ...):
    prod(output dims) (summed over the leaves of a tuple-shaped result).
  * `fusion`, `call`, async `*-start` with `calls=`: the sum over the called computation.
  * `while`: (body + condition) x the trip count when XLA printed one in `backend_config`
    (`"known_trip_count":{"n":"5"}`), otherwise once (the trip count is data dependent).
  * `conditional`: the most expensive branch (an upper bound; which branch runs is data
    dependent).
  * `custom-call`: a target whose name mentions matmul/gemm/dot is estimated from shapes as
    2 * prod(lhs dims) * (last output dim) (exact for `[..., M, K] x [..., K, N]`); a target
    mentioning conv that carries `window`/`dim_labels` uses the convolution rule; any other
    target counts 0 (its cost is unknown).

Buffers
  * Every array leaf of an op's result (a tuple-shaped result gives one buffer per leaf) is an
    `activation` of `bytes(shape)` (pred/s8/u8/f8 = 1, bf16/f16/s16/u16 = 2, f32/s32/u32 = 4,
    f64/s64/u64/c64 = 8, c128 = 16; sub-byte types round up). Leaves with a zero dimension and
    token/opaque leaves are skipped.
  * ENTRY `parameter`s are all `parameter` buffers (def = null): HLO does not say which
    arguments are weights and which are program inputs. A tuple-shaped parameter gives one
    buffer per leaf.
  * Constants: an ENTRY constant of more than `SMALL_CONSTANT_BYTES` bytes is read-only data
    that exists before the program, so it becomes a `parameter` buffer too; smaller constants
    (scalars, tiny tables) are ignored, as they are immediates rather than memory traffic.
  * The buffers the ROOT resolves to (each leaf if the ROOT is a tuple) become `output`s; a
    leaf that resolves to a parameter stays a parameter.
  * Aliasing: `get-tuple-element`, `bitcast`, `tuple` (and the other non-op instructions
    above) create no buffer; they resolve to the buffer(s) they alias, so a use of them is a
    use of those buffers. `copy-start`/`copy-done` (a memory-space move) resolve to their
    operand.
  * In-place ops (dynamic-update-slice fusions with `output_to_operand_aliasing`, a `while`'s
    loop state, donated arguments named in `input_output_alias`, and XLA's reuse of a dead
    operand's buffer for an elementwise result) are treated as new buffers: the workload
    models logical tensors, not XLA's buffer assignment.

Against `compiled.memory_analysis()` (measured on CPU MLPs and CNNs): the parameter bytes
equal XLA's argument bytes and the output bytes its output bytes (less 8 bytes per element of
a tuple-shaped result, XLA's pointer table). `peak_live_bytes` is not XLA's
argument + output + temp: XLA keeps every argument allocated for the whole program and gives
outputs their own allocations (both make XLA higher), and it updates in place, e.g. a new
weight into its dead gradient's buffer (which makes XLA lower: by up to ~30% of the workload's
peak for training steps with large weight matrices).

Uses
  An op uses every buffer reachable through its operands after alias resolution. Operands are
  defined earlier in the schedule, so every use is strictly after the definition.

Malformed text (empty, no ENTRY computation, an unparseable instruction line, an operand that
names no earlier instruction, a truncated module) raises `WorkloadError` with one line.
"""

from __future__ import annotations

import dataclasses
import functools
import math
import re
from typing import Any, Callable, Iterator, Union

import numpy as np

from malloczero.env.errors import WorkloadError
from malloczero.env.workload import Workload

SMALL_CONSTANT_BYTES = 64  # ENTRY constants up to this size are ignored (immediates).

# Element sizes in bits (sub-byte types are rounded up to whole bytes per buffer).
_DTYPE_BITS = {
    "pred": 8, "s1": 1, "u1": 1, "s2": 2, "u2": 2, "s4": 4, "u4": 4, "s8": 8, "u8": 8,
    "s16": 16, "u16": 16, "s32": 32, "u32": 32, "s64": 64, "u64": 64,
    "f16": 16, "bf16": 16, "f32": 32, "f64": 64, "c64": 64, "c128": 128,
    "f4e2m1fn": 4, "f8e8m0fnu": 8, "f8e3m4": 8, "f8e4m3": 8, "f8e4m3fn": 8, "f8e4m3b11fnuz": 8,
    "f8e4m3fnuz": 8, "f8e5m2": 8, "f8e5m2fnuz": 8,
    "token": 0, "opaque": 0,
}

# Instructions that are not ops: they alias existing buffers or create none.
_NON_OPS = frozenset({"parameter", "constant", "get-tuple-element", "bitcast", "tuple",
                      "copy-start", "copy-done", "add-dependency", "opt-barrier", "domain",
                      "after-all"})
# Ops that only move data: 0 flops.
_DATA_MOVEMENT = frozenset({
    "parameter", "constant", "get-tuple-element", "bitcast", "tuple", "copy-start",
    "copy-done", "add-dependency", "opt-barrier", "domain", "after-all", "broadcast", "reshape",
    "dynamic-reshape", "transpose", "copy", "slice", "dynamic-slice", "dynamic-update-slice",
    "concatenate", "pad", "iota", "reverse", "gather", "bitcast-convert", "get-dimension-size",
    "set-dimension-size", "partition-id", "replica-id", "send", "send-done", "recv",
    "recv-done", "infeed", "outfeed", "all-gather", "all-gather-start", "all-gather-done",
    "all-to-all", "collective-permute", "collective-permute-start", "collective-permute-done",
    "all-reduce-done", "async-done", "async-update", "rng-get-and-update-state",
    "collective-broadcast", "ragged-all-to-all"})

_IDENT = re.compile(r"[A-Za-z0-9_.\-]+")
_COMMENT = re.compile(r"/\*.*?\*/")
_HEADER = re.compile(r"^(ENTRY\s+)?%?([A-Za-z0-9_.\-]+)\s*\(.*\)\s*->\s*.*\{\s*$")
_INSTR_START = re.compile(r"^\s*(ROOT\s+)?%?([A-Za-z0-9_.\-]+)\s*=\s*")
_OPCODE = re.compile(r"\s*([a-z][a-z0-9\-_]*)\(")
_ARRAY = re.compile(r"([a-z][a-z0-9]*)\[([^\]]*)\]")


# ----------------------------------------------------------------------------- shapes


@dataclasses.dataclass(frozen=True)
class _Array:
  dtype: str
  dims: tuple[int, ...]

  @property
  def elements(self) -> int:
    return math.prod(self.dims)

  @property
  def bytes(self) -> int:
    return (self.elements * _DTYPE_BITS[self.dtype] + 7) // 8


_Shape = Union[_Array, tuple]  # A tuple shape is a Python tuple of shapes.


def _leaves(shape: _Shape) -> Iterator[tuple[tuple[int, ...], _Array]]:
  """(index path, array) for every array leaf of a shape, in order."""
  if isinstance(shape, _Array):
    yield (), shape
    return
  for i, sub in enumerate(shape):
    for path, leaf in _leaves(sub):
      yield (i,) + path, leaf


def _elements(shape: _Shape) -> int:
  return sum(leaf.elements for _, leaf in _leaves(shape) if _DTYPE_BITS[leaf.dtype] > 0)


def _skip_braces(s: str, i: int) -> int:
  """Index just past the balanced `{...}` that starts at `s[i]`."""
  depth = 0
  while i < len(s):
    c = s[i]
    if c == "{":
      depth += 1
    elif c == "}":
      depth -= 1
      if depth == 0:
        return i + 1
    i += 1
  raise ValueError("unbalanced '{' in a shape layout")


def _parse_shape(s: str, i: int) -> tuple[_Shape, int]:
  """Parses the shape starting at `s[i]`; returns (shape, index just past it)."""
  if s.startswith("(", i):
    i += 1
    parts = []
    while True:
      while i < len(s) and s[i] == " ":
        i += 1
      if s.startswith(")", i):
        return tuple(parts), i + 1
      sub, i = _parse_shape(s, i)
      parts.append(sub)
      while i < len(s) and s[i] == " ":
        i += 1
      if s.startswith(",", i):
        i += 1
      elif not s.startswith(")", i):
        raise ValueError("expected ',' or ')' in a tuple shape")
  m = _ARRAY.match(s, i)
  if not m:
    raise ValueError("expected a shape such as f32[8,16]")
  dtype = m.group(1)
  if dtype not in _DTYPE_BITS:
    raise ValueError(f"unknown element type '{dtype}'")
  dims = []
  for d in (x.strip() for x in m.group(2).split(",")):
    if not d:
      continue
    d = d[2:] if d.startswith("<=") else d
    if not d.isdigit():
      raise ValueError(f"cannot read dimension '{d}'")
    dims.append(int(d))
  i = m.end()
  if s.startswith("{", i):
    i = _skip_braces(s, i)
  return _Array(dtype, tuple(dims)), i


# ----------------------------------------------------------------------------- parsing


@dataclasses.dataclass
class _Instr:
  name: str
  shape: _Shape
  opcode: str
  operands: list[str]
  attrs: str
  is_root: bool
  line: int


@dataclasses.dataclass
class _Computation:
  name: str
  is_entry: bool
  instrs: list[_Instr]
  line: int

  @functools.cached_property
  def by_name(self) -> dict[str, _Instr]:
    return {ins.name: ins for ins in self.instrs}

  @property
  def root(self) -> _Instr:
    for ins in self.instrs:
      if ins.is_root:
        return ins
    return self.instrs[-1]


def _matching_paren(s: str, i: int) -> int:
  """Index of the `)` closing the `(` at `s[i]`, skipping over quoted strings."""
  depth, quoted = 0, False
  while i < len(s):
    c = s[i]
    if quoted:
      if c == "\\":
        i += 1
      elif c == '"':
        quoted = False
    elif c == '"':
      quoted = True
    elif c == "(":
      depth += 1
    elif c == ")":
      depth -= 1
      if depth == 0:
        return i
    i += 1
  raise ValueError("unbalanced '(' in the operand list")


def _split_top_level(s: str) -> list[str]:
  parts, depth, start = [], 0, 0
  for i, c in enumerate(s):
    if c in "([{":
      depth += 1
    elif c in ")]}":
      depth -= 1
    elif c == "," and depth == 0:
      parts.append(s[start:i])
      start = i + 1
  parts.append(s[start:])
  return [p.strip() for p in parts if p.strip()]


def _parse_instr(line: str, lineno: int) -> _Instr:
  m = _INSTR_START.match(line)
  if not m:
    raise ValueError("expected 'name = shape opcode(operands)'")
  shape, i = _parse_shape(line, m.end())
  op = _OPCODE.match(line, i)
  if not op:
    raise ValueError("expected an opcode followed by '(' after the shape")
  opcode = op.group(1)
  open_paren = op.end() - 1
  close = _matching_paren(line, open_paren)
  inner = line[open_paren + 1:close]
  operands = []
  if opcode not in ("constant", "parameter"):
    for part in _split_top_level(inner):
      token = part.split()[-1].lstrip("%")  # Older printers put the operand's shape first.
      if not _IDENT.fullmatch(token):
        raise ValueError(f"cannot read operand '{part}'")
      operands.append(token)
  return _Instr(m.group(2), shape, opcode, operands, line[close + 1:], bool(m.group(1)), lineno)


def _parse_module(text: str, where: str) -> dict[str, _Computation]:
  if not isinstance(text, str):
    raise WorkloadError(f"{where}: expected HLO text (a str), got {type(text).__name__}")
  if not text.strip():
    raise WorkloadError(f"{where}: empty HLO text")
  comps: dict[str, _Computation] = {}
  current: _Computation | None = None
  for lineno, raw in enumerate(text.splitlines(), start=1):
    line = _COMMENT.sub("", raw).rstrip()
    stripped = line.strip()
    if current is None:
      m = _HEADER.match(stripped)
      if m:
        current = _Computation(m.group(2), bool(m.group(1)), [], lineno)
      # Anything else outside a computation (the HloModule line, blank lines, stack-frame
      # tables of newer printers) carries nothing the workload needs.
      continue
    if not stripped or stripped.startswith("//"):
      continue
    if stripped == "}":
      if not current.instrs:
        raise WorkloadError(f"{where}: line {current.line}: computation '{current.name}' has "
                            "no instructions")
      if current.name in comps:
        raise WorkloadError(f"{where}: line {current.line}: computation '{current.name}' is "
                            "defined twice")
      comps[current.name] = current
      current = None
      continue
    try:
      current.instrs.append(_parse_instr(line, lineno))
    except ValueError as e:
      snippet = stripped if len(stripped) <= 80 else stripped[:77] + "..."
      raise WorkloadError(f"{where}: line {lineno}: unparseable HLO instruction ({e}): "
                          f"{snippet}") from None
  if current is not None:
    raise WorkloadError(f"{where}: truncated HLO: computation '{current.name}' (line "
                        f"{current.line}) is not closed by '}}'")
  entries = [c for c in comps.values() if c.is_entry]
  if not entries:
    raise WorkloadError(f"{where}: no ENTRY computation in the HLO text (is it truncated, or "
                        "not an HLO module?)")
  if len(entries) > 1:
    raise WorkloadError(f"{where}: more than one ENTRY computation in the HLO text")
  for comp in comps.values():
    seen: set[str] = set()
    for ins in comp.instrs:
      for operand in ins.operands:
        if operand not in seen:
          later = "is defined after its use" if operand in comp.by_name else "is not defined"
          raise WorkloadError(f"{where}: line {ins.line}: instruction '{ins.name}' uses unknown "
                              f"operand '{operand}' (it {later} in computation '{comp.name}')")
      if ins.name in seen:
        raise WorkloadError(f"{where}: line {ins.line}: instruction '{ins.name}' is defined "
                            f"twice in computation '{comp.name}'")
      seen.add(ins.name)
  return comps


# ----------------------------------------------------------------------------- flops


def _attr(attrs: str, key: str) -> str | None:
  """The value of `key=...` in an instruction's attribute text (braces kept balanced)."""
  m = re.search(r"(?:^|[,\s])" + re.escape(key) + r"=", attrs)
  if not m:
    return None
  i = m.end()
  if attrs.startswith("{", i):
    return attrs[i + 1:_skip_braces(attrs, i) - 1]
  if attrs.startswith('"', i):
    j = i + 1
    while j < len(attrs) and attrs[j] != '"':
      j += 2 if attrs[j] == "\\" else 1
    return attrs[i + 1:j]
  m2 = re.compile(r"[^,\s]*").match(attrs, i)
  return m2.group(0)


def _int_list(value: str | None) -> list[int]:
  return [int(x) for x in re.findall(r"\d+", value or "")]


def _comp_names(value: str | None) -> list[str]:
  return [x.strip().lstrip("%") for x in (value or "").split(",") if x.strip()]


class _FlopCounter:
  def __init__(self, comps: dict[str, _Computation], where: str):
    self.comps, self.where = comps, where
    self.memo: dict[str, float] = {}
    self.active: set[str] = set()

  def computation(self, name: str, user: _Instr) -> float:
    if name not in self.comps:
      raise WorkloadError(f"{self.where}: line {user.line}: instruction '{user.name}' calls "
                          f"unknown computation '{name}' (is the module truncated?)")
    if name in self.memo:
      return self.memo[name]
    if name in self.active:
      raise WorkloadError(f"{self.where}: computation '{name}' calls itself")
    self.active.add(name)
    comp = self.comps[name]
    total = sum(self.instr(ins, comp) for ins in comp.instrs)
    self.active.discard(name)
    self.memo[name] = total
    return total

  def instr(self, ins: _Instr, comp: _Computation) -> float:
    op, attrs = ins.opcode, ins.attrs
    operand = lambda k: comp.by_name[ins.operands[k]].shape
    out_elems = _elements(ins.shape)
    try:
      if op in ("fusion", "call", "async-start") or (op.endswith("-start") and "calls=" in attrs):
        called = _comp_names(_attr(attrs, "calls") or _attr(attrs, "to_apply"))
        return sum(self.computation(c, ins) for c in called)
      if op == "while":
        body = self.computation(_comp_names(_attr(attrs, "body"))[0], ins)
        cond = self.computation(_comp_names(_attr(attrs, "condition"))[0], ins)
        return (body + cond) * _trip_count(attrs)
      if op == "conditional":
        branches = _comp_names(_attr(attrs, "branch_computations")) or [
            c for key in ("true_computation", "false_computation")
            for c in _comp_names(_attr(attrs, key))]
        return max((self.computation(c, ins) for c in branches), default=0.0)
      if op == "dot":
        lhs = operand(0)
        k = math.prod(lhs.dims[d] for d in _int_list(_attr(attrs, "lhs_contracting_dims")))
        return 2.0 * out_elems * k
      if op == "convolution":
        return _conv_flops(ins, operand(0), operand(1))
      if op == "custom-call":
        return _custom_call_flops(ins, [operand(k) for k in range(len(ins.operands))])
      if op == "reduce":
        n = max(1, len(ins.operands) // 2)
        return float(sum(_elements(operand(k)) for k in range(n)))
      if op == "reduce-window":
        window = _window_size(attrs)
        return float(out_elems * math.prod(window))
      if op == "select-and-scatter":
        return float(_elements(operand(0)) * math.prod(_window_size(attrs)))
      if op in _DATA_MOVEMENT:
        return 0.0
      return float(out_elems)
    except WorkloadError:
      raise
    except (IndexError, AttributeError, KeyError, TypeError, ValueError, ZeroDivisionError) as e:
      raise WorkloadError(f"{self.where}: line {ins.line}: cannot count the flops of "
                          f"'{ins.name}' ({op}): malformed shapes or attributes "
                          f"({type(e).__name__})") from None


def _trip_count(attrs: str) -> int:
  m = re.search(r'known_trip_count"?\s*:\s*\{\s*"?n"?\s*:\s*"?(\d+)', attrs)
  return int(m.group(1)) if m else 1


def _window_size(attrs: str) -> list[int]:
  window = _attr(attrs, "window") or ""
  m = re.search(r"size=([0-9x]+)", window)
  return [int(x) for x in m.group(1).split("x")] if m else [1]


def _conv_flops(ins: _Instr, lhs: _Shape, kernel: _Shape) -> float:
  """2 x (output batch x output features) x (input features per group) x, for every spatial
  dimension, the number of (output position, kernel tap) pairs that land on a real input
  element (not padding, not a hole of `lhs_dilate`), as XLA's HloCostAnalysis counts them.

  Falls back to 2 * prod(output) * prod(kernel) / (kernel output features) when the
  dimension labels cannot be read."""
  out = next(leaf for _, leaf in _leaves(ins.shape))
  labels = _attr(ins.attrs, "dim_labels") or ""
  m = re.fullmatch(r"([a-z0-9]+)_([a-z0-9]+)->([a-z0-9]+)", labels)
  if m and isinstance(lhs, _Array) and isinstance(kernel, _Array):
    in_l, k_l, out_l = m.groups()
    spatial = sorted(c for c in k_l if c.isdigit())
    window = _window(ins.attrs, len(spatial))
    if (len(in_l) == len(lhs.dims) and len(k_l) == len(kernel.dims) == len(in_l)
        and len(out_l) == len(out.dims) and window is not None
        and all(c in in_l and c in out_l for c in spatial + ["b", "f"]) and "i" in k_l):
      total = 2.0 * out.dims[out_l.index("b")] * out.dims[out_l.index("f")] * kernel.dims[
          k_l.index("i")]
      for d, c in enumerate(spatial):
        size, stride, (pad_lo, _), lhs_dil, rhs_dil = (w[d] for w in window)
        total *= _valid_taps(lhs.dims[in_l.index(c)], out.dims[out_l.index(c)],
                             kernel.dims[k_l.index(c)], stride, pad_lo, lhs_dil, rhs_dil)
      return total
  o_index = len(kernel.dims) - 1
  if m and "o" in m.group(2) and len(m.group(2)) == len(kernel.dims):
    o_index = m.group(2).index("o")
  return 2.0 * out.elements * math.prod(kernel.dims) / max(1, kernel.dims[o_index])


def _window(attrs: str, rank: int) -> list[list[Any]] | None:
  """[sizes, strides, pads, lhs dilations, rhs dilations] of a `window={...}` attribute."""
  text = _attr(attrs, "window")
  if text is None:
    return [[1] * rank, [1] * rank, [(0, 0)] * rank, [1] * rank, [1] * rank] if rank == 0 else None
  fields = dict(f.split("=", 1) for f in text.split() if "=" in f)
  def ints(key: str, default: int) -> list[int]:
    return [int(x) for x in fields[key].split("x")] if key in fields else [default] * rank
  pads = ([tuple(int(v) for v in p.split("_")) for p in fields["pad"].split("x")]
          if "pad" in fields else [(0, 0)] * rank)
  result = [ints("size", 1), ints("stride", 1), pads, ints("lhs_dilate", 1),
            ints("rhs_dilate", 1)]
  return result if all(len(r) == rank for r in result) else None


def _valid_taps(in_size: int, out_size: int, kernel_size: int, stride: int, pad_lo: int,
                lhs_dil: int, rhs_dil: int) -> int:
  """Number of (output position, kernel tap) pairs of one spatial dimension that read a real
  input element."""
  o = np.arange(out_size, dtype=np.int64) * stride - pad_lo
  last, lhs_dil = (in_size - 1) * lhs_dil, max(1, lhs_dil)
  count = 0
  for k in range(kernel_size):  # One tap at a time keeps memory at O(out_size).
    j = o + k * rhs_dil  # Index into the lhs-dilated input.
    count += int(((j >= 0) & (j <= last) & (j % lhs_dil == 0)).sum())
  return count


def _custom_call_flops(ins: _Instr, operands: list[_Shape]) -> float:
  target = (_attr(ins.attrs, "custom_call_target") or "").lower()
  arrays = [s for s in operands if isinstance(s, _Array)]
  out = next((leaf for _, leaf in _leaves(ins.shape)), None)
  if out is None or not out.dims:
    return 0.0
  if any(k in target for k in ("matmul", "gemm", "dot")) and arrays:
    return 2.0 * arrays[0].elements * out.dims[-1]
  if "conv" in target and len(arrays) >= 2 and _attr(ins.attrs, "dim_labels"):
    return _conv_flops(ins, arrays[0], arrays[1])
  return 0.0


# ----------------------------------------------------------------------------- conversion


def workload_from_hlo_text(text: str, name: str, source: str = "xla-hlo") -> Workload:
  """Converts optimised, scheduled HLO text (`compiled.as_text()`) to a `Workload`.

  The rules (which instructions are ops, how flops are counted, which buffers exist and what
  aliases what) are in this module's docstring. Malformed text raises a one-line
  `WorkloadError`.
  """
  comps = _parse_module(text, name)
  entry = next(c for c in comps.values() if c.is_entry)
  flops = _FlopCounter(comps, name)
  ops: list[dict[str, Any]] = []
  buffers: list[dict[str, Any]] = []
  values: dict[str, Any] = {}  # instruction -> value tree: a buffer index, None, or a tuple.

  def new_buffers(ins: _Instr, kind: str, def_op: int | None) -> Any:
    def build(shape: _Shape, path: tuple[int, ...]) -> Any:
      if isinstance(shape, tuple):
        return tuple(build(sub, path + (i,)) for i, sub in enumerate(shape))
      if shape.bytes <= 0:
        return None
      label = ins.name + ("{" + ",".join(map(str, path)) + "}" if path else "")
      buffers.append({"id": len(buffers), "name": label, "size": shape.bytes, "def": def_op,
                      "uses": [], "kind": kind})
      return len(buffers) - 1
    return build(ins.shape, ())

  def element(value: Any, index: int, ins: _Instr) -> Any:
    if not isinstance(value, tuple) or not 0 <= index < len(value):
      raise WorkloadError(f"{name}: line {ins.line}: '{ins.name}' takes element {index} of "
                          f"'{ins.operands[0]}', which is not a tuple with that many elements")
    return value[index]

  for ins in entry.instrs:
    op = ins.opcode
    arg = lambda k: values[ins.operands[k]]
    if op in _NON_OPS and op not in ("parameter", "constant", "tuple", "after-all") and (
        not ins.operands):
      raise WorkloadError(f"{name}: line {ins.line}: '{ins.name}' ({op}) needs an operand")
    if op == "parameter":
      values[ins.name] = new_buffers(ins, "parameter", None)
    elif op == "constant":
      size = sum(leaf.bytes for _, leaf in _leaves(ins.shape))
      values[ins.name] = (new_buffers(ins, "parameter", None) if size > SMALL_CONSTANT_BYTES
                          else None)
    elif op == "get-tuple-element":
      index = _int_list(_attr(ins.attrs, "index"))
      if not index:
        raise WorkloadError(f"{name}: line {ins.line}: get-tuple-element '{ins.name}' has no "
                            "index=")
      values[ins.name] = element(arg(0), index[0], ins)
    elif op in ("bitcast", "add-dependency", "opt-barrier", "domain"):
      values[ins.name] = arg(0)
    elif op == "tuple":
      values[ins.name] = tuple(arg(k) for k in range(len(ins.operands)))
    elif op == "copy-start":
      values[ins.name] = (arg(0), arg(0), None)
    elif op == "copy-done":
      values[ins.name] = element(arg(0), 0, ins)
    elif op == "after-all":
      values[ins.name] = None
    else:
      t = len(ops)
      ops.append({"name": ins.name, "flops": flops.instr(ins, entry)})
      for k in range(len(ins.operands)):
        for b in _flatten(arg(k)):
          if not buffers[b]["uses"] or buffers[b]["uses"][-1] != t:
            buffers[b]["uses"].append(t)
      values[ins.name] = new_buffers(ins, "activation", t)

  for b in _flatten(values[entry.root.name]):
    if buffers[b]["kind"] == "activation":
      buffers[b]["kind"] = "output"
  if not ops:
    raise WorkloadError(f"{name}: the ENTRY computation '{entry.name}' has no ops (it only "
                        "forwards its parameters or constants)")
  if not buffers:
    raise WorkloadError(f"{name}: the ENTRY computation '{entry.name}' has no non-empty buffers")
  return Workload.from_dict({"name": name, "source": source, "ops": ops, "buffers": buffers},
                            where=name)


def _flatten(value: Any) -> Iterator[int]:
  if value is None:
    return
  if isinstance(value, tuple):
    for v in value:
      yield from _flatten(v)
  else:
    yield value


# ----------------------------------------------------------------------------- jax


def workload_from_jax(fn: Callable[..., Any], *example_args: Any,
                      name: str) -> tuple[Workload, dict[str, int]]:
  """Compiles `fn` for CPU with `jax.jit(fn).lower(*args).compile()` and imports the result.

  `example_args` may be arrays or `jax.ShapeDtypeStruct`s. Returns the workload and XLA's own
  memory statistics from `compiled.memory_analysis()` (argument, output, temp, alias and
  generated-code bytes, plus `total_bytes = argument + output + temp - alias`), for comparison
  with `workload.peak_live_bytes`, and `xla_flops` from `compiled.cost_analysis()` (which
  counts a while body once); keys are missing where the backend reports nothing.
  """
  import jax  # Imported here: the rest of `env` does not need jax.

  # Abstract arguments: nothing is committed to (or copied onto) an accelerator, so the
  # default device below decides the backend.
  abstract = jax.tree_util.tree_map(
      lambda a: jax.ShapeDtypeStruct(a.shape, a.dtype)
      if hasattr(a, "shape") and hasattr(a, "dtype") else a, example_args)
  try:
    cpu = jax.devices("cpu")[0]
    with jax.default_device(cpu):
      compiled = jax.jit(fn).lower(*abstract).compile()
    text = compiled.as_text()
  except Exception as e:  # Tracing or compiling user code; report it on one line.
    first = (str(e).strip().splitlines() or [""])[0]
    raise WorkloadError(f"{name}: XLA could not compile the function: "
                        f"{type(e).__name__}: {first}") from None
  workload = workload_from_hlo_text(text, name, source=f"xla-hlo (jax {jax.__version__}, cpu)")
  stats: dict[str, int] = {}
  try:
    analysis = compiled.memory_analysis()
  except Exception:  # Optional: some backends have no memory analysis.
    analysis = None
  if analysis is not None:
    for key in ("argument_size_in_bytes", "output_size_in_bytes", "temp_size_in_bytes",
                "alias_size_in_bytes", "generated_code_size_in_bytes"):
      value = getattr(analysis, key, None)
      if value is not None:
        stats[key] = int(value)
    if {"argument_size_in_bytes", "output_size_in_bytes", "temp_size_in_bytes"} <= stats.keys():
      stats["total_bytes"] = (stats["argument_size_in_bytes"] + stats["output_size_in_bytes"]
                              + stats["temp_size_in_bytes"] - stats.get("alias_size_in_bytes", 0))
  try:
    cost = compiled.cost_analysis()
    cost = cost[0] if isinstance(cost, (list, tuple)) and cost else cost
    if isinstance(cost, dict) and "flops" in cost:
      stats["xla_flops"] = int(cost["flops"])
  except Exception:  # Optional: some backends have no cost analysis.
    pass
  return workload, stats
