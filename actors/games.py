"""The programs actors play: (workload, hardware) pairs from a suite, and a pool of live games."""

from __future__ import annotations

import dataclasses
from typing import Sequence

import dm_env
import numpy as np

from malloczero.env.game import GameConfig, make_game
from malloczero.env.game.cache import BuiltGames
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


def _workload_specs(config) -> list[GameSpec]:
  """The run's workload files (`train --workload`): training programs."""
  return [GameSpec(p.name, load_workload(p.workload), p.hardware) for p in config.programs]


def program_specs(config, split: str = "train") -> list[GameSpec]:
  """The programs a training run (`configs.Config`) is measured on in `split` (the learning
  curve, checkpoint selection, the final report): its report suite's (none when it has no
  suite), plus its workload files (`train --workload`), which count as training programs."""
  suite = config.measured_suite
  specs = suite_games(suite, split) if suite else []
  if split in ("train", "all"):
    specs += _workload_specs(config)
  return specs


def training_specs(config) -> list[GameSpec]:
  """What a run's actors play and its demonstrations cover: its suite's training programs, its
  workload files, and each training suite entry at every fraction of `capacity_variants` other
  than its own (named as suite entries are). The figures keep to `program_specs`, so a run's
  figures compare with runs without variants or on another training suite."""
  specs = (suite_games(config.suite, "train") if config.suite else []) + _workload_specs(config)
  names = {s.name for s in specs}
  for entry in get_suite(config.suite).split("train").entries if config.capacity_variants else ():
    for fraction in config.capacity_variants:
      variant = entry.at_capacity(fraction)
      if variant.name not in names:
        names.add(variant.name)
        specs.append(GameSpec(variant.name, *variant.load()))
  return specs


def demonstration_specs(config, specs: Sequence[GameSpec]) -> list[GameSpec]:
  """The training programs `specs` that keep a demonstration: all of them, or with
  `learner.demonstration_programs` = N, N of them: the report's training programs first (in
  their order), then the others in an order drawn from the run's seed."""
  limit = config.learner.demonstration_programs
  if not limit or limit >= len(specs):
    return list(specs)
  reported = {s.name for s in program_specs(config, "train")}
  first = [s for s in specs if s.name in reported]
  others = [s for s in specs if s.name not in reported]
  order = np.random.default_rng(config.seed).permutation(len(others))
  return (first + [others[i] for i in order])[:limit]


class GamePool:
  """Hands each of `num_slots` batch slots a fresh game on a uniformly drawn program.

  Games are built once per (slot, program) and reset afterwards, `cached_games` of them kept at
  most (`BuiltGames`; 0: all).
  """

  def __init__(
    self,
    specs: Sequence[GameSpec],
    game_config: GameConfig,
    num_slots: int,
    seed: int = 0,
    cached_games: int = 0,
  ):
    if not specs:
      raise ValueError("no programs to play")
    self.specs = list(specs)
    self._config = game_config
    self._rng = np.random.default_rng(seed)
    # At least one per slot: the games the slots are playing stay built.
    self._cache = BuiltGames(max(cached_games, num_slots) if cached_games else 0)
    # Per program: the msa game's (msa time, moves), measured by its first game only.
    self._references: dict[int, tuple[float, int] | None] = {}
    self.num_slots = num_slots

  def game(self, slot: int, index: int) -> dm_env.Environment:
    def build() -> dm_env.Environment:
      spec = self.specs[index]
      game = make_game(spec.workload, spec.hardware, self._config, self._references.get(index))
      self._references[index] = getattr(game, "reference", None)
      return game

    return self._cache.get((slot, index), build)

  def draw(self, slot: int) -> tuple[int, dm_env.Environment]:
    index = int(self._rng.integers(len(self.specs)))
    return index, self.game(slot, index)
