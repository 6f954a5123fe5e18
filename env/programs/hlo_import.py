"""Import a program compiled by XLA: HLO text -> `Workload`.

The input is an HLO module as text: the post-optimisation module printed by
`jax.jit(f).lower(*args).compile().as_text()` or dumped by XLA on any backend
(`--xla_dump_to=DIR --xla_dump_hlo_as_text`, the `*after_optimizations.txt` file), or an
unoptimised module (TensorFlow, torch-xla, a `before_optimizations` dump), which is compiled
here first. Only the ENTRY computation becomes the schedule; called computations only
contribute flops and tell which bytes a fusion reads.

Conversion rules
----------------
Parsing
  XLA's own parser reads the text (`hlo_module_from_text` of the installed jaxlib), and its
  `HloModuleProto` gives exact shapes, operands, attributes and the schedule; the proto classes
  are built from the descriptors in TensorFlow's generated `hlo_pb2.py` / `xla_data_pb2.py`
  without importing TensorFlow. Where XLA's parser refuses the text (an old module with an
  attribute it no longer knows, ...), a hand-written parser reads it instead and a one-line note
  says so and why. XLA's parser gives duplicate instruction names a suffix (`.1`), which the
  fallback does not. XLA's parser takes the last computation as the entry when none is marked
  ENTRY (a note says so: the text may be truncated).

Schedule and compiling
  A module is scheduled when it says `is_scheduled=true` (the proto then holds a schedule for
  the ENTRY computation): its ops are taken in that order. An unscheduled module's print order
  is not a schedule and it has no fusion, so `import_hlo_text` (and `import-hlo`) compiles it
  with the installed XLA for the CPU first (HLO -> StableHLO -> the CPU client's compiler ->
  the optimised, scheduled module) and imports that, with a one-line note; `compile=False`
  (`--no-compile`) keeps the print order, with a note. A module XLA cannot compile on one CPU
  (collectives over several devices, another backend's custom calls) keeps its print order with
  a note, unless compiling was asked for explicitly (then it is an error).

Ops
  The ENTRY instructions in schedule order, except the ones that create no data of their own:
  `parameter`, `constant`, `get-tuple-element`, `bitcast`, `tuple`, `copy-start`,
  `copy-done`, `async-update`, `add-dependency`, `opt-barrier`, `domain` and `after-all`.
  Every other instruction (fusion, dot, convolution, custom-call, reduce, copy, while, call,
  conditional, the start and the done of each asynchronous operation, ...) is one op, named
  after the instruction.

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
    dynamic-(update-)slice, ...) and every collective (all-gather, all-reduce, reduce-scatter,
    all-to-all, collective-permute, send, recv, their -start/-done forms): 0. (XLA's cost
    analysis counts an all-reduce's additions; they are negligible next to the transfer.)
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
  * Asynchronous pairs alias as XLA aliases them. A start whose result is a tuple
    (`async-start` `((operands), results, context)`, `all-gather-start`,
    `collective-permute-start`, `all-to-all-start`, ...) aliases element {0} to its operands,
    defines element {1} (the results: new buffers, defined at the start) and ignores the
    context elements; `all-reduce-start` defines its whole result (a tuple of results when it
    reduces several operands). `send`
    aliases its data operand; `recv` defines element {0}. `async-update` passes the start
    through. The done (`*-done`, `send-done`, `recv-done`) defines nothing: its result is the
    start's results (`recv-done`: (data, token)). The done is a 0-flop op that uses the start's
    operands and results with 0 bytes (see Bytes), so that they stay live until the transfer
    ends, as in XLA, without being charged twice.
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

Bytes (what an op moves of each buffer: the workload's `use_bytes` / `def_bytes`)
  An op reads all of each operand and writes all of each result, except where XLA's
  HloCostAnalysis charges less:
  * `slice`, `dynamic-slice` and `gather` read their output's size of operand 0 (the rows
    fetched, not the table); their index operands are read whole.
  * `dynamic-update-slice` updates operand 0 in place: it reads 0 bytes of it and writes the
    update's size of its result; the update is read whole.
  * A fusion reads of an operand what its fused computation reads of that parameter: when
    every use of the parameter inside (following bitcasts) is operand 0 of a slice, dynamic
    slice or gather, the sum of their output sizes (an embedding lookup reads its rows); when
    they are all in-place updates of it, 0; as soon as any other use reads it, all of it
    (HloCostAnalysis::FusionParameterReadBytes, with gathers counted as XLA counts them
    unfused). A fusion whose root (or a root tuple's element) is a dynamic-update-slice
    writes the update's size of that result.
  * `pad` is charged whole, as XLA charges it (operand and result).
  * The done of an asynchronous pair moves 0 bytes (it only marks the end of the transfer).
  Reads of one buffer through several operands of one op add up, capped at its size. Live
  ranges do not depend on the bytes moved.

Warnings
  A module with custom calls of unknown cost or shapes that cannot be sized still imports,
  with one warning line per kind (a custom-call target; an unknown element type; an unbounded
  dynamic dimension), not per instruction: an unknown custom call counts 0 flops and is
  charged its operands and results whole; an unsizable shape gets no buffer.

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

from malloczero.common.errors import WorkloadError
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
                      "after-all", "async-update"})
# Collectives: they move data between devices, they compute nothing the workload counts.
_COLLECTIVES = frozenset({
    "all-gather", "all-gather-start", "all-gather-done", "all-reduce", "all-reduce-start",
    "all-reduce-done", "all-to-all", "all-to-all-start", "all-to-all-done", "reduce-scatter",
    "reduce-scatter-start", "reduce-scatter-done", "collective-permute",
    "collective-permute-start", "collective-permute-done", "collective-broadcast",
    "ragged-all-to-all", "send", "send-done", "recv", "recv-done"})
# Ops that only move data: 0 flops.
_DATA_MOVEMENT = _COLLECTIVES | frozenset({
    "parameter", "constant", "get-tuple-element", "bitcast", "tuple", "copy-start",
    "copy-done", "add-dependency", "opt-barrier", "domain", "after-all", "broadcast", "reshape",
    "dynamic-reshape", "transpose", "copy", "slice", "dynamic-slice", "dynamic-update-slice",
    "concatenate", "pad", "iota", "reverse", "gather", "bitcast-convert", "get-dimension-size",
    "set-dimension-size", "partition-id", "replica-id", "infeed", "outfeed", "async-done",
    "async-update", "rng-get-and-update-state"})
# Ops that read only an output-sized part of operand 0 (HloCostAnalysis::HandleSlice,
# HandleDynamicSlice, HandleGather).
_PARTIAL_READS = frozenset({"slice", "dynamic-slice", "gather"})


def _is_async_start(op: str) -> bool:
  return op in ("send", "recv") or (op.endswith("-start") and op != "copy-start")


def _is_async_done(op: str) -> bool:
  return op.endswith("-done") and op != "copy-done"


_IDENT = re.compile(r"[A-Za-z0-9_.\-]+")
_COMMENT = re.compile(r"/\*.*?\*/")
_HEADER = re.compile(r"^(ENTRY\s+)?%?([A-Za-z0-9_.\-]+)\s*\(.*\)\s*->\s*.*\{\s*$")
_INSTR_START = re.compile(r"^\s*(ROOT\s+)?%?([A-Za-z0-9_.\-]+)\s*=\s*")
_OPCODE = re.compile(r"\s*([a-z][a-z0-9\-_]*)\(")
_ARRAY = re.compile(r"([a-z][a-z0-9]*)\[([^\]]*)\]")


# ----------------------------------------------------------------------------- shapes


@dataclasses.dataclass(frozen=True)
class _Array:
  """An array shape. An element type the importer does not know, or an unbounded dynamic
  dimension (stored as -1), makes it unsizable: it then has no elements and no bytes."""
  dtype: str
  dims: tuple[int, ...]

  @property
  def sizable(self) -> bool:
    return self.dtype in _DTYPE_BITS and all(d >= 0 for d in self.dims)

  @property
  def elements(self) -> int:
    return math.prod(self.dims) if self.sizable else 0

  @property
  def bytes(self) -> int:
    return (self.elements * _DTYPE_BITS[self.dtype] + 7) // 8 if self.sizable else 0

  @property
  def why_unsizable(self) -> str:
    if self.dtype not in _DTYPE_BITS:
      return f"shapes of unknown element type '{self.dtype}'"
    return "shapes with an unbounded dynamic dimension"


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
  return sum(leaf.elements for _, leaf in _leaves(shape)
             if leaf.sizable and _DTYPE_BITS[leaf.dtype] > 0)


def _bytes(shape: _Shape) -> int:
  return sum(leaf.bytes for _, leaf in _leaves(shape))


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
  dtype = m.group(1)  # An unknown type parses; the shape is then unsizable (warned).
  dims = []
  for d in (x.strip() for x in m.group(2).split(",")):
    if not d:
      continue
    d = d[2:] if d.startswith("<=") else d
    if d == "?":
      dims.append(-1)
      continue
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
  line: int  # In the text; 0 when the instruction comes from XLA's parser.
  number: int = -1  # A parameter's number.

  @property
  def at(self) -> str:
    """Where the instruction is, for error messages."""
    return f"line {self.line}: " if self.line else ""


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
  number = int(inner) if opcode == "parameter" and inner.strip().isdigit() else -1
  return _Instr(m.group(2), shape, opcode, operands, line[close + 1:], bool(m.group(1)), lineno,
                number)


@dataclasses.dataclass
class _Module:
  comps: dict[str, _Computation]
  entry: _Computation  # Its instructions in schedule order (print order if unscheduled).
  scheduled: bool      # `is_scheduled=true` / a schedule for the ENTRY computation.
  parser: str          # "xla" (XLA's own parser) or "text" (the hand-written fallback).


_SCHEDULED = re.compile(r"^\s*HloModule\s+[^,\s]+.*\bis_scheduled=true\b")


def _check_text(text: Any, where: str) -> None:
  if not isinstance(text, str):
    raise WorkloadError(f"{where}: expected HLO text (a str), got {type(text).__name__}")
  if not text.strip():
    raise WorkloadError(f"{where}: empty HLO text")


def _parse_text(text: str, where: str) -> _Module:
  """The hand-written parser: for text XLA's own parser refuses (old modules)."""
  _check_text(text, where)
  comps: dict[str, _Computation] = {}
  current: _Computation | None = None
  scheduled = False
  for lineno, raw in enumerate(text.splitlines(), start=1):
    line = _COMMENT.sub("", raw).rstrip()
    stripped = line.strip()
    if current is None:
      if _SCHEDULED.match(line):
        scheduled = True
      m = _HEADER.match(stripped)
      if m:
        current = _Computation(m.group(2), bool(m.group(1)), [], lineno)
      # Anything else outside a computation (blank lines, stack-frame tables of newer
      # printers) carries nothing the workload needs.
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
  module = _Module(comps, entries[0], scheduled, "text")
  _check_operands(module, where)
  return module


def _check_operands(module: _Module, where: str) -> None:
  """Every operand is defined earlier in its computation (in the ENTRY's schedule order)."""
  for comp in module.comps.values():
    seen: set[str] = set()
    for ins in comp.instrs:
      for operand in ins.operands:
        if operand not in seen:
          later = "is defined after its use" if operand in comp.by_name else "is not defined"
          raise WorkloadError(f"{where}: {ins.at}instruction '{ins.name}' uses unknown "
                              f"operand '{operand}' (it {later} in computation '{comp.name}')")
      if ins.name in seen:
        raise WorkloadError(f"{where}: {ins.at}instruction '{ins.name}' is defined "
                            f"twice in computation '{comp.name}'")
      seen.add(ins.name)


# ----------------------------------------------------------------------------- XLA's parser

# xla::PrimitiveType numbers (xla_data.proto) -> the element type names of the text format.
# Numbers TensorFlow 2.8's copy of the proto does not know yet still arrive as plain ints.
_PRIMITIVE_TYPES = {
    1: "pred", 2: "s8", 3: "s16", 4: "s32", 5: "s64", 6: "u8", 7: "u16", 8: "u32", 9: "u64",
    10: "f16", 11: "f32", 12: "f64", 15: "c64", 16: "bf16", 18: "c128", 14: "opaque",
    17: "token", 19: "f8e5m2", 20: "f8e4m3fn", 21: "s4", 22: "u4", 23: "f8e4m3b11fnuz",
    24: "f8e5m2fnuz", 25: "f8e4m3fnuz", 26: "s2", 27: "u2", 28: "f8e4m3", 29: "f8e3m4",
    30: "s1", 31: "u1", 32: "f4e2m1fn", 33: "f8e8m0fnu"}
_TUPLE_TYPE = 13
_PB2_FILES = ("compiler/xla/xla_data_pb2.py", "compiler/xla/service/hlo_pb2.py")


@functools.lru_cache(maxsize=1)
def _hlo_module_proto() -> Any:
  """The `xla.HloModuleProto` message class of the installed TensorFlow's `hlo_pb2`, built in a
  private descriptor pool from the serialized descriptors in its two generated files.

  Importing `tensorflow.compiler.xla.service.hlo_pb2` runs `tensorflow/__init__.py`, which loads
  all of TensorFlow (about 1.8 s and 1,600 modules here); reading the two files takes about
  0.03 s and loads nothing of TensorFlow. Raises LookupError when they cannot be found."""
  import ast
  import importlib.util
  import os
  from google.protobuf import descriptor_pb2, descriptor_pool, message_factory

  spec = importlib.util.find_spec("tensorflow")  # Finds the package without importing it.
  if spec is None or not spec.origin:
    raise LookupError("TensorFlow (for hlo_pb2) is not installed")
  pool = descriptor_pool.DescriptorPool()
  for rel in _PB2_FILES:
    path = os.path.join(os.path.dirname(spec.origin), rel)
    try:
      with open(path, encoding="utf-8") as f:
        tree = ast.parse(f.read())
    except (OSError, SyntaxError, ValueError) as e:
      raise LookupError(f"cannot read TensorFlow's {rel}: {e}") from None
    found = [node.value for node in ast.walk(tree)
             if isinstance(node, ast.keyword) and node.arg == "serialized_pb"]
    if not found:
      raise LookupError(f"TensorFlow's {rel} has no serialized descriptor")
    value = found[0].args[0] if isinstance(found[0], ast.Call) and found[0].args else found[0]
    data = ast.literal_eval(value)
    data = data.encode("latin-1") if isinstance(data, str) else data  # `_b(...)` of py2/3 pb2.
    pool.Add(descriptor_pb2.FileDescriptorProto.FromString(data))
  return message_factory.MessageFactory(pool).GetPrototype(
      pool.FindMessageTypeByName("xla.HloModuleProto"))


def _parse_with_xla(text: str, where: str) -> _Module | str:
  """Parses with the installed XLA (`hlo_module_from_text`) and reads the `HloModuleProto` it
  serialises. Returns the module, or a one-line reason why XLA's parser could not be used."""
  try:
    from jaxlib import xla_client  # Lazy: `import malloczero` loads neither jaxlib nor TF.
    module = xla_client._xla.hlo_module_from_text(text)
    data = module.as_serialized_hlo_module_proto()
  except ImportError as e:
    return f"jaxlib is not usable ({e})"
  except Exception as e:  # XLA refuses the text: say why on one line.
    return _xla_reason(e)
  try:
    proto = _hlo_module_proto().FromString(data)
  except LookupError as e:
    return str(e)
  except Exception as e:  # A proto this TensorFlow cannot decode.
    return f"cannot decode XLA's HloModuleProto ({type(e).__name__})"
  return _module_from_proto(proto, where)


def _xla_reason(error: Exception) -> str:
  """XLA's error on one line: its first `error:` line (where XLA's parser says what it
  expected), else its first line."""
  lines = [ln.strip() for ln in str(error).splitlines() if ln.strip()]
  line = next((ln for ln in lines if " error: " in ln), lines[0] if lines else
              type(error).__name__)
  m = re.match(r"was parsing (\d+):(\d+): error: (.*)", line)
  if m:
    line = f"line {m.group(1)} column {m.group(2)}: {m.group(3)}"
  return line if len(line) <= 160 else line[:157] + "..."


def _proto_shape(shape: Any) -> _Shape:
  if shape.element_type == _TUPLE_TYPE:
    return tuple(_proto_shape(sub) for sub in shape.tuple_shapes)
  dtype = _PRIMITIVE_TYPES.get(shape.element_type, f"type#{shape.element_type}")
  # A bounded dynamic dimension holds its bound; an unbounded one is negative.
  return _Array(dtype, tuple(int(d) if d >= 0 else -1 for d in shape.dimensions))


def _proto_attrs(ins: Any, comp_names: dict[int, str]) -> str:
  """The attributes the flop counter and the converter read, spelled as the text format
  spells them, so that both parsers feed the same code."""
  parts = []
  called = ["%" + comp_names.get(c, f"computation#{c}") for c in ins.called_computation_ids]
  if ins.opcode == "while" and len(called) == 2:  # XLA keeps [body, condition].
    parts += [f"body={called[0]}", f"condition={called[1]}"]
  elif ins.opcode == "conditional":
    parts.append("branch_computations={" + ", ".join(called) + "}")
  elif called:
    parts.append("calls={" + ", ".join(called) + "}")
  if ins.opcode == "get-tuple-element":
    parts.append(f"index={ins.tuple_index}")
  if ins.HasField("dot_dimension_numbers"):
    dims = ins.dot_dimension_numbers.lhs_contracting_dimensions
    parts.append("lhs_contracting_dims={" + ",".join(map(str, dims)) + "}")
  if ins.HasField("window") and ins.window.dimensions:
    w = ins.window.dimensions
    field = lambda f: "x".join(str(f(d)) for d in w)
    parts.append("window={size=" + field(lambda d: d.size) + " stride=" + field(lambda d: d.stride)
                 + " pad=" + field(lambda d: f"{d.padding_low}_{d.padding_high}")
                 + " lhs_dilate=" + field(lambda d: d.base_dilation or 1)
                 + " rhs_dilate=" + field(lambda d: d.window_dilation or 1) + "}")
  if ins.HasField("convolution_dimension_numbers"):
    parts.append("dim_labels=" + _dim_labels(ins.convolution_dimension_numbers))
  if ins.custom_call_target:
    parts.append(f'custom_call_target="{ins.custom_call_target}"')
  if ins.backend_config:
    parts.append("backend_config=" + ins.backend_config.decode("utf-8", "replace"))
  return ", " + ", ".join(parts) if parts else ""


def _dim_labels(d: Any) -> str:
  """`dim_labels` (for example `b01f_01io->b01f`) of ConvolutionDimensionNumbers."""
  def labels(named: dict[int, str], spatial: Any) -> str:
    out = dict(named)
    out.update({dim: str(i) for i, dim in enumerate(spatial)})
    return "".join(out.get(i, "?") for i in range(len(out)))
  return (labels({d.input_batch_dimension: "b", d.input_feature_dimension: "f"},
                 d.input_spatial_dimensions) + "_"
          + labels({d.kernel_input_feature_dimension: "i", d.kernel_output_feature_dimension: "o"},
                   d.kernel_spatial_dimensions) + "->"
          + labels({d.output_batch_dimension: "b", d.output_feature_dimension: "f"},
                   d.output_spatial_dimensions))


def _module_from_proto(proto: Any, where: str) -> _Module:
  comp_names = {c.id: c.name for c in proto.computations}
  comps: dict[str, _Computation] = {}
  entry = None
  for c in proto.computations:
    by_id = {i.id: i for i in c.instructions}
    order = list(c.instructions)
    is_entry = c.id == proto.entry_computation_id
    scheduled = is_entry and c.id in proto.schedule.sequences
    if scheduled:
      ids = proto.schedule.sequences[c.id].instruction_ids
      if sorted(ids) != sorted(by_id):
        raise WorkloadError(f"{where}: the schedule of '{c.name}' does not list each of its "
                            "instructions once")
      order = [by_id[i] for i in ids]
    instrs = []
    for i in order:
      missing = [o for o in i.operand_ids if o not in by_id]
      if missing:
        raise WorkloadError(f"{where}: instruction '{i.name}' uses an operand that is not in "
                            f"computation '{c.name}'")
      instrs.append(_Instr(i.name, _proto_shape(i.shape), i.opcode,
                           [by_id[o].name for o in i.operand_ids], _proto_attrs(i, comp_names),
                           i.id == c.root_id, 0, int(i.parameter_number)))
    comps[c.name] = _Computation(c.name, is_entry, instrs, 0)
    if is_entry:
      entry = (comps[c.name], scheduled)
  if entry is None:
    raise WorkloadError(f"{where}: XLA's module has no ENTRY computation")
  module = _Module(comps, entry[0], entry[1], "xla")
  _check_operands(module, where)
  return module


def _parse(text: str, where: str, notes: "_Notes", use_xla: bool = True) -> _Module:
  """XLA's own parser when it accepts the text, else the hand-written one (with a note)."""
  _check_text(text, where)
  reason = _parse_with_xla(text, where) if use_xla else "not asked for"
  if isinstance(reason, _Module):
    if not re.search(r"^\s*ENTRY\b", text, re.M):
      notes.note(f"no computation is marked ENTRY: XLA takes the last one, "
                 f"'{reason.entry.name}', as the program (is the text truncated?)")
    return reason
  module = _parse_text(text, where)
  notes.note(f"XLA's parser refused the module ({reason}); read it with the hand-written "
             "parser, which reads shapes, operands and the attributes used here the same way "
             "but checks less")
  return module


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
  def __init__(self, comps: dict[str, _Computation], where: str, notes: "_Notes"):
    self.comps, self.where, self.notes = comps, where, notes
    self.memo: dict[str, float] = {}
    self.active: set[str] = set()

  def computation(self, name: str, user: _Instr) -> float:
    if name not in self.comps:
      raise WorkloadError(f"{self.where}: {user.at}instruction '{user.name}' calls "
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
      if op in _DATA_MOVEMENT:  # Before `calls`: an all-reduce calls its reducer.
        return 0.0
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
        flops = _custom_call_flops(ins, [operand(k) for k in range(len(ins.operands))])
        if flops == 0.0:
          target = _attr(attrs, "custom_call_target") or "?"
          self.notes.warn(f"custom-call '{target}'", ins.name,
                          "its cost is unknown: 0 flops, and its operands and results are "
                          "charged whole")
        return flops
      if op == "reduce":
        n = max(1, len(ins.operands) // 2)
        return float(sum(_elements(operand(k)) for k in range(n)))
      if op == "reduce-window":
        window = _window_size(attrs)
        return float(out_elems * math.prod(window))
      if op == "select-and-scatter":
        return float(_elements(operand(0)) * math.prod(_window_size(attrs)))
      return float(out_elems)
    except WorkloadError:
      raise
    except (IndexError, AttributeError, KeyError, TypeError, ValueError, ZeroDivisionError) as e:
      raise WorkloadError(f"{self.where}: {ins.at}cannot count the flops of "
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


class _Notes:
  """One-line notes for the user: what was done, and one warning per kind of approximation
  (not per instruction)."""

  def __init__(self) -> None:
    self.lines: list[str] = []
    self.kinds: dict[str, tuple[set[str], str]] = {}

  def note(self, line: str) -> None:
    self.lines.append(line)

  def warn(self, kind: str, instruction: str, what: str) -> None:
    self.kinds.setdefault(kind, (set(), what))[0].add(instruction)

  def all(self) -> list[str]:
    warnings = []
    for kind, (instructions, what) in self.kinds.items():
      count = len(instructions)
      warnings.append(f"warning: {kind} ({count} instruction{'s' if count != 1 else ''}, e.g. "
                      f"'{min(instructions)}'): {what}")
    return self.lines + warnings


@dataclasses.dataclass(frozen=True)
class HloImport:
  """What `import_hlo_text` made of a module: the workload, whether the input module was
  scheduled and whether it was compiled here first, and one-line notes for the user (which parser read
  it, what compiling did, one warning per kind of approximation)."""
  workload: Workload
  scheduled: bool
  compiled: bool
  notes: tuple[str, ...]


def import_hlo_text(text: str, name: str, source: str = "xla-hlo",
                    compile: bool | None = None) -> HloImport:
  """Converts HLO text to a `Workload`, compiling it on the CPU first when it is not scheduled.

  `compile=None` compiles an unscheduled module (its print order is not a schedule, and it has
  no fusion) and keeps a scheduled one as it is; if XLA cannot compile it (a collective over
  many devices, another backend's custom call), the print order is kept with a note.
  `compile=True` insists (a failure is a `WorkloadError`), `compile=False` never compiles. The
  conversion rules are in this module's docstring.
  """
  notes = _Notes()
  _check_text(text, name)
  module = _parse(text, name, notes)
  compiled, was_scheduled = False, module.scheduled
  if compile or (compile is None and not was_scheduled):
    before = len(_ops_of(module))
    try:
      optimised, seconds = compile_hlo_on_cpu(text, name)
    except WorkloadError as e:
      if compile:
        raise
      notes.note(f"the module is not scheduled and XLA could not compile it on the CPU "
                 f"({getattr(e, 'reason', e)}); kept its print order as the schedule, without "
                 "XLA's fusion")
    else:
      module, compiled = _parse(optimised, name, notes), True
      what = ("was scheduled; compiled it again" if was_scheduled else
              "was not scheduled: compiled it")
      notes.note(f"the module {what} with XLA on the CPU in {seconds:.1f} s ({before} ops "
                 f"before, {len(_ops_of(module))} after fusion and scheduling)"
                 + ("" if was_scheduled else "; --no-compile keeps the print order"))
  elif not was_scheduled:
    notes.note("the module is not scheduled: its print order is taken as the schedule and "
               "nothing is fused (--compile lets XLA optimise and schedule it first)")
  if compiled:
    source += ", compiled with XLA on the CPU"
  workload = _convert(module, name, source, notes)
  return HloImport(workload, was_scheduled, compiled, tuple(notes.all()))


def workload_from_hlo_text(text: str, name: str, source: str = "xla-hlo") -> Workload:
  """Converts HLO text, as it is (no compiling), to a `Workload`; `import_hlo_text` also
  compiles unscheduled modules and returns the notes. The rules (which instructions are ops,
  how flops and bytes are counted, which buffers exist and what aliases what) are in this
  module's docstring. Malformed text raises a one-line `WorkloadError`.
  """
  notes = _Notes()
  return _convert(_parse(text, name, notes), name, source, notes)


def _ops_of(module: _Module) -> list[_Instr]:
  return [ins for ins in module.entry.instrs if ins.opcode not in _NON_OPS]


def compile_hlo_on_cpu(text: str, name: str) -> tuple[str, float]:
  """Optimises and schedules HLO text with the installed XLA for the CPU (HLO -> StableHLO ->
  the CPU client's compiler) and returns the optimised module's text and the seconds it took.

  This is what `jax.jit(f).lower(...).compile()` does to a JAX program, applied to a module
  from elsewhere (TensorFlow, torch-xla, an unoptimised dump). Raises a one-line `WorkloadError`
  (its `reason` attribute without the module's name) when XLA cannot."""
  import time
  start = time.perf_counter()
  try:
    import jax  # Lazy, as the rest of this module: only compiling needs JAX.
    from jaxlib import xla_client
    module = xla_client._xla.hlo_module_from_text(text)
    mlir = xla_client._xla.mlir.hlo_to_stablehlo(module.as_serialized_hlo_module_proto())
    cpu = jax.devices("cpu")[0]
    executable = cpu.client.compile_and_load(mlir, xla_client.DeviceList((cpu,)),
                                             xla_client.CompileOptions())
    optimised = executable.hlo_modules()[0].to_string()
  except Exception as e:  # XLA's parser, converter or compiler refused: one line.
    reason = _xla_reason(e)
    error = WorkloadError(f"{name}: XLA could not compile the module on the CPU: {reason}")
    error.reason = reason
    raise error from None
  return optimised, time.perf_counter() - start


def _convert(module: _Module, name: str, source: str, notes: _Notes) -> Workload:
  comps, entry = module.comps, module.entry
  flops = _FlopCounter(comps, name, notes)
  ops: list[dict[str, Any]] = []
  buffers: list[dict[str, Any]] = []
  moved: list[dict[int, int]] = []  # Per buffer: op -> bytes it reads (uses) of the buffer.
  values: dict[str, Any] = {}  # instruction -> value tree: a buffer index, None, or a tuple.
  pending: dict[str, tuple[list[Any], Any]] = {}  # async start -> (operand values, its value)

  def new_buffers(ins: _Instr, kind: str, def_op: int | None, shape: _Shape | None = None,
                  written: Any = None, index: tuple[int, ...] = ()) -> Any:
    """Buffers for the leaves of `shape` (the instruction's own by default), which sits at
    `index` of the instruction's result; `written` is what `_result_bytes` says."""
    def build(shape: _Shape, path: tuple[int, ...], written: Any) -> Any:
      if isinstance(shape, tuple):
        return tuple(build(sub, path + (i,), written[i] if isinstance(written, tuple) else None)
                     for i, sub in enumerate(shape))
      if not shape.sizable:
        notes.warn(shape.why_unsizable, ins.name,
                   "they cannot be sized, so no buffer is made for them")
        return None
      if shape.bytes <= 0:
        return None
      label = ins.name + ("{" + ",".join(map(str, path)) + "}" if path else "")
      entry = {"id": len(buffers), "name": label, "size": shape.bytes, "def": def_op,
               "uses": [], "kind": kind}
      if isinstance(written, int) and def_op is not None:
        entry["def_bytes"] = min(written, shape.bytes)
      buffers.append(entry)
      moved.append({})
      return len(buffers) - 1
    return build(ins.shape if shape is None else shape, index, written)

  def element(value: Any, index: int, ins: _Instr) -> Any:
    if not isinstance(value, tuple) or not 0 <= index < len(value):
      raise WorkloadError(f"{name}: {ins.at}'{ins.name}' takes element {index} of "
                          f"'{ins.operands[0]}', which is not a tuple with that many elements")
    return value[index]

  def use(value: Any, t: int, nbytes: int | None) -> None:
    """Op t reads `nbytes` of the buffer `value` (None: all of it; of a tuple, all of each
    leaf, or nothing of any when `nbytes` is 0)."""
    leaves = list(_flatten(value))
    for b in leaves:
      size = buffers[b]["size"]
      part = size if nbytes is None or (len(leaves) != 1 and nbytes != 0) else nbytes
      moved[b][t] = min(size, moved[b].get(t, 0) + part)

  def begin_op(ins: _Instr) -> int:
    ops.append({"name": ins.name, "flops": flops.instr(ins, entry)})
    return len(ops) - 1

  for ins in entry.instrs:
    op = ins.opcode
    arg = lambda k: values[ins.operands[k]]
    if op in _NON_OPS and op not in ("parameter", "constant", "tuple", "after-all") and (
        not ins.operands):
      raise WorkloadError(f"{name}: {ins.at}'{ins.name}' ({op}) needs an operand")
    if op == "parameter":
      values[ins.name] = new_buffers(ins, "parameter", None)
    elif op == "constant":
      size = _bytes(ins.shape)
      values[ins.name] = (new_buffers(ins, "parameter", None) if size > SMALL_CONSTANT_BYTES
                          else None)
    elif op == "get-tuple-element":
      index = _int_list(_attr(ins.attrs, "index"))
      if not index:
        raise WorkloadError(f"{name}: {ins.at}get-tuple-element '{ins.name}' has no index=")
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
    elif op == "async-update":
      values[ins.name] = arg(0)
      if ins.operands[0] in pending:
        pending[ins.name] = pending[ins.operands[0]]
    elif _is_async_done(op) and ins.operands and ins.operands[0] in pending:
      # The done defines nothing: its result is what the start defined, and it keeps the
      # start's operands and results live up to here without moving any data.
      operands, results = pending[ins.operands[0]]
      t = begin_op(ins)
      for v in operands + [results]:
        use(v, t, 0)
      values[ins.name] = (results, None) if op == "recv-done" else results
    elif _is_async_start(op):
      t = begin_op(ins)
      operands = [arg(k) for k in range(len(ins.operands))]
      for v in operands:
        use(v, t, None)
      shape = ins.shape
      context = lambda: (None,) * (len(shape) - 2)
      if op == "send":  # (data, context, token): the data stays the operand's buffer.
        results, value = None, (operands[0] if operands else None,) + (None,) * (
            len(shape) - 1 if isinstance(shape, tuple) else 0)
      elif op == "recv" and isinstance(shape, tuple) and shape:  # (data, context, token)
        results = new_buffers(ins, "activation", t, shape[0], index=(0,))
        value = (results,) + (None,) * (len(shape) - 1)
      elif isinstance(shape, tuple) and len(shape) >= 2 and op != "all-reduce-start":
        # ((operands), results, context...): {0} aliases the operands, {1} is new.
        aliased = operands[0] if len(operands) == 1 and not isinstance(shape[0], tuple) else (
            tuple(operands))
        results = new_buffers(ins, "activation", t, shape[1], index=(1,))
        value = (aliased, results) + context()
      else:  # all-reduce-start (a variadic one returns a tuple of results): all of it is new.
        results = value = new_buffers(ins, "activation", t)
      values[ins.name] = value
      pending[ins.name] = (operands, results)
    else:
      t = begin_op(ins)
      for k in range(len(ins.operands)):
        use(arg(k), t, _operand_bytes(ins, k, comps))
      values[ins.name] = new_buffers(ins, "activation", t, written=_result_bytes(ins, comps,
                                                                                  entry))

  for b in _flatten(values[entry.root.name]):
    if buffers[b]["kind"] == "activation":
      buffers[b]["kind"] = "output"
  for b, reads in zip(buffers, moved):
    b["uses"] = sorted(reads)
    if any(reads[t] != b["size"] for t in reads):
      b["use_bytes"] = [reads[t] for t in b["uses"]]
  if not ops:
    raise WorkloadError(f"{name}: the ENTRY computation '{entry.name}' has no ops (it only "
                        "forwards its parameters or constants)")
  if not buffers:
    raise WorkloadError(f"{name}: the ENTRY computation '{entry.name}' has no non-empty buffers")
  return Workload.from_dict({"name": name, "source": source, "ops": ops, "buffers": buffers},
                            where=name)


def _operand_bytes(ins: _Instr, k: int, comps: dict[str, _Computation]) -> int | None:
  """Bytes op `ins` reads of its operand k when XLA's cost analysis charges less than all of
  it; None for all of it."""
  op = ins.opcode
  if op in _PARTIAL_READS and k == 0:
    return _bytes(ins.shape)
  if op == "dynamic-update-slice" and k == 0:
    return 0  # Updated in place: the operand's untouched part is neither read nor written.
  if op in ("fusion", "call"):
    return _called_parameter_bytes(ins, k, comps, 0)
  return None


def _called_parameter_bytes(ins: _Instr, k: int, comps: dict[str, _Computation],
                            depth: int) -> int | None:
  """Bytes a fusion or call reads of its operand k: what its computation reads of
  `parameter(k)` (the CPU backend wraps fusions in calls, so both are followed)."""
  called = _fused_computation(ins, comps)
  param = _fused_parameter(called, k) if called else None
  if param is None or not isinstance(param.shape, _Array) or depth > 8:
    return None
  return _fused_parameter_bytes(called, param.name, comps, depth + 1)


def _fused_computation(ins: _Instr, comps: dict[str, _Computation]) -> _Computation | None:
  called = _comp_names(_attr(ins.attrs, "calls") or _attr(ins.attrs, "to_apply"))
  return comps.get(called[0]) if called else None


def _fused_parameter(fused: _Computation, k: int) -> _Instr | None:
  """The fused computation's `parameter(k)`."""
  for ins in fused.instrs:
    if ins.opcode == "parameter" and ins.number == k:
      return ins
  return None


def _fused_parameter_bytes(fused: _Computation, name: str, comps: dict[str, _Computation],
                           depth: int) -> int | None:
  """Bytes a fusion reads of the operand bound to fused instruction `name`, when every use of
  it inside the fusion reads only part of it (slices, dynamic slices and gathers read their
  output's size of operand 0, an in-place dynamic-update-slice nothing of operand 0; bitcasts
  and nested fusions and calls are followed); None (all of it) as soon as one use reads it
  otherwise. This is HloCostAnalysis::FusionParameterReadBytes with gathers counted as it
  counts them unfused."""
  total = 0
  for user in fused.instrs:
    for k, operand in enumerate(user.operands):
      if operand != name:
        continue
      if user.opcode in ("bitcast", "fusion", "call"):
        sub = (_fused_parameter_bytes(fused, user.name, comps, depth) if user.opcode == "bitcast"
               else _called_parameter_bytes(user, k, comps, depth))
        if sub is None:
          return None
        total += sub
      elif user.opcode in _PARTIAL_READS and k == 0:
        total += _bytes(user.shape)
      elif user.opcode == "dynamic-update-slice" and k == 0:
        pass
      else:
        return None
  return total


def _result_bytes(ins: _Instr, comps: dict[str, _Computation], entry: _Computation) -> Any:
  """Bytes an op writes of its result when XLA charges less than all of it (a value tree
  shaped like the result, None for all of it): a dynamic-update-slice, or a fusion whose root
  (or a root tuple's element) is one, writes only the update in place."""
  def update_bytes(dus: _Instr, comp: _Computation) -> int | None:
    return _bytes(comp.by_name[dus.operands[1]].shape) if len(dus.operands) > 1 else None
  if ins.opcode == "dynamic-update-slice":
    return update_bytes(ins, entry)
  if ins.opcode != "fusion":
    return None
  fused = _fused_computation(ins, comps)
  if fused is None:
    return None
  root = fused.root
  if root.opcode == "dynamic-update-slice":
    return update_bytes(root, fused)
  if root.opcode == "tuple":
    return tuple(update_bytes(fused.by_name[o], fused)
                 if fused.by_name[o].opcode == "dynamic-update-slice" else None
                 for o in root.operands)
  return None


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
