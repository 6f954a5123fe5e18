"""mallocGame on msa's decision points (env/game/game.py): the heuristic is a policy in the game.

What must hold: playing msa's slot at every step gives the `msa` solver's mapping exactly; with
the "advantage" reward an episode returns exactly the fraction of msa's time it saves (0 for
msa's own play), with the "time" reward every reward is the exact decrease of the cost model's
program time (copies contending) so the rewards sum to the time saved; short games replay as
whole games; any legal play gives a mapping the validator accepts; the legal
mask, the slots and the observation describe the options msa weighs.
"""

import dataclasses

import numpy as np
import pytest
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st

from malloczero.env import (
  PRESETS,
  REQUESTS_GAME,
  GameConfig,
  IllegalActionError,
  MalloczeroError,
  MsaGame,
  RequestsGame,
  make_game,
  validate_mapping,
)
from malloczero.env.cost_model import CostModel
from malloczero.env.msa.algorithm import msa_allocations, option_slots
from malloczero.env.programs.suites import get_suite
from malloczero.env.programs.synthetic import contended, random_workload
from tests.strategies import counting_actor, hardware_for, workloads
from tests.test_msa_steps import same_allocations

CONFIG = GameConfig()
TIME_REWARD = GameConfig(reward="time")


def play(game: MsaGame, policy: str, seed: int = 0) -> np.ndarray:
  """Rewards of one episode under "msa", "random" or "default" (action 0 everywhere)."""
  rng = np.random.default_rng(seed)
  timestep, rewards = game.reset(), []
  while not timestep.last():
    legal = np.flatnonzero(timestep.observation["legal_actions"])
    action = {
      "msa": game.msa_action,
      "default": 0,
      "random": legal[rng.integers(len(legal))] if len(legal) else 0,
    }[policy]
    timestep = game.step(action)
    rewards.append(timestep.reward)
  return np.array(rewards)


def tiny_entries():
  return [(e.name, *e.load()) for e in get_suite("tiny").entries]


def new_game(workload, hardware, config: GameConfig = CONFIG) -> MsaGame:
  try:
    return MsaGame(workload, hardware, config)
  except MalloczeroError:
    assume(False)  # msa has nothing to decide (every buffer an output or empty): not a game.


@pytest.mark.parametrize("name,workload,hardware", tiny_entries(), ids=lambda x: str(x)[:30])
def test_msas_slot_at_every_step_is_the_msa_solver(name, workload, hardware):
  game = MsaGame(workload, hardware)
  rewards = play(game, "msa")
  expected, _ = msa_allocations(workload, hardware)
  assert same_allocations(game.allocations(), expected)
  report = validate_mapping(workload, hardware, game.mapping("msa"))
  assert report.estimated_time_s == pytest.approx(game.total_time, rel=1e-9)
  assert game.msa_time == game.total_time and rewards.sum() == 0.0  # The advantage over msa.
  timed = MsaGame(workload, hardware, TIME_REWARD)
  rewards = play(timed, "msa")
  assert rewards.sum() == pytest.approx(1 - report.estimated_time_s / game.normaliser, rel=1e-7)


@pytest.mark.parametrize("preset", ["tpu-v4i-like", "nnpi-like"])
def test_msas_slot_is_the_msa_solver_on_a_contended_random_program(preset):
  workload = random_workload(3, num_ops=120)
  hardware = contended(PRESETS[preset], workload, 0.25)
  game = MsaGame(workload, hardware)
  play(game, "msa")
  expected, stats = msa_allocations(workload, hardware)
  assert stats.prefetches > 0
  assert same_allocations(game.allocations(), expected)


@pytest.mark.slow  # Integration-sized: subprocesses, compiles or every solver.
@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.data())
def test_rewards_sum_to_the_time_saved_and_every_mapping_validates(data):
  workload = data.draw(workloads())
  hardware = data.draw(hardware_for(workload))
  config = data.draw(st.sampled_from([CONFIG, TIME_REWARD]))
  game = new_game(workload, hardware, config)
  policy = data.draw(st.sampled_from(["random", "msa", "default"]))
  rewards = play(game, policy, seed=data.draw(st.integers(0, 1000)))
  model = CostModel(workload, hardware)
  report = validate_mapping(workload, hardware, game.mapping(policy))
  assert game.total_time == pytest.approx(report.estimated_time_s, rel=1e-9)
  reference = model.slow_only_time if config.reward == "time" else game.msa_time
  assert rewards.sum() == pytest.approx(
    1 - report.estimated_time_s / reference, rel=1e-7, abs=1e-12
  )
  if config.reward == "advantage":  # Every reward but the last is 0: C is measured at the end.
    assert not rewards[:-1].any()
  if policy == "default":  # All-slow: nothing saved, so msa's whole advantage is lost.
    assert len(game.allocations()) == 0
    assert rewards.sum() == (
      0.0
      if config.reward == "time"
      else pytest.approx(1 - model.slow_only_time / game.msa_time, rel=1e-9)
    )


@pytest.mark.parametrize(
  "seed,preset", [(0, "tpu-v4i-like"), (1, "nnpi-like"), (2, "tpu-v4i-like")]
)
def test_each_reward_is_the_exact_cost_model_decrease(seed, preset):
  """Step by step, against a fresh evaluation of the segments committed so far (uncommits,
  evictions and stalls included)."""
  workload = random_workload(seed, num_ops=40)
  hardware = contended(PRESETS[preset], workload, 0.25)
  game = MsaGame(workload, hardware, TIME_REWARD)
  model = CostModel(workload, hardware)
  rng = np.random.default_rng(seed)
  timestep, previous, stalled = game.reset(), model.slow_only_time, False
  while not timestep.last():
    legal = np.flatnonzero(timestep.observation["legal_actions"])
    timestep = game.step(legal[rng.integers(len(legal))])
    evaluation = model.evaluate(game.allocations())
    stalled |= evaluation.total_stall_s > 0
    assert timestep.reward == pytest.approx(
      (previous - evaluation.total_time_s) / model.slow_only_time, rel=1e-6, abs=1e-12
    )
    assert game.total_time == pytest.approx(evaluation.total_time_s, rel=1e-9)
    previous = evaluation.total_time_s
  assert stalled, "the program should make copies wait, or the check is too easy"


def test_uncommit_takes_back_the_buffers_segments_and_copies():
  """XLA's evict-and-prefetch program with no eviction allowed: the activation kept in fast
  memory must be evicted before its late use, the eviction is refused, and option 0 sends the
  whole buffer back to default memory; the reward takes back what its first segment saved."""
  from malloczero.env.msa.algorithm import MsaOptions
  from tests.msa_xla_cases import XLA_HW
  from tests.test_msa import evict_and_prefetch

  workload = evict_and_prefetch()
  game = MsaGame(
    workload,
    XLA_HW,
    TIME_REWARD,
    msa_options=MsaOptions(picker="instruction_count", max_outstanding_evictions=0),
  )
  timestep, total, seen = game.reset(), 0.0, False
  while not timestep.last():
    decision = game.decision
    if decision.options[0].kind == "uncommit":
      seen = True
      before = game.total_time
      held = [a for a in dataclasses.astuple(game.allocations())]
      assert len(held[0]) > 0 and decision.buffer in held[0].tolist()
      timestep = game.step(0)
      assert decision.buffer not in game.allocations().buffer.tolist()
      assert timestep.reward < 0 and game.total_time > before
    else:
      timestep = game.step(1 if timestep.observation["legal_actions"][1] else game.msa_action)
    total += timestep.reward
  assert seen, "the program should force an uncommit"
  report = validate_mapping(workload, XLA_HW, game.mapping("uncommit"))
  assert total == pytest.approx(1 - report.estimated_time_s / game.normaliser, rel=1e-9)


def test_slots_legal_mask_and_observation_describe_msas_options():
  workload = random_workload(5, num_ops=60)
  hardware = contended(PRESETS["nnpi-like"], workload, 0.25)
  game = MsaGame(workload, hardware)
  layout = CONFIG.layout
  c, q = layout.candidate, layout.request
  rng = np.random.default_rng(0)
  timestep, kinds = game.reset(), set()
  while not timestep.last():
    obs, decision = timestep.observation, game.decision
    slots = option_slots(decision.options, CONFIG.max_prefetch_starts)
    assert len(set(slots.tolist())) == len(slots)
    np.testing.assert_array_equal(np.flatnonzero(obs["legal_actions"]), np.sort(slots))
    np.testing.assert_array_equal(obs["candidates"][:, c.index("valid")], obs["legal_actions"][1:])
    assert game.msa_action == slots[decision.msa_choice]
    marked = np.flatnonzero(obs["candidates"][:, c.index("msa_choice")])
    assert marked.tolist() == ([] if game.msa_action == 0 else [game.msa_action - 1])
    assert obs["request"][q.index("msa_takes_option0")] == (game.msa_action == 0)
    for option, slot in zip(decision.options[1:], slots[1:]):
      row = obs["candidates"][slot - 1]
      kinds.add(option.kind)
      assert row[c.index(option.kind)] == 1.0
      assert row[c.slice("level")].argmax() == option.level
      if option.kind == "prefetch":
        assert (
          2 + option.level * CONFIG.max_prefetch_starts
          <= slot
          < 2 + (option.level + 1) * CONFIG.max_prefetch_starts
        )
      else:
        assert slot == 1
    # Occupancy: each bin's share taken by the chunks live during the segment's window.
    for level in range(hardware.num_fast_levels):
      start, end, offset, size = game._decisions.algorithm.heaps[level].chunks()
      live = (start <= decision.use) & (end > max(decision.segment_start, 0))
      edges = np.linspace(0, hardware.levels[level].capacity_bytes, CONFIG.occupancy_bins + 1)
      covered = np.clip(edges[:, None] - offset[live][None, :], 0, size[live][None, :]).sum(1)
      np.testing.assert_allclose(
        obs["occupancy"][level],
        np.minimum(np.diff(covered) / (edges[1] - edges[0]), 1.0),
        atol=1e-6,
      )
    kind0 = decision.options[0].kind
    assert obs["request"][q.slice("option0")].argmax() == ("default", "evict", "uncommit").index(
      kind0
    )
    for name, spec in game.observation_spec().items():
      assert obs[name].shape == spec.shape and obs[name].dtype == spec.dtype
    legal = np.flatnonzero(obs["legal_actions"])
    timestep = game.step(legal[rng.integers(len(legal))])
  assert kinds == {"keep", "prefetch"}
  assert timestep.observation["legal_actions"].tolist() == [True] + [False] * (
    CONFIG.num_actions - 1
  )


def test_illegal_actions_and_wrong_configs_are_clear_errors():
  workload = random_workload(1, num_ops=30)
  hardware = contended(PRESETS["tpu-v4i-like"], workload, 0.25)
  game = MsaGame(workload, hardware)
  timestep = game.reset()
  illegal = np.flatnonzero(~timestep.observation["legal_actions"])
  assert len(illegal)
  with pytest.raises(IllegalActionError, match=f"action {illegal[0]} is illegal at decision 0"):
    game.step(illegal[0])
  with pytest.raises(IllegalActionError, match="is illegal"):
    game.step(CONFIG.num_actions)
  with pytest.raises(ValueError, match="MsaGame plays msa's decisions"):
    MsaGame(workload, hardware, REQUESTS_GAME)
  with pytest.raises(ValueError, match="RequestsGame plays requests"):
    RequestsGame(workload, hardware, CONFIG)
  with pytest.raises(ValueError, match="game.decisions must be one of msa, requests, got 'xla'"):
    GameConfig(decisions="xla")
  assert isinstance(make_game(workload, hardware, CONFIG), MsaGame)
  assert isinstance(make_game(workload, hardware, REQUESTS_GAME), RequestsGame)
  assert CONFIG.num_actions == 2 + 4 * 2 and REQUESTS_GAME.num_actions == 17


def test_deterministic_and_a_step_after_the_end_starts_again():
  workload = random_workload(2, num_ops=40)
  hardware = contended(PRESETS["tpu-v4i-like"], workload, 0.25)
  game = MsaGame(workload, hardware)
  first = play(game, "random", seed=3)
  second = play(game, "random", seed=3)
  np.testing.assert_array_equal(first, second)
  timestep = game.step(0)
  assert timestep.first() and game.num_steps == 0


def test_usable_from_acme_environment_loop():
  from acme import environment_loop, specs

  column = CONFIG.layout.candidate.index("msa_choice")
  # Plays the slot msa marks in the observation: no access to the game's internals.
  actor = counting_actor(
    lambda observation: (
      (np.flatnonzero(observation["candidates"][:, column]).tolist() + [-1])[0] + 1
    )
  )
  workload = random_workload(1, num_ops=40)
  hardware = contended(PRESETS["tpu-v4i-like"], workload, 0.25)
  game = MsaGame(workload, hardware)
  assert specs.make_environment_spec(game).actions.num_values == CONFIG.num_actions
  environment_loop.EnvironmentLoop(game, actor, should_update=False).run(num_episodes=1)
  expected, _ = msa_allocations(workload, hardware)
  assert same_allocations(game.allocations(), expected)
  assert actor.observed == game.num_steps + 1


@pytest.mark.parametrize("preset", ["tpu-v4i-like", "nnpi-like"])
def test_skipping_small_decisions_keeps_rewards_exact_and_msa_reachable(preset):
  """With `skip_below`, msa plays the decisions that cannot matter much; the agent sees fewer
  moves, each offering a choice, msa's slot everywhere is still the msa solver, and the rewards
  (those of the skipped decisions included) still sum to the time saved."""
  workload = random_workload(4, num_ops=120)
  hardware = contended(PRESETS[preset], workload, 0.25)
  full = MsaGame(workload, hardware)
  play(full, "msa")
  config = dataclasses.replace(TIME_REWARD, skip_below=1e-3)
  game = MsaGame(workload, hardware, config)
  threshold = 1e-3 * game.normaliser
  rng = np.random.default_rng(0)
  for policy in ("msa", "random"):
    timestep, total = game.reset(), 0.0
    while not timestep.last():
      options = game.decision.options
      assert len(options) > 1 and max(o.saving for o in options) >= threshold
      legal = np.flatnonzero(timestep.observation["legal_actions"])
      timestep = game.step(game.msa_action if policy == "msa" else rng.choice(legal))
      total += timestep.reward
    report = validate_mapping(workload, hardware, game.mapping(policy))
    assert total == pytest.approx(1 - report.estimated_time_s / game.normaliser, rel=1e-7)
    if policy == "msa":
      expected, _ = msa_allocations(workload, hardware)
      assert same_allocations(game.allocations(), expected)
      assert 0 < game.num_steps < full.num_steps


def test_skip_below_is_checked_and_a_game_with_nothing_worth_deciding_is_refused():
  with pytest.raises(ValueError, match="skip_below must be a fraction"):
    GameConfig(skip_below=1.0)
  workload = random_workload(1, num_ops=30)
  hardware = contended(PRESETS["tpu-v4i-like"], workload, 0.25)
  with pytest.raises(MalloczeroError, match="no decision of msa's is worth 0.9"):
    MsaGame(workload, hardware, dataclasses.replace(CONFIG, skip_below=0.9))


@pytest.mark.parametrize("preset", ["tpu-v4i-like", "nnpi-like"])
def test_short_games_return_their_advantage_and_replay_as_whole_games(preset):
  """`reset_segment`: msa plays up to `start`, the agent `moves`, msa the rest; the return is the
  exact advantage over msa of the whole trajectory, which `played_actions` replays."""
  workload = random_workload(5, num_ops=120)
  hardware = contended(PRESETS[preset], workload, 0.25)
  game = MsaGame(workload, hardware)
  model = CostModel(workload, hardware)
  msa_time = model.evaluate(msa_allocations(workload, hardware)[0]).total_time_s
  assert game.msa_time == pytest.approx(msa_time, rel=1e-12) and game.msa_moves > 10
  rng = np.random.default_rng(1)
  whole, msa_slots = MsaGame(workload, hardware, reference=game.reference), []
  timestep = whole.reset()
  while not timestep.last():
    msa_slots.append(whole.msa_action)
    timestep = whole.step(whole.msa_action)
  returns = []
  for start in (0, game.msa_moves // 2, game.msa_moves - 1):
    timestep, total, moves = game.reset_segment(start, 4), 0.0, 0
    # The prefix plans only msa's options and simulates the stall once, yet the agent starts
    # from exactly the state (program time, observation) msa's whole game reaches there.
    reached = whole.reset()
    for action in msa_slots[:start]:
      reached = whole.step(action)
    assert game.total_time == whole.total_time
    for key, value in reached.observation.items():
      np.testing.assert_array_equal(timestep.observation[key], value, err_msg=key)
    while not timestep.last():
      legal = np.flatnonzero(timestep.observation["legal_actions"])
      timestep = game.step(rng.choice(legal))
      total, moves = total + timestep.reward, moves + 1
    assert moves == min(4, game.msa_moves - start)
    assert total == pytest.approx(1 - game.total_time / msa_time, rel=1e-9, abs=1e-15)
    played, time = game.played_actions, game.total_time
    assert len(played) == game.num_steps
    timestep, replayed = game.reset(), 0.0
    for action in played:
      timestep = game.step(action)
      replayed += timestep.reward
    assert timestep.last() and game.total_time == time and replayed == pytest.approx(total)
    returns.append(total)
  assert any(r != 0 for r in returns), "random moves should change the mapping somewhere"
  with pytest.raises(ValueError, match="start < "):
    game.reset_segment(game.msa_moves, 4)
  with pytest.raises(ValueError, match="'advantage' reward"):
    MsaGame(workload, hardware, TIME_REWARD).reset_segment(0, 4)
