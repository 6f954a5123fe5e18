"""Probes in the training loop: actors play every legal move of a decision of msa's game (msa
finishing), the learner fits its policy to the exact advantages (learner/probes/: prober.py,
store.py, loss.py `probe_policy_loss`)."""

import dataclasses

import jax
import numpy as np
import pytest

from malloczero.actors.actor import BatchedActor
from malloczero.actors.games import GamePool, suite_games
from malloczero.actors.variable_client import VariableClient
from malloczero.common.errors import MalloczeroError
from malloczero.configs.config import get_config, small, with_section
from malloczero.env.game import make_game
from malloczero.env.solvers.evo_msa import decode
from malloczero.learner import MuZeroLearner, make_networks
from malloczero.learner.fakes import random_batch
from malloczero.learner.probes import (
  PROBES_FILENAME,
  Prober,
  ProbeStore,
  advantage_targets,
  one_move_advantages,
  probe_policy_loss,
)

CONFIG = with_section(get_config("tiny"), "probes", share=0.5)
GAME = CONFIG.game
NETWORKS = make_networks(CONFIG.network, GAME)
SPECS = suite_games("tiny", "train")


@pytest.fixture(scope="module")
def probes():
  prober = Prober(SPECS, GAME, seed=3)
  found = [prober.probe() for _ in range(12)]
  return prober, [p for p in found if p is not None]


def test_probes_hold_each_legal_moves_exact_advantage(probes):
  prober, found = probes
  assert len(found) >= 10 and prober.num_probes == len(found)
  specs = {s.name: s for s in SPECS}
  config = dataclasses.replace(GAME, reward="advantage")
  for probe in found[:4]:
    spec = specs[probe.program]
    game = make_game(spec.workload, spec.hardware, config)
    legal = probe.observation["legal_actions"] > 0
    assert legal.sum() > 1 and legal[probe.msa_action]
    assert probe.advantages[probe.msa_action] == 0.0 and not probe.advantages[~legal].any()
    # Independently: msa's trajectory's decision keys, then evo-msa's decode of the genome that
    # departs at the probed step only.
    keys, timestep = [], game.reset()
    while not timestep.last():
      keys.append((game.decision.buffer, game.decision.use))
      timestep = game.step(game.msa_action)
    for action in np.flatnonzero(legal):
      if action == probe.msa_action:
        continue
      time = decode(
        game.cost_model,
        {keys[probe.step]: int(action)},
        max_prefetch_starts=config.max_prefetch_starts,
        skip_below=config.skip_below,
      )[0]
      expected = (game.msa_time - time) / game.msa_time
      assert probe.advantages[action] == pytest.approx(expected, abs=1e-6)
  # The same seed probes the same decisions.
  again = Prober(SPECS, GAME, seed=3)
  first = again.probe()
  assert (first.program, first.step) == (found[0].program, found[0].step)
  np.testing.assert_array_equal(first.advantages, found[0].advantages)
  assert any(p.advantages.max() > 0 for p in found) or any(p.advantages.min() < 0 for p in found)


def _last_legal_slot(observation):
  """A policy that departs from msa wherever msa's slot is not the last legal one."""
  return int(np.flatnonzero(observation["legal_actions"])[-1])


@pytest.mark.parametrize("per_rollout", [1, 4])
def test_on_policy_probes_are_exact_after_the_policys_own_moves(per_rollout):
  prober = Prober(SPECS, GAME, seed=4, on_policy=1.0, per_rollout=per_rollout)
  found = [p for p in (prober.probe(_last_legal_slot) for _ in range(8)) if p is not None]
  assert len(found) >= 6 and prober.num_on_policy == prober.num_probes == len(found)
  assert all(p.on_policy for p in found)
  # One rollout serves up to `per_rollout` probes, at decisions that are mostly distinct.
  assert len(found) / per_rollout <= prober.num_rollouts <= 8
  if per_rollout > 1:
    assert prober.num_rollouts < len(found)
    assert len({(p.program, p.step) for p in found}) > len(found) // 2
  specs = {s.name: s for s in SPECS}
  config = dataclasses.replace(GAME, reward="advantage")
  departed_before = 0
  for probe in found[:4]:
    spec = specs[probe.program]
    game = make_game(spec.workload, spec.hardware, config)
    assert probe.advantages[probe.msa_action] == 0.0

    def program_time(action: int) -> tuple[float, int]:
      """Independently, by the game's own moves: the policy's up to the probed step, `action`
      there, msa's after; (program time, the policy's departures before the step)."""
      timestep, departures = game.reset(), 0
      while game.num_steps < probe.step:
        departures += _last_legal_slot(timestep.observation) != game.msa_action
        timestep = game.step(_last_legal_slot(timestep.observation))
      np.testing.assert_array_equal(
        timestep.observation["legal_actions"], probe.observation["legal_actions"]
      )
      assert game.msa_action == probe.msa_action
      timestep = game.step(action)
      while not timestep.last():
        timestep = game.step(game.msa_action)
      return game.total_time, departures

    with_msa, departures = program_time(probe.msa_action)
    departed_before += departures > 0
    for action in np.flatnonzero(probe.observation["legal_actions"]):
      expected = (with_msa - program_time(int(action))[0]) / game.msa_time
      assert probe.advantages[action] == pytest.approx(expected, abs=1e-6)
  assert departed_before  # Some probed state lies off msa's trajectory.
  # Without a policy every probe is on msa's trajectory.
  assert not prober.probe().on_policy and prober.num_on_policy == len(found)


def test_one_move_advantages_needs_the_advantage_reward():
  spec = SPECS[0]
  game = make_game(spec.workload, spec.hardware, GAME)  # The tiny preset's "time" reward.
  with pytest.raises(ValueError, match="advantage"):
    one_move_advantages(game, 0)


def test_probe_store_ring_sample_save_and_restore(tmp_path, probes):
  _, found = probes
  store = ProbeStore(GAME, capacity=4, seed=0)
  with pytest.raises(ValueError, match="no probes"):
    store.sample(2)
  for probe in found[:6]:
    store.add(probe.observation, probe.advantages, probe.msa_action)
  assert len(store) == 4 and store.num_added == 6
  observations, advantages, msa_actions = store.sample(32)
  assert advantages.shape == (32, GAME.num_actions) and msa_actions.shape == (32,)
  # Only the newest four are kept, each with its msa move.
  kept = {(p.advantages.tobytes(), p.msa_action) for p in found[2:6]}
  assert {(row.tobytes(), int(m)) for row, m in zip(advantages, msa_actions)} <= kept
  for key, value in observations.items():
    assert value.shape == (32,) + found[0].observation[key].shape
  store.save(str(tmp_path))
  restored = ProbeStore(GAME, capacity=4, seed=0)
  assert restored.restore(str(tmp_path)) == 4 and restored.num_added == 6
  _, restored_advantages, restored_msa = restored.sample(32)  # Same rows, same seed.
  np.testing.assert_array_equal(restored_advantages, advantages)
  np.testing.assert_array_equal(restored_msa, msa_actions)
  assert ProbeStore(GAME, capacity=4).restore(str(tmp_path / "none")) is None
  with pytest.raises(ValueError, match="shape"):
    store.add(found[0].observation, found[0].advantages[:-1], 0)
  with pytest.raises(ValueError, match="msa move"):
    store.add(found[0].observation, found[0].advantages, GAME.num_actions)
  # A probe refused for its last observation field's shape leaves the full ring as it was.
  last = list(found[0].observation)[-1]
  bad = dict(found[0].observation, **{last: found[0].observation[last][:-1]})
  with pytest.raises(ValueError, match=f"{last} has shape"):
    store.add(bad, found[0].advantages, found[0].msa_action)
  assert store.num_added == 6
  (kept_observations, kept, _), (saved_observations, saved, _) = (
    store.sample(32),
    restored.sample(32),
  )
  np.testing.assert_array_equal(kept, saved)  # Both stores at their second draw: the same rows.
  for key, value in kept_observations.items():
    np.testing.assert_array_equal(value, saved_observations[key])
  # A file whose msa moves lie outside the action slots is refused in one line.
  with np.load(tmp_path / PROBES_FILENAME) as f:
    arrays = {k: f[k] for k in f.files}
  np.savez(tmp_path / PROBES_FILENAME, **dict(arrays, msa_actions=arrays["msa_actions"] + 99))
  with pytest.raises(MalloczeroError, match="msa moves"):
    ProbeStore(GAME, capacity=4).restore(str(tmp_path))
  (tmp_path / PROBES_FILENAME).write_bytes(b"not an npz")
  with pytest.raises(MalloczeroError) as error:
    ProbeStore(GAME, capacity=4).restore(str(tmp_path))
  assert "\n" not in str(error.value) and "probed decisions" in str(error.value)


def test_advantage_targets_are_a_sharp_softmax_over_legal_moves():
  advantages = np.array([[0.0, 0.002, -0.01, 0.5]], np.float32)
  legal = np.array([[True, True, True, False]])
  target = np.asarray(advantage_targets(advantages, legal, 1e-3))
  expected = np.exp([0.0, 2.0, -10.0]) / np.exp([0.0, 2.0, -10.0]).sum()
  np.testing.assert_allclose(target[0, :3], expected, rtol=1e-5)
  assert target[0, 3] == 0.0  # Illegal, however large its advantage.
  # msa's move (slot 0) raised by a margin of 2e-3: it ties the 2e-3 gain.
  raised = np.asarray(advantage_targets(advantages, legal, 1e-3, np.array([0]), 2e-3))
  expected = np.exp([2.0, 2.0, -10.0]) / np.exp([2.0, 2.0, -10.0]).sum()
  np.testing.assert_allclose(raised[0, :3], expected, rtol=1e-5)


@pytest.mark.slow  # Compiles its own update.
def test_probe_loss_teaches_the_best_move(probes):
  """A few hundred steps on the probes alone: the loss falls and the policy's legal argmax
  earns the best advantage at every probed decision."""
  import optax

  _, found = probes
  observations = {k: np.stack([p.observation[k] for p in found]) for k in found[0].observation}
  advantages = np.stack([p.advantages for p in found])
  msa_actions = np.array([p.msa_action for p in found])
  params = NETWORKS.init(jax.random.PRNGKey(0), {k: v[:1] for k, v in observations.items()})
  optimiser = optax.adam(3e-3)
  state = optimiser.init(params)

  @jax.jit
  def update(params, state):
    (loss, metrics), grads = jax.value_and_grad(
      lambda p: probe_policy_loss(NETWORKS, p, observations, advantages, msa_actions, 1e-3),
      has_aux=True,
    )(params)
    updates, state = optimiser.update(grads, state, params)
    return optax.apply_updates(params, updates), state, metrics

  first = None
  for _ in range(300):
    params, state, metrics = update(params, state)
    first = first or float(metrics["probe_policy_loss"])
  assert float(metrics["probe_policy_loss"]) < 0.5 * first
  assert float(metrics["probe_pick_advantage"]) == pytest.approx(
    float(metrics["probe_best_advantage"]), abs=1e-4
  )


class _Params:
  """A variable source holding fixed parameters."""

  def __init__(self, params):
    self._params = params

  def get_variables(self):
    return self._params


@pytest.mark.slow  # Compiles the actors' search.
def test_actor_probes_its_share_and_offers_them(probes):
  params = NETWORKS.init(
    jax.random.PRNGKey(1), {k: v[None] for k, v in probes[1][0].observation.items()}
  )
  offered = []
  pool = GamePool(SPECS, GAME, 2, seed=0)
  actor = BatchedActor(
    NETWORKS,
    CONFIG,
    pool,
    VariableClient(_Params(params), 10),
    # Along the network's own trajectory, as it plays with the client's parameters.
    prober=Prober(SPECS, GAME, seed=5, on_policy=1.0),
    offer_probe=lambda observation, advantages, msa_action: offered.append(
      (observation, advantages, msa_action)
    ),
  )
  for _ in range(6):
    actor.step()
  actor.close(wait=True)
  assert actor.num_probes >= 1 and len(offered) == actor.num_probes
  assert actor.num_on_policy_probes == actor.num_probes
  # After every step probing has caught up with its share of the time.
  assert actor.probing_share >= 0.5 * (1 - 1e-9)
  # As plain lists (courier passes no numpy arguments), which the learner's store takes.
  observation, advantages, msa_action = offered[0]
  assert isinstance(advantages, list) and len(advantages) == GAME.num_actions
  assert all(isinstance(v, list) for v in observation.values())
  store = ProbeStore(GAME, capacity=4)
  assert store.add(observation, advantages, msa_action) == 1
  np.testing.assert_array_equal(store.sample(1)[1][0], np.asarray(advantages, np.float32))


@pytest.mark.slow  # Compiles the SGD step with and without probes.
def test_learner_fits_probes_beside_its_batches_and_keeps_them(tmp_path, probes):
  _, found = probes
  store = ProbeStore(GAME, CONFIG.probes.capacity)
  batch = random_batch(CONFIG, CONFIG.learner.batch_size)
  learner = MuZeroLearner(
    NETWORKS, CONFIG, lambda: batch, checkpoint_dir=str(tmp_path), probes=store
  )
  assert "probe_policy_loss" not in learner.step()  # No probes yet.
  for probe in found:
    assert learner.offer_probe(probe.observation, probe.advantages, probe.msa_action) == len(store)
  metrics = learner.step()
  assert metrics["probes"] == len(found) and metrics["probe_policy_loss"] > 0
  learner.save()
  resumed_store = ProbeStore(GAME, CONFIG.probes.capacity)
  resumed = MuZeroLearner(
    NETWORKS, CONFIG, lambda: batch, checkpoint_dir=str(tmp_path), probes=resumed_store
  )
  assert resumed.num_steps == 2 and len(resumed_store) == len(found)
  without = MuZeroLearner(NETWORKS, CONFIG, lambda: batch)
  assert without.offer_probe(found[0].observation, found[0].advantages, found[0].msa_action) == 0


def test_probes_need_the_msa_game_and_a_share_below_one():
  with pytest.raises(ValueError, match="msa game"):
    with_section(with_section(small(), "game", decisions="requests"), "probes", share=0.3)
  with pytest.raises(ValueError, match="probes.share"):
    with_section(small(), "probes", share=1.0)
  with pytest.raises(ValueError, match="probes.on_policy"):
    with_section(small(), "probes", on_policy=1.5)
  with pytest.raises(ValueError, match="on_policy"):
    Prober(SPECS, GAME, on_policy=-0.1)
  with pytest.raises(ValueError, match="probes.batch"):
    with_section(small(), "probes", batch=0)
  with pytest.raises(ValueError, match="probes.msa_margin"):
    with_section(small(), "probes", msa_margin=-1e-3)


@pytest.mark.parametrize(
  "flags, message",
  [
    (("--set", "probes.share=1"), "probes.share: expected a fraction in [0, 1)"),
    (
      ("--set", "probes.share=0.3", "--set", "probes.batch=0"),
      "probes.batch: expected a positive integer",
    ),
    (("--set", "learner.policy_loss_weight=-1"), "learner.policy_loss_weight: expected a"),
    (("--set", "probes.on_policy=1.5"), "probes.on_policy: expected a probability"),
    (("--set", "probes.msa_margin=-0.001"), "probes.msa_margin: expected a"),
  ],
)
def test_probe_flags_are_checked_in_one_line(flags, message, tmp_path):
  import subprocess
  import sys

  result = subprocess.run(
    [sys.executable, "-m", "malloczero", "train", "--config", "tiny", *flags],
    cwd=tmp_path,
    capture_output=True,
    text=True,
    timeout=120,
  )
  assert result.returncode == 2 and result.stderr.count("\n") == 1, result.stderr
  assert message in result.stderr, result.stderr
