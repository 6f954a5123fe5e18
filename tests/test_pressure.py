"""The msa game's pressure rows (env/game/pressure.py, `GameConfig.pressure_bins`): what msa's own
complete mapping fills of each fast level, over the decision's segment and over the program.

What must hold: the rows are the fill of msa's mapping (the `msa` solver's segments, counted op
by op here) averaged over equal stretches; the game's other parts are the same with or without
them; the network reads them; a game without an msa mapping refuses the setting.
"""

import dataclasses

import jax
import numpy as np
import pytest

from malloczero.configs.config import get_config
from malloczero.env import GameConfig, make_game
from malloczero.env.game.pressure import stretch_fill
from malloczero.env.msa.algorithm import msa_allocations
from malloczero.env.programs.suites import get_suite
from malloczero.learner import make_networks

BINS = 4


def fill_per_op(workload, hardware) -> np.ndarray:
  """`[F, T]` msa's fast bytes at each op / the level's capacity, one op at a time."""
  allocations, _ = msa_allocations(workload, hardware)
  levels, num_ops = len(hardware.capacities) - 1, workload.num_ops
  fill = np.zeros((levels, num_ops))
  for buffer, level, start, end in zip(
    allocations.buffer, allocations.level, allocations.start, allocations.end
  ):
    for op in range(max(start, 0), min(end, num_ops)):
      fill[level, op] += workload.arrays.sizes[buffer] / hardware.capacities[level]
  return fill


def stretches(fill: np.ndarray, first: int, last: int, bins: int) -> np.ndarray:
  """`[F, bins]` means over equal stretches of ops first..last: each op cut into `bins` equal
  parts, so that every stretch is a whole number of parts."""
  parts = np.repeat(fill[:, first : last + 1], bins, axis=1)
  return parts.reshape(len(fill), bins, -1).mean(axis=2)


def test_the_pressure_is_msas_fill_over_the_segment_and_the_program():
  workload, hardware = get_suite("tiny").entries[0].load()
  game = make_game(workload, hardware, GameConfig(pressure_bins=BINS))
  fill = fill_per_op(workload, hardware)
  assert fill.max() > 0.1  # msa keeps something in fast memory: the rows are not all zero.
  program = stretches(fill, 0, workload.num_ops - 1, BINS)
  timestep, checked = game.reset(), 0
  while not timestep.last():
    pressure, decision = timestep.observation["pressure"], game.decision
    first = max(decision.segment_start, 0)
    levels = len(fill)
    np.testing.assert_allclose(
      pressure[:levels, :BINS], stretches(fill, first, decision.use, BINS), atol=1e-5
    )
    np.testing.assert_allclose(pressure[:levels, BINS:], program, atol=1e-5)
    assert not pressure[levels:].any()
    checked += 1
    legal = np.flatnonzero(timestep.observation["legal_actions"])
    timestep = game.step(legal[checked % len(legal)])  # Not msa's play: the rows stay msa's.
  assert checked > 10


def test_the_other_parts_are_the_same_with_or_without_the_pressure():
  workload, hardware = get_suite("tiny").entries[0].load()
  plain = make_game(workload, hardware, GameConfig())
  seen = make_game(workload, hardware, GameConfig(pressure_bins=BINS), plain.reference)
  assert "pressure" not in plain.observation_spec()
  assert seen.observation_spec()["pressure"].shape == (2, 2 * BINS)
  first, second = plain.reset(), seen.reset()
  while not first.last():
    assert set(second.observation) == set(first.observation) | {"pressure"}
    for name, value in first.observation.items():
      np.testing.assert_array_equal(second.observation[name], value)
    first, second = plain.step(plain.msa_action), seen.step(seen.msa_action)
  assert second.last() and second.reward == first.reward


def test_stretches_of_part_of_an_op_are_that_ops_fill():
  prefix = np.array([[0.0, 1.0, 1.5, 3.5]])  # Fills 1.0, 0.5, 2.0 at ops 0, 1, 2.
  np.testing.assert_allclose(stretch_fill(prefix, 1, 2, 4), [[0.5, 0.5, 2.0, 2.0]])
  np.testing.assert_allclose(stretch_fill(prefix, 0, 2, 1), [[3.5 / 3]])
  np.testing.assert_allclose(stretch_fill(prefix, 2, 2, 3), [[2.0, 2.0, 2.0]])


def test_the_network_reads_the_pressure():
  config = get_config("tiny")
  game = dataclasses.replace(config.game, pressure_bins=BINS)
  networks = make_networks(config.network, game)
  workload, hardware = get_suite("tiny").entries[0].load()
  observation = make_game(workload, hardware, game).reset().observation
  batch = {name: value[None] for name, value in observation.items()}
  params = networks.init(jax.random.PRNGKey(0), batch)
  assert "embed_pressure" in " ".join(params)
  emptier = dict(batch, pressure=np.zeros_like(batch["pressure"]))
  assert not np.allclose(networks.represent(params, batch), networks.represent(params, emptier))


def test_a_game_without_an_msa_mapping_refuses_the_pressure():
  with pytest.raises(ValueError, match="pressure_bins is for the msa game"):
    GameConfig(decisions="requests", reward="time", pressure_bins=BINS)
