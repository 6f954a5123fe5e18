"""The HLO reader that uses XLA's own parser: text -> `HloModuleProto` -> `hlo.Module`.

The installed jaxlib's `hlo_module_from_text` parses the text and serialises the module, in a
child process kept for the next parses: a malformed module can fail a CHECK in XLA's parser,
which aborts the process it runs in, and here that is a refusal (the hand-written parser reads
the text instead). The proto classes that decode the module are built from the descriptors in
TensorFlow's generated `hlo_pb2.py` / `xla_data_pb2.py` without importing TensorFlow. The proto
gives exact shapes, operands, attributes and each computation's schedule; the attributes
the importer reads are spelled back as the text format spells them, so that both parsers feed
the same code.
"""

from __future__ import annotations

import atexit
import functools
import os
import re
import signal
import struct
import subprocess
import sys
import tempfile
import threading
from typing import Any

from malloczero.common.errors import WorkloadError
from malloczero.env.programs.hlo_import.hlo import (
  Array,
  Computation,
  Instr,
  Module,
  Shape,
  check_operands,
)

# xla::PrimitiveType numbers (xla_data.proto) -> the element type names of the text format.
# Numbers TensorFlow 2.8's copy of the proto does not know yet still arrive as plain ints.
_PRIMITIVE_TYPES = {
  1: "pred",
  2: "s8",
  3: "s16",
  4: "s32",
  5: "s64",
  6: "u8",
  7: "u16",
  8: "u32",
  9: "u64",
  10: "f16",
  11: "f32",
  12: "f64",
  15: "c64",
  16: "bf16",
  18: "c128",
  14: "opaque",
  17: "token",
  19: "f8e5m2",
  20: "f8e4m3fn",
  21: "s4",
  22: "u4",
  23: "f8e4m3b11fnuz",
  24: "f8e5m2fnuz",
  25: "f8e4m3fnuz",
  26: "s2",
  27: "u2",
  28: "f8e4m3",
  29: "f8e3m4",
  30: "s1",
  31: "u1",
  32: "f4e2m1fn",
  33: "f8e8m0fnu",
}
_TUPLE_TYPE = 13
_PB2_FILES = ("compiler/xla/xla_data_pb2.py", "compiler/xla/service/hlo_pb2.py")


@functools.lru_cache(maxsize=1)
def hlo_module_proto() -> Any:
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
    found = [
      node.value
      for node in ast.walk(tree)
      if isinstance(node, ast.keyword) and node.arg == "serialized_pb"
    ]
    if not found:
      raise LookupError(f"TensorFlow's {rel} has no serialized descriptor")
    value = found[0].args[0] if isinstance(found[0], ast.Call) and found[0].args else found[0]
    data = ast.literal_eval(value)
    data = data.encode("latin-1") if isinstance(data, str) else data  # `_b(...)` of py2/3 pb2.
    pool.Add(descriptor_pb2.FileDescriptorProto.FromString(data))
  return message_factory.MessageFactory(pool).GetPrototype(
    pool.FindMessageTypeByName("xla.HloModuleProto")
  )


# XLA's parser runs in a child process: some malformed modules fail one of its CHECKs (an
# instruction `tuple(...)` given an array shape, ...), which aborts the process it runs in. The
# child reads `[length: 8 bytes][text]` requests on stdin and answers each with
# `[kind: 1 byte][length: 8 bytes][payload]`: `M` and the serialised `HloModuleProto`, `E` and
# XLA's error, or `I` and why jaxlib cannot be imported. It imports jaxlib only, not this package.
_PARSER_PROCESS_CODE = r"""
import struct, sys
read, write = sys.stdin.buffer.read, sys.stdout.buffer
try:
  from jaxlib import xla_client
except ImportError as e:
  xla_client, missing = None, str(e).encode()
while True:
  header = read(8)
  if len(header) < 8:
    break
  text = read(struct.unpack("<Q", header)[0]).decode("utf-8", "replace")
  if xla_client is None:
    kind, payload = b"I", missing
  else:
    try:
      kind = b"M"
      payload = xla_client._xla.hlo_module_from_text(text).as_serialized_hlo_module_proto()
    except Exception as e:
      kind, payload = b"E", str(e).encode("utf-8", "replace")
  write.write(kind + struct.pack("<Q", len(payload)) + payload)
  write.flush()
"""


class _ParserProcess:
  """The child process that runs XLA's parser, started at the first parse and kept for the next
  ones (starting it costs about 0.3 s; a parse in it, milliseconds). One that crashed is
  replaced at the next parse; it exits when this process closes its stdin (at exit)."""

  def __init__(self) -> None:
    self._lock = threading.Lock()
    self._process: subprocess.Popen | None = None
    self._stderr: Any = None
    self._owner = 0

  def parse(self, data: bytes) -> tuple[str, bytes]:
    """(kind, payload) as the child answered for the UTF-8 text `data`, or ("C", why it died)
    when it crashed."""
    with self._lock:
      if self._process is None or self._owner != os.getpid():  # A forked copy starts its own.
        self._stderr = tempfile.TemporaryFile()
        self._process = subprocess.Popen(
          [sys.executable, "-c", _PARSER_PROCESS_CODE],
          stdin=subprocess.PIPE,
          stdout=subprocess.PIPE,
          stderr=self._stderr,
        )
        if not self._owner:
          atexit.register(self.close)
        self._owner = os.getpid()
      process = self._process
      try:
        process.stdin.write(struct.pack("<Q", len(data)) + data)
        process.stdin.flush()
        header = process.stdout.read(9)
        if len(header) == 9:
          return header[:1].decode(), process.stdout.read(struct.unpack("<Q", header[1:])[0])
      except BrokenPipeError:
        pass
      self._process = None
      return "C", self._crash_reason(process).encode()

  def close(self) -> None:
    """Ends the child (it exits when its stdin closes) and closes its pipes and log."""
    with self._lock:
      if self._process is not None and self._owner == os.getpid():
        self._end(self._process)
      self._process = None

  def _end(self, process: subprocess.Popen) -> tuple[int, str]:
    """The child's exit status and what it logged, once it has ended."""
    for pipe in (process.stdin, process.stdout):
      try:
        pipe.close()
      except OSError:  # The child is gone and its pipe could not flush: nothing to keep.
        pass
    try:
      status = process.wait(timeout=10)
    except subprocess.TimeoutExpired:
      process.kill()
      status = process.wait()
    self._stderr.seek(0)
    log = self._stderr.read().decode("utf-8", "replace")
    self._stderr.close()
    return status, log

  def _crash_reason(self, process: subprocess.Popen) -> str:
    """Why the child died: XLA's failed CHECK (its message, as XLA logged it) and the signal."""
    status, log = self._end(process)
    lines = log.splitlines()
    check = next((ln for ln in lines if "Check failed" in ln), "")
    # Without XLA's log prefix (`F1129 04:45:18.115559   27371 shape.cc:184] `).
    check = re.sub(r"^.*?\] ", "", check).strip()
    how = f"signal {signal.Signals(-status).name}" if status < 0 else f"exit status {status}"
    return f"XLA's parser crashed ({how}){': ' + check if check else ''}"


_PARSER = _ParserProcess()


@functools.lru_cache(maxsize=4)
def serialized_module(text: str) -> bytes | str:
  """The `HloModuleProto` XLA's parser makes of `text`, serialised, or a one-line reason why
  there is none (XLA refused the text, its parser crashed, jaxlib is not usable). Kept for the
  last few texts: importing an unscheduled module parses it again to compile it."""
  try:
    data = text.encode("utf-8")
  except UnicodeEncodeError as e:  # A lone surrogate, which XLA's parser cannot take either.
    return f"the text is not valid Unicode ({e.reason} at character {e.start})"
  kind, payload = _PARSER.parse(data)
  if kind == "M":
    return payload
  message = payload.decode("utf-8", "replace")
  if kind == "I":
    return f"jaxlib is not usable ({message})"
  return xla_reason(message)  # XLA's error, or why its parser crashed.


def parse_with_xla(text: str, where: str) -> Module | str:
  """Parses with the installed XLA (`hlo_module_from_text`, in a child process) and reads the
  `HloModuleProto` it serialises. Returns the module, or a one-line reason why XLA's parser could
  not be used."""
  data = serialized_module(text)
  if isinstance(data, str):
    return data
  try:
    proto = hlo_module_proto().FromString(data)
  except LookupError as e:
    return str(e)
  except Exception as e:  # A proto this TensorFlow cannot decode.
    return f"cannot decode XLA's HloModuleProto ({type(e).__name__})"
  return _module_from_proto(proto, where)


def xla_reason(error: Exception | str) -> str:
  """XLA's error (an exception or its message) on one line: its first `error:` line (where
  XLA's parser says what it expected), else its first line."""
  lines = [ln.strip() for ln in str(error).splitlines() if ln.strip()]
  fallback = lines[0] if lines else (type(error).__name__ if isinstance(error, Exception) else "")
  line = next((ln for ln in lines if " error: " in ln), fallback or "no reason given")
  m = re.match(r"was parsing (\d+):(\d+): error: (.*)", line)
  if m:
    line = f"line {m.group(1)} column {m.group(2)}: {m.group(3)}"
  return line if len(line) <= 160 else line[:157] + "..."


def _proto_shape(shape: Any) -> Shape:
  if shape.element_type == _TUPLE_TYPE:
    return tuple(_proto_shape(sub) for sub in shape.tuple_shapes)
  dtype = _PRIMITIVE_TYPES.get(shape.element_type, f"type#{shape.element_type}")
  # A bounded dynamic dimension holds its bound; an unbounded one is negative.
  return Array(dtype, tuple(int(d) if d >= 0 else -1 for d in shape.dimensions))


# The opcodes whose attributes the flop counter reads beyond called computations: the rest are
# not spelled out (reading a proto field costs more than the rest of an instruction's import).
_WINDOWED = frozenset({"convolution", "reduce-window", "select-and-scatter", "custom-call"})


def _proto_attrs(ins: Any, comp_names: dict[int, str]) -> str:
  """The attributes the flop counter and the converter read, spelled as the text format
  spells them, so that both parsers feed the same code: called computations, a
  get-tuple-element's index, a dot's contracting dimensions, a window and convolution
  dimensions, a custom call's target and a while loop's backend config (its trip count)."""
  parts = []
  opcode = ins.opcode
  if ins.called_computation_ids:
    called = ["%" + comp_names.get(c, f"computation#{c}") for c in ins.called_computation_ids]
    if opcode == "while" and len(called) == 2:  # XLA keeps [body, condition].
      parts += [f"body={called[0]}", f"condition={called[1]}"]
    elif opcode == "conditional":
      parts.append("branch_computations={" + ", ".join(called) + "}")
    else:
      parts.append("calls={" + ", ".join(called) + "}")
  if opcode == "get-tuple-element":
    parts.append(f"index={ins.tuple_index}")
  elif opcode == "dot":
    dims = ins.dot_dimension_numbers.lhs_contracting_dimensions
    parts.append("lhs_contracting_dims={" + ",".join(map(str, dims)) + "}")
  elif opcode in _WINDOWED:
    parts += _window_attrs(ins)
  elif opcode == "while" and ins.backend_config:
    parts.append("backend_config=" + ins.backend_config.decode("utf-8", "replace"))
  return ", " + ", ".join(parts) if parts else ""


def _window_attrs(ins: Any) -> list[str]:
  """`window=`, `dim_labels=` and `custom_call_target=` of a windowed op or custom call."""
  parts = []
  if ins.HasField("window") and ins.window.dimensions:
    w = ins.window.dimensions
    field = lambda f: "x".join(str(f(d)) for d in w)
    parts.append(
      "window={size="
      + field(lambda d: d.size)
      + " stride="
      + field(lambda d: d.stride)
      + " pad="
      + field(lambda d: f"{d.padding_low}_{d.padding_high}")
      + " lhs_dilate="
      + field(lambda d: d.base_dilation or 1)
      + " rhs_dilate="
      + field(lambda d: d.window_dilation or 1)
      + "}"
    )
  if ins.HasField("convolution_dimension_numbers"):
    parts.append("dim_labels=" + _dim_labels(ins.convolution_dimension_numbers))
  if ins.custom_call_target:
    parts.append(f'custom_call_target="{ins.custom_call_target}"')
  return parts


def _dim_labels(d: Any) -> str:
  """`dim_labels` (for example `b01f_01io->b01f`) of ConvolutionDimensionNumbers."""

  def labels(named: dict[int, str], spatial: Any) -> str:
    out = dict(named)
    out.update({dim: str(i) for i, dim in enumerate(spatial)})
    return "".join(out.get(i, "?") for i in range(len(out)))

  return (
    labels(
      {d.input_batch_dimension: "b", d.input_feature_dimension: "f"}, d.input_spatial_dimensions
    )
    + "_"
    + labels(
      {d.kernel_input_feature_dimension: "i", d.kernel_output_feature_dimension: "o"},
      d.kernel_spatial_dimensions,
    )
    + "->"
    + labels(
      {d.output_batch_dimension: "b", d.output_feature_dimension: "f"}, d.output_spatial_dimensions
    )
  )


def _module_from_proto(proto: Any, where: str) -> Module:
  comp_names = {c.id: c.name for c in proto.computations}
  comps: dict[str, Computation] = {}
  entry = None
  for c in proto.computations:
    by_id = {i.id: i for i in c.instructions}
    order = list(c.instructions)
    is_entry = c.id == proto.entry_computation_id
    scheduled = c.id in proto.schedule.sequences
    if scheduled:
      ids = proto.schedule.sequences[c.id].instruction_ids
      if sorted(ids) != sorted(by_id):
        raise WorkloadError(
          f"{where}: the schedule of '{c.name}' does not list each of its instructions once"
        )
      order = [by_id[i] for i in ids]
    instrs = []
    for i in order:
      missing = [o for o in i.operand_ids if o not in by_id]
      if missing:
        raise WorkloadError(
          f"{where}: instruction '{i.name}' uses an operand that is not in computation '{c.name}'"
        )
      instrs.append(
        Instr(
          i.name,
          _proto_shape(i.shape),
          i.opcode,
          [by_id[o].name for o in i.operand_ids],
          _proto_attrs(i, comp_names),
          i.id == c.root_id,
          0,
          int(i.parameter_number),
        )
      )
    comps[c.name] = Computation(c.name, is_entry, instrs, 0, scheduled)
    if is_entry:
      entry = (comps[c.name], scheduled)
  if entry is None:
    raise WorkloadError(f"{where}: XLA's module has no ENTRY computation")
  module = Module(comps, entry[0], entry[1], "xla")
  check_operands(module, where)
  return module
