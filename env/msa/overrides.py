"""XLA's sort-order and preferred-prefetch overrides, matched against a workload as XLA matches
them against a module (openxla/xla `xla/service/memory_space_assignment/utils.cc`,
`MemorySpaceAssignmentUtils`; reading note: shared/references/xla-msa-overrides-notes.md).

A workload keeps the names of the imported module's instructions: an op is an instruction of the
schedule, and a buffer is the position `NAME` or `NAME{i,j}` (the instruction's result, or the
element at that tuple index). So:

* **sort order** (`GetBufferIntervalOverridePriority`): a buffer's priority is set by the first
  override, in list order, whose `hlo_position_matcher` matches its position: `assign_first` at
  index i gives INT64_MIN + i, `assign_last` INT64_MAX - i, no match 0. The priority is the first
  key of msa's sort (buffer_order.py), so `assign_first` buffers are allocated first in list
  order and `assign_last` ones last, the first of them very last. A position matches
  (`DoesPositionMatchFilter`) when every field set passes: `size_gte` / `size_lte` on its size
  in bytes, `tuple_index` equal to its whole tuple index, `instruction_name_regex` a full match
  (RE2's `FullMatch`) of its instruction's name, and `hlo_use_filter` passed by one of its uses.
* **preferred prefetch** (`GetOverriddenPreferredPrefetchTime`): for a use's prefetch, the first
  override whose `hlo_operand_filter` matches the use (`DoesUseMatchFilter`: the using
  instruction's name a full match, the buffer's size within the bounds, `tuple_index` equal to
  the use's operand index) and whose time falls within [earliest, use] sets msa's preferred
  start: `prefetch_eagerness` e gives earliest + (use - earliest) x e, truncated (so 1 is the
  latest, not the earliest); `after_instruction` X gives X's schedule time, `before_instruction`
  X that time - 1 (a start time is the op after which the copy is issued). X is the first op of
  the schedule whose name the matcher's regex fully matches. msa's picker then tries that start
  first (raised to its own earliest, ignored when past its own latest) and alternates around it
  as before, and, as XLA's `CheckPrefetchFit` does for any request with a preferred time, charges
  the copy no bandwidth in its copy-resource check.

Fields the workload cannot evaluate are refused in one line, not ignored: `instruction_regex`
(matches the instruction's printed HLO, which is not kept), `operand_number` (a use here is a
(buffer, op) pair, not an operand slot) and a use's `tuple_index` (the operand index of a use is
not kept). Python's `re.fullmatch` stands in for RE2 (the same syntax for the names' regexes).

Departures, both where XLA's choice is an accident of its data structures: an instruction
matcher that several ops match names the first in schedule order (XLA takes the first of a hash
map's iteration); and a preferred start before the picker's own earliest is raised to it and
tried (XLA never returns that start and walks from the one after it, which may lie below the
picker's earliest).
"""

from __future__ import annotations

import dataclasses
import functools
import os
import re
from typing import Any, Optional

import numpy as np

from malloczero.env.msa.xla_proto import (
  PREFERRED_PREFETCH,
  SORT_ORDER,
  OverridesError,
  read_text_proto,
)
from malloczero.env.workload import Workload

INT64_MIN, INT64_MAX = -(2**63), 2**63 - 1
_POSITION = re.compile(r"(.*?)(?:\{([0-9]+(?:,[0-9]+)*)?\})?")


def buffer_position(name: str) -> tuple[str, tuple[int, ...]]:
  """A buffer's (instruction name, tuple index): `add.3` -> ("add.3", ()), `while.1{2}` ->
  ("while.1", (2,)) (the importer names a tuple element's buffer so)."""
  match = _POSITION.fullmatch(name)
  instruction, index = match.group(1), match.group(2)
  return instruction, tuple(int(i) for i in index.split(",")) if index else ()


def _regex(pattern: str, where: str) -> re.Pattern:
  try:
    return re.compile(pattern)
  except re.error as e:
    raise OverridesError(f"{where}: bad regex {pattern!r}: {e}") from None


def _refuse_unkept(message: Any, fields: tuple[str, ...], where: str) -> None:
  for name in fields:
    if message.HasField(name):
      why = {
        "instruction_regex": "the instruction's printed HLO, which a workload does not keep; "
        "match its name with instruction_name_regex",
        "operand_number": "operand slots, which a workload does not keep (a use is a buffer "
        "and the op that reads it)",
        "tuple_index": "the use's operand index, which a workload does not keep",
      }[name]
      raise OverridesError(f"{where}: {name} matches {why}")


@dataclasses.dataclass(frozen=True)
class _UseFilter:
  name: Optional[re.Pattern]
  size_gte: Optional[int]
  size_lte: Optional[int]

  @staticmethod
  def of(message: Any, where: str) -> "_UseFilter":
    _refuse_unkept(message, ("instruction_regex", "operand_number", "tuple_index"), where)
    return _UseFilter(
      _regex(message.instruction_name_regex, where)
      if message.HasField("instruction_name_regex")
      else None,
      message.size_gte if message.HasField("size_gte") else None,
      message.size_lte if message.HasField("size_lte") else None,
    )

  def matches(self, op_name: str, size: int) -> bool:
    return (
      (self.size_gte is None or size >= self.size_gte)
      and (self.size_lte is None or size <= self.size_lte)
      and (self.name is None or self.name.fullmatch(op_name) is not None)
    )


def _use_ops(workload: Workload) -> list[np.ndarray]:
  """Per buffer, `[U]` the ops that read it (its uses, the definition left out)."""
  return [np.asarray(b.uses, np.int64) for b in workload.buffers]


def _position_matches(matcher: Any, workload: Workload, where: str) -> np.ndarray:
  """`[N]` bool: the buffers whose position `matcher` (an `HloPositionMatcher`) matches."""
  _refuse_unkept(matcher, ("instruction_regex",), where)
  a = workload.arrays
  matched = np.ones(workload.num_buffers, bool)
  if matcher.HasField("size_gte"):
    matched &= a.sizes >= matcher.size_gte
  if matcher.HasField("size_lte"):
    matched &= a.sizes <= matcher.size_lte
  positions = [buffer_position(b.name) for b in workload.buffers]
  if matcher.HasField("tuple_index"):
    index = tuple(matcher.tuple_index.index)
    matched &= np.array([p[1] == index for p in positions], bool)
  if matcher.HasField("instruction_name_regex"):
    name = _regex(matcher.instruction_name_regex, where)
    matched &= np.array([name.fullmatch(p[0]) is not None for p in positions], bool)
  if matcher.HasField("hlo_use_filter"):
    use_filter = _UseFilter.of(matcher.hlo_use_filter, f"{where} hlo_use_filter")
    ops = [op.name for op in workload.ops]
    for b, uses in enumerate(_use_ops(workload)):
      if matched[b]:
        size = int(a.sizes[b])
        matched[b] = any(use_filter.matches(ops[u], size) for u in uses.tolist())
  return matched


def sort_order_priorities(overrides: Any, workload: Workload, where: str = "") -> np.ndarray:
  """`[N]` int64: each buffer's override priority under `overrides` (an `MsaSortOrderOverrides`),
  the first key of msa's sort (buffer_order.py)."""
  priority = np.zeros(workload.num_buffers, np.int64)
  decided = np.zeros(workload.num_buffers, bool)
  for i, override in enumerate(overrides.overrides):
    at = f"{where}: override {i}"
    kind = override.override_options.WhichOneof("options")
    if kind is None:  # XLA skips an override that says neither first nor last.
      continue
    matched = _position_matches(override.hlo_position_matcher, workload, at) & ~decided
    priority[matched] = INT64_MIN + i if kind == "assign_first" else INT64_MAX - i
    decided |= matched
  return priority


@dataclasses.dataclass(frozen=True)
class PreferredPrefetchTimes:
  """A workload's preferred-prefetch overrides, matched: `time(b, use, earliest)` is the start
  msa prefers for the prefetch of buffer `b` to the op `use` whose earliest start is `earliest`,
  or None where no override sets one."""

  # Per (buffer, use op): the overrides matching that use, in list order, as (kind, value):
  # ("eagerness", e) or ("time", the start it names).
  matches: dict[tuple[int, int], tuple[tuple[str, float], ...]]

  def time(self, b: int, use: int, earliest: int) -> Optional[int]:
    for kind, value in self.matches.get((b, use), ()):
      if kind == "eagerness":
        start = int(earliest + (use - earliest) * value)
      else:
        start = int(value)
      if earliest <= start <= use:  # XLA drops an override whose time is out of the window.
        return start
    return None


def _instruction_time(matcher: Any, workload: Workload, where: str) -> int:
  """The schedule time of the first op whose name `matcher` fully matches (XLA reads only the
  matcher's regexes here); refused when none does (XLA's compiler stops there too)."""
  _refuse_unkept(matcher, ("instruction_regex",), where)
  if not matcher.HasField("instruction_name_regex"):
    raise OverridesError(f"{where}: the instruction matcher has no instruction_name_regex")
  name = _regex(matcher.instruction_name_regex, where)
  for t, op in enumerate(workload.ops):
    if name.fullmatch(op.name):
      return t
  raise OverridesError(
    f"{where}: no op of the program is named to match {matcher.instruction_name_regex!r}"
  )


def preferred_prefetch_times(
  overrides: Any, workload: Workload, where: str = ""
) -> PreferredPrefetchTimes:
  """`overrides` (a `PreferredPrefetchOverrides`) matched against every use of `workload`."""
  a = workload.arrays
  ops = [op.name for op in workload.ops]
  matches: dict[tuple[int, int], list[tuple[str, float]]] = {}
  use_ops = _use_ops(workload)
  for i, override in enumerate(overrides.overrides):
    at = f"{where}: override {i}"
    options = override.override_options
    kind = options.WhichOneof("options")
    if kind is None:
      continue
    if kind == "prefetch_eagerness":
      if not 0.0 <= options.prefetch_eagerness <= 1.0:
        raise OverridesError(f"{at}: prefetch_eagerness must be in [0, 1]")
      value = ("eagerness", float(options.prefetch_eagerness))
    elif kind == "after_instruction":
      value = ("time", _instruction_time(options.after_instruction, workload, at))
    else:
      value = ("time", _instruction_time(options.before_instruction, workload, at) - 1)
    use_filter = _UseFilter.of(override.hlo_operand_filter, at)
    for b, uses in enumerate(use_ops):
      size = int(a.sizes[b])
      for use in uses.tolist():
        if use_filter.matches(ops[use], size):
          matches.setdefault((b, use), []).append(value)
  return PreferredPrefetchTimes({k: tuple(v) for k, v in matches.items()})


@functools.lru_cache(maxsize=16)
def _read(path: str, name: str, stamp: tuple[int, int]) -> Any:
  return read_text_proto(path, name)


def _read_file(path: str, name: str) -> Any:
  """The message in `path`, read again only when the file changes."""
  try:
    stat = os.stat(path)
  except OSError:
    raise OverridesError(f"{path}: no such overrides file") from None
  return _read(os.path.abspath(path), name, (stat.st_size, stat.st_mtime_ns))


def read_sort_order_priorities(path: str, workload: Workload) -> np.ndarray:
  """`sort_order_priorities` of the `MsaSortOrderOverrides` text file `path`."""
  return sort_order_priorities(_read_file(path, SORT_ORDER), workload, path)


def read_preferred_prefetch_times(path: str, workload: Workload) -> PreferredPrefetchTimes:
  """`preferred_prefetch_times` of the `PreferredPrefetchOverrides` text file `path`."""
  return preferred_prefetch_times(_read_file(path, PREFERRED_PREFETCH), workload, path)
