"""The hand-written HLO text parser: the fallback for text XLA's own parser refuses.

XLA's parser (`xla_proto`) reads a module first; an old module with an attribute XLA no longer
knows is read here instead. This parser reads shapes, operands and the attributes the importer
uses the same way as XLA's, but checks less, and it keeps duplicate instruction names as
printed (XLA's parser gives them a suffix, `.1`).
"""

from __future__ import annotations

import re

from malloczero.common.errors import WorkloadError
from malloczero.env.programs.hlo_import.hlo import (
  Array,
  Computation,
  Instr,
  Module,
  Shape,
  check_operands,
  check_text,
  skip_braces,
)

_IDENT = re.compile(r"[A-Za-z0-9_.\-]+")
_COMMENT = re.compile(r"/\*.*?\*/")
# A computation's first line: `[ENTRY] %name (params) -> shape {`, or JAX's short `ENTRY main.22 {`
# and `region_0.15 {` (`as_hlo_text()`), which print the signature nowhere.
_HEADER = re.compile(r"^(ENTRY\s+)?%?([A-Za-z0-9_.\-]+)\s*(?:\(.*\)\s*->\s*.*)?\{\s*$")
_INSTR_START = re.compile(r"^\s*(ROOT\s+)?%?([A-Za-z0-9_.\-]+)\s*=\s*")
_OPCODE = re.compile(r"\s*([a-z][a-z0-9\-_]*)\(")
_ARRAY = re.compile(r"([a-z][a-z0-9]*)\[([^\]]*)\]")
_SCHEDULED = re.compile(r"^\s*HloModule\s+[^,\s]+.*\bis_scheduled=true\b")


def _parse_shape(s: str, i: int) -> tuple[Shape, int]:
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
    i = skip_braces(s, i)
  return Array(dtype, tuple(dims)), i


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


def _parse_instr(line: str, lineno: int) -> Instr:
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
  inner = line[open_paren + 1 : close]
  operands = []
  if opcode not in ("constant", "parameter"):
    for part in _split_top_level(inner):
      token = part.split()[-1].lstrip("%")  # Older printers put the operand's shape first.
      if not _IDENT.fullmatch(token):
        raise ValueError(f"cannot read operand '{part}'")
      operands.append(token)
  number = int(inner) if opcode == "parameter" and inner.strip().isdigit() else -1
  return Instr(
    m.group(2), shape, opcode, operands, line[close + 1 :], bool(m.group(1)), lineno, number
  )


def parse_text(text: str, where: str) -> Module:
  """The hand-written parser: for text XLA's own parser refuses (old modules)."""
  check_text(text, where)
  comps: dict[str, Computation] = {}
  current: Computation | None = None
  scheduled = False
  for lineno, raw in enumerate(text.splitlines(), start=1):
    line = _COMMENT.sub("", raw).rstrip()
    stripped = line.strip()
    if current is None:
      if _SCHEDULED.match(line):
        scheduled = True
      m = _HEADER.match(stripped)
      if m:
        current = Computation(m.group(2), bool(m.group(1)), [], lineno)
      # Anything else outside a computation (blank lines, stack-frame tables of newer
      # printers) carries nothing the workload needs.
      continue
    if not stripped or stripped.startswith("//"):
      continue
    if stripped == "}":
      if not current.instrs:
        raise WorkloadError(
          f"{where}: line {current.line}: computation '{current.name}' has no instructions"
        )
      if current.name in comps:
        raise WorkloadError(
          f"{where}: line {current.line}: computation '{current.name}' is defined twice"
        )
      comps[current.name] = current
      current = None
      continue
    try:
      current.instrs.append(_parse_instr(line, lineno))
    except ValueError as e:
      snippet = stripped if len(stripped) <= 80 else stripped[:77] + "..."
      raise WorkloadError(
        f"{where}: line {lineno}: unparseable HLO instruction ({e}): {snippet}"
      ) from None
  if current is not None:
    raise WorkloadError(
      f"{where}: truncated HLO: computation '{current.name}' (line "
      f"{current.line}) is not closed by '}}'"
    )
  entries = [c for c in comps.values() if c.is_entry]
  if not entries:
    raise WorkloadError(
      f"{where}: no ENTRY computation in the HLO text (is it truncated, or not an HLO module?)"
    )
  if len(entries) > 1:
    raise WorkloadError(f"{where}: more than one ENTRY computation in the HLO text")
  for comp in comps.values():  # A scheduled module prints every sequence in schedule order.
    comp.sequenced = scheduled
  module = Module(comps, entries[0], scheduled, "text")
  check_operands(module, where)
  return module
