"""The game's config: which decisions it offers and how wide its observations are.

`GameConfig.decisions` picks the game: "msa" (env/game/game.py, the default, what the agent trains
on: one step per decision point of XLA's msa loop) or "requests" (env/game/requests_game.py, the
project's first game, which the `bestfit` baseline still plays). `make_game` builds either.
"""

from __future__ import annotations

import dataclasses

import numpy as np
from dm_env import specs

from malloczero.common.settings import check_settings, setting
from malloczero.env.game.observation import (
  ObservationLayout,
  msa_observation_layout,
  observation_layout,
)

DECISIONS = ("msa", "requests")
REWARDS = ("advantage", "time")


# Actions of either game (K, prefetch starts): beyond it the policy head and every search tree
# are too wide to allocate.
MAX_ACTIONS = 1024


@dataclasses.dataclass(frozen=True)
class GameConfig:
  """What the game plays and how wide its observations are.

  decisions: "msa" (env/game/game.py, the default: one step per decision point of XLA's msa
    loop, the actions the options msa weighs there) or "requests" (env/game/requests_game.py:
    one step per request, the actions its best-fit candidates).
  num_candidates: K of the requests game (1 + K actions).
  max_prefetch_starts: prefetch starts offered per fast level in the msa game
    (2 + max_prefetch_starts x max_fast_levels actions).
  pressure_bins: msa game only. 0 (the default) leaves the observation as it is. Above 0 it
    gains `pressure` `[F, 2 x pressure_bins]`: per fast level, the share of its capacity msa's
    own complete mapping fills, in that many equal stretches of the decision's segment, then of
    the whole program. The rest of the observation shows what is placed so far; this shows what
    will compete for the same memory once every buffer is placed (env/game/pressure.py).
  skip_below: msa game only. 0 offers every decision. Above 0, msa's own choice is played, not
    offered, at decisions with a single option or whose best option msa estimates to save less
    than this fraction of the all-slow time (most moves cannot matter: docs/design.md,
    "Actions, rewards, episode"); their rewards go to the next move the agent makes.
  reward: msa game only. "advantage" (the default): an episode's return is the fraction of msa's
    own program time the mapping saves, `(T_msa - T) / T_msa`, so msa's play returns exactly 0
    and a return above 0 beats the heuristic (potential-based shaping with msa's completion as
    the potential, env/game/game.py). "time": each move's reward is the program time it saves
    over the all-slow time (the return is the fraction of the all-slow time saved), the
    project's first reward, kept for comparison. The requests game always rewards "time".
  """

  num_candidates: int = setting(
    16, "positive_int", "K of the requests game (1 + K actions)", maximum=MAX_ACTIONS
  )
  occupancy_bins: int = setting(
    32, "positive_int", "bins of each fast level's occupancy row", maximum=4096
  )
  lookahead: int = setting(8, "non_negative_int", "upcoming requests observed (M)", maximum=4096)
  # Observation width: hardware may have up to this many fast levels.
  max_fast_levels: int = setting(
    2, "positive_int", "fast levels the observation has room for", maximum=16
  )
  decisions: str = setting(
    "msa",
    "choice",
    "msa: a step per decision of XLA's msa loop; requests: a step per request",
    DECISIONS,
  )
  max_prefetch_starts: int = setting(
    4,
    "positive_int",
    "prefetch starts offered per fast level in the msa game",
    maximum=MAX_ACTIONS,
  )
  skip_below: float = setting(
    0.0,
    "fraction",
    "the game plays msa's own choice at decisions whose best option saves less than this "
    "fraction of the all-slow time",
  )
  pressure_bins: int = setting(
    0,
    "non_negative_int",
    "msa game only: bins of each fast level's pressure row, the share of its capacity msa's "
    "own mapping fills over the decision's segment and over the whole program (0: not observed)",
    maximum=1024,
  )
  reward: str = setting(
    "advantage",
    "choice",
    "advantage: a game returns the fraction of msa's time it saves (0 for msa's play); time: "
    "each move its time saved over the all-slow time (the first reward, for comparison)",
    REWARDS,
  )

  def __post_init__(self):
    check_settings(self, "game")
    if self.pressure_bins and self.decisions != "msa":
      raise ValueError(
        f"game.pressure_bins is for the msa game; the {self.decisions} game has no msa mapping "
        "to profile (set game.pressure_bins=0)"
      )

  @property
  def num_actions(self) -> int:
    if self.decisions == "msa":
      return 2 + self.max_prefetch_starts * self.max_fast_levels
    return 1 + self.num_candidates

  @property
  def candidate_slots(self) -> int:
    """Rows of the candidates observation: one per action after action 0."""
    return self.num_actions - 1

  @property
  def layout(self) -> ObservationLayout:
    """The named features of each observation part."""
    if self.decisions == "msa":
      return msa_observation_layout(self.max_fast_levels)
    return observation_layout(self.max_fast_levels)

  @property
  def static_features(self) -> int:
    return self.layout.static.size

  @property
  def request_features(self) -> int:
    return self.layout.request.size

  @property
  def candidate_features(self) -> int:
    return self.layout.candidate.size

  @property
  def lookahead_features(self) -> int:
    return self.layout.lookahead.size


REQUESTS_GAME = GameConfig(decisions="requests", reward="time")


def return_speedup(config: GameConfig, episode_return: float, msa_speedup: float) -> float:
  """The speed-up over all-slow of a complete game that returned `episode_return`: msa's
  speed-up / (1 - return) with the msa game's "advantage" reward, 1 / (1 - return) otherwise."""
  if config.decisions == "msa" and config.reward == "advantage":
    return msa_speedup / (1.0 - episode_return)
  return 1.0 / (1.0 - episode_return)


def observation_spec(config: GameConfig) -> dict[str, specs.Array]:
  """Specs of one observation (no leading dimensions)."""
  f32 = np.float32
  return {
    "request": specs.Array((config.request_features,), f32, "request"),
    "occupancy": specs.Array((config.max_fast_levels, config.occupancy_bins), f32, "occupancy"),
    "candidates": specs.Array(
      (config.candidate_slots, config.candidate_features), f32, "candidates"
    ),
    "lookahead": specs.Array((config.lookahead, config.lookahead_features), f32, "lookahead"),
    "legal_actions": specs.Array((config.num_actions,), bool, "legal_actions"),
    **(
      {"pressure": specs.Array((config.max_fast_levels, 2 * config.pressure_bins), f32, "pressure")}
      if config.pressure_bins
      else {}
    ),
  }
