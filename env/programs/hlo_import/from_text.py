"""HLO text -> `Workload`: the importer's entry points for text.

`parse_module` reads the text with XLA's own parser (`xla_proto`) or, where XLA refuses it,
with the hand-written one (`text_parser`); `import_hlo_text` also compiles an unscheduled module
on the CPU first (`compile_hlo_on_cpu`); `convert.convert_module` makes the workload.
"""

from __future__ import annotations

import dataclasses
import re

from malloczero.common.errors import WorkloadError
from malloczero.env.programs.hlo_import.convert import convert_module, count_ops
from malloczero.env.programs.hlo_import.hlo import Module, check_text
from malloczero.env.programs.hlo_import.notes import Notes
from malloczero.env.programs.hlo_import.text_parser import parse_text
from malloczero.env.programs.hlo_import.xla_proto import (
  parse_with_xla,
  serialized_module,
  xla_reason,
)
from malloczero.env.workload import Workload, collection_paused


def parse_module(text: str, where: str, notes: Notes, use_xla: bool = True) -> Module:
  """XLA's own parser when it accepts the text, else the hand-written one (with a note)."""
  check_text(text, where)
  reason = parse_with_xla(text, where) if use_xla else "not asked for"
  if isinstance(reason, Module):
    if not re.search(r"^\s*ENTRY\b", text, re.M):
      notes.note(
        f"no computation is marked ENTRY: XLA takes the last one, "
        f"'{reason.entry.name}', as the program (is the text truncated?)"
      )
    return reason
  module = parse_text(text, where)
  notes.note(
    f"XLA's parser refused the module ({reason}); read it with the hand-written "
    "parser, which reads shapes, operands and the attributes used here the same way "
    "but checks less"
  )
  return module


@dataclasses.dataclass(frozen=True)
class HloImport:
  """What `import_hlo_text` made of a module: the workload, whether the input module was
  scheduled and whether it was compiled here first, and one-line notes for the user (which
  parser read it, what compiling did, one warning per kind of approximation)."""

  workload: Workload
  scheduled: bool
  compiled: bool
  notes: tuple[str, ...]


def import_hlo_text(
  text: str, name: str, source: str = "xla-hlo", compile: bool | None = None
) -> HloImport:
  """Converts HLO text to a `Workload`, compiling it on the CPU first when it is not scheduled.

  `compile=None` compiles an unscheduled module (its print order is not a schedule, and it has
  no fusion) and keeps a scheduled one as it is; if XLA cannot compile it (a collective over
  many devices, another backend's custom call), the print order is kept with a note.
  `compile=True` insists (a failure is a `WorkloadError`), `compile=False` never compiles. The
  conversion rules are in the docstring of the package, `malloczero.env.programs.hlo_import`.
  """
  with collection_paused():  # Every object the import builds is kept until it returns.
    return _import(text, name, source, compile)


def _import(text: str, name: str, source: str, compile: bool | None) -> HloImport:
  notes = Notes()
  check_text(text, name)
  module = parse_module(text, name, notes)
  compiled, was_scheduled = False, module.scheduled
  if compile or (compile is None and not was_scheduled):
    before = count_ops(module)
    try:
      optimised, seconds = compile_hlo_on_cpu(text, name)
    except WorkloadError as e:
      if compile:
        raise
      notes.note(
        f"the module is not scheduled and XLA could not compile it on the CPU "
        f"({getattr(e, 'reason', e)}); kept its print order as the schedule, without "
        "XLA's fusion"
      )
    else:
      module, compiled = parse_module(optimised, name, notes), True
      what = (
        "was scheduled; compiled it again" if was_scheduled else "was not scheduled: compiled it"
      )
      notes.note(
        f"the module {what} with XLA on the CPU in {seconds:.1f} s ({before} ops "
        f"before, {count_ops(module)} after fusion and scheduling)"
        + ("" if was_scheduled else "; --no-compile keeps the print order")
      )
  elif not was_scheduled:
    notes.note(
      "the module is not scheduled: its print order is taken as the schedule and "
      "nothing is fused (--compile lets XLA optimise and schedule it first)"
    )
  if compiled:
    source += ", compiled with XLA on the CPU"
  workload = convert_module(module, name, source, notes)
  return HloImport(workload, was_scheduled, compiled, tuple(notes.all()))


def workload_from_hlo_text(text: str, name: str, source: str = "xla-hlo") -> Workload:
  """Converts HLO text, as it is (no compiling), to a `Workload`; `import_hlo_text` also
  compiles unscheduled modules and returns the notes. The rules (which instructions are ops,
  how flops and bytes are counted, which buffers exist and what aliases what) are in the
  package's docstring. Malformed text raises a one-line `WorkloadError`.
  """
  notes = Notes()
  with collection_paused():
    return convert_module(parse_module(text, name, notes), name, source, notes)


def compile_hlo_on_cpu(text: str, name: str) -> tuple[str, float]:
  """Optimises and schedules HLO text with the installed XLA for the CPU (HLO -> StableHLO ->
  the CPU client's compiler) and returns the optimised module's text and the seconds it took.

  This is what `jax.jit(f).lower(...).compile()` does to a JAX program, applied to a module
  from elsewhere (TensorFlow, torch-xla, an unoptimised dump). Raises a one-line `WorkloadError`
  (its `reason` attribute without the module's name) when XLA cannot."""
  import time

  start = time.perf_counter()
  try:
    # XLA's parser runs in a child process (a malformed module can abort the process it runs
    # in); the text was parsed there already when the module was read.
    proto = serialized_module(text)
    if isinstance(proto, str):
      raise ValueError(proto)
    import jax  # Lazy, as in the rest of the package: only compiling needs JAX.
    from jaxlib import xla_client

    mlir = xla_client._xla.mlir.hlo_to_stablehlo(proto)
    cpu = jax.devices("cpu")[0]
    executable = cpu.client.compile_and_load(
      mlir, xla_client.DeviceList((cpu,)), xla_client.CompileOptions()
    )
    optimised = executable.hlo_modules()[0].to_string()
  except Exception as e:  # XLA's parser, converter or compiler refused: one line.
    reason = xla_reason(e)
    error = WorkloadError(f"{name}: XLA could not compile the module on the CPU: {reason}")
    error.reason = reason
    raise error from None
  return optimised, time.perf_counter() - start
