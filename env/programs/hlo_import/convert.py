"""The conversion: a parsed module -> `Workload`, called computations flattened onto its time axis.

The ENTRY computation is walked in schedule order, and a `call`, a `while` (its condition, then
its body), a `conditional` (each branch in turn) or an `async-start` with a wrapped computation
contributes the called computation's instructions in place, before the calling instruction, as
XLA's `HloLiveRange::FlattenSchedule` orders them (xla/hlo/utils/hlo_live_range.cc). Each
instruction is one step: one that makes no op (a parameter, a constant, one that only aliases
buffers, a flattened call), the start or the done of an asynchronous pair, or an op that reads
its operands and defines buffers for its result. What each instruction resolves to is a value
tree (a buffer index, None, or a tuple of trees), so that a use through a tuple, a
get-tuple-element, an async pair, a called computation's parameter or root is a use of the
buffers behind it. The rules, and where they depart from XLA, are in the package docstring.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Iterator

from malloczero.common.errors import WorkloadError
from malloczero.env.programs.hlo_import.cost_rules import (
  FlopCounter,
  operand_bytes,
  result_bytes,
  trip_count,
)
from malloczero.env.programs.hlo_import.hlo import (
  NON_OPS,
  Computation,
  Instr,
  Module,
  Shape,
  attr,
  comp_names,
  int_list,
  shape_bytes,
)
from malloczero.env.programs.hlo_import.notes import Notes
from malloczero.env.workload import Workload
from malloczero.env.workload_json import workload_from_dict

SMALL_CONSTANT_BYTES = 64  # Constants up to this size are ignored (immediates).
# Flattening copies a computation at every call site; a module whose copies would exceed this
# many instructions (computations called from many places, nested) is refused.
MAX_FLATTENED_INSTRUCTIONS = 20_000_000
# Instructions whose called computations are flattened (the others' are fused or applied
# element by element: reducers, comparators, fusion bodies).
FLATTENED = frozenset({"call", "while", "conditional", "async-start"})


def _is_async_start(op: str) -> bool:
  return op in ("send", "recv") or (op.endswith("-start") and op != "copy-start")


def _is_async_done(op: str) -> bool:
  return op.endswith("-done") and op != "copy-done"


def called_computations(ins: Instr) -> list[str]:
  """The computations a `call`, `while` ([condition, body]), `conditional` (its branches) or
  `async-start` runs, in the order XLA flattens them."""
  if ins.opcode == "while":
    return comp_names(attr(ins.attrs, "condition")) + comp_names(attr(ins.attrs, "body"))
  if ins.opcode == "conditional":
    return comp_names(attr(ins.attrs, "branch_computations")) or [
      c
      for key in ("true_computation", "false_computation")
      for c in comp_names(attr(ins.attrs, key))
    ]
  return comp_names(attr(ins.attrs, "calls") or attr(ins.attrs, "to_apply"))


def flattens(module: Module, ins: Instr) -> bool:
  """Whether `ins` contributes its called computations' instructions to the time axis: a call,
  while, conditional or async-start whose computations are in the module's schedule (or any,
  in an unscheduled module taken in print order). XLA's HloLiveRange skips computations that
  have no sequence in the schedule; so does the importer (the instruction is then one op)."""
  if ins.opcode not in FLATTENED:
    return False
  names = called_computations(ins)
  expected = 2 if ins.opcode == "while" else 1
  if len(names) < expected or any(n not in module.comps for n in names):
    return False  # The flop counter reports the unknown computation.
  return not module.scheduled or all(module.comps[n].sequenced for n in names)


def count_ops(module: Module) -> int:
  """How many ops the module's flattened schedule has (what `convert_module` would make)."""
  memo: dict[str, int] = {}

  def ops_in(comp: Computation, depth: int) -> int:
    if comp.name in memo:
      return memo[comp.name]
    if depth > len(module.comps):
      raise WorkloadError(f"computation '{comp.name}' calls itself")
    total = 0
    for ins in comp.instrs:
      if flattens(module, ins):
        total += sum(ops_in(module.comps[n], depth + 1) for n in called_computations(ins))
      elif ins.opcode not in NON_OPS:
        total += 1
    memo[comp.name] = total
    return total

  return ops_in(module.entry, 0)


def convert_module(module: Module, name: str, source: str, notes: Notes) -> Workload:
  """The workload of `module`, named `name`, its called computations flattened; warnings go to
  `notes`. Malformed modules raise a one-line `WorkloadError`."""
  conversion = _Conversion(module, name, notes)
  root = conversion.run(module.entry, None, 1, 0)
  return conversion.finish(root, source)


@dataclasses.dataclass
class _Scope:
  """One computation as flattened at one call site: the values its parameters are bound to
  (None for the ENTRY computation, whose parameters are the program's), the weight of its ops
  (the product of the enclosing loops' trip counts) and how many while loops enclose them, its
  instructions' values, and its async starts whose dones are still to come."""

  comp: Computation
  args: list[Any] | None
  weight: int
  loop_depth: int
  values: dict[str, Any] = dataclasses.field(default_factory=dict)
  pending: dict[str, tuple[list[Any], Any]] = dataclasses.field(default_factory=dict)


class _Conversion:
  """The workload being built, one instruction of the flattened schedule at a time."""

  def __init__(self, module: Module, name: str, notes: Notes) -> None:
    self.module, self.comps, self.name, self.notes = module, module.comps, name, notes
    self.flops = FlopCounter(module.comps, name, notes)
    self.ops: list[dict[str, Any]] = []
    self.buffers: list[dict[str, Any]] = []
    self.moved: list[dict[int, int]] = []  # Per buffer: op -> bytes it reads (uses) of the buffer.
    self.merged_into: dict[int, int] = {}  # A buffer merged into a loop's or branch's one.
    self.active: list[str] = []  # The computations being flattened, outermost first.
    self.instructions = 0

  def run(self, comp: Computation, args: list[Any] | None, weight: int, loop_depth: int) -> Any:
    """Flattens `comp` with its parameters bound to `args`, its ops of `weight` inside
    `loop_depth` while loops; returns its root's value."""
    if comp.name in self.active:
      raise WorkloadError(f"{self.name}: computation '{comp.name}' calls itself")
    self.active.append(comp.name)
    scope = _Scope(comp, args, weight, loop_depth)
    for ins in comp.instrs:
      self._add(scope, ins)
    self.active.pop()
    return scope.values[comp.root.name]

  # ---------------------------------------------------------------------- one instruction

  def _add(self, scope: _Scope, ins: Instr) -> None:
    """Converts the next instruction of `scope`'s computation in schedule order."""
    self.instructions += 1
    if self.instructions > MAX_FLATTENED_INSTRUCTIONS:
      raise WorkloadError(
        f"{self.name}: flattening the called computations gives more than "
        f"{MAX_FLATTENED_INSTRUCTIONS:,} instructions (computations called from many places)"
      )
    op = ins.opcode
    if (
      op in NON_OPS
      and op not in ("parameter", "constant", "tuple", "after-all")
      and (not ins.operands)
    ):
      raise WorkloadError(f"{self.name}: {ins.at}'{ins.name}' ({op}) needs an operand")
    if op in NON_OPS:
      scope.values[ins.name] = self._non_op(scope, ins)
    elif flattens(self.module, ins):
      scope.values[ins.name] = self._flatten(scope, ins)
    elif _is_async_done(op) and ins.operands and ins.operands[0] in scope.pending:
      self._async_done(scope, ins)
    elif _is_async_start(op):
      self._async_start(scope, ins)
    else:
      self._op(scope, ins)

  def _non_op(self, scope: _Scope, ins: Instr) -> Any:
    """The value of an instruction that makes no op: new buffers for a program parameter or a
    large constant (both exist before the program), the bound argument for a called
    computation's parameter, else the buffers it aliases."""
    op = ins.opcode
    if op == "parameter":
      if scope.args is None:
        return self._new_buffers(scope, ins, "parameter", None)
      if not 0 <= ins.number < len(scope.args):
        raise WorkloadError(
          f"{self.name}: {ins.at}'{ins.name}' is parameter {ins.number} of computation "
          f"'{scope.comp.name}', which is called with {len(scope.args)} operands"
        )
      return scope.args[ins.number]
    if op == "constant":
      large = shape_bytes(ins.shape) > SMALL_CONSTANT_BYTES
      return self._new_buffers(scope, ins, "parameter", None) if large else None
    if op == "get-tuple-element":
      index = int_list(attr(ins.attrs, "index"))
      if not index:
        raise WorkloadError(f"{self.name}: {ins.at}get-tuple-element '{ins.name}' has no index=")
      return self._element(self._operand(scope, ins, 0), index[0], ins)
    if op == "tuple":
      return tuple(self._operand(scope, ins, k) for k in range(len(ins.operands)))
    if op == "copy-start":
      return (self._operand(scope, ins, 0), self._operand(scope, ins, 0), None)
    if op == "copy-done":
      return self._element(self._operand(scope, ins, 0), 0, ins)
    if op == "after-all":
      return None
    if op == "async-update" and ins.operands[0] in scope.pending:
      scope.pending[ins.name] = scope.pending[ins.operands[0]]
    return self._operand(scope, ins, 0)  # bitcast, add-dependency, opt-barrier, domain, ...

  def _flatten(self, scope: _Scope, ins: Instr) -> Any:
    """A call, while, conditional or async-start: its computations' instructions in place of
    it; returns its value (it makes no op of its own)."""
    operands = [self._operand(scope, ins, k) for k in range(len(ins.operands))]
    comps = [self.comps[n] for n in called_computations(ins)]
    first = len(self.ops)
    if ins.opcode == "call":
      return self.run(comps[0], operands, scope.weight, scope.loop_depth)
    if ins.opcode == "while":
      return self._while(scope, ins, comps, operands, first)
    if ins.opcode == "conditional":
      self.notes.warn(
        "conditional",
        ins.name,
        "every branch is on the time axis and counts once (which one runs is data "
        "dependent): an upper bound on its time",
      )
      roots = [
        self.run(comp, operands[k + 1 : k + 2], scope.weight, scope.loop_depth)
        for k, comp in enumerate(comps)
      ]
      return self._join(roots, first)
    # async-start: the wrapped computation runs between the start and the done.
    results = self.run(comps[0], operands, scope.weight, scope.loop_depth)
    value = self._async_value(ins, operands, results)
    scope.pending[ins.name] = (operands, results)
    return value

  def _while(
    self, scope: _Scope, ins: Instr, comps: list[Computation], operands: list[Any], first: int
  ) -> Any:
    """A while loop: its condition, then its body, each op weighted by the trip count (the
    condition runs once more than the body); the loop state is carried across iterations."""
    if not operands:
      raise WorkloadError(f"{self.name}: {ins.at}while '{ins.name}' has no operand")
    trips = trip_count(ins.attrs)
    if trips is None or trips < 1:
      self.notes.warn(
        "while loop without a known trip count",
        ins.name,
        "its condition and body count once (XLA printed no known_trip_count)"
        if trips is None
        else "XLA's known_trip_count is 0; its condition and body count once",
      )
      body_weight = cond_weight = scope.weight
    else:
      body_weight, cond_weight = scope.weight * trips, scope.weight * (trips + 1)
    state, depth = operands[0], scope.loop_depth + 1
    self.run(comps[0], [state], cond_weight, depth)
    root = self.run(comps[1], [state], body_weight, depth)
    return self._carry(state, root, first)

  # ---------------------------------------------------------------------- loops and branches

  def _carry(self, state: Any, root: Any, first: int) -> Any:
    """The loop's value, one buffer per element of its state, as XLA's alias analysis puts the
    init value, the condition's and body's parameters, the body's root and the while's result in
    one buffer: an element the body computes anew is written into the state's buffer (merged
    into it), and every element stays live up to the loop's last op, since the next iteration
    reads it."""

    def carried(s: Any, r: Any) -> Any:
      if isinstance(s, tuple) and isinstance(r, tuple) and len(s) == len(r):
        return tuple(carried(a, b) for a, b in zip(s, r))
      if isinstance(s, tuple) or isinstance(r, tuple):
        return s  # Shapes that do not match: XLA would refuse the loop; keep the state.
      s, r = self._resolved(s), self._resolved(r)
      if r is None or r == s or not self._defined_since(r, first):
        return s  # Passed through, or an outer value (XLA copies those before the root).
      if s is None or self.buffers[s]["size"] != self.buffers[r]["size"]:
        return r
      self._merge(r, s)
      return s

    value = carried(state, root)
    last = len(self.ops) - 1
    for b in _flatten(value):
      defined = self.buffers[b]["def"]
      if last >= first and (defined is None or defined < last):
        self.moved[b].setdefault(last, 0)
    return value

  def _join(self, roots: list[Any], first: int) -> Any:
    """A conditional's value: per element, the branches' new buffers merged into one (XLA's
    alias analysis gives the branch roots and the result one buffer)."""

    def joined(values: list[Any]) -> Any:
      if all(isinstance(v, tuple) and len(v) == len(values[0]) for v in values):
        return tuple(joined([v[i] for v in values]) for i in range(len(values[0])))
      values = [v if isinstance(v, tuple) else self._resolved(v) for v in values]
      new = [v for v in values if not isinstance(v, tuple) and self._defined_since(v, first)]
      if not new:
        return values[0]
      for other in new[1:]:
        if other != new[0] and self.buffers[other]["size"] == self.buffers[new[0]]["size"]:
          self._merge(other, new[0])
      return new[0]

    return joined(roots)

  def _resolved(self, b: int | None) -> int | None:
    """The buffer `b` is part of now (itself unless merged into another)."""
    return self.merged_into.get(b, b) if b is not None else None

  def _defined_since(self, b: Any, first: int) -> bool:
    return b is not None and self.buffers[b]["def"] is not None and self.buffers[b]["def"] >= first

  def _merge(self, other: int, into: int) -> None:
    """Buffer `other` becomes part of `into`: its definition a write of `into`, its uses uses."""
    src, size, moved = self.buffers[other], self.buffers[into]["size"], self.moved[into]
    moved[src["def"]] = min(size, moved.get(src["def"], 0) + src.get("def_bytes", src["size"]))
    for t, n in self.moved[other].items():
      moved[t] = min(size, moved.get(t, 0) + n)
    self.moved[other] = {}
    self.merged_into[other] = into

  # ---------------------------------------------------------------------- asynchronous pairs

  def _async_start(self, scope: _Scope, ins: Instr) -> None:
    """The start of an asynchronous pair: an op that reads its operands and defines its results
    now; the done will keep both live."""
    t = self._begin_op(scope, ins)
    operands = [self._operand(scope, ins, k) for k in range(len(ins.operands))]
    for v in operands:
      self._use(v, t, None)
    results = self._async_results(scope, ins, t)
    scope.values[ins.name] = self._async_value(ins, operands, results)
    scope.pending[ins.name] = (operands, results)

  def _async_results(self, scope: _Scope, ins: Instr, t: int) -> Any:
    """The buffers a start defines, laid out as XLA lays out each kind of start's result."""
    op, shape = ins.opcode, ins.shape
    if op == "send":  # (data, context, token): the data stays the operand's buffer.
      return None
    if op == "recv" and isinstance(shape, tuple) and shape:  # (data, context, token)
      return self._new_buffers(scope, ins, "activation", t, shape[0], index=(0,))
    if isinstance(shape, tuple) and len(shape) >= 2 and op != "all-reduce-start":
      # ((operands), results, context...): {0} aliases the operands, {1} is new.
      return self._new_buffers(scope, ins, "activation", t, shape[1], index=(1,))
    # all-reduce-start (a variadic one returns a tuple of results): all of it is new.
    return self._new_buffers(scope, ins, "activation", t)

  def _async_value(self, ins: Instr, operands: list[Any], results: Any) -> Any:
    """The value of a start's whole result, given its operands and the buffers it defines."""
    op, shape = ins.opcode, ins.shape
    rest = lambda used: (None,) * (len(shape) - used if isinstance(shape, tuple) else 0)
    if op == "send":
      return (operands[0] if operands else None,) + rest(1)
    if op == "recv" and isinstance(shape, tuple) and shape:
      return (results,) + rest(1)
    if isinstance(shape, tuple) and len(shape) >= 2 and op != "all-reduce-start":
      aliased = (
        operands[0] if len(operands) == 1 and not isinstance(shape[0], tuple) else tuple(operands)
      )
      return (aliased, results) + rest(2)
    return results

  def _async_done(self, scope: _Scope, ins: Instr) -> None:
    """The done defines nothing: its result is what the start defined, and it keeps the start's
    operands and results live up to here without moving any data."""
    operands, results = scope.pending[ins.operands[0]]
    t = self._begin_op(scope, ins)
    for v in operands + [results]:
      self._use(v, t, 0)
    scope.values[ins.name] = (results, None) if ins.opcode == "recv-done" else results

  def _op(self, scope: _Scope, ins: Instr) -> None:
    """Any other instruction: an op that reads its operands and defines new buffers for its
    result, each moving the bytes the cost rules say."""
    t = self._begin_op(scope, ins)
    for k in range(len(ins.operands)):
      self._use(self._operand(scope, ins, k), t, operand_bytes(ins, k, self.comps))
    scope.values[ins.name] = self._new_buffers(
      scope, ins, "activation", t, written=result_bytes(ins, self.comps, scope.comp)
    )

  # ---------------------------------------------------------------------- buffers and uses

  def _operand(self, scope: _Scope, ins: Instr, k: int) -> Any:
    return scope.values[ins.operands[k]]

  def _element(self, value: Any, index: int, ins: Instr) -> Any:
    if not isinstance(value, tuple) or not 0 <= index < len(value):
      raise WorkloadError(
        f"{self.name}: {ins.at}'{ins.name}' takes element {index} of "
        f"'{ins.operands[0]}', which is not a tuple with that many elements"
      )
    return value[index]

  def _begin_op(self, scope: _Scope, ins: Instr) -> int:
    op = {"name": ins.name, "flops": self.flops.instr(ins, scope.comp)}
    if scope.weight != 1:
      op["weight"] = scope.weight
    if scope.loop_depth:
      op["loop_depth"] = scope.loop_depth
    self.ops.append(op)
    return len(self.ops) - 1

  def _new_buffers(
    self,
    scope: _Scope,
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
          scope,
          ins,
          kind,
          def_op,
          sub,
          written[i] if isinstance(written, tuple) else None,
          index + (i,),
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
    leaves = [self._resolved(b) for b in _flatten(value)]
    for b in leaves:
      size = self.buffers[b]["size"]
      part = size if nbytes is None or (len(leaves) != 1 and nbytes != 0) else nbytes
      self.moved[b][t] = min(size, self.moved[b].get(t, 0) + part)

  # ---------------------------------------------------------------------- the workload

  def finish(self, root: Any, source: str) -> Workload:
    """The workload, once the ENTRY computation is flattened; `root` is its root's value."""
    self._mark_outputs(root)
    self._check_not_empty()
    buffers = self._record_uses()
    return workload_from_dict(
      {"name": self.name, "source": source, "ops": self.ops, "buffers": buffers},
      where=self.name,
    )

  def _mark_outputs(self, root: Any) -> None:
    """The activations the ROOT resolves to are the program's outputs; a parameter stays one."""
    for b in map(self._resolved, _flatten(root)):
      if self.buffers[b]["kind"] == "activation":
        self.buffers[b]["kind"] = "output"

  def _record_uses(self) -> list[dict[str, Any]]:
    """The buffers that were not merged into others, numbered again, each with its uses in op
    order and their bytes where one moves less than all of it."""
    kept = []
    for i, (b, reads) in enumerate(zip(self.buffers, self.moved)):
      if i in self.merged_into:
        continue
      b["id"] = len(kept)
      b["uses"] = sorted(reads)
      if any(reads[t] != b["size"] for t in reads):
        b["use_bytes"] = [reads[t] for t in b["uses"]]
      kept.append(b)
    return kept

  def _check_not_empty(self) -> None:
    entry = self.module.entry
    if not self.ops:
      raise WorkloadError(
        f"{self.name}: the ENTRY computation '{entry.name}' has no ops "
        "(it only forwards its parameters or constants)"
      )
    if len(self.buffers) == len(self.merged_into):
      raise WorkloadError(
        f"{self.name}: the ENTRY computation '{entry.name}' has no non-empty buffers"
      )


def _flatten(value: Any) -> Iterator[int]:
  if value is None:
    return
  if isinstance(value, tuple):
    for v in value:
      yield from _flatten(v)
  else:
    yield value
