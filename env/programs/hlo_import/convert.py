"""The conversion: a parsed module's ENTRY computation -> `Workload`.

The ENTRY instructions are taken in schedule order, one step each: an instruction that makes no
op (a parameter, a constant, or one that only aliases buffers), the start or the done of an
asynchronous pair, or an op that reads its operands and defines buffers for its result. What
each instruction resolves to is a value tree (a buffer index, None, or a tuple of trees), so that
a use through a tuple, a get-tuple-element or an async pair is a use of the buffers behind it.
The rules are in the package docstring.
"""

from __future__ import annotations

from typing import Any, Iterator

from malloczero.common.errors import WorkloadError
from malloczero.env.programs.hlo_import.cost_rules import FlopCounter, operand_bytes, result_bytes
from malloczero.env.programs.hlo_import.hlo import (
  NON_OPS,
  Instr,
  Module,
  Shape,
  attr,
  int_list,
  shape_bytes,
)
from malloczero.env.programs.hlo_import.notes import Notes
from malloczero.env.workload import Workload
from malloczero.env.workload_json import workload_from_dict

SMALL_CONSTANT_BYTES = 64  # ENTRY constants up to this size are ignored (immediates).


def _is_async_start(op: str) -> bool:
  return op in ("send", "recv") or (op.endswith("-start") and op != "copy-start")


def _is_async_done(op: str) -> bool:
  return op.endswith("-done") and op != "copy-done"


def ops_of(module: Module) -> list[Instr]:
  """The ENTRY instructions that become ops."""
  return [ins for ins in module.entry.instrs if ins.opcode not in NON_OPS]


def convert_module(module: Module, name: str, source: str, notes: Notes) -> Workload:
  """The workload of `module`'s ENTRY computation, named `name`; warnings go to `notes`.
  Malformed modules raise a one-line `WorkloadError`."""
  conversion = _Conversion(module, name, notes)
  for ins in module.entry.instrs:
    conversion.add(ins)
  return conversion.finish(source)


class _Conversion:
  """The workload being built, one ENTRY instruction at a time."""

  def __init__(self, module: Module, name: str, notes: Notes) -> None:
    self.comps, self.entry, self.name, self.notes = module.comps, module.entry, name, notes
    self.flops = FlopCounter(module.comps, name, notes)
    self.ops: list[dict[str, Any]] = []
    self.buffers: list[dict[str, Any]] = []
    self.moved: list[dict[int, int]] = []  # Per buffer: op -> bytes it reads (uses) of the buffer.
    self.values: dict[str, Any] = {}  # instruction -> value tree: a buffer index, None, or a tuple.
    # async start -> (operand values, what it defines): the done keeps them live.
    self.pending: dict[str, tuple[list[Any], Any]] = {}

  # ---------------------------------------------------------------------- one instruction

  def add(self, ins: Instr) -> None:
    """Converts the next ENTRY instruction in schedule order."""
    op = ins.opcode
    if (
      op in NON_OPS
      and op not in ("parameter", "constant", "tuple", "after-all")
      and (not ins.operands)
    ):
      raise WorkloadError(f"{self.name}: {ins.at}'{ins.name}' ({op}) needs an operand")
    if op in NON_OPS:
      self.values[ins.name] = self._non_op(ins)
    elif _is_async_done(op) and ins.operands and ins.operands[0] in self.pending:
      self._async_done(ins)
    elif _is_async_start(op):
      self._async_start(ins)
    else:
      self._op(ins)

  def _non_op(self, ins: Instr) -> Any:
    """The value of an instruction that makes no op: new buffers for a parameter or a large
    constant (both exist before the program), else the buffers it aliases."""
    op = ins.opcode
    if op == "parameter":
      return self._new_buffers(ins, "parameter", None)
    if op == "constant":
      large = shape_bytes(ins.shape) > SMALL_CONSTANT_BYTES
      return self._new_buffers(ins, "parameter", None) if large else None
    if op == "get-tuple-element":
      index = int_list(attr(ins.attrs, "index"))
      if not index:
        raise WorkloadError(f"{self.name}: {ins.at}get-tuple-element '{ins.name}' has no index=")
      return self._element(self._operand(ins, 0), index[0], ins)
    if op == "tuple":
      return tuple(self._operand(ins, k) for k in range(len(ins.operands)))
    if op == "copy-start":
      return (self._operand(ins, 0), self._operand(ins, 0), None)
    if op == "copy-done":
      return self._element(self._operand(ins, 0), 0, ins)
    if op == "after-all":
      return None
    if op == "async-update" and ins.operands[0] in self.pending:
      self.pending[ins.name] = self.pending[ins.operands[0]]
    return self._operand(ins, 0)  # bitcast, add-dependency, opt-barrier, domain, async-update.

  def _async_start(self, ins: Instr) -> None:
    """The start of an asynchronous pair: an op that reads its operands and defines its results
    now; the done will keep both live."""
    t = self._begin_op(ins)
    operands = [self._operand(ins, k) for k in range(len(ins.operands))]
    for v in operands:
      self._use(v, t, None)
    results, value = self._async_start_value(ins, t, operands)
    self.values[ins.name] = value
    self.pending[ins.name] = (operands, results)

  def _async_start_value(self, ins: Instr, t: int, operands: list[Any]) -> tuple[Any, Any]:
    """(the buffers a start defines, the value of its whole result), laid out as XLA lays out
    each kind of start's result."""
    op, shape = ins.opcode, ins.shape
    if op == "send":  # (data, context, token): the data stays the operand's buffer.
      return None, (operands[0] if operands else None,) + (None,) * (
        len(shape) - 1 if isinstance(shape, tuple) else 0
      )
    if op == "recv" and isinstance(shape, tuple) and shape:  # (data, context, token)
      results = self._new_buffers(ins, "activation", t, shape[0], index=(0,))
      return results, (results,) + (None,) * (len(shape) - 1)
    if isinstance(shape, tuple) and len(shape) >= 2 and op != "all-reduce-start":
      # ((operands), results, context...): {0} aliases the operands, {1} is new.
      aliased = (
        operands[0] if len(operands) == 1 and not isinstance(shape[0], tuple) else (tuple(operands))
      )
      results = self._new_buffers(ins, "activation", t, shape[1], index=(1,))
      return results, (aliased, results) + (None,) * (len(shape) - 2)
    # all-reduce-start (a variadic one returns a tuple of results): all of it is new.
    results = self._new_buffers(ins, "activation", t)
    return results, results

  def _async_done(self, ins: Instr) -> None:
    """The done defines nothing: its result is what the start defined, and it keeps the start's
    operands and results live up to here without moving any data."""
    operands, results = self.pending[ins.operands[0]]
    t = self._begin_op(ins)
    for v in operands + [results]:
      self._use(v, t, 0)
    self.values[ins.name] = (results, None) if ins.opcode == "recv-done" else results

  def _op(self, ins: Instr) -> None:
    """Any other instruction: an op that reads its operands and defines new buffers for its
    result, each moving the bytes the cost rules say."""
    t = self._begin_op(ins)
    for k in range(len(ins.operands)):
      self._use(self._operand(ins, k), t, operand_bytes(ins, k, self.comps))
    self.values[ins.name] = self._new_buffers(
      ins, "activation", t, written=result_bytes(ins, self.comps, self.entry)
    )

  # ---------------------------------------------------------------------- buffers and uses

  def _operand(self, ins: Instr, k: int) -> Any:
    return self.values[ins.operands[k]]

  def _element(self, value: Any, index: int, ins: Instr) -> Any:
    if not isinstance(value, tuple) or not 0 <= index < len(value):
      raise WorkloadError(
        f"{self.name}: {ins.at}'{ins.name}' takes element {index} of "
        f"'{ins.operands[0]}', which is not a tuple with that many elements"
      )
    return value[index]

  def _begin_op(self, ins: Instr) -> int:
    self.ops.append({"name": ins.name, "flops": self.flops.instr(ins, self.entry)})
    return len(self.ops) - 1

  def _new_buffers(
    self,
    ins: Instr,
    kind: str,
    def_op: int | None,
    shape: Shape | None = None,
    written: Any = None,
    index: tuple[int, ...] = (),
  ) -> Any:
    """Buffers for the leaves of `shape` (the instruction's own by default), which sits at
    `index` of the instruction's result; `written` is what `result_bytes` says. Returns their
    value tree."""
    shape = ins.shape if shape is None else shape
    if isinstance(shape, tuple):
      return tuple(
        self._new_buffers(
          ins, kind, def_op, sub, written[i] if isinstance(written, tuple) else None, index + (i,)
        )
        for i, sub in enumerate(shape)
      )
    if not shape.sizable:
      self.notes.warn(
        shape.why_unsizable, ins.name, "they cannot be sized, so no buffer is made for them"
      )
      return None
    if shape.bytes <= 0:
      return None
    label = ins.name + ("{" + ",".join(map(str, index)) + "}" if index else "")
    entry = {
      "id": len(self.buffers),
      "name": label,
      "size": shape.bytes,
      "def": def_op,
      "uses": [],
      "kind": kind,
    }
    if isinstance(written, int) and def_op is not None:
      entry["def_bytes"] = min(written, shape.bytes)
    self.buffers.append(entry)
    self.moved.append({})
    return len(self.buffers) - 1

  def _use(self, value: Any, t: int, nbytes: int | None) -> None:
    """Op t reads `nbytes` of the buffer `value` (None: all of it; of a tuple, all of each
    leaf, or nothing of any when `nbytes` is 0)."""
    leaves = list(_flatten(value))
    for b in leaves:
      size = self.buffers[b]["size"]
      part = size if nbytes is None or (len(leaves) != 1 and nbytes != 0) else nbytes
      self.moved[b][t] = min(size, self.moved[b].get(t, 0) + part)

  # ---------------------------------------------------------------------- the workload

  def finish(self, source: str) -> Workload:
    """The workload, once every ENTRY instruction is added."""
    self._mark_outputs()
    self._record_uses()
    self._check_not_empty()
    return workload_from_dict(
      {"name": self.name, "source": source, "ops": self.ops, "buffers": self.buffers},
      where=self.name,
    )

  def _mark_outputs(self) -> None:
    """The activations the ROOT resolves to are the program's outputs; a parameter stays one."""
    for b in _flatten(self.values[self.entry.root.name]):
      if self.buffers[b]["kind"] == "activation":
        self.buffers[b]["kind"] = "output"

  def _record_uses(self) -> None:
    """Each buffer's uses in op order, and their bytes where one moves less than all of it."""
    for b, reads in zip(self.buffers, self.moved):
      b["uses"] = sorted(reads)
      if any(reads[t] != b["size"] for t in reads):
        b["use_bytes"] = [reads[t] for t in b["uses"]]

  def _check_not_empty(self) -> None:
    if not self.ops:
      raise WorkloadError(
        f"{self.name}: the ENTRY computation '{self.entry.name}' has no ops "
        "(it only forwards its parameters or constants)"
      )
    if not self.buffers:
      raise WorkloadError(
        f"{self.name}: the ENTRY computation '{self.entry.name}' has no non-empty buffers"
      )


def _flatten(value: Any) -> Iterator[int]:
  if value is None:
    return
  if isinstance(value, tuple):
    for v in value:
      yield from _flatten(v)
  else:
    yield value
