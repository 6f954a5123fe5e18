"""The workload JSON format (`.json`, or gzipped `.json.gz`), read strictly, and the workload
files of every format: `load_workload` and `save_workload` choose JSON or MiniMalloc's CSV
(env/minimalloc_csv.py) by the file's extension; `workload_format` also tells HLO text modules
(`.hlo`, `.txt`, or content starting `HloModule`), which the importer converts, not this loader.

JSON format (docs/design.md)::

  {"name": str, "source": str,
   "ops": [{"name": str, "flops": number,                  # in schedule order
            "weight": int,                                  # optional, default 1
            "loop_depth": int}, ...],                       # optional, default 0
   "buffers": [{"id": int, "name": str, "size": int,         # id >= 0, unique; size in bytes
                "def": int | null,                           # defining op; null = program start
                "uses": [int, ...],                          # ops that read it: sorted, unique
                "kind": "activation" | "parameter" | "input" | "output",
                "use_bytes": [int, ...],                     # optional, parallel to uses
                "def_bytes": int}, ...]}                     # optional

What each field means is the model's (env/workload.py). `use_bytes` and `def_bytes` are checked
on load: `use_bytes` needs the same length as `uses` (strictly increasing, as always, so the
pairing is unambiguous), and every value an integer `0 <= bytes <= size`; `def_bytes` needs a
defining op and the same bounds. Both keys are omitted on save when every value equals `size`,
so files without partial accesses are unchanged.

Every value is checked before it becomes part of a workload, each failure one line naming the
file (or the workload) and the op or buffer. Nearly every op and buffer of a file is plain
(`_plain_op`, `_plain_buffer`): those are checked in one pass, and the checks one key at a time,
with their messages, judge the others.
"""

from __future__ import annotations

import gzip
import itertools
import json
import math
import os
from typing import Any, Mapping, Sequence

import numpy as np

from malloczero.common import strict_json
from malloczero.common.errors import WorkloadError
from malloczero.common.files import write_bytes
from malloczero.common.strict_json import show_value, unknown_key
from malloczero.common.units import show_int
from malloczero.env.minimalloc_csv import workload_from_minimalloc_csv, workload_to_minimalloc_csv
from malloczero.env.workload import (
  MAX_FILE_INT,
  MAX_LOOP_DEPTH,
  PROGRAM_START,
  Buffer,
  Op,
  Workload,
  collection_paused,
  fail,
  finite_number,
  frozen_instances,
  int_out_of_range,
  is_int,
)

# The keys of a workload file at each level; any other is refused (a misspelt optional key such
# as 'use_byte' would otherwise be ignored without a word).
WORKLOAD_KEYS = ("name", "source", "ops", "buffers")
OP_KEYS = ("name", "flops", "weight", "loop_depth")
BUFFER_KEYS = ("id", "name", "size", "def", "uses", "kind", "use_bytes", "def_bytes")


def workload_to_dict(w: Workload) -> dict[str, Any]:
  """The JSON document of `w` (per-access bytes only where some are less than the size)."""
  buffers = []
  for b in w.buffers:
    entry = {
      "id": b.id,
      "name": b.name,
      "size": b.size,
      "def": None if b.def_op == PROGRAM_START else b.def_op,
      "uses": list(b.uses),
      "kind": b.kind,
    }
    if b.use_bytes is not None:
      entry["use_bytes"] = list(b.use_bytes)
    if b.def_bytes is not None:
      entry["def_bytes"] = b.def_bytes
    buffers.append(entry)
  return {
    "name": w.name,
    "source": w.source,
    "ops": [
      {
        "name": o.name,
        "flops": o.flops,
        **({"weight": o.weight} if o.weight != 1 else {}),
        **({"loop_depth": o.loop_depth} if o.loop_depth else {}),
      }
      for o in w.ops
    ],
    "buffers": buffers,
  }


def _plain_op_indices(uses: Any) -> bool:
  """Whether `uses` is a list of Python ints within the file limit, each larger than the one
  before: what nearly every buffer of a file has, checked at once (the checks one value at a
  time, with their messages, run on a list that is not)."""
  return (
    type(uses) is list
    and all(type(u) is int for u in uses)
    and (not uses or (-MAX_FILE_INT <= uses[0] and uses[-1] <= MAX_FILE_INT))
    and all(map(int.__lt__, uses, uses[1:]))
  )


def _one_line(text: str) -> bool:
  """Whether `text` can stand in a one-line message (no line break or other control character)."""
  return text.isprintable()


def _plain_op(op: Any, known: frozenset[str], t: int) -> Op | None:
  """Op `t` when it is what nearly every op of a file is (known keys; a printable name, a
  finite float or small int of flops >= 0, a small int weight >= 1 and a loop depth, each where
  given), in
  one pass; else None, and the checks one key at a time, with their messages, judge it."""
  if type(op) is not dict or not known.issuperset(op):
    return None
  name = op.get("name", None)
  if name is None:
    if "name" in op:
      return None
    name = f"op{t}"
  flops, weight, depth = op.get("flops", 0.0), op.get("weight", 1), op.get("loop_depth", 0)
  if not (
    type(name) is str
    and name.isprintable()
    and (type(flops) is float or (type(flops) is int and flops <= MAX_FILE_INT))
    and 0.0 <= flops < math.inf
    and type(weight) is int
    and 1 <= weight <= MAX_FILE_INT
    and type(depth) is int
    and 0 <= depth <= MAX_LOOP_DEPTH
  ):
    return None
  return Op(name, float(flops), weight, depth)


def _plain_buffer(b: Any, known: frozenset[str]) -> Buffer | None:
  """As `_plain_op`, a buffer: known keys, a small int id >= 0, small ints of size and
  definition (or no definition), a printable name where given, a kind string and plain uses
  (`_plain_op_indices`), without per-access bytes."""
  if type(b) is not dict or not known.issuperset(b) or "use_bytes" in b or "def_bytes" in b:
    return None
  bid, size, def_op, kind = b.get("id"), b.get("size"), b.get("def"), b.get("kind")
  name = b.get("name", None)
  if name is None:
    if "name" in b:
      return None
    name = f"b{bid}"
  if def_op is None:
    def_op = PROGRAM_START
  if not (
    type(bid) is int
    and 0 <= bid <= MAX_FILE_INT
    and type(size) is int
    and -MAX_FILE_INT <= size <= MAX_FILE_INT
    and type(def_op) is int
    and -MAX_FILE_INT <= def_op <= MAX_FILE_INT
    and type(kind) is str
    and type(name) is str
    and name.isprintable()
    and _plain_op_indices(b.get("uses"))
  ):
    return None
  return Buffer(bid, name, size, def_op, tuple(b["uses"]), kind)


def _plain_ops(raw_ops: list, known: frozenset[str]) -> list[Op] | None:
  """Every op of a file when all are plain (`_plain_op`'s checks, made column by column: one
  Python call per op was most of reading a program of 100,000 ops); else None, and the ops are
  read one at a time."""
  if not all(type(op) is dict for op in raw_ops) or not all(map(known.issuperset, raw_ops)):
    return None
  names = [op.get("name") for op in raw_ops]
  if None in names:
    if any(name is None and "name" in op for name, op in zip(names, raw_ops)):
      return None
    names = [f"op{t}" if name is None else name for t, name in enumerate(names)]
  flops = [op.get("flops", 0.0) for op in raw_ops]
  weights = [op.get("weight", 1) for op in raw_ops]
  depths = [op.get("loop_depth", 0) for op in raw_ops]
  if not (
    set(map(type, names)) <= {str}
    and all(map(str.isprintable, names))
    and set(map(type, flops)) <= {float, int}
    and set(map(type, weights)) <= {int}
    and set(map(type, depths)) <= {int}
  ):
    return None
  if not (
    all(0.0 <= f < math.inf for f in flops)  # Not NaN either.
    and all(f <= MAX_FILE_INT for f in flops if type(f) is int)
    and (not weights or (1 <= min(weights) and max(weights) <= MAX_FILE_INT))
    and (not depths or (0 <= min(depths) and max(depths) <= MAX_LOOP_DEPTH))
  ):
    return None
  return frozen_instances(
    Op,
    [
      {"name": name, "flops": float(f), "weight": weight, "loop_depth": depth}
      for name, f, weight, depth in zip(names, flops, weights, depths)
    ],
  )


def _plain_buffers(raw_buffers: list, known: frozenset[str]) -> list[Buffer] | None:
  """Every buffer of a file when all are plain (`_plain_buffer`'s checks, made column by
  column); else None, and the buffers are read one at a time."""
  partial = frozenset(("use_bytes", "def_bytes"))
  if (
    not all(type(b) is dict for b in raw_buffers)
    or not all(map(known.issuperset, raw_buffers))
    or not all(map(partial.isdisjoint, raw_buffers))
  ):
    return None
  ids = [b.get("id") for b in raw_buffers]
  sizes = [b.get("size") for b in raw_buffers]
  defs = [b.get("def") for b in raw_buffers]
  kinds = [b.get("kind") for b in raw_buffers]
  uses = [b.get("uses") for b in raw_buffers]
  names = [b.get("name") for b in raw_buffers]
  if None in names:
    if any(name is None and "name" in b for name, b in zip(names, raw_buffers)):
      return None
    names = [f"b{bid}" if name is None else name for bid, name in zip(ids, names)]
  if None in defs:
    defs = [PROGRAM_START if d is None else d for d in defs]
  if not (
    set(map(type, ids)) <= {int}
    and set(map(type, sizes)) <= {int}
    and set(map(type, defs)) <= {int}
    and set(map(type, kinds)) <= {str}
    and set(map(type, names)) <= {str}
    and all(map(str.isprintable, names))
    and set(map(type, uses)) <= {list}
  ):
    return None
  flat = list(itertools.chain.from_iterable(uses))
  if not set(map(type, flat)) <= {int}:
    return None
  if raw_buffers and not (
    0 <= min(ids)
    and max(ids) <= MAX_FILE_INT
    and -MAX_FILE_INT <= min(sizes)
    and max(sizes) <= MAX_FILE_INT
    and -MAX_FILE_INT <= min(defs)
    and max(defs) <= MAX_FILE_INT
    and (not flat or (-MAX_FILE_INT <= min(flat) and max(flat) <= MAX_FILE_INT))
  ):
    return None
  # Each buffer's uses strictly increasing: every step between neighbours of one list.
  steps = np.diff(np.array(flat, np.int64))
  first = np.cumsum([len(u) for u in uses])[:-1] - 1  # The step from one list into the next.
  first = first[(first >= 0) & (first < len(steps))]
  increasing = np.ones(len(steps), bool)
  increasing[first] = False
  if np.any(steps[increasing] <= 0):
    return None
  return frozen_instances(
    Buffer,
    [
      {
        "id": bid,
        "name": name,
        "size": size,
        "def_op": def_op,
        "uses": tuple(used),
        "kind": kind,
        "use_bytes": None,
        "def_bytes": None,
      }
      for bid, name, size, def_op, used, kind in zip(ids, names, sizes, defs, uses, kinds)
    ],
  )


def _ops_one_by_one(raw_ops: list, where: str) -> list[Op]:
  """The ops of a file checked one at a time, each failure with its message."""
  ops = []
  op_keys = frozenset(OP_KEYS)
  for t, op in enumerate(raw_ops):
    if (plain_op := _plain_op(op, op_keys, t)) is not None:
      ops.append(plain_op)
      continue
    if not isinstance(op, Mapping):
      fail(where, f"op {t}: expected an object, got {type(op).__name__}")
    if problem := unknown_key(op, OP_KEYS):
      fail(where, f"op {t}: {problem}")
    op_name = op.get("name", f"op{t}")
    flops = op.get("flops", 0.0)
    if not isinstance(op_name, str) or not _one_line(op_name):
      fail(where, f"op {t}: 'name' must be a string of printable text, got {show_value(op_name)}")
    if finite_number(flops) is None or flops < 0:
      fail(
        where,
        f"op {t} ('{op_name}'): 'flops' must be a finite number >= 0, got {show_value(flops)}",
      )
    weight = op.get("weight", 1)
    if not is_int(weight) or not 1 <= weight <= MAX_FILE_INT:
      fail(
        where,
        f"op {t} ('{op_name}'): 'weight' must be an integer from 1 to 2**60, got "
        f"{show_int(weight) if is_int(weight) else show_value(weight)}",
      )
    depth = op.get("loop_depth", 0)
    if not is_int(depth) or not 0 <= depth <= MAX_LOOP_DEPTH:
      fail(
        where,
        f"op {t} ('{op_name}'): 'loop_depth' must be an integer from 0 to {MAX_LOOP_DEPTH}, got "
        f"{show_int(depth) if is_int(depth) else show_value(depth)}",
      )
    ops.append(Op(op_name, float(flops), int(weight), int(depth)))
  return ops


def _buffers_one_by_one(raw_buffers: list, where: str) -> list[Buffer]:
  """The buffers of a file checked one at a time, each failure with its message."""
  buffers = []
  buffer_keys = frozenset(BUFFER_KEYS)
  for i, b in enumerate(raw_buffers):
    if (plain_buffer := _plain_buffer(b, buffer_keys)) is not None:
      buffers.append(plain_buffer)
      continue
    if not isinstance(b, Mapping):
      fail(where, f"buffer #{i}: expected an object, got {type(b).__name__}")
    if problem := unknown_key(b, BUFFER_KEYS):
      fail(where, f"buffer #{i}: {problem}")
    for key in ("id", "size", "uses", "kind"):
      if key not in b:
        fail(where, f"buffer #{i}: missing required key '{key}'")
    bid = b["id"]
    if not is_int(bid):
      fail(where, f"buffer #{i}: 'id' must be an integer, got {show_value(bid)}")
    if problem := int_out_of_range(bid, "id"):
      fail(where, f"buffer #{i}: {problem}")
    if bid < 0:
      fail(where, f"buffer #{i}: 'id' must be >= 0, got {bid}")
    label = f"buffer {bid}"
    size, def_op, uses, kind = b["size"], b.get("def"), b["uses"], b["kind"]
    bname = b.get("name", f"b{bid}")
    if not isinstance(bname, str) or not _one_line(bname):
      fail(where, f"{label}: 'name' must be a string of printable text, got {show_value(bname)}")
    if not is_int(size):
      fail(
        where,
        f"{label} ('{bname}'): 'size' must be an integer number of bytes, got {show_value(size)}",
      )
    if def_op is None:
      def_op = PROGRAM_START
    elif not is_int(def_op):
      fail(
        where, f"{label} ('{bname}'): 'def' must be an op index or null, got {show_value(def_op)}"
      )
    if not isinstance(uses, list) or not all(is_int(u) for u in uses):
      fail(
        where, f"{label} ('{bname}'): 'uses' must be a list of op indices, got {show_value(uses)}"
      )
    if not isinstance(kind, str):
      fail(where, f"{label} ('{bname}'): 'kind' must be a string, got {show_value(kind)}")
    for key, value in (("size", size), ("def", def_op), *(("uses", u) for u in uses)):
      if problem := int_out_of_range(value, key):
        fail(where, f"{label} ('{bname}'): {problem}")
    if (k := next((k for k in range(1, len(uses)) if uses[k - 1] >= uses[k]), None)) is not None:
      fail(
        where,
        f"{label} ('{bname}'): 'uses' must be sorted with each op once, got "
        f"{uses[k]} after {uses[k - 1]}",
      )
    use_bytes, def_bytes = b.get("use_bytes"), b.get("def_bytes")
    if use_bytes is not None:
      if not isinstance(use_bytes, list) or not all(is_int(x) for x in use_bytes):
        fail(
          where,
          f"{label} ('{bname}'): 'use_bytes' must be a list of integers, got "
          f"{show_value(use_bytes)}",
        )
      if len(use_bytes) != len(uses):
        fail(
          where,
          f"{label} ('{bname}'): 'use_bytes' has {len(use_bytes)} entries for {len(uses)} uses",
        )
      for x in use_bytes:
        if problem := int_out_of_range(x, "use_bytes"):
          fail(where, f"{label} ('{bname}'): {problem}")
      use_bytes = tuple(int(x) for x in use_bytes)
    if def_bytes is not None:
      if not is_int(def_bytes):
        fail(
          where, f"{label} ('{bname}'): 'def_bytes' must be an integer, got {show_value(def_bytes)}"
        )
      if problem := int_out_of_range(def_bytes, "def_bytes"):
        fail(where, f"{label} ('{bname}'): {problem}")
      def_bytes = int(def_bytes)
    buffers.append(
      Buffer(
        int(bid),
        bname,
        int(size),
        int(def_op),
        tuple(int(u) for u in uses),
        kind,
        *_normal_access_bytes(use_bytes, def_bytes, int(size)),
      )
    )
  return buffers


def workload_from_dict(data: Any, where: str = "workload") -> Workload:
  """The workload of a JSON document (`data` as `json.loads` returns it), checked strictly:
  every failure is a one-line WorkloadError starting with `where`."""
  if not isinstance(data, Mapping):
    fail(where, f"expected a JSON object at the top level, got {type(data).__name__}")
  if problem := unknown_key(data, WORKLOAD_KEYS):
    fail(where, problem)
  for key in ("ops", "buffers"):
    if key not in data:
      fail(where, f"missing required key '{key}'")
  name = data.get("name", os.path.splitext(os.path.basename(where))[0])
  source = data.get("source", "unknown")
  if not isinstance(name, str) or not isinstance(source, str):
    fail(where, "'name' and 'source' must be strings")
  if not _one_line(name) or not _one_line(source):
    fail(where, "'name' and 'source' must be printable text without line breaks")
  raw_ops, raw_buffers = data["ops"], data["buffers"]
  if not isinstance(raw_ops, list):
    fail(where, f"'ops' must be a list, got {type(raw_ops).__name__}")
  if not isinstance(raw_buffers, list):
    fail(where, f"'buffers' must be a list, got {type(raw_buffers).__name__}")
  ops = _plain_ops(raw_ops, frozenset(OP_KEYS))
  if ops is None:
    ops = _ops_one_by_one(raw_ops, where)
  buffers = _plain_buffers(raw_buffers, frozenset(BUFFER_KEYS))
  if buffers is None:
    buffers = _buffers_one_by_one(raw_buffers, where)
  try:
    return Workload(name, source, tuple(ops), tuple(buffers))
  except WorkloadError as e:
    raise WorkloadError(f"{where}: {getattr(e, 'detail', e)}") from None


def _normal_access_bytes(
  use_bytes: tuple[int, ...] | None, def_bytes: int | None, size: int
) -> tuple[tuple[int, ...] | None, int | None]:
  """None where every access is the whole buffer, so that a file that spells out full sizes
  loads equal to (and saves as) one that omits them."""
  if use_bytes is not None and all(x == size for x in use_bytes):
    use_bytes = None
  if def_bytes == size:
    def_bytes = None
  return use_bytes, def_bytes


# HLO text modules, which `solve`, `validate` and `train --workload` import on first use (the
# command line's launch/hlo_input.py); XLA's dumps end in `.txt`.
HLO_EXTENSIONS = (".hlo", ".txt")


def workload_format(path: str | os.PathLike) -> str:
  """'csv', 'hlo' (an HLO text module) or 'json', by the extension (`.csv`; `.hlo`, `.txt`;
  `.json`, `.json.gz`), else by the content: a file that starts with `HloModule`, as every printed
  module does, is HLO text, and anything else is read as JSON (whose errors then say why)."""
  path = os.fspath(path)
  if path.endswith(".csv"):
    return "csv"
  if path.endswith(HLO_EXTENSIONS):
    return "hlo"
  if path.endswith((".json", ".json.gz")):
    return "json"
  if not os.path.isfile(path):  # A FIFO would block here; reading it says why it is refused.
    return "json"
  try:
    with open(path, "rb") as f:
      head = f.read(4096)
  except OSError:
    return "json"  # Reading it again says why it cannot be read.
  return "hlo" if head.lstrip().startswith(b"HloModule") else "json"


def load_workload(path: str | os.PathLike) -> Workload:
  """Loads `.json`, `.json.gz` or MiniMalloc `.csv`; every failure is a one-line WorkloadError.
  An HLO text module is refused with where it is imported: converting one is the importer's work
  (env/programs/hlo_import/), which needs XLA, and this loader is the game core's."""
  path = os.fspath(path)
  base = os.path.basename(path)
  stem = base.split(".")[0]
  if not os.path.exists(path):
    raise WorkloadError(f"{path}: no such workload file")
  if workload_format(path) == "hlo":
    raise WorkloadError(
      f"{path}: an HLO text module, not a workload file: `malloczero solve`, `validate` and "
      "`train --workload` import it on first use, `malloczero import-hlo` writes its workload "
      "file (in Python: malloczero.env.programs.hlo_import.import_hlo_text)"
    )
  text = strict_json.read_text(path, WorkloadError)
  if path.endswith(".csv"):
    try:
      return workload_from_minimalloc_csv(text, name=stem)
    except WorkloadError as e:  # Named after the file, not the workload it would have been.
      raise WorkloadError(f"{path}: {getattr(e, 'detail', e)}") from None
  with collection_paused():
    return workload_from_dict(strict_json.loads(text, path, WorkloadError), where=path)


def save_workload(w: Workload, path: str | os.PathLike) -> None:
  path = os.fspath(path)
  if path.endswith(".csv"):
    text = workload_to_minimalloc_csv(w)
  else:
    text = json.dumps(workload_to_dict(w), separators=(",", ":"))
  data = text.encode("utf-8")
  write_bytes(path, gzip.compress(data) if path.endswith(".gz") else data)


def workload_from_ops(
  name: str, source: str, op_flops: Sequence[float], buffers: Sequence[dict[str, Any]]
) -> Workload:
  """Convenience constructor from plain Python values (importers and generators use it)."""
  return workload_from_dict(
    {
      "name": name,
      "source": source,
      "ops": [{"name": f"op{t}", "flops": f} for t, f in enumerate(op_flops)],
      "buffers": list(buffers),
    },
    where=name,
  )
