"""Greedy play (actors/greedy_play.py) on the tiny suite's real XLA programs: valid, consistent
mappings, each program's fastest attempt kept, the policy alone as one more attempt, results
independent of the batch; and the programs actors play with capacity variants."""

import dataclasses

import pytest

from malloczero.actors.games import program_specs, training_specs
from malloczero.actors.greedy_play import evaluate_params, play_programs
from malloczero.env import validate_mapping
from tests.tiny_agent import (
  ALL_SPECS,
  CONFIG,
  NETWORKS,
  TRAIN_SPECS,
  all_default_moves,
  initial_params,
  noisy,
)


@pytest.fixture(scope="module")
def params():
  return initial_params()


@pytest.mark.slow
def test_evaluate_params_mappings_are_valid_and_consistent(params):
  # Perturbed parameters, so that the greedy search places buffers and the mappings checked
  # below hold real allocations (fresh parameters mostly leave everything in slow memory).
  results = evaluate_params(NETWORKS, noisy(params, 7, scale=0.5), CONFIG, ALL_SPECS, seed=3)
  assert [r.program for r in results] == [s.name for s in ALL_SPECS]
  assert sum(len(r.mapping.allocations) for r in results) > 0
  for spec, result in zip(ALL_SPECS, results):
    report = validate_mapping(spec.workload, spec.hardware, result.mapping)
    slow, final = result.mapping.slow_only_time_s, result.mapping.estimated_time_s
    assert result.time_s == final
    assert report.estimated_time_s == pytest.approx(final, rel=1e-6)
    assert report.slow_only_time_s == pytest.approx(slow, rel=1e-6)
    assert result.episode_return == pytest.approx((slow - final) / slow, rel=1e-9, abs=1e-12)
    assert result.speedup == pytest.approx(slow / final, rel=1e-12)


@pytest.mark.slow
def test_play_programs_keeps_each_programs_fastest_attempt(params):
  """Several programs x several attempts in one batch: per program, the kept mapping is the
  fastest of its attempts, the greedy attempt comes first, and every mapping validates."""
  specs = ALL_SPECS[:3]
  search = dataclasses.replace(CONFIG.search, num_simulations=4, eval_num_simulations=4)
  results = play_programs(
    NETWORKS, noisy(params, 11, scale=0.5), search, CONFIG.game, specs, attempts=3, seed=5
  )
  assert [r.program for r in results] == [s.name for s in specs]
  for spec, result in zip(specs, results):
    assert len(result.attempt_speedups) == 3
    assert result.speedup == pytest.approx(max(result.attempt_speedups), rel=1e-12)
    assert result.attempt_speedups[result.best_attempt] == pytest.approx(result.speedup)
    assert result.greedy_speedup == result.attempt_speedups[0]
    # Moves of the greedy trajectory: at most every segment's decision (an uncommit skips the
    # rest of its buffer), which is what always leaving the buffer in default memory plays.
    assert 1 <= result.requests <= all_default_moves(spec)
    checked = validate_mapping(spec.workload, spec.hardware, result.mapping)
    assert checked.speedup == pytest.approx(result.speedup, rel=1e-6)
  with pytest.raises(ValueError, match="attempts"):
    play_programs(NETWORKS, params, search, CONFIG.game, specs, attempts=0)


@pytest.mark.slow  # Compiles the search or the learner step.
def test_the_policy_alone_is_one_more_attempt_played_as_with_zero_simulations(params):
  """`policy_alone`: per program one more trajectory, the policy's own (no search): the one that
  a search of 0 simulations plays greedily, kept last among the attempts and counted in the
  fastest; where the greedy search has 0 simulations already, no game is added."""
  specs = ALL_SPECS[:3]
  noisy_params = noisy(params, 11, scale=0.5)
  search = dataclasses.replace(CONFIG.search, num_simulations=4, eval_num_simulations=4)
  alone = dataclasses.replace(search, num_simulations=0, eval_num_simulations=0)
  results = play_programs(
    NETWORKS, noisy_params, search, CONFIG.game, specs, attempts=2, seed=5, policy_alone=True
  )
  policy = play_programs(NETWORKS, noisy_params, alone, CONFIG.game, specs, seed=9)
  without = play_programs(NETWORKS, noisy_params, search, CONFIG.game, specs, attempts=2, seed=5)
  assert {len(p.actions) for p in policy} != {0}
  for result, played, plain in zip(results, policy, without):
    assert len(result.attempt_speedups) == 3
    assert result.policy_speedup == result.attempt_speedups[-1]
    assert result.policy_speedup == pytest.approx(played.greedy_speedup, rel=1e-12)
    assert result.speedup == pytest.approx(max(result.attempt_speedups), rel=1e-12)
    # The searched attempts are the ones played without the policy's game beside them.
    assert result.attempt_speedups[:2] == pytest.approx(plain.attempt_speedups, rel=1e-12)
    assert plain.policy_speedup is None
  for result, played in zip(
    play_programs(NETWORKS, noisy_params, alone, CONFIG.game, specs, seed=9, policy_alone=True),
    policy,
  ):
    assert len(result.attempt_speedups) == 1
    assert result.policy_speedup == result.greedy_speedup == played.greedy_speedup


@pytest.mark.slow  # Compiles the search or the learner step.
def test_greedy_play_does_not_depend_on_the_batch_it_shares_as_games_finish(params):
  """The msa game's episodes differ in length, so the batch shrinks as games end
  (`_batch_size`): each program's greedy trajectory is the one it gets when played alone."""
  specs = ALL_SPECS[:4]
  search = dataclasses.replace(CONFIG.search, num_simulations=4, eval_num_simulations=4)
  noisy_params = noisy(params, 3, scale=0.5)
  together = play_programs(NETWORKS, noisy_params, search, CONFIG.game, specs, seed=2)
  assert len({r.requests for r in together}) > 1, "the games should end at different steps"
  for spec, result in zip(specs, together):
    (alone,) = play_programs(NETWORKS, noisy_params, search, CONFIG.game, [spec], seed=2)
    assert alone.requests == result.requests
    assert alone.speedup == pytest.approx(result.speedup, rel=1e-12)


def test_capacity_variants_add_each_training_entry_at_the_other_fractions():
  """Actors play every training entry at each variant fraction of its program's peak, named as
  suite entries are; an entry's own fraction is not added twice, and what reports evaluate
  (`program_specs`) is the suite's own entries."""
  config = dataclasses.replace(CONFIG, capacity_variants=(0.25, 0.5))
  own = program_specs(config, "train")
  specs = training_specs(config)
  assert [s.name for s in own] == [s.name for s in TRAIN_SPECS]
  assert [s.name for s in specs[: len(own)]] == [s.name for s in own]
  # tiny's training entries are all at 25%: each comes once more, at 50%.
  assert [s.name for s in specs[len(own) :]] == [s.name.replace(":25%", ":50%") for s in own]
  for variant, entry in zip(specs[len(own) :], own):
    assert variant.workload is entry.workload
    doubled = 2 * entry.hardware.fast_capacity_bytes
    slack = 2 * len(entry.hardware.levels) * entry.hardware.alignment_bytes
    assert abs(variant.hardware.fast_capacity_bytes - doubled) <= slack, variant.name
  assert [s.name for s in training_specs(CONFIG)] == [s.name for s in own]
  with pytest.raises(ValueError, match=r"fractions in \(0, 1\]"):
    dataclasses.replace(CONFIG, capacity_variants=(0.0,))
  with pytest.raises(ValueError, match="train on a suite"):
    dataclasses.replace(CONFIG, suite="", capacity_variants=(0.5,))


@pytest.mark.slow  # Compiles the search.
def test_the_policy_alone_plays_first_so_a_stop_that_cuts_the_searches_keeps_it(params):
  """The policy's own trajectory (no search) is played to its end before any searched move: a
  stop (or deadline) that cuts the searched trajectories still leaves the network's own play, its
  mapping the kept one."""
  specs = ALL_SPECS[:3]
  noisy_params = noisy(params, 11, scale=0.5)
  search = dataclasses.replace(CONFIG.search, num_simulations=4, eval_num_simulations=4)
  alone = dataclasses.replace(search, num_simulations=0, eval_num_simulations=0)
  policy = play_programs(NETWORKS, noisy_params, alone, CONFIG.game, specs, seed=9)
  # The stop is asked once per extra game built (one policy game per program) and once per
  # move of the policy's batch, then before the first searched move: it says stop there.
  looks = iter(range(10**6))
  allowed = len(specs) + max(len(p.actions) for p in policy)
  results = play_programs(
    NETWORKS, noisy_params, search, CONFIG.game, specs, seed=5, policy_alone=True,
    should_stop=lambda: next(looks) >= allowed,
  )  # fmt: skip
  for result, played in zip(results, policy):
    assert result.greedy_speedup is None and result.unfinished == 1
    assert result.policy_speedup == pytest.approx(played.greedy_speedup, rel=1e-12)
    assert result.mapping is not None
    assert result.speedup == pytest.approx(result.policy_speedup, rel=1e-12)


@pytest.mark.slow  # Compiles the search.
def test_split_search_calls_and_a_stop_keep_greedy_play_or_drop_it(params, monkeypatch):
  """A batch split into calls of fewer games (`CALL_COST`, so that a call stays short) plays the
  same greedy trajectories; a stop ends the play between calls, and the cut trajectories are
  dropped (no mapping, no speed-up), never reported half played."""
  import malloczero.actors.greedy_play as greedy_play

  specs = ALL_SPECS[:3]
  search = dataclasses.replace(CONFIG.search, num_simulations=4, eval_num_simulations=4)
  noisy_params = noisy(params, 3, scale=0.5)
  whole = play_programs(NETWORKS, noisy_params, search, CONFIG.game, specs, seed=2)
  monkeypatch.setattr(greedy_play, "CALL_COST", 16)  # 4 simulations: one game a call.
  assert greedy_play.games_per_call(4, len(specs)) == 1
  split = play_programs(NETWORKS, noisy_params, search, CONFIG.game, specs, seed=2)
  for a, b in zip(whole, split):
    assert a.actions == b.actions and a.speedup == pytest.approx(b.speedup, rel=1e-12)
    assert a.unfinished == b.unfinished == 0
  looks = iter(range(10**6))
  stopped = play_programs(
    NETWORKS, noisy_params, search, CONFIG.game, specs, seed=2, should_stop=lambda: next(looks) > 5
  )
  assert [r.unfinished for r in stopped] == [1, 1, 1]
  assert all(r.mapping is None and r.greedy_speedup is None for r in stopped)
