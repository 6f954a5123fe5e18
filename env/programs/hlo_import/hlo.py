"""The HLO module as the importer holds it, whichever parser read it.

Both parsers (`text_parser`, the hand-written one, and `xla_proto`, which reads XLA's own
`HloModuleProto`) produce these classes, with attributes spelled as the text format spells them,
so that the cost rules and the conversion read one form. Also here: array shapes and their
sizes, the checks both parsers share, and the readers of the attribute text.
"""

from __future__ import annotations

import dataclasses
import functools
import math
import re
from typing import Any, Iterator, Union

from malloczero.common.errors import WorkloadError

# Element sizes in bits (sub-byte types are rounded up to whole bytes per buffer).
_DTYPE_BITS = {
  "pred": 8,
  "s1": 1,
  "u1": 1,
  "s2": 2,
  "u2": 2,
  "s4": 4,
  "u4": 4,
  "s8": 8,
  "u8": 8,
  "s16": 16,
  "u16": 16,
  "s32": 32,
  "u32": 32,
  "s64": 64,
  "u64": 64,
  "f16": 16,
  "bf16": 16,
  "f32": 32,
  "f64": 64,
  "c64": 64,
  "c128": 128,
  "f4e2m1fn": 4,
  "f8e8m0fnu": 8,
  "f8e3m4": 8,
  "f8e4m3": 8,
  "f8e4m3fn": 8,
  "f8e4m3b11fnuz": 8,
  "f8e4m3fnuz": 8,
  "f8e5m2": 8,
  "f8e5m2fnuz": 8,
  "token": 0,
  "opaque": 0,
}

# Instructions that are not ops: they alias existing buffers or create none.
NON_OPS = frozenset(
  {
    "parameter",
    "constant",
    "get-tuple-element",
    "bitcast",
    "tuple",
    "copy-start",
    "copy-done",
    "add-dependency",
    "opt-barrier",
    "domain",
    "after-all",
    "async-update",
  }
)


@dataclasses.dataclass(frozen=True)
class Array:
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


Shape = Union[Array, tuple]  # A tuple shape is a Python tuple of shapes.


def leaves(shape: Shape) -> Iterator[tuple[tuple[int, ...], Array]]:
  """(index path, array) for every array leaf of a shape, in order."""
  if isinstance(shape, Array):
    yield (), shape
    return
  for i, sub in enumerate(shape):
    for path, leaf in leaves(sub):
      yield (i,) + path, leaf


def shape_elements(shape: Shape) -> int:
  """Elements of a shape's sizable leaves, tokens and opaque leaves left out."""
  return sum(
    leaf.elements for _, leaf in leaves(shape) if leaf.sizable and _DTYPE_BITS[leaf.dtype] > 0
  )


def shape_bytes(shape: Shape) -> int:
  """Bytes of a shape, summed over its leaves (an unsizable leaf counts 0)."""
  return sum(leaf.bytes for _, leaf in leaves(shape))


def skip_braces(s: str, i: int) -> int:
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


@dataclasses.dataclass
class Instr:
  """One HLO instruction; `attrs` is the text after its operand list, as the text format prints
  it."""

  name: str
  shape: Shape
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
class Computation:
  """One HLO computation: its instructions in order; in schedule order when `sequenced` (the
  module's schedule holds a sequence for it, or the text of a scheduled module prints it)."""

  name: str
  is_entry: bool
  instrs: list[Instr]
  line: int
  sequenced: bool = False

  @functools.cached_property
  def by_name(self) -> dict[str, Instr]:
    return {ins.name: ins for ins in self.instrs}

  @property
  def root(self) -> Instr:
    for ins in self.instrs:
      if ins.is_root:
        return ins
    return self.instrs[-1]


@dataclasses.dataclass
class Module:
  """A parsed HLO module: its computations by name, the ENTRY one, and how it was read."""

  comps: dict[str, Computation]
  entry: Computation  # Its instructions in schedule order (print order if unscheduled).
  scheduled: bool  # `is_scheduled=true` / a schedule for the ENTRY computation.
  parser: str  # "xla" (XLA's own parser) or "text" (the hand-written fallback).


def check_text(text: Any, where: str) -> None:
  """Raises a one-line `WorkloadError` unless `text` is a non-empty str."""
  if not isinstance(text, str):
    raise WorkloadError(f"{where}: expected HLO text (a str), got {type(text).__name__}")
  if not text.strip():
    raise WorkloadError(f"{where}: empty HLO text")


def check_operands(module: Module, where: str) -> None:
  """Every operand is defined earlier in its computation (in the ENTRY's schedule order)."""
  for comp in module.comps.values():
    seen: set[str] = set()
    for ins in comp.instrs:
      for operand in ins.operands:
        if operand not in seen:
          later = "is defined after its use" if operand in comp.by_name else "is not defined"
          raise WorkloadError(
            f"{where}: {ins.at}instruction '{ins.name}' uses unknown "
            f"operand '{operand}' (it {later} in computation '{comp.name}')"
          )
      if ins.name in seen:
        raise WorkloadError(
          f"{where}: {ins.at}instruction '{ins.name}' is defined twice in computation '{comp.name}'"
        )
      seen.add(ins.name)


@functools.lru_cache(maxsize=1 << 16)
def attr(attrs: str, key: str) -> str | None:
  """The value of `key=...` in an instruction's attribute text (braces kept balanced). Cached:
  the cost rules and the flattening read the same few attributes of an instruction many times."""
  m = re.search(r"(?:^|[,\s])" + re.escape(key) + r"=", attrs)
  if not m:
    return None
  i = m.end()
  if attrs.startswith("{", i):
    return attrs[i + 1 : skip_braces(attrs, i) - 1]
  if attrs.startswith('"', i):
    j = i + 1
    while j < len(attrs) and attrs[j] != '"':
      j += 2 if attrs[j] == "\\" else 1
    return attrs[i + 1 : j]
  m2 = re.compile(r"[^,\s]*").match(attrs, i)
  return m2.group(0)


def int_list(value: str | None) -> list[int]:
  """The integers in an attribute value (`{1,0}` -> [1, 0])."""
  return [int(x) for x in re.findall(r"\d+", value or "")]


def comp_names(value: str | None) -> list[str]:
  """The computation names in an attribute value (`%body, %cond` -> ['body', 'cond'])."""
  return [x.strip().lstrip("%") for x in (value or "").split(",") if x.strip()]
