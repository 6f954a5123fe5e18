"""A mapping written back as XLA's own msa overrides: the `PreferredPrefetchOverrides` and
`MsaSortOrderOverrides` that steer XLA's msa from its own mapping toward the one found.

XLA's msa takes two kinds of advice (overrides.py says how it matches them): when to prefer to
start a use's prefetch, and which buffers to allocate first or last. So a mapping is compared use
by use with msa's own (`use_services`: each use of each buffer read from default memory, kept in
a fast level, or prefetched into one from a start), and:

* a use the mapping prefetches from another start than msa's, or prefetches where msa leaves it
  in default memory, gets a preferred-prefetch override: the use matched by its instruction's
  name and the buffer's size (`instruction_name_regex`, `size_gte` = `size_lte`), its start the
  op after which the copy is issued (`after_instruction`; `before_instruction` the first op for a
  copy issued at the program's start). Only these are written, not every prefetch: XLA charges a
  copy whose start an override prefers no bandwidth, so pinning msa's own prefetches too would
  change what msa's other decisions see;
* buffers the search deferred (evo-msa's `defer`) get `assign_last`, in reverse order, so that
  XLA allocates them last in the order they were.

What the overrides cannot say (`Exported.not_expressible`, counted per kind): a use read from
default memory where msa puts it in fast memory (XLA's overrides have no "keep in default
memory"), a use kept in fast memory where msa copies it or leaves it (a keep is msa's first
choice wherever it fits; no override forbids or forces it), a use served from another fast level
than msa's (XLA has one alternate memory), a prefetch where msa keeps (the keep is tried first),
and anything about chunk offsets (XLA's chunk search is not steerable) or evictions (when a
buffer is evicted follows from its segments).
"""

from __future__ import annotations

import collections
import dataclasses
import re
from typing import Any, Iterable

import numpy as np

from malloczero.common.files import write_text
from malloczero.env.cost_model import Allocations
from malloczero.env.msa.overrides import buffer_position
from malloczero.env.msa.xla_proto import PREFERRED_PREFETCH, SORT_ORDER, message_class, to_text
from malloczero.env.workload import Workload

# How a use is served: ("default",), ("keep", level) or ("prefetch", level, start).
Service = tuple


def use_services(workload: Workload, allocations: Allocations) -> dict[tuple[int, int], Service]:
  """Per (buffer, use op): how `allocations` serves that use."""
  services: dict[tuple[int, int], Service] = {}
  by_buffer: dict[int, list[int]] = collections.defaultdict(list)
  for row, b in enumerate(np.asarray(allocations.buffer).tolist()):
    by_buffer[b].append(row)
  start, end = np.asarray(allocations.start), np.asarray(allocations.end)
  done, level = np.asarray(allocations.prefetch_done), np.asarray(allocations.level)
  for buffer in workload.buffers:
    rows = by_buffer.get(buffer.id, ())
    for use in buffer.uses:
      service: Service = ("default",)
      for r in rows:
        first = done[r] if done[r] >= 0 else start[r]
        if first <= use < end[r]:
          prefetched = done[r] == use
          service = (
            ("prefetch", int(level[r]), int(start[r]) - 1)
            if prefetched
            else ("keep", int(level[r]))
          )
          break
      services[(buffer.id, use)] = service
  return services


@dataclasses.dataclass(frozen=True)
class Exported:
  """The overrides for one mapping: the two messages, and per kind of differing decision how
  many uses the overrides express (`prefetches`) or cannot (`not_expressible`)."""

  sort_order: Any  # MsaSortOrderOverrides
  preferred_prefetch: Any  # PreferredPrefetchOverrides
  prefetches: int
  deferred: int
  not_expressible: dict[str, int]

  def sort_order_text(self) -> str:
    return to_text(self.sort_order)

  def preferred_prefetch_text(self) -> str:
    return to_text(self.preferred_prefetch)

  def write(self, files: dict[str, str], header: str = "") -> None:
    """Both messages as text protos, to `override_files`' paths; `header` (comment lines, each
    starting with #) before each."""
    write_text(files["preferred_prefetch"], header + self.preferred_prefetch_text())
    write_text(files["sort_order"], header + self.sort_order_text())


def override_files(path: str) -> dict[str, str]:
  """The two files `FILE[.textproto]` names, by message: FILE.preferred_prefetch.textproto and
  FILE.sort_order.textproto."""
  stem = path[: -len(".textproto")] if path.endswith(".textproto") else path
  return {
    "preferred_prefetch": f"{stem}.preferred_prefetch.textproto",
    "sort_order": f"{stem}.sort_order.textproto",
  }


def _differs(found: Service, msa: Service) -> str | None:
  """The kind of a differing decision the overrides cannot express, "" for one they can, None
  where the two agree."""
  if found == msa:
    return None
  if found[0] == "prefetch":
    if msa[0] == "keep":
      return "prefetch where msa keeps"
    if msa[0] == "prefetch" and msa[1] != found[1]:
      return "another fast level"
    return ""
  if found[0] == "default":
    return "default memory where msa uses fast memory"
  if msa[0] != "default" and msa[1] != found[1]:
    return "another fast level"
  return "kept where msa copies or leaves it"


def export_overrides(
  workload: Workload,
  allocations: Allocations,
  msa_allocations: Allocations,
  deferred: Iterable[int] = (),
  deferred_order: Iterable[int] = (),
) -> Exported:
  """The overrides that steer XLA's msa from `msa_allocations` (its own mapping) toward
  `allocations`; `deferred` buffers allocated last, in `deferred_order` (msa's order)."""
  found = use_services(workload, allocations)
  msa = use_services(workload, msa_allocations)
  ops = [op.name for op in workload.ops]
  sizes = workload.arrays.sizes
  prefetch = message_class(PREFERRED_PREFETCH)()
  missed: dict[str, int] = collections.Counter()
  count = 0
  for (b, use), service in sorted(found.items(), key=lambda item: (item[0][1], item[0][0])):
    kind = _differs(service, msa[(b, use)])
    if kind is None:
      continue
    if kind:
      missed[kind] += 1
      continue
    override = prefetch.overrides.add()
    override.hlo_operand_filter.instruction_name_regex = re.escape(ops[use])
    override.hlo_operand_filter.size_gte = int(sizes[b])
    override.hlo_operand_filter.size_lte = int(sizes[b])
    start = service[2]
    if start >= 0:
      override.override_options.after_instruction.instruction_name_regex = re.escape(ops[start])
    else:
      override.override_options.before_instruction.instruction_name_regex = re.escape(ops[0])
    count += 1
  sort_order = message_class(SORT_ORDER)()
  deferred = set(int(b) for b in deferred)
  last_first = [b for b in reversed(list(deferred_order)) if b in deferred]
  for b in last_first:
    name, index = buffer_position(workload.buffers[b].name)
    override = sort_order.overrides.add()
    override.hlo_position_matcher.instruction_name_regex = re.escape(name)
    if index:
      override.hlo_position_matcher.tuple_index.index.extend(index)
    override.override_options.assign_last = True
  return Exported(sort_order, prefetch, count, len(last_first), dict(missed))
