"""The observation layout: named features tile each axis, and the game writes them where named."""

import numpy as np
import pytest

from malloczero.env import PRESETS, GameConfig, RequestsGame, observation_layout
from malloczero.env.game.observation import msa_observation_layout
from malloczero.env.programs.synthetic import contended, mlp_training_step


@pytest.mark.parametrize("decisions", ["requests", "msa"])
@pytest.mark.parametrize("levels", [1, 2, 3])
def test_features_tile_each_axis_and_size_the_game_config(levels, decisions):
  layout = (observation_layout if decisions == "requests" else msa_observation_layout)(levels)
  for part in (layout.static, layout.request, layout.candidate, layout.lookahead):
    covered = np.concatenate([np.arange(part.size)[part.slice(name)] for name in part.names])
    np.testing.assert_array_equal(covered, np.arange(part.size))
  config = GameConfig(max_fast_levels=levels, decisions=decisions)
  assert (
    config.static_features,
    config.request_features,
    config.candidate_features,
    config.lookahead_features,
  ) == (layout.static.size, layout.request.size, layout.candidate.size, layout.lookahead.size)
  assert layout.candidate.width("level") == levels
  with pytest.raises(ValueError, match="use slice"):
    layout.request.index("static" if decisions == "requests" else "option0")


def test_named_features_hold_what_their_names_say():
  workload = mlp_training_step()
  game = RequestsGame(workload, contended(PRESETS["nnpi-like"], workload, 0.25))
  layout = game.config.layout
  obs = game.reset().observation
  num_valid = int(obs["legal_actions"].sum()) - 1
  cand = obs["candidates"]
  np.testing.assert_array_equal(cand[:, layout.candidate.index("valid")], obs["legal_actions"][1:])
  levels, _ = game.candidates
  np.testing.assert_array_equal(
    cand[:num_valid, layout.candidate.slice("level")].argmax(-1), levels
  )
  request = obs["request"]
  np.testing.assert_array_equal(
    request[layout.request.slice("level_present")], [1.0] * game.hardware.num_fast_levels
  )
  assert request[layout.request.index("program_time")] == 1.0  # Nothing placed yet.
  static = request[layout.request.slice("static")]
  assert static[layout.static.index("position")] == 0.0
  following = obs["lookahead"][0, layout.lookahead.slice("static")]
  assert following[layout.static.index("position")] == pytest.approx(1 / len(game.requests))
