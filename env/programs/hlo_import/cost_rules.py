"""What an op costs: its flops, and the bytes it reads of each operand and writes of its result.

The rules follow XLA's HloCostAnalysis (the package docstring lists them): flops per opcode,
the sum over a called computation for fusions, calls and async starts, a while body times its
known trip count, the most expensive branch of a conditional; bytes read in part by slices,
dynamic slices, gathers and in-place updates, also inside fusions.
"""

from __future__ import annotations

import math
import re
from typing import Any

import numpy as np

from malloczero.common.errors import WorkloadError
from malloczero.env.programs.hlo_import.hlo import (
  NON_OPS,
  Array,
  Computation,
  Instr,
  Shape,
  attr,
  comp_names,
  int_list,
  leaves,
  shape_bytes,
  shape_elements,
)
from malloczero.env.programs.hlo_import.notes import Notes

# Collectives: they move data between devices, they compute nothing the workload counts.
_COLLECTIVES = frozenset(
  {
    "all-gather",
    "all-gather-start",
    "all-gather-done",
    "all-reduce",
    "all-reduce-start",
    "all-reduce-done",
    "all-to-all",
    "all-to-all-start",
    "all-to-all-done",
    "reduce-scatter",
    "reduce-scatter-start",
    "reduce-scatter-done",
    "collective-permute",
    "collective-permute-start",
    "collective-permute-done",
    "collective-broadcast",
    "ragged-all-to-all",
    "send",
    "send-done",
    "recv",
    "recv-done",
  }
)
# Ops that only move data: 0 flops.
_DATA_MOVEMENT = (
  _COLLECTIVES
  | NON_OPS
  | frozenset(
    {
      "broadcast",
      "reshape",
      "dynamic-reshape",
      "transpose",
      "copy",
      "slice",
      "dynamic-slice",
      "dynamic-update-slice",
      "concatenate",
      "pad",
      "iota",
      "reverse",
      "gather",
      "bitcast-convert",
      "get-dimension-size",
      "set-dimension-size",
      "partition-id",
      "replica-id",
      "infeed",
      "outfeed",
      "async-done",
      "rng-get-and-update-state",
    }
  )
)
# Ops that read only an output-sized part of operand 0 (HloCostAnalysis::HandleSlice,
# HandleDynamicSlice, HandleGather).
_PARTIAL_READS = frozenset({"slice", "dynamic-slice", "gather"})


class FlopCounter:
  """Flops of instructions and of the computations they call (each computation's total is
  worked out once); a custom call of unknown cost counts 0, with a warning in `notes`."""

  def __init__(self, comps: dict[str, Computation], where: str, notes: Notes) -> None:
    self.comps, self.where, self.notes = comps, where, notes
    self.memo: dict[str, float] = {}
    self.active: set[str] = set()

  def computation(self, name: str, user: Instr) -> float:
    """Flops of computation `name`, which instruction `user` calls."""
    if name not in self.comps:
      raise WorkloadError(
        f"{self.where}: {user.at}instruction '{user.name}' calls "
        f"unknown computation '{name}' (is the module truncated?)"
      )
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

  def instr(self, ins: Instr, comp: Computation) -> float:
    """Flops of instruction `ins` of computation `comp`."""
    op, attrs = ins.opcode, ins.attrs
    operand = lambda k: comp.by_name[ins.operands[k]].shape
    out_elems = shape_elements(ins.shape)
    try:
      if op in _DATA_MOVEMENT:  # Before `calls`: an all-reduce calls its reducer.
        return 0.0
      if op in ("fusion", "call", "async-start") or (op.endswith("-start") and "calls=" in attrs):
        called = comp_names(attr(attrs, "calls") or attr(attrs, "to_apply"))
        return sum(self.computation(c, ins) for c in called)
      if op == "while":
        body = self.computation(comp_names(attr(attrs, "body"))[0], ins)
        cond = self.computation(comp_names(attr(attrs, "condition"))[0], ins)
        return (body + cond) * (trip_count(attrs) or 1)
      if op == "conditional":
        branches = comp_names(attr(attrs, "branch_computations")) or [
          c
          for key in ("true_computation", "false_computation")
          for c in comp_names(attr(attrs, key))
        ]
        return max((self.computation(c, ins) for c in branches), default=0.0)
      if op == "dot":
        lhs = operand(0)
        k = math.prod(lhs.dims[d] for d in int_list(attr(attrs, "lhs_contracting_dims")))
        return 2.0 * out_elems * k
      if op == "convolution":
        return _conv_flops(ins, operand(0), operand(1))
      if op == "custom-call":
        flops = _custom_call_flops(ins, [operand(k) for k in range(len(ins.operands))])
        if flops == 0.0:
          target = attr(attrs, "custom_call_target") or "?"
          self.notes.warn(
            f"custom-call '{target}'",
            ins.name,
            "its cost is unknown: 0 flops, and its operands and results are charged whole",
          )
        return flops
      if op == "reduce":
        n = max(1, len(ins.operands) // 2)
        return float(sum(shape_elements(operand(k)) for k in range(n)))
      if op == "reduce-window":
        window = _window_size(attrs)
        return float(out_elems * math.prod(window))
      if op == "select-and-scatter":
        return float(shape_elements(operand(0)) * math.prod(_window_size(attrs)))
      return float(out_elems)
    except WorkloadError:
      raise
    except (IndexError, AttributeError, KeyError, TypeError, ValueError, ZeroDivisionError) as e:
      raise WorkloadError(
        f"{self.where}: {ins.at}cannot count the flops of "
        f"'{ins.name}' ({op}): malformed shapes or attributes "
        f"({type(e).__name__})"
      ) from None


def trip_count(attrs: str) -> int | None:
  """A while loop's trip count, where XLA printed one in its backend_config
  (`"known_trip_count":{"n":"5"}`); None where it did not (the count is data dependent)."""
  m = re.search(r'known_trip_count"?\s*:\s*\{\s*"?n"?\s*:\s*"?(\d+)', attrs)
  return int(m.group(1)) if m else None


def _window_size(attrs: str) -> list[int]:
  window = attr(attrs, "window") or ""
  m = re.search(r"size=([0-9x]+)", window)
  return [int(x) for x in m.group(1).split("x")] if m else [1]


def _conv_flops(ins: Instr, lhs: Shape, kernel: Shape) -> float:
  """2 x (output batch x output features) x (input features per group) x, for every spatial
  dimension, the number of (output position, kernel tap) pairs that land on a real input
  element (not padding, not a hole of `lhs_dilate`), as XLA's HloCostAnalysis counts them.

  Falls back to 2 * prod(output) * prod(kernel) / (kernel output features) when the
  dimension labels cannot be read."""
  out = next(leaf for _, leaf in leaves(ins.shape))
  labels = attr(ins.attrs, "dim_labels") or ""
  m = re.fullmatch(r"([a-z0-9]+)_([a-z0-9]+)->([a-z0-9]+)", labels)
  if m and isinstance(lhs, Array) and isinstance(kernel, Array):
    in_l, k_l, out_l = m.groups()
    spatial = sorted(c for c in k_l if c.isdigit())
    window = _window(ins.attrs, len(spatial))
    if (
      len(in_l) == len(lhs.dims)
      and len(k_l) == len(kernel.dims) == len(in_l)
      and len(out_l) == len(out.dims)
      and window is not None
      and all(c in in_l and c in out_l for c in spatial + ["b", "f"])
      and "i" in k_l
    ):
      total = (
        2.0 * out.dims[out_l.index("b")] * out.dims[out_l.index("f")] * kernel.dims[k_l.index("i")]
      )
      for d, c in enumerate(spatial):
        size, stride, (pad_lo, _), lhs_dil, rhs_dil = (w[d] for w in window)
        total *= _valid_taps(
          lhs.dims[in_l.index(c)],
          out.dims[out_l.index(c)],
          kernel.dims[k_l.index(c)],
          stride,
          pad_lo,
          lhs_dil,
          rhs_dil,
        )
      return total
  o_index = len(kernel.dims) - 1
  if m and "o" in m.group(2) and len(m.group(2)) == len(kernel.dims):
    o_index = m.group(2).index("o")
  return 2.0 * out.elements * math.prod(kernel.dims) / max(1, kernel.dims[o_index])


def _window(attrs: str, rank: int) -> list[list[Any]] | None:
  """[sizes, strides, pads, lhs dilations, rhs dilations] of a `window={...}` attribute."""
  text = attr(attrs, "window")
  if text is None:
    return [[1] * rank, [1] * rank, [(0, 0)] * rank, [1] * rank, [1] * rank] if rank == 0 else None
  fields = dict(f.split("=", 1) for f in text.split() if "=" in f)

  def ints(key: str, default: int) -> list[int]:
    return [int(x) for x in fields[key].split("x")] if key in fields else [default] * rank

  pads = (
    [tuple(int(v) for v in p.split("_")) for p in fields["pad"].split("x")]
    if "pad" in fields
    else [(0, 0)] * rank
  )
  result = [ints("size", 1), ints("stride", 1), pads, ints("lhs_dilate", 1), ints("rhs_dilate", 1)]
  return result if all(len(r) == rank for r in result) else None


def _valid_taps(
  in_size: int,
  out_size: int,
  kernel_size: int,
  stride: int,
  pad_lo: int,
  lhs_dil: int,
  rhs_dil: int,
) -> int:
  """Number of (output position, kernel tap) pairs of one spatial dimension that read a real
  input element."""
  o = np.arange(out_size, dtype=np.int64) * stride - pad_lo
  last, lhs_dil = (in_size - 1) * lhs_dil, max(1, lhs_dil)
  count = 0
  for k in range(kernel_size):  # One tap at a time keeps memory at O(out_size).
    j = o + k * rhs_dil  # Index into the lhs-dilated input.
    count += int(((j >= 0) & (j <= last) & (j % lhs_dil == 0)).sum())
  return count


def _custom_call_flops(ins: Instr, operands: list[Shape]) -> float:
  target = (attr(ins.attrs, "custom_call_target") or "").lower()
  arrays = [s for s in operands if isinstance(s, Array)]
  out = next((leaf for _, leaf in leaves(ins.shape)), None)
  if out is None or not out.dims:
    return 0.0
  if any(k in target for k in ("matmul", "gemm", "dot")) and arrays:
    return 2.0 * arrays[0].elements * out.dims[-1]
  if "conv" in target and len(arrays) >= 2 and attr(ins.attrs, "dim_labels"):
    return _conv_flops(ins, arrays[0], arrays[1])
  return 0.0


def operand_bytes(ins: Instr, k: int, comps: dict[str, Computation]) -> int | None:
  """Bytes op `ins` reads of its operand k when XLA's cost analysis charges less than all of
  it; None for all of it."""
  op = ins.opcode
  if op in _PARTIAL_READS and k == 0:
    return shape_bytes(ins.shape)
  if op == "dynamic-update-slice" and k == 0:
    return 0  # Updated in place: the operand's untouched part is neither read nor written.
  if op in ("fusion", "call"):
    return _called_parameter_bytes(ins, k, comps, 0)
  return None


def _called_parameter_bytes(
  ins: Instr, k: int, comps: dict[str, Computation], depth: int
) -> int | None:
  """Bytes a fusion or call reads of its operand k: what its computation reads of
  `parameter(k)` (the CPU backend wraps fusions in calls, so both are followed)."""
  called = _fused_computation(ins, comps)
  param = _fused_parameter(called, k) if called else None
  if param is None or not isinstance(param.shape, Array) or depth > 8:
    return None
  return _fused_parameter_bytes(called, param.name, comps, depth + 1)


def _fused_computation(ins: Instr, comps: dict[str, Computation]) -> Computation | None:
  called = comp_names(attr(ins.attrs, "calls") or attr(ins.attrs, "to_apply"))
  return comps.get(called[0]) if called else None


def _fused_parameter(fused: Computation, k: int) -> Instr | None:
  """The fused computation's `parameter(k)`."""
  for ins in fused.instrs:
    if ins.opcode == "parameter" and ins.number == k:
      return ins
  return None


def _fused_parameter_bytes(
  fused: Computation, name: str, comps: dict[str, Computation], depth: int
) -> int | None:
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
        sub = (
          _fused_parameter_bytes(fused, user.name, comps, depth)
          if user.opcode == "bitcast"
          else _called_parameter_bytes(user, k, comps, depth)
        )
        if sub is None:
          return None
        total += sub
      elif user.opcode in _PARTIAL_READS and k == 0:
        total += shape_bytes(user.shape)
      elif user.opcode == "dynamic-update-slice" and k == 0:
        pass
      else:
        return None
  return total


def result_bytes(ins: Instr, comps: dict[str, Computation], entry: Computation) -> Any:
  """Bytes an op writes of its result when XLA charges less than all of it (a value tree
  shaped like the result, None for all of it): a dynamic-update-slice, or a fusion whose root
  (or a root tuple's element) is one, writes only the update in place."""

  def update_bytes(dus: Instr, comp: Computation) -> int | None:
    return shape_bytes(comp.by_name[dus.operands[1]].shape) if len(dus.operands) > 1 else None

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
    return tuple(
      update_bytes(fused.by_name[o], fused)
      if fused.by_name[o].opcode == "dynamic-update-slice"
      else None
      for o in root.operands
    )
  return None
