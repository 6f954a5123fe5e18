"""Real programs: a zoo model compiled by XLA and imported as a workload, under a stable name."""

from __future__ import annotations

from typing import Any, Mapping

from malloczero.env.workload import Workload


def program_name(model: str, batch: int, train: bool, tiny: bool = False) -> str:
  """E.g. `resnet50-b8-train`, `tiny-gpt-b2-infer`."""
  return f"{'tiny-' if tiny else ''}{model}-b{batch}-{'train' if train else 'infer'}"


def import_model(
  model: str,
  batch: int,
  train: bool,
  tiny: bool = False,
  seed: int = 0,
  overrides: Mapping[str, Any] | None = None,
  name: str | None = None,
) -> tuple[Workload, dict[str, int]]:
  """Builds the zoo model's program (its config with `overrides`, `zoo.model_config`), compiles
  it with XLA on the CPU and imports it, named `name` (default `program_name(...)`).

  Returns the workload and XLA's own memory and flop statistics for the same program."""
  from malloczero.env.programs.hlo_import import (
    workload_from_jax,  # jax and haiku load only when importing.
  )
  from malloczero.env.programs.zoo import build_program

  fn, args = build_program(model, batch, train, seed=seed, tiny=tiny, overrides=overrides)
  return workload_from_jax(fn, *args, name=name or program_name(model, batch, train, tiny))
