"""The programs actors play: (workload, hardware) pairs from a suite, and a pool of live games."""

from __future__ import annotations

import dataclasses
from typing import Sequence

import dm_env
import numpy as np

from malloczero.env.game import GameConfig, make_game
from malloczero.env.hardware import Hardware
from malloczero.env.programs.suites import get_suite
from malloczero.env.workload import Workload
from malloczero.env.workload_json import load_workload


@dataclasses.dataclass(frozen=True)
class GameSpec:
  name: str
  workload: Workload
  hardware: Hardware


def suite_games(suite: str, split: str = "train") -> list[GameSpec]:
  """The entries of a built-in suite's split (`train`, `heldout` or `all`) as game specs."""
  return [GameSpec(e.name, *e.load()) for e in get_suite(suite).split(split).entries]


def program_specs(config, split: str = "train") -> list[GameSpec]:
  """The programs of a training run (`configs.Config`) in `split`: its suite's (none when the
  suite is ""), plus its workload files (`train --workload`), which count as training programs."""
  specs = suite_games(config.suite, split) if config.suite else []
  if split in ("train", "all"):
    specs += [GameSpec(p.name, load_workload(p.workload), p.hardware) for p in config.programs]
  return specs


def training_specs(config) -> list[GameSpec]:
  """What a run's actors play and its demonstrations cover: the training programs
  (`program_specs`), plus each training suite entry at every fraction of `capacity_variants`
  other than its own (named as suite entries are). Reports, the learning curve and checkpoint
  selection keep to `program_specs`, so a run's figures compare with runs without variants."""
  specs = program_specs(config, "train")
  if not config.capacity_variants:
    return specs
  names = {s.name for s in specs}
  for entry in get_suite(config.suite).split("train").entries:
    for fraction in config.capacity_variants:
      variant = entry.at_capacity(fraction)
      if variant.name not in names:
        names.add(variant.name)
        specs.append(GameSpec(variant.name, *variant.load()))
  return specs


class GamePool:
  """Hands each of `num_slots` batch slots a fresh game on a uniformly drawn program.

  Games are built once per (slot, program) and reset afterwards: building one computes the
  requests and the cost model, which is far more work than a reset.
  """

  def __init__(
    self, specs: Sequence[GameSpec], game_config: GameConfig, num_slots: int, seed: int = 0
  ):
    if not specs:
      raise ValueError("no programs to play")
    self.specs = list(specs)
    self._config = game_config
    self._rng = np.random.default_rng(seed)
    self._cache: dict[tuple[int, int], dm_env.Environment] = {}
    # Per program: the msa game's (msa time, moves), measured by its first game only.
    self._references: dict[int, tuple[float, int] | None] = {}
    self.num_slots = num_slots

  def game(self, slot: int, index: int) -> dm_env.Environment:
    key = (slot, index)
    if key not in self._cache:
      spec = self.specs[index]
      game = make_game(spec.workload, spec.hardware, self._config, self._references.get(index))
      self._references[index] = getattr(game, "reference", None)
      self._cache[key] = game
    return self._cache[key]

  def draw(self, slot: int) -> tuple[int, dm_env.Environment]:
    index = int(self._rng.integers(len(self.specs)))
    return index, self.game(slot, index)
