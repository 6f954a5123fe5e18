"""The MuZero learner: value targets, loss, priorities, checkpoints, and that it learns.

Batches come from real mallocGame episodes (small random programs, random legal actions, peaked
"search" policies) laid out as the replay writer lays them out: the real steps, the terminal state
(valid 0, its observation, zero action/reward/policy) and zero padding.
"""

import os

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import tree

from malloczero.actors.search import make_search_fn
from malloczero.configs.config import get_config
from malloczero.env import PRESETS, MalloczeroError, make_game
from malloczero.env.programs.synthetic import contended, random_workload
from malloczero.learner import (
  MuZeroLearner,
  importance_weights,
  load_params,
  logits_to_scalar,
  make_networks,
  scalar_to_probs,
  value_targets,
)
from malloczero.learner import learner as learner_lib
from malloczero.learner.fakes import random_batch
from malloczero.replay import PRIORITY_EPSILON
from malloczero.replay.types import Batch, Step, zero_step

CONFIG = get_config("tiny")
NETWORKS = make_networks(CONFIG.network, CONFIG.game)  # Shared: compiled functions are reused.
K, N = CONFIG.learner.unroll_steps, CONFIG.learner.td_steps
L = CONFIG.learner.sequence_length


# ------------------------------------------------------------------------------ synthetic data


def _episode(seed: int) -> list[Step]:
  """One episode as the writer stores it: T real steps, the terminal step, L - 2 padding steps."""
  workload = random_workload(seed, 24)
  game = make_game(workload, contended(PRESETS["tpu-v4i-like"], workload, 0.25), CONFIG.game)
  rng = np.random.default_rng(seed)
  ts = game.reset()
  steps = []
  while not ts.last():
    obs = ts.observation
    legal = obs["legal_actions"]
    # A peaked policy, as a search's action weights are, with the action drawn from it.
    action = int(rng.choice(np.flatnonzero(legal)))
    policy = 0.4 * legal / legal.sum() + 0.6 * np.eye(len(legal))[action]
    ts = game.step(action)
    steps.append(
      Step(
        observation=obs,
        action=np.int32(action),
        reward=np.float32(ts.reward),
        policy=policy.astype(np.float32),
        root_value=np.float32(0.0),
        valid=np.float32(1.0),
      )
    )
  zero = zero_step(CONFIG.game)
  steps.append(zero._replace(observation=ts.observation))
  steps.extend([zero] * (L - 2))
  return steps


def _game_batch(batch_size: int = CONFIG.learner.batch_size, seed: int = 0) -> Batch:
  """Items from a few episodes; a third of them hold the episode's end."""
  rng = np.random.default_rng(seed)
  items = []
  episode_seed = seed * 1000
  while len(items) < batch_size:
    steps = _episode(episode_seed)
    episode_seed += 1
    num_real = len(steps) - (L - 1)
    starts = list(rng.choice(num_real - L, 4, replace=False)) + [num_real - 1, num_real - 4]
    items.extend(steps[t : t + L] for t in starts)
  items = items[:batch_size]
  stacked = tree.map_structure(
    lambda *xs: np.stack(xs),
    *[tree.map_structure(lambda *xs: np.stack(xs), *item) for item in items],
  )
  return Batch(
    steps=stacked,
    keys=np.arange(batch_size, dtype=np.uint64),
    probabilities=rng.uniform(0.5, 1.5, batch_size) / batch_size,
  )


@pytest.fixture(scope="module")
def batch() -> Batch:
  return _game_batch()


@pytest.fixture(scope="module")
def trained(batch):
  """A learner trained for 300 steps on one fixed batch, with its per-step metrics and the
  priorities it wrote back."""
  written = []
  learner = MuZeroLearner(
    NETWORKS,
    CONFIG,
    lambda: batch,
    update_priorities_fn=lambda k, p: written.append((k, p)),
    seed=0,
  )
  history = [learner.step() for _ in range(300)]
  return learner, history, written


# ------------------------------------------------------------------------------ value targets


def test_value_targets_hand_computed():
  k, n = 2, 3
  rewards = np.array(
    [
      [0.1, 0.2, 0.3, 0.4, 0.5, 0.6],  # No end within the item: every target bootstraps.
      [0.1, 0.2, 0.3, 0.0, 0.0, 0.0],  # Terminal state at index 3, padding after it.
      [0.0, 0.0, 0.0, 0.0, 0.0, 0.0],  # The item starts at the terminal state.
      [0.1, 0.2, 0.3, 0.4, 0.0, 0.0],  # Terminal at index 4: z_1 stops there, z_2 too.
    ],
    np.float32,
  )
  valid = np.array(
    [[1, 1, 1, 1, 1, 1], [1, 1, 1, 0, 0, 0], [0, 0, 0, 0, 0, 0], [1, 1, 1, 1, 0, 0]], np.float32
  )
  # Garbage where it must be ignored (terminal, padding, indices other than n..n+k).
  bootstrap = np.full((4, 6), 100.0, np.float32)
  bootstrap[:, 3:6] = [[1.0, 2.0, 3.0]] * 4
  expected = np.array(
    [
      [0.1 + 0.2 + 0.3 + 1.0, 0.2 + 0.3 + 0.4 + 2.0, 0.3 + 0.4 + 0.5 + 3.0],
      [0.1 + 0.2 + 0.3, 0.2 + 0.3, 0.3],
      [0.0, 0.0, 0.0],
      [0.1 + 0.2 + 0.3 + 1.0, 0.2 + 0.3 + 0.4, 0.3 + 0.4],
    ]
  )
  z = value_targets(jnp.asarray(rewards), jnp.asarray(valid), jnp.asarray(bootstrap), k, n)
  np.testing.assert_allclose(z, expected, rtol=1e-6)

  g = 0.9
  z = value_targets(jnp.asarray(rewards), jnp.asarray(valid), jnp.asarray(bootstrap), k, n, g)
  np.testing.assert_allclose(z[0, 1], 0.2 + g * 0.3 + g**2 * 0.4 + g**3 * 2.0, rtol=1e-6)
  np.testing.assert_allclose(z[1, 0], 0.1 + g * 0.2 + g**2 * 0.3, rtol=1e-6)

  with pytest.raises(ValueError, match="too short"):
    value_targets(jnp.asarray(rewards), jnp.asarray(valid), jnp.asarray(bootstrap), 3, 3)


@pytest.mark.slow  # Integration-sized: subprocesses, compiles or every solver.
def test_value_transform_keeps_small_values_in_float32():
  """Rewards of 1e-7..1e-3 (most of this game's) survive encoding and decoding: h and its
  inverse, and the two-hot target decoded back. rlax's forms lost them (1e-6 -> -6.1e-6)."""
  import rlax

  from malloczero.learner.networks import signed_hyperbolic, signed_parabolic

  x = np.concatenate([-np.logspace(-8, 3, 45), [0.0], np.logspace(-8, 3, 45)]).astype(np.float32)
  y = signed_hyperbolic(jnp.asarray(x))
  np.testing.assert_allclose(np.asarray(signed_parabolic(y)), x, rtol=2e-6, atol=1e-12)
  # The same function as rlax's where rlax is accurate (away from 0).
  big = np.abs(x) >= 1e-1
  np.testing.assert_allclose(
    np.asarray(y)[big], np.asarray(rlax.signed_hyperbolic(x[big])), rtol=1e-5
  )
  config = CONFIG.network
  limit = float(signed_parabolic(jnp.float32(config.support_limit))) / config.value_scale
  raw = x[np.abs(x) < 0.99 * limit]
  probs = scalar_to_probs(jnp.asarray(raw), config)
  assert np.all(np.asarray(probs) >= 0) and np.allclose(np.asarray(probs).sum(-1), 1.0)
  assert np.all((np.asarray(probs) > 0).sum(-1) <= 2)
  decoded = logits_to_scalar(jnp.log(probs + 1e-30), config)
  np.testing.assert_allclose(np.asarray(decoded), raw, rtol=1e-4, atol=1e-10)
  # Values 1e-6 apart stay apart after a round trip.
  pair = logits_to_scalar(
    jnp.log(scalar_to_probs(jnp.asarray([2e-5, 2.1e-5]), config) + 1e-30), config
  )
  assert float(pair[1] - pair[0]) == pytest.approx(1e-6, rel=1e-2)


def _constant_value_params(params, value: float):
  """Params whose value head predicts `value` everywhere (its weights are zero at init)."""
  probs = scalar_to_probs(jnp.asarray(value), CONFIG.network)
  head = dict(
    params["value_head"], w=jnp.zeros_like(params["value_head"]["w"]), b=jnp.log(probs + 1e-12)
  )
  return dict(params, value_head=head)


@pytest.mark.slow
def test_loss_uses_n_step_targets_with_target_network_bootstrap(batch):
  """Priorities are |z_0 - v_0| + eps: with the online value at 0 and the target network's value
  at a known constant, they reveal the z_0 the loss used."""
  c = 0.25
  steps = tree.map_structure(np.copy, batch.steps)
  b = steps.valid.shape[0]
  rewards = np.tile(0.01 * (1 + np.arange(L, dtype=np.float32)), (b, 1))
  valid = np.ones((b, L), np.float32)
  # Terminal index per item: none, at the bootstrap state, just after it, early, at once.
  ends = [[L, N, N + 1, 2, 0][i % 5] for i in range(b)]
  for i, end in enumerate(ends):
    valid[i, end:] = 0.0
    rewards[i, end:] = 0.0
  steps = steps._replace(reward=rewards, valid=valid)
  params = learner_lib.make_initial_state(NETWORKS, CONFIG, jax.random.PRNGKey(0)).params
  online = _constant_value_params(params, 0.0)
  state = learner_lib.TrainingState(
    params=online,
    target_params=_constant_value_params(params, c),
    opt_state=jax.jit(learner_lib.make_optimizer(CONFIG.learner).init)(online),
    steps=jnp.zeros((), jnp.int32),
    rng=jax.random.PRNGKey(0),
  )
  # The SGD step reports the priorities and targets of the parameters it started from.
  _, metrics, priorities = learner_lib.make_sgd_step(NETWORKS, CONFIG)(state, steps, jnp.ones(b))
  expected = np.array(
    [rewards[i, :N].sum() + (c if end > N else 0.0) for i, end in enumerate(ends)]
  )
  np.testing.assert_allclose(priorities, np.abs(expected) + PRIORITY_EPSILON, atol=2e-3)
  np.testing.assert_allclose(metrics["value_target"], expected.mean(), atol=2e-3)


# ------------------------------------------------------------------------------ reanalyse


def _with_self_imitation_target(steps: Step, row: int, state: int) -> Step:
  """The steps with a self-imitation target at (row, state): one-hot on a legal move other than
  the one played, as an actor writes msa's move where a game that lost to msa left it."""
  legal = np.flatnonzero(steps.observation["legal_actions"][row, state])
  other = int(legal[legal != steps.action[row, state]][0])
  policy = np.array(steps.policy)
  policy[row, state] = np.eye(policy.shape[-1])[other]
  return steps._replace(policy=policy)


@pytest.mark.slow  # Compiles the reanalyse search and the learner step.
def test_reanalyse_searches_real_states_and_keeps_self_imitation_targets(batch):
  from malloczero.learner.reanalyse import make_reanalyse_fn, self_imitation_targets

  params = learner_lib.make_initial_state(NETWORKS, CONFIG, jax.random.PRNGKey(0)).params
  head = lambda x: np.asarray(x)[:8, : K + 1]
  steps = jax.tree_util.tree_map(head, batch.steps)
  assert steps.valid.min() == 0  # Some items end inside the unroll.
  steps = _with_self_imitation_target(steps, 0, 1)
  imitation = np.asarray(self_imitation_targets(steps.policy, steps.action))
  assert imitation.sum() == 1 and imitation[0, 1]
  key = jax.random.PRNGKey(3)
  out = jax.device_get(
    make_reanalyse_fn(make_search_fn(NETWORKS, CONFIG.search, jit=False))(
      params, key, steps.observation, steps.policy, steps.action, steps.valid
    )
  )
  np.testing.assert_array_equal(out.reanalysed, (steps.valid > 0) & ~imitation)
  kept = ~out.reanalysed
  np.testing.assert_array_equal(out.policy[kept], steps.policy[kept])
  assert np.all(out.shift[kept] == 0)
  # The fresh targets are the actors' training search on the same states with the same key.
  flat = jax.tree_util.tree_map(lambda x: x.reshape((-1,) + x.shape[2:]), steps.observation)
  search = make_search_fn(NETWORKS, CONFIG.search)(params, key, flat)
  expected = np.asarray(search.action_weights).reshape(out.policy.shape)
  np.testing.assert_allclose(out.policy[out.reanalysed], expected[out.reanalysed], atol=1e-6)
  fresh = out.policy[out.reanalysed]
  np.testing.assert_allclose(fresh.sum(-1), 1.0, rtol=1e-5)
  assert np.all(fresh[~steps.observation["legal_actions"][out.reanalysed]] == 0)
  # An untrained search is not the stored policy wherever there is a choice.
  choice = out.reanalysed & (steps.observation["legal_actions"].sum(-1) > 1)
  assert choice.any() and np.all(out.shift[choice] > 0)
  assert np.all(out.shift[out.reanalysed & ~choice] < 1e-6)


@pytest.mark.slow  # Compiles the reanalyse search and the learner step.
def test_learner_reanalyses_the_first_sampled_items_only(batch):
  import dataclasses

  config = dataclasses.replace(
    CONFIG, learner=dataclasses.replace(CONFIG.learner, reanalyse_fraction=0.25)
  )
  rows = config.learner.reanalyse_batch
  assert 0 < rows < config.learner.replay_batch
  with pytest.raises(ValueError, match="needs the search"):
    MuZeroLearner(NETWORKS, config, lambda: batch, seed=0)
  search = make_search_fn(NETWORKS, config.search, jit=False)
  learner = MuZeroLearner(NETWORKS, config, lambda: batch, seed=0, reanalyse_search=search)
  stored = _with_self_imitation_target(batch.steps, 0, 1)
  steps, metrics = learner._reanalysed(stored)
  changed = np.any(steps.policy != stored.policy, axis=-1)  # [B, L]
  assert changed[:rows, : K + 1].any() and not changed[0, 1]
  assert not changed[rows:].any() and not changed[:, K + 1 :].any()
  real = stored.valid[:rows, : K + 1] > 0
  assert not changed[:rows, : K + 1][~real].any()
  # Every real state but the self-imitation target was searched again.
  assert metrics["reanalysed_share"] == pytest.approx((real.sum() - 1) / real.sum())
  assert metrics["reanalyse_policy_shift"] > 0
  history = [learner.step() for _ in range(2)]
  assert all(0 < m["reanalysed_share"] <= 1 for m in history)
  assert all(np.isfinite(m["loss"]) for m in history)


def test_importance_weights():
  w = importance_weights(np.array([0.1, 0.2, 0.4]), 0.5)
  np.testing.assert_allclose(w, [1.0, 0.5**0.5, 0.25**0.5], rtol=1e-6)
  np.testing.assert_array_equal(importance_weights(np.zeros(3), 0.4), np.ones(3))


# ------------------------------------------------------------------------------ learning


@pytest.mark.slow
def test_loss_drops_on_a_fixed_batch(trained):
  _, history, _ = trained
  losses = np.array([m["loss"] for m in history])
  assert np.all(np.isfinite(losses))
  initial, final = losses[:3].mean(), losses[-10:].mean()
  assert final < 0.5 * initial, (initial, final)
  assert history[-1]["learner_steps"] == 300.0
  assert history[-1]["learner_steps_per_s"] > 0
  for key in (
    "value_loss",
    "reward_loss",
    "policy_loss",
    "legality_loss",
    "value_target",
    "policy_entropy",
    "legality_accuracy",
    "grad_norm",
    "learning_rate",
  ):
    assert np.isfinite(history[-1][key]), key


@pytest.mark.slow
def test_priorities_are_finite_positive_per_item(trained, batch):
  _, _, written = trained
  assert len(written) == 300
  keys, priorities = written[-1]
  np.testing.assert_array_equal(keys, batch.keys)
  assert priorities.shape == (CONFIG.learner.batch_size,)
  assert np.all(np.isfinite(priorities)) and np.all(priorities > 0)
  # The value at state 0 is fitted, so the TD errors shrink.
  assert written[-1][1].mean() < written[0][1].mean()


@pytest.mark.slow
def test_legality_head_learns_the_mask(trained, batch):
  learner, history, _ = trained
  assert history[-1]["legality_accuracy"] > 0.9
  # Stronger than per-action accuracy (most actions are illegal): whole masks, at the root.
  params = learner.get_variables()
  root = tree.map_structure(lambda x: x[:, 0], batch.steps.observation)
  prediction = jax.jit(lambda p, o: NETWORKS.predict(p, NETWORKS.represent(p, o)))(params, root)
  exact = np.all((np.asarray(prediction.legality_logits) > 0) == root["legal_actions"], axis=-1)
  assert exact.mean() > 0.9


@pytest.mark.slow
def test_random_batch_is_well_formed_and_trainable(trained):
  learner, _, _ = trained
  data = random_batch(CONFIG, CONFIG.learner.batch_size, seed=1)
  s = data.steps
  assert s.observation["legal_actions"].shape == (
    CONFIG.learner.batch_size,
    L,
    CONFIG.game.num_actions,
  )
  real_or_terminal = s.observation["legal_actions"].any(-1)
  assert np.all(s.observation["legal_actions"][..., 0] == real_or_terminal)
  assert np.all(s.observation["legal_actions"][s.valid > 0][:, 0])
  np.testing.assert_allclose(s.policy[s.valid > 0].sum(-1), 1.0, rtol=1e-5)
  legal_at_action = np.take_along_axis(s.observation["legal_actions"], s.action[..., None], -1)
  assert np.all(legal_at_action[s.valid > 0])
  weights = importance_weights(data.probabilities, 0.4)
  _, metrics, priorities = learner_lib.make_sgd_step(NETWORKS, CONFIG)(learner.state, s, weights)
  assert all(np.isfinite(float(v)) for v in metrics.values())
  assert np.all(np.isfinite(priorities))


# ------------------------------------------------------------------------- variables, checkpoints


@pytest.mark.slow
def test_get_variables(trained):
  learner, _, _ = trained
  params = learner.get_variables()
  leaves = jax.tree_util.tree_leaves(params)
  assert all(isinstance(x, np.ndarray) for x in leaves)
  expected = jax.tree_util.tree_leaves(learner.state.params)
  assert all(np.array_equal(a, b) for a, b in zip(leaves, expected))
  named, steps = learner.get_variables(["params", "steps"])
  assert named is params and int(steps) == 300
  with pytest.raises(KeyError):
    learner.get_variables(["nope"])


@pytest.mark.slow
def test_save_restore_round_trip(tmp_path, batch):
  first = MuZeroLearner(NETWORKS, CONFIG, lambda: batch, seed=1, checkpoint_dir=str(tmp_path))
  for _ in range(3):
    first.step()
  file = first.save()
  assert os.path.basename(file) == "learner_state.npz"
  assert not [f for f in os.listdir(tmp_path) if ".tmp" in f]
  # A learner on the same directory resumes: same params, optimizer state and step count.
  second = MuZeroLearner(NETWORKS, CONFIG, lambda: batch, seed=2, checkpoint_dir=str(tmp_path))
  assert second.num_steps == 3
  for a, b in zip(jax.tree_util.tree_leaves(first.state), jax.tree_util.tree_leaves(second.state)):
    np.testing.assert_array_equal(a, b)
  # ... so the next step is the same step.
  assert first.step()["loss"] == pytest.approx(second.step()["loss"], rel=1e-5)
  # Explicit restore from the file; params also load without a learner.
  third = MuZeroLearner(NETWORKS, CONFIG, lambda: batch, seed=3)
  third.restore(file)
  assert third.num_steps == 3
  loaded = load_params(str(tmp_path))
  for a, b in zip(jax.tree_util.tree_leaves(loaded), jax.tree_util.tree_leaves(third.state.params)):
    np.testing.assert_array_equal(a, b)


@pytest.mark.slow  # Compiles its own SGD step.
def test_learner_keeps_the_newest_candidates_for_selection(tmp_path, batch):
  import dataclasses

  from malloczero.learner.checkpoint import candidate_checkpoints, checkpoint_steps

  config = dataclasses.replace(CONFIG, eval_every_steps=2, select_checkpoints=3)
  learner = MuZeroLearner(NETWORKS, config, lambda: batch, candidates_dir=str(tmp_path / "c"))
  for _ in range(7):
    learner.step()
  kept = candidate_checkpoints(str(tmp_path / "c"))
  assert [steps for steps, _ in kept] == [2, 4, 6]
  for _ in range(2):
    learner.step()
  kept = candidate_checkpoints(str(tmp_path / "c"))
  assert [steps for steps, _ in kept] == [4, 6, 8]  # The oldest is deleted.
  assert [checkpoint_steps(file) for _, file in kept] == [4, 6, 8]


@pytest.mark.slow  # Integration-sized: subprocesses, compiles or every solver.
def test_restore_errors_are_one_line(tmp_path, batch):
  learner = MuZeroLearner(NETWORKS, CONFIG, lambda: batch)
  with pytest.raises(MalloczeroError, match="no learner checkpoint"):
    learner.restore(str(tmp_path / "missing.pkl"))
  corrupt = tmp_path / "corrupt.pkl"
  corrupt.write_bytes(b"not a pickle")
  with pytest.raises(MalloczeroError) as error:
    learner.restore(str(corrupt))
  assert "\n" not in str(error.value)
  with pytest.raises(MalloczeroError, match="no checkpoint path"):
    learner.save()


@pytest.mark.parametrize(
  "module", ["malloczero.actors.search", "malloczero.learner.reanalyse", "malloczero.system.nodes"]
)
def test_each_agent_module_imports_first_in_a_fresh_process(module):
  """The actors' search imports the learner's networks, and reanalyse takes that search from the
  system's builder: a process whose first import is any of them must not meet a partly
  initialised module."""
  import subprocess
  import sys

  done = subprocess.run([sys.executable, "-c", f"import {module}"], capture_output=True, text=True)
  assert done.returncode == 0, done.stderr[-2000:]
