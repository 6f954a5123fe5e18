"""Generated programs whose statistics are those of compiled ones: mosaics of compiled windows.

`mosaic_workload` lays windows of consecutive ops, cut from compiled reference programs, end to
end until the program has the buffers asked for. Inside a window every op keeps its flops and
every buffer its size, kind, uses and partial reads, so the distributions a solver meets (sizes,
lifetimes, reuse distances, arithmetic intensity, parameter shares) are the references' own; what
is new is the mix of windows and the program's length. At a cut:

* a buffer defined before the window and read inside it becomes an `input` (a parameter stays a
  parameter), read only at its uses inside the window;
* a buffer's uses after the window are dropped: it dies at its last use inside it (or, with none
  left, right after it is written);
* a program output becomes an activation read at its window's last op, except in the last window,
  so that outputs do not pile up to the end of the mosaic (the references' outputs are mostly
  updated parameters, written at their step's end).

The generator never reads a program outside `references`: the corpus passes only its own compiled
programs, so no held-out or evaluation program reaches a mosaic.
"""

from __future__ import annotations

from typing import Any, Sequence

import numpy as np

from malloczero.common.errors import WorkloadError
from malloczero.env.workload import Workload
from malloczero.env.workload_json import workload_from_dict, workload_to_dict

# Window lengths in ops, drawn log-uniformly: a layer or two to a few blocks of a compiled program.
DEFAULT_WINDOW_OPS = (40, 400)
SOURCE = "generated (mosaic of compiled programs' windows)"


def _window(program: dict[str, Any], start: int, stop: int, offset: int, last: bool) -> tuple:
  """The ops [start, stop) of `program` (a `workload_to_dict` document) as ([flops], [buffers])
  at op `offset` of the mosaic; buffer ids are left for the caller to number."""
  ops = program["ops"][start:stop]
  buffers = []
  for b in program["buffers"]:
    keep = [i for i, u in enumerate(b["uses"]) if start <= u < stop]
    defined = b["def"] is not None and start <= b["def"] < stop
    if not defined and not keep:
      continue
    uses = [b["uses"][i] - start + offset for i in keep]
    kind = b["kind"]
    if not defined:
      kind = kind if kind in ("parameter", "input") else "input"
    elif kind == "output" and not last:
      kind = "activation"
      end = stop - 1 - start + offset
      uses = sorted(set(uses) | ({end} if end > b["def"] - start + offset else set()))
    elif kind not in ("activation", "output"):
      kind = "activation"
    buffer = {
      "name": b["name"],
      "size": b["size"],
      "def": None if not defined else b["def"] - start + offset,
      "uses": uses,
      "kind": kind,
    }
    if b.get("use_bytes") is not None:
      buffer["use_bytes"] = [b["use_bytes"][i] for i in keep]
    if defined and b.get("def_bytes") is not None:
      buffer["def_bytes"] = b["def_bytes"]
    buffers.append(buffer)
  return [dict(op, name=f"{program['name']}/{op['name']}") for op in ops], buffers


def mosaic_workload(
  references: Sequence[Workload],
  num_buffers: int,
  seed: int = 0,
  window_ops: tuple[int, int] = DEFAULT_WINDOW_OPS,
  name: str | None = None,
) -> Workload:
  """A program of about `num_buffers` buffers (at least, by less than one window) made of windows
  of `references`' schedules, each window from a reference and a start drawn uniformly, its
  length log-uniform in `window_ops` (at most half of `num_buffers`).

  Raises WorkloadError without references or for a non-positive size."""
  if not references:
    raise WorkloadError("a mosaic needs at least one reference program")
  if num_buffers < 1:
    raise WorkloadError(f"a mosaic needs a positive number of buffers, got {num_buffers}")
  # Seeded by the size too: two sizes with one seed are two programs, not one's prefix.
  rng = np.random.default_rng([seed, num_buffers])
  documents = [workload_to_dict(w) for w in references]
  # Windows of at most about half the program: a small one is still several windows.
  shortest, longest = window_ops[0], min(window_ops[1], max(window_ops[0], num_buffers // 2))
  low, high = np.log(shortest), np.log(longest)
  pieces: list[tuple[dict, int, int]] = []
  counted = 0
  while counted < num_buffers:
    program = documents[int(rng.integers(len(documents)))]
    length = min(len(program["ops"]), int(np.exp(rng.uniform(low, high))))
    start = int(rng.integers(len(program["ops"]) - length + 1))
    pieces.append((program, start, start + length))
    counted += len(_window(program, start, start + length, 0, False)[1])
  ops, buffers = [], []
  for i, (program, start, stop) in enumerate(pieces):
    window_ops_, window_buffers = _window(program, start, stop, len(ops), i == len(pieces) - 1)
    ops += window_ops_
    for b in window_buffers:
      buffers.append(dict(b, id=len(buffers), name=f"w{i}/{b['name']}"))
  used = sorted({p[0]["name"] for p in pieces})
  return workload_from_dict(
    {
      "name": name or f"mosaic-n{num_buffers}-s{seed}",
      "source": f"{SOURCE}: {len(pieces)} windows of {', '.join(used)}",
      "ops": ops,
      "buffers": buffers,
    },
    where=name or "mosaic",
  )
