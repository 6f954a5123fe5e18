"""Demonstrations: the best known trajectory per training program, replayed from its moves,
sampled into learner batches beside replay items and fitted to their exact returns."""

import dataclasses
import functools
import json
import threading

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import tree

from malloczero.actors.games import suite_games
from malloczero.configs.config import get_config
from malloczero.env import MalloczeroError, make_game, validate_mapping
from malloczero.env.game import GameConfig, return_speedup
from malloczero.env.mapping import load_mapping
from malloczero.env.solvers import solve
from malloczero.learner import MuZeroLearner, make_networks
from malloczero.learner import learner as learner_lib
from malloczero.learner.demonstrations import (
  DEMONSTRATIONS_FILENAME,
  Demonstration,
  Demonstrations,
  demonstration_steps,
  heuristic_actions,
)
from malloczero.learner.fakes import random_batch
from malloczero.replay import PRIORITY_EPSILON
from malloczero.system.builder import write_best_mapping

CONFIG = get_config("tiny")
L = CONFIG.learner.sequence_length
K, N = CONFIG.learner.unroll_steps, CONFIG.learner.td_steps
SPECS = suite_games("tiny", "train")


def _random_actions(game, seed: int) -> tuple[list[int], float]:
  rng = np.random.default_rng(seed)
  timestep, actions, total = game.reset(), [], 0.0
  while not timestep.last():
    actions.append(int(rng.choice(np.flatnonzero(timestep.observation["legal_actions"]))))
    timestep = game.step(actions[-1])
    total += timestep.reward
  return actions, total


@pytest.fixture(scope="module")
def demonstrations():
  demos = Demonstrations(SPECS, CONFIG.game, L, seed=0)
  assert demos.add_heuristic() == len(SPECS)
  return demos


def test_heuristic_play_is_the_msa_solver_and_steps_follow_the_replay_layout():
  spec = SPECS[0]
  game = make_game(spec.workload, spec.hardware, CONFIG.game)
  actions = heuristic_actions(game)
  steps, episode_return, departures = demonstration_steps(game, actions, L, CONFIG.game)
  assert departures.size == 0  # msa's own play never leaves msa's move.
  msa = solve(spec.workload, spec.hardware, "msa")
  assert game.msa_time == pytest.approx(msa.mapping.estimated_time_s, rel=1e-9)
  slow = game.cost_model.slow_only_time  # The tiny preset's "time" reward: the time saved.
  assert episode_return == pytest.approx(1.0 - msa.mapping.estimated_time_s / slow, rel=1e-9)
  advantage = GameConfig(reward="advantage")  # The default reward: no advantage over msa.
  game = make_game(spec.workload, spec.hardware, advantage)
  assert demonstration_steps(game, actions, L, advantage)[1] == 0.0
  T = len(actions)
  assert steps.valid.shape == (T + L - 1,)
  np.testing.assert_array_equal(steps.valid, np.r_[np.ones(T), np.zeros(L - 1)])
  np.testing.assert_array_equal(steps.action[:T], actions)
  np.testing.assert_array_equal(steps.policy[:T], np.eye(CONFIG.game.num_actions)[actions])
  # root_value is the exact return still to come; terminal and padding hold zeros.
  np.testing.assert_allclose(
    steps.root_value[:T], np.cumsum(steps.reward[:T][::-1])[::-1], rtol=1e-5, atol=1e-7
  )
  assert steps.root_value[0] == pytest.approx(episode_return, rel=1e-6)
  assert not steps.policy[T:].any() and not steps.reward[T:].any()
  assert steps.observation["legal_actions"][T].tolist() == [True] + [False] * (
    CONFIG.game.num_actions - 1
  )
  assert not steps.observation["legal_actions"][T + 1 :].any()
  # Every observation is the game's own at that step.
  timestep = game.reset()
  for t, action in enumerate(actions):
    for key, value in timestep.observation.items():
      np.testing.assert_array_equal(steps.observation[key][t], value, err_msg=key)
    timestep = game.step(action)


def test_replaying_wrong_moves_is_a_one_line_error():
  spec = SPECS[0]
  game = make_game(spec.workload, spec.hardware, CONFIG.game)
  actions = heuristic_actions(game)
  with pytest.raises(MalloczeroError, match="stops before the game ends"):
    demonstration_steps(game, actions[:-1], L, CONFIG.game)
  with pytest.raises(MalloczeroError, match="more moves than the game"):
    demonstration_steps(game, actions + [0], L, CONFIG.game)


def test_offers_keep_only_improvements_and_check_the_return(demonstrations):
  spec = SPECS[0]
  msa_return = demonstrations.best_return(spec.name)
  assert demonstrations.best()[spec.name].source == "msa" and demonstrations.num_improved() == 0
  game = make_game(spec.workload, spec.hardware, CONFIG.game)
  worse, worse_return = _random_actions(game, 1)
  assert worse_return < msa_return
  # A worse game is refused without replaying it; a wrong claimed return is caught on replay.
  replays = demonstrations.num_replays
  assert replays >= len(SPECS) and demonstrations.replay_seconds > 0  # msa's, one per program.
  assert demonstrations.offer(spec.name, [0], worse_return, "agent") == msa_return
  assert demonstrations.num_replays == replays
  with pytest.raises(MalloczeroError, match="replays to return"):
    demonstrations.offer(spec.name, worse, msa_return + 0.5, "agent")
  assert demonstrations.num_replays == replays + 1
  with pytest.raises(MalloczeroError, match="unknown program"):
    demonstrations.offer("no-such-program", worse, 1.0, "agent")
  assert demonstrations.best()[spec.name].source == "msa"


def test_a_better_game_replaces_msas_and_is_saved_and_restored(tmp_path):
  """... and its mapping is written (validated, with its picture) by the run's `on_improve`;
  msa's own mappings are not."""
  best_dir = tmp_path / "best"
  demos = Demonstrations(
    SPECS, CONFIG.game, L, seed=0, on_improve=functools.partial(write_best_mapping, str(best_dir))
  )
  demos.add_heuristic()
  assert not best_dir.exists()
  # A better game than msa's, found by random search (rarely found by chance: the tiny
  # programs' msa is strong, so the search goes on until one appears or gives up).
  improved = None
  for spec in SPECS:
    game = make_game(spec.workload, spec.hardware, CONFIG.game)
    for seed in range(300):
      actions, total = _random_actions(game, seed)
      if total > demos.best_return(spec.name) + 1e-9:
        improved = (spec.name, actions, total)
        break
    if improved:
      break
  assert improved is not None, "no random game beat msa on any tiny program"
  name, actions, total = improved
  assert demos.offer(name, actions, total, "agent") == pytest.approx(total, rel=1e-9)
  assert demos.best()[name].actions == tuple(actions)
  assert demos.num_improved() == 1
  spec = next(s for s in SPECS if s.name == name)
  written = load_mapping(str(best_dir / f"{name}.json"))
  report = validate_mapping(spec.workload, spec.hardware, written)
  msa = solve(spec.workload, spec.hardware, "msa").speedup
  assert report.speedup == pytest.approx(return_speedup(CONFIG.game, total, msa), rel=1e-6)
  assert (best_dir / f"{name}.png").stat().st_size > 0
  assert sorted(p.name for p in best_dir.iterdir()) == [f"{name}.json", f"{name}.png"]
  path = demos.save(str(tmp_path))
  assert path.endswith(DEMONSTRATIONS_FILENAME)
  restored = Demonstrations(SPECS, CONFIG.game, L, seed=0)
  assert restored.restore(str(tmp_path)) == len(SPECS)
  restored.add_heuristic()  # Does not undo the improvement.
  assert restored.best() == demos.best()
  # A store of fewer programs (a smaller learner.demonstration_programs) keeps its own alone.
  fewer = Demonstrations([s for s in SPECS if s.name != name], CONFIG.game, L, seed=0)
  assert fewer.restore(str(tmp_path)) == len(SPECS) - 1 and name not in fewer.best()
  (tmp_path / DEMONSTRATIONS_FILENAME).write_text('[{"program": 1}]')
  with pytest.raises(MalloczeroError, match="demonstrations file .* is unusable"):
    Demonstrations(SPECS, CONFIG.game, L).restore(str(tmp_path))


def test_the_learner_samples_while_a_demonstration_is_replayed():
  """A replay steps through a whole program (seconds on the largest), and the learner's batches
  must not wait for it: `on_improve` runs at a replay's end with its game still held, and a
  sample taken meanwhile from another thread (the learner's) comes back."""
  returned = []

  def sample_meanwhile(demonstration, game):
    sampled = []
    learner = threading.Thread(target=lambda: sampled.append(demos.sample(4)))
    learner.start()
    learner.join(timeout=30)
    returned.append(not learner.is_alive() and len(sampled) == 1)
    if sampled:
      steps, weights = sampled[0]
      assert weights.tolist() == [1.0] * 4 and steps.valid.shape[:2] == (4, L)

  demos = Demonstrations(SPECS[:2], CONFIG.game, L, seed=0, on_improve=sample_meanwhile)
  assert demos.add_heuristic() == 2
  assert returned == [True, True]


def test_samples_are_windows_of_the_demonstrations(demonstrations):
  steps, weights = demonstrations.sample(64)
  assert steps.valid.shape == (64, L) and steps.policy.shape == (64, L, CONFIG.game.num_actions)
  np.testing.assert_array_equal(weights, np.ones(64))
  whole = {
    name: demonstration_steps(
      make_game(s.workload, s.hardware, CONFIG.game),
      demonstrations.best()[name].actions,
      L,
      CONFIG.game,
    )[0]
    for name, s in ((s.name, s) for s in SPECS)
  }
  found = set()
  for b in range(64):
    window = tree.map_structure(lambda x: x[b], steps)
    assert window.valid[0] == 1.0  # Every window starts at a real step.
    for name, full in whole.items():
      starts = np.flatnonzero(
        (full.action == window.action[0]) & (full.root_value == window.root_value[0])
      )
      if any(
        np.array_equal(full.observation["candidates"][s : s + L], window.observation["candidates"])
        for s in starts
      ):
        found.add(name)
        break
    else:
      pytest.fail(f"window {b} is not a slice of any demonstration")
  assert len(found) == len(SPECS)  # Programs are drawn uniformly: all appear in 64 draws.
  empty, weights = Demonstrations(SPECS, CONFIG.game, L).sample(4)
  assert empty.valid.shape == (4, L) and not empty.valid.any() and not weights.any()


def _one_departure(game, at: int) -> tuple[list[int], int]:
  """msa's play of `game` with one other legal move at the first step from `at` that has one:
  (moves, the step that departs)."""
  timestep, actions, departure = game.reset(), [], -1
  while not timestep.last():
    action = game.msa_action
    legal = np.flatnonzero(timestep.observation["legal_actions"])
    others = legal[legal != action]
    if departure < 0 and len(actions) >= at and others.size:
      action, departure = int(others[0]), len(actions)
    actions.append(action)
    timestep = game.step(action)
  return actions, departure


def test_windows_can_be_placed_on_the_departures_from_msa():
  """With `departure_share` 1, every window of a demonstration that leaves msa's move once has
  that step among its first K + 1 (the steps fitted with a policy target); with 0 they start
  anywhere."""
  spec = SPECS[0]
  game = make_game(spec.workload, spec.hardware, CONFIG.game)
  actions, departure = _one_departure(game, at=len(heuristic_actions(game)) // 2)
  assert departure > K
  full, _, departures = demonstration_steps(game, actions, L, CONFIG.game)
  np.testing.assert_array_equal(departures, [departure])

  def starts(share: float) -> set[int]:
    demos = Demonstrations([spec], CONFIG.game, L, seed=0, departure_share=share, unroll_steps=K)
    demos.offer(spec.name, actions, None, "agent")  # Kept: nothing is held before it.
    assert demos.num_departures() == 1
    steps, _ = demos.sample(64)
    found = set()
    for b in range(64):
      window = steps.observation["candidates"][b]
      found |= {
        s
        for s in range(len(actions))
        if np.array_equal(full.observation["candidates"][s : s + L], window)
      }
    return found

  placed = starts(1.0)
  assert placed and placed <= set(range(departure - K, departure + 1))
  assert not starts(0.0) <= set(range(departure - K, departure + 1))
  with pytest.raises(ValueError, match="departure_share"):
    Demonstrations([spec], CONFIG.game, L, departure_share=1.5)


@pytest.mark.slow  # Compiles the search or the learner step.
def test_demonstration_items_bootstrap_from_their_exact_returns():
  """With the target network predicting 0, a replay item's z_0 is its n-step reward sum and a
  demonstration item's adds the stored return to go at step n."""
  networks = make_networks(CONFIG.network, CONFIG.game)
  b = 8
  steps = random_batch(CONFIG, b, seed=0).steps
  steps = steps._replace(
    valid=np.ones((b, L), np.float32),
    reward=np.full((b, L), 0.01, np.float32),
    root_value=np.full((b, L), 0.3, np.float32),
  )
  state = learner_lib.make_initial_state(networks, CONFIG, jax.random.PRNGKey(0))
  exact = np.arange(b) >= b // 2
  _, _, priorities = learner_lib.make_sgd_step(networks, CONFIG)(state, steps, jnp.ones(b), exact)
  # The untrained value head is zero-initialised: its prediction (and the target's) is 0.
  expected = np.where(exact, 0.01 * N + 0.3, 0.01 * N)
  np.testing.assert_allclose(priorities, expected + PRIORITY_EPSILON, atol=1e-4)


@pytest.mark.slow  # Compiles the search or the learner step.
def test_learner_mixes_demonstrations_into_batches_and_checkpoints_them(tmp_path, demonstrations):
  config = dataclasses.replace(
    CONFIG, learner=dataclasses.replace(CONFIG.learner, batch_size=16, demonstration_fraction=0.25)
  )
  assert (config.learner.replay_batch, config.learner.demonstration_batch) == (12, 4)
  networks = make_networks(config.network, config.game)
  written = []
  learner = MuZeroLearner(
    networks,
    config,
    lambda: random_batch(config, 12, seed=1),
    update_priorities_fn=lambda k, p: written.append((k, p)),
    checkpoint_dir=str(tmp_path),
    demonstrations=demonstrations,
  )
  metrics = learner.step()
  assert metrics["demonstrations_improved"] == 0.0
  assert metrics["demonstration_replays"] == demonstrations.num_replays >= len(SPECS)
  assert metrics["demonstration_replay_s"] == demonstrations.replay_seconds > 0
  assert written[0][0].shape == written[0][1].shape == (12,)  # Replay items' priorities only.
  learner.save()
  saved = json.loads((tmp_path / DEMONSTRATIONS_FILENAME).read_text())
  assert {d["program"] for d in saved} == {s.name for s in SPECS}
  with pytest.raises(ValueError, match="demonstration_fraction"):
    dataclasses.replace(CONFIG.learner, demonstration_fraction=1.0)


def test_best_mappings_only_ever_improve(tmp_path):
  """A resumed run's demonstrations can be older than best/: a mapping no faster than the one
  kept is not written (its file and picture stay as they were); a faster one replaces it."""
  spec = SPECS[0]
  game = make_game(spec.workload, spec.hardware, CONFIG.game)
  played = []
  for seed in range(40):
    actions, total = _random_actions(game, seed)
    played.append((game.total_time, total, actions))
  played.sort(key=lambda p: p[0])
  fastest, slowest = played[0], played[-1]
  assert slowest[0] > fastest[0]

  def write(play):
    replayed = make_game(spec.workload, spec.hardware, CONFIG.game)
    replayed.reset()
    for action in play[2]:
      replayed.step(action)
    demonstration = Demonstration(spec.name, tuple(play[2]), play[1], "agent")
    return write_best_mapping(str(tmp_path), demonstration, replayed)

  assert write(slowest) == str(tmp_path / f"{spec.name}.json")
  assert load_mapping(str(tmp_path / f"{spec.name}.json")).estimated_time_s == pytest.approx(
    slowest[0]
  )
  assert write(fastest) is not None
  kept = (tmp_path / f"{spec.name}.json").read_bytes()
  picture = (tmp_path / f"{spec.name}.png").stat().st_mtime_ns
  assert write(slowest) is None and write(fastest) is None  # No faster: nothing written.
  assert (tmp_path / f"{spec.name}.json").read_bytes() == kept
  assert (tmp_path / f"{spec.name}.png").stat().st_mtime_ns == picture
