"""mallocGame: the game the agent plays (game.py, over msa's decision points), the older requests
game (requests_game.py), their config and their observations."""

from __future__ import annotations

import dm_env

from malloczero.env.game.config import (
  REQUESTS_GAME,
  GameConfig,
  observation_spec,
  return_speedup,
)
from malloczero.env.game.game import MsaGame
from malloczero.env.game.observation import FeatureLayout, ObservationLayout, observation_layout
from malloczero.env.game.pressure import MsaReference
from malloczero.env.game.requests_game import RequestsGame
from malloczero.env.hardware import Hardware
from malloczero.env.workload import Workload


def make_game(
  workload: Workload,
  hardware: Hardware,
  config: GameConfig = GameConfig(),
  reference: MsaReference | None = None,
) -> dm_env.Environment:
  """The game `config.decisions` names: `MsaGame` ("msa") or `RequestsGame` ("requests").
  `reference`: an msa game's `reference` for the same pair (spares its msa pass)."""
  if config.decisions == "msa":
    return MsaGame(workload, hardware, config, reference=reference)
  return RequestsGame(workload, hardware, config)


__all__ = [
  "REQUESTS_GAME",
  "FeatureLayout",
  "GameConfig",
  "RequestsGame",
  "MsaGame",
  "MsaReference",
  "ObservationLayout",
  "make_game",
  "observation_layout",
  "observation_spec",
  "return_speedup",
]
