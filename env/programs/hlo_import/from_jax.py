"""A JAX function -> `Workload`: compiled for the CPU by XLA, then imported from its HLO text.

Also returns XLA's own memory and flop statistics for the same program, to compare with the
workload's.
"""

from __future__ import annotations

from typing import Any, Callable

from malloczero.common.errors import WorkloadError
from malloczero.env.programs.hlo_import.from_text import workload_from_hlo_text
from malloczero.env.workload import Workload


def workload_from_jax(
  fn: Callable[..., Any], *example_args: Any, name: str
) -> tuple[Workload, dict[str, int]]:
  """Compiles `fn` for CPU with `jax.jit(fn).lower(*args).compile()` and imports the result.

  `example_args` may be arrays or `jax.ShapeDtypeStruct`s. Returns the workload and XLA's own
  memory statistics from `compiled.memory_analysis()` (argument, output, temp, alias and
  generated-code bytes, plus `total_bytes = argument + output + temp - alias`), for comparison
  with `workload.peak_live_bytes`, and `xla_flops` from `compiled.cost_analysis()` (which
  counts a while body once); keys are missing where the backend reports nothing.
  """
  import jax  # Imported here: the rest of `env` does not need jax.

  # Abstract arguments: nothing is committed to (or copied onto) an accelerator, so the
  # default device below decides the backend.
  abstract = jax.tree_util.tree_map(
    lambda a: (
      jax.ShapeDtypeStruct(a.shape, a.dtype) if hasattr(a, "shape") and hasattr(a, "dtype") else a
    ),
    example_args,
  )
  try:
    cpu = jax.devices("cpu")[0]
    with jax.default_device(cpu):
      compiled = jax.jit(fn).lower(*abstract).compile()
    text = compiled.as_text()
  except Exception as e:  # Tracing or compiling user code; report it on one line.
    first = (str(e).strip().splitlines() or [""])[0]
    raise WorkloadError(
      f"{name}: XLA could not compile the function: {type(e).__name__}: {first}"
    ) from None
  workload = workload_from_hlo_text(text, name, source=f"xla-hlo (jax {jax.__version__}, cpu)")
  stats: dict[str, int] = {}
  try:
    analysis = compiled.memory_analysis()
  except Exception:  # Optional: some backends have no memory analysis.
    analysis = None
  if analysis is not None:
    for key in (
      "argument_size_in_bytes",
      "output_size_in_bytes",
      "temp_size_in_bytes",
      "alias_size_in_bytes",
      "generated_code_size_in_bytes",
    ):
      value = getattr(analysis, key, None)
      if value is not None:
        stats[key] = int(value)
    if {"argument_size_in_bytes", "output_size_in_bytes", "temp_size_in_bytes"} <= stats.keys():
      stats["total_bytes"] = (
        stats["argument_size_in_bytes"]
        + stats["output_size_in_bytes"]
        + stats["temp_size_in_bytes"]
        - stats.get("alias_size_in_bytes", 0)
      )
  try:
    cost = compiled.cost_analysis()
    cost = cost[0] if isinstance(cost, (list, tuple)) and cost else cost
    if isinstance(cost, dict) and "flops" in cost:
      stats["xla_flops"] = int(cost["flops"])
  except Exception:  # Optional: some backends have no cost analysis.
    pass
  return workload, stats
