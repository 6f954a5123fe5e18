"""A training program's best mapping so far, written as the learner finds it: validated, to the
work directory's best/ folder (configs/workdir.py), with its memory map drawn beside it."""

from __future__ import annotations

import os
from typing import Optional

from malloczero.env.validator import validate_mapping
from malloczero.learner.demonstrations import Demonstration


def write_best_mapping(directory: str, demonstration: Demonstration, game) -> Optional[str]:
  """Writes the mapping of `game` (at the end of `demonstration`'s replay), validated, to
  `directory`/<program>.json, and its memory map beside it (.png); returns the JSON's path.
  msa's own play is a baseline, not a find: it is not written (None); nor is a mapping no faster
  than the one already there (None): best/ only ever improves."""
  if demonstration.source == "msa":
    return None
  from malloczero.evaluation.plots import plot_memory_map  # matplotlib, once a mapping is found.

  mapping = game.mapping("agent")
  validate_mapping(game.workload, game.hardware, mapping)
  os.makedirs(directory, exist_ok=True)
  path = os.path.join(directory, f"{demonstration.program}.json")
  kept = _kept_time(path)
  # A resumed run's demonstrations can be older than best/: never replace a faster mapping.
  if kept is not None and kept <= mapping.estimated_time_s:
    return None
  mapping.save(path)
  plot_memory_map(game.workload, game.hardware, mapping, path[: -len(".json")] + ".png")
  return path


def _kept_time(path: str) -> Optional[float]:
  """The estimated time of the mapping already at `path`; None when there is none, or it cannot
  be read (it is then replaced)."""
  if not os.path.exists(path):
    return None
  from malloczero.common.errors import MalloczeroError
  from malloczero.env.mapping import load_mapping

  try:
    return float(load_mapping(path).estimated_time_s)
  except (MalloczeroError, OSError, ValueError):
    return None
