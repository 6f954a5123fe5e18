"""mallocGame: rewards are exact cost-model differences, mappings validate, specs hold."""

import dm_env
import numpy as np
import pytest
from hypothesis import assume, given
from hypothesis import strategies as st

from malloczero.env import (
  PRESETS,
  REQUESTS_GAME,
  IllegalActionError,
  MalloczeroError,
  RequestsGame,
  validate_mapping,
)
from malloczero.env.cost_model import CostModel
from malloczero.env.programs.synthetic import contended, mlp_training_step, random_workload
from tests.strategies import counting_actor, hardware_for, workloads


def play(game: RequestsGame, policy: str, seed: int = 0):
  """Plays one episode; returns (rewards, timesteps)."""
  rng = np.random.default_rng(seed)
  ts = game.reset()
  steps = [ts]
  while not ts.last():
    legal = np.flatnonzero(ts.observation["legal_actions"])
    if policy == "random":
      action = legal[rng.integers(len(legal))]
    elif policy == "first":
      action = legal[-1] if len(legal) > 1 and rng.random() < 0.2 else legal[min(1, len(legal) - 1)]
    else:
      action = 0
    ts = game.step(action)
    steps.append(ts)
  return np.array([t.reward for t in steps[1:]]), steps


def make_game(workload, hardware):
  try:
    return RequestsGame(workload, hardware)
  except MalloczeroError:
    assume(False)  # Nothing to place (every buffer too big or useless): not a game.


@pytest.mark.slow  # Integration-sized: subprocesses, compiles or every solver.
@given(st.data())
def test_rewards_sum_to_normalised_time_saved_and_mapping_validates(data):
  workload = data.draw(workloads())
  hardware = data.draw(hardware_for(workload))
  game = make_game(workload, hardware)
  policy = data.draw(st.sampled_from(["random", "first", "slow"]))
  rewards, _ = play(game, policy, seed=data.draw(st.integers(0, 100)))
  fresh = CostModel(workload, hardware)
  mapping = game.mapping(policy)
  report = validate_mapping(workload, hardware, mapping)
  expected_return = (fresh.slow_only_time - report.estimated_time_s) / fresh.slow_only_time
  assert rewards.sum() == pytest.approx(expected_return, rel=1e-7, abs=1e-12)
  assert game.total_time == pytest.approx(report.estimated_time_s, rel=1e-9)
  assert game.normaliser == fresh.slow_only_time
  if policy == "slow":
    assert len(mapping.allocations) == 0 and rewards.sum() == 0.0


@given(
  seed=st.integers(0, 10_000),
  fraction=st.sampled_from([0.1, 0.25, 0.5]),
  preset=st.sampled_from(["tpu-v4i-like", "nnpi-like"]),
)
@pytest.mark.slow  # Integration-sized: subprocesses, compiles or every solver.
def test_each_reward_is_the_exact_cost_model_decrease(seed, fraction, preset):
  workload = random_workload(seed, num_ops=30)
  hardware = contended(PRESETS[preset], workload, fraction)
  game = RequestsGame(workload, hardware)
  model = CostModel(workload, hardware)
  rng = np.random.default_rng(seed)
  ts = game.reset()
  previous = model.slow_only_time
  while not ts.last():
    legal = np.flatnonzero(ts.observation["legal_actions"])
    ts = game.step(legal[rng.integers(len(legal))])
    now = model.evaluate(game.allocations()).total_time_s
    assert ts.reward == pytest.approx((previous - now) / model.slow_only_time, rel=1e-6, abs=1e-12)
    previous = now


def test_three_level_hardware_places_in_both_fast_levels():
  workload = random_workload(3, num_ops=80)
  hardware = contended(PRESETS["nnpi-like"], workload, 0.1)
  assert hardware.num_fast_levels == 2
  game = RequestsGame(workload, hardware)
  levels_seen = set()
  ts = game.reset()
  while not ts.last():
    level, _ = game.candidates
    levels_seen.update(level.tolist())
    # Always take the last legal candidate: that interleaves into the slower fast level too.
    ts = game.step(np.flatnonzero(ts.observation["legal_actions"])[-1])
  mapping = game.mapping("last")
  validate_mapping(workload, hardware, mapping)
  assert levels_seen == {0, 1}
  assert {a["level"] for a in mapping.allocations} == {0, 1}


def test_illegal_action_raises_a_clear_error():
  workload = random_workload(5, num_ops=20)
  game = RequestsGame(workload, contended(PRESETS["tpu-v4i-like"], workload, 0.05))
  ts = game.reset()
  legal = ts.observation["legal_actions"]
  illegal = np.flatnonzero(~legal)
  assert illegal.size, "a 5% capacity must leave some candidate slots empty"
  with pytest.raises(IllegalActionError, match=rf"action {illegal[0]} is illegal for request 0"):
    game.step(illegal[0])
  with pytest.raises(IllegalActionError, match="action 99 is illegal"):
    game.step(99)
  with pytest.raises(IllegalActionError, match="action -1 is illegal"):
    game.step(-1)
  game.step(0)  # The failed attempts changed nothing: the game goes on.
  assert game.cursor == 1


def test_observations_match_specs_and_game_is_deterministic():
  workload = mlp_training_step()
  hardware = contended(PRESETS["tpu-v4i-like"], workload, 0.25)
  first = play(RequestsGame(workload, hardware), "random", seed=4)
  second = play(RequestsGame(workload, hardware), "random", seed=4)
  game = RequestsGame(workload, hardware)
  spec = game.observation_spec()
  for a, b in zip(first[1], second[1]):
    for key, s in spec.items():
      s.validate(a.observation[key])
      np.testing.assert_array_equal(a.observation[key], b.observation[key])
    assert a.observation["legal_actions"][0]
  np.testing.assert_array_equal(first[0], second[0])
  assert first[1][0].step_type == dm_env.StepType.FIRST
  assert first[1][-1].step_type == dm_env.StepType.LAST and first[1][-1].discount == 0.0
  assert game.action_spec().num_values == REQUESTS_GAME.num_actions


def test_step_after_the_end_starts_a_new_episode():
  workload = random_workload(2, num_ops=10)
  game = RequestsGame(workload, contended(PRESETS["tpu-v4i-like"], workload, 0.5))
  _, steps = play(game, "random")
  assert game.done
  ts = game.step(0)
  assert ts.first() and game.cursor == 0 and game.total_time == game.normaliser


def test_candidates_are_free_best_fit_first_and_requests_ordered_by_boundedness():
  workload = random_workload(9, num_ops=60)
  hardware = contended(PRESETS["tpu-v4i-like"], workload, 0.2)
  game = RequestsGame(workload, hardware)
  req = game.requests
  saving = np.max(req.standalone_saving, axis=1)
  boundedness = saving / np.sqrt(req.size)
  assert np.all(np.diff(boundedness) <= 1e-12 * boundedness.max())
  assert np.all(saving > 0)
  rng = np.random.default_rng(0)
  ts = game.reset()
  while not ts.last():
    _, offsets = game.candidates
    cand = ts.observation["candidates"]
    n = len(offsets)
    first_numeric = 1 + REQUESTS_GAME.max_fast_levels  # after the valid flag and level one-hot
    waste = cand[:n, first_numeric + 2]  # (gap - size) / capacity, one fast level here
    assert np.all(np.diff(waste) >= 0), "best fit first"
    legal = np.flatnonzero(ts.observation["legal_actions"])
    ts = game.step(legal[rng.integers(len(legal))])
  validate_mapping(workload, hardware, game.mapping("random"))


def test_usable_from_acme_environment_loop():
  from acme import environment_loop, specs

  rng = np.random.default_rng(0)
  actor = counting_actor(
    lambda observation: rng.choice(np.flatnonzero(observation["legal_actions"]))
  )
  workload = random_workload(1, num_ops=25)
  game = RequestsGame(workload, contended(PRESETS["tpu-v4i-like"], workload, 0.25))
  env_spec = specs.make_environment_spec(game)
  assert env_spec.actions.num_values == REQUESTS_GAME.num_actions
  loop = environment_loop.EnvironmentLoop(game, actor, should_update=False)
  loop.run(num_episodes=2)
  assert actor.observed == 2 * (len(game.requests) + 1)
  validate_mapping(workload, game.hardware, game.mapping("acme-loop"))


def test_too_many_fast_levels_for_the_observation_is_a_clear_error():
  from malloczero.env import Hardware, HardwareError, MemoryLevel

  workload = random_workload(1, num_ops=10)
  hw = Hardware(
    "deep", tuple(MemoryLevel(f"l{i}", 1 << 30, 10.0 ** (12 - i)) for i in range(4)), 1e12, 1e9, 1
  )
  with pytest.raises(HardwareError, match="3 fast levels"):
    RequestsGame(workload, hw)


@pytest.mark.parametrize("seed", [0, 1])
def test_rewards_stay_exact_while_copies_stall(seed):
  """Random play on a contended program makes prefetches wait for each other: the game's time
  includes the stalls, and the rewards still sum to the simulated time saved."""
  workload = random_workload(seed, num_ops=30)
  hardware = contended(PRESETS["tpu-v4i-like"], workload, 0.25)
  game = RequestsGame(workload, hardware)
  rewards, _ = play(game, "random", seed=seed)
  evaluation = CostModel(workload, hardware).evaluate(game.allocations())
  assert evaluation.total_stall_s > 0
  assert game.total_time == pytest.approx(evaluation.total_time_s, rel=1e-9)
  assert game.total_time == pytest.approx(
    evaluation.compute_and_memory_s + evaluation.total_stall_s, rel=1e-12
  )
  assert rewards.sum() == pytest.approx(1 - evaluation.total_time_s / game.normaliser, rel=1e-7)


def test_the_old_name_of_the_requests_game_still_works_with_a_warning():
  import malloczero as mz

  with pytest.warns(
    DeprecationWarning, match="malloczero.MallocGame is now malloczero.RequestsGame"
  ):
    assert mz.MallocGame is mz.RequestsGame
