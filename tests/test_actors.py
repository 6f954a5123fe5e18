"""Actors: the batched Gumbel MuZero search and the batched actor writing to a real Reverb server,
on the tiny suite's real XLA programs (greedy play: tests/test_greedy_play.py; the variable
client: tests/test_variable_client.py)."""

import dataclasses

import jax
import numpy as np
import pytest
import reverb

from malloczero.actors.actor import BatchedActor, EpisodeResult, stack_observations
from malloczero.actors.games import GamePool
from malloczero.actors.greedy_play import play_programs
from malloczero.actors.search import make_search_fn
from malloczero.actors.variable_client import VariableClient
from malloczero.env import validate_mapping
from malloczero.learner.networks import logits_to_scalar
from malloczero.replay import TABLE_NAME, SequenceWriter, start_server
from tests.tiny_agent import (
  ALL_SPECS,
  CONFIG,
  NETWORKS,
  SPECS_BY_NAME,
  TRAIN_SPECS,
  A,
  L,
  game_of,
  initial_params,
  noisy,
)


@pytest.fixture(scope="module")
def params():
  return initial_params()


def real_observations():
  """[B = 8] observations of real games: fresh starts, mid-episode states after random legal
  moves, a terminal observation (only action 0 legal), and real states whose legal mask has
  been narrowed to {0, k} (the search must respect the mask whatever the features say)."""
  rng = np.random.default_rng(0)
  observations = []
  for spec in TRAIN_SPECS[:3]:
    observations.append(game_of(spec).reset().observation)
  for spec, moves in ((TRAIN_SPECS[0], 7), (TRAIN_SPECS[2], 15), (TRAIN_SPECS[3], 30)):
    game = game_of(spec)
    obs = game.reset().observation
    for _ in range(moves):
      obs = game.step(int(rng.choice(np.flatnonzero(obs["legal_actions"])))).observation
    observations.append(obs)
  game = game_of(TRAIN_SPECS[4])
  timestep = game.reset()
  while not timestep.last():
    timestep = game.step(int(rng.choice(np.flatnonzero(timestep.observation["legal_actions"]))))
  observations.append(timestep.observation)
  narrowed = {k: v.copy() for k, v in observations[0].items()}
  last_legal = int(np.flatnonzero(narrowed["legal_actions"])[-1])
  narrowed["legal_actions"][:] = False
  narrowed["legal_actions"][[0, last_legal]] = True
  observations.append(narrowed)
  return stack_observations(observations)


@pytest.fixture(scope="module")
def observations():
  batch = real_observations()
  legal = batch["legal_actions"]
  # The batch really covers the cases the search must handle.
  assert legal[:, 0].all()
  assert (legal.sum(1) == 1).any(), "no terminal-like observation (only action 0 legal)"
  assert ((legal.sum(1) > 1) & (legal.sum(1) < A)).any(), "no partially legal observation"
  return batch


def check_search_output(output, legal: np.ndarray) -> None:
  batch = legal.shape[0]
  action = np.asarray(output.action)
  weights = np.asarray(output.action_weights)
  value = np.asarray(output.root_value)
  assert action.shape == (batch,) and action.dtype == np.int32
  assert weights.shape == (batch, A) and weights.dtype == np.float32
  assert value.shape == (batch,) and value.dtype == np.float32
  assert np.isfinite(weights).all() and np.isfinite(value).all()
  assert legal[np.arange(batch), action].all(), f"illegal action chosen: {action}"
  assert (weights >= 0).all()
  np.testing.assert_allclose(weights.sum(-1), 1.0, atol=1e-5)
  assert (weights[~legal] == 0).all(), "policy target puts weight on an illegal root action"


# ------------------------------------------------------------------------------ search


@pytest.mark.slow  # Compiles the search or the learner step.
def test_search_shapes_legality_and_policy_targets(params, observations):
  legal = observations["legal_actions"]
  search = make_search_fn(NETWORKS, CONFIG.search)
  chosen = set()
  for seed, p in enumerate([params, noisy(params, 1), noisy(params, 2, scale=3.0)]):
    for key in range(3):
      output = jax.device_get(search(p, jax.random.PRNGKey(10 * seed + key), observations))
      check_search_output(output, legal)
      chosen.update(enumerate(output.action.tolist()))
  terminal = legal.sum(1) == 1
  assert all(a == 0 for row, a in chosen if terminal[row])
  # Training search explores: some state with several legal actions saw more than one move.
  per_row = {row: {a for r, a in chosen if r == row} for row in range(legal.shape[0])}
  assert any(len(moves) > 1 for moves in per_row.values())


@pytest.mark.slow  # Compiles the search or the learner step.
def test_evaluation_search_is_deterministic_and_legal(params, observations):
  legal = observations["legal_actions"]
  search = make_search_fn(NETWORKS, CONFIG.search, evaluation=True)
  for p in (params, noisy(params, 3)):
    outputs = [
      jax.device_get(search(p, jax.random.PRNGKey(seed), observations)) for seed in (0, 1, 12345)
    ]
    for output in outputs:
      check_search_output(output, legal)
    for output in outputs[1:]:
      np.testing.assert_array_equal(output.action, outputs[0].action)
      np.testing.assert_array_equal(output.action_weights, outputs[0].action_weights)
      np.testing.assert_array_equal(output.root_value, outputs[0].root_value)


@pytest.mark.slow  # Compiles the search or the learner step.
def test_zero_simulations_play_the_networks_policy_alone(params, observations):
  """With 0 simulations evaluation plays the legal argmax of the network's prior, with the
  prior over legal moves as the weights and the network's value as the root value; training
  mode samples legal moves from it."""
  legal = observations["legal_actions"]
  alone = dataclasses.replace(CONFIG.search, num_simulations=0, eval_num_simulations=0)
  p = noisy(params, 7, scale=3.0)
  latent = NETWORKS.represent(p, observations)
  prediction = jax.device_get(NETWORKS.predict(p, latent))
  logits = np.where(legal, np.asarray(prediction.policy_logits, np.float64), -np.inf)
  prior = np.exp(logits - logits.max(-1, keepdims=True))
  prior /= prior.sum(-1, keepdims=True)
  evaluation = make_search_fn(NETWORKS, alone, evaluation=True)
  greedy = jax.device_get(evaluation(p, jax.random.PRNGKey(0), observations))
  check_search_output(greedy, legal)
  np.testing.assert_array_equal(greedy.action, logits.argmax(-1))
  np.testing.assert_allclose(greedy.action_weights, prior, rtol=1e-4, atol=1e-6)
  np.testing.assert_allclose(
    greedy.root_value, logits_to_scalar(prediction.value_logits, NETWORKS.config), rtol=1e-5
  )
  sampling = make_search_fn(NETWORKS, alone)
  moves = set()
  for key in range(8):
    # The initial parameters: a flat prior, where sampling must vary (the noisy one is peaked).
    sampled = jax.device_get(sampling(params, jax.random.PRNGKey(key), observations))
    check_search_output(sampled, legal)
    moves.update(enumerate(sampled.action.tolist()))
  assert len(moves) > legal.shape[0], "sampling from the policy never varied a move"


@pytest.mark.slow  # Compiles the search or the learner step.
def test_evaluation_msa_prior_plays_msa_when_large_and_training_search_ignores_it(params):
  """A large `eval_msa_prior_logit` makes greedy play msa's own mapping on every tiny program;
  the mask it adds is msa's move; training searches are unchanged by it."""
  from malloczero.actors.search import msa_action_mask
  from malloczero.env.solvers import solve

  biased = dataclasses.replace(CONFIG.search, eval_msa_prior_logit=1e4)
  noisy_params = noisy(params, 5)
  msa = [solve(spec.workload, spec.hardware, "msa").speedup for spec in ALL_SPECS]
  results = play_programs(NETWORKS, noisy_params, biased, CONFIG.game, ALL_SPECS)
  for spec, result, expected in zip(ALL_SPECS, results, msa):
    assert result.speedup == pytest.approx(expected, rel=1e-9), spec.name
  # Without the bias the same network plays otherwise.
  unbiased = play_programs(NETWORKS, noisy_params, CONFIG.search, CONFIG.game, ALL_SPECS)
  assert any(r.speedup != pytest.approx(m, rel=1e-9) for r, m in zip(unbiased, msa))
  game = game_of(ALL_SPECS[0])
  timestep, masks, moves = game.reset(), [], []
  while not timestep.last():
    masks.append(
      np.asarray(msa_action_mask(stack_observations([timestep.observation]), CONFIG.game))[0]
    )
    moves.append(game.msa_action)
    timestep = game.step(game.msa_action)
  np.testing.assert_array_equal(np.stack(masks), np.eye(A)[moves])
  plain = make_search_fn(NETWORKS, CONFIG.search)(
    noisy_params, jax.random.PRNGKey(0), stack_observations([game.reset().observation])
  )
  with_bias = make_search_fn(NETWORKS, biased)(
    noisy_params, jax.random.PRNGKey(0), stack_observations([game.reset().observation])
  )
  np.testing.assert_array_equal(plain.action_weights, with_bias.action_weights)


@pytest.mark.slow  # Compiles the search.
def test_evaluation_q_spread_floor_hands_greedy_play_to_the_policy_and_spares_training(params):
  """A huge `eval_q_spread_floor` flattens every Q gap, so the greedy search plays the policy's
  own mapping on every tiny program; at the training floor the same network's search departs
  from it somewhere; training searches are unchanged by the evaluation floor."""
  noisy_params = noisy(params, 5)
  flat = dataclasses.replace(CONFIG.search, eval_q_spread_floor=1e4)
  results = play_programs(NETWORKS, noisy_params, flat, CONFIG.game, ALL_SPECS, policy_alone=True)
  for spec, result in zip(ALL_SPECS, results):
    assert result.greedy_speedup == pytest.approx(result.policy_speedup, rel=1e-12), spec.name
  sharp = play_programs(
    NETWORKS, noisy_params, CONFIG.search, CONFIG.game, ALL_SPECS, policy_alone=True
  )
  assert any(r.greedy_speedup != pytest.approx(r.policy_speedup, rel=1e-12) for r in sharp)
  observation = stack_observations([game_of(ALL_SPECS[0]).reset().observation])
  plain = make_search_fn(NETWORKS, CONFIG.search)(noisy_params, jax.random.PRNGKey(0), observation)
  with_floor = make_search_fn(NETWORKS, flat)(noisy_params, jax.random.PRNGKey(0), observation)
  np.testing.assert_array_equal(plain.action_weights, with_floor.action_weights)


# ------------------------------------------------------------------------------ batched actor


class FlakySource:
  """A variable source whose parameters change on every fetch and every third fetch fails."""

  def __init__(self, params):
    self._params = params
    self.calls = 0

  def get_variables(self):
    self.calls += 1
    if self.calls % 3 == 0:
      raise ConnectionError("learner unavailable")
    return noisy(self._params, self.calls, scale=0.05)


class RecordingWriter:
  """Passes writes through to a SequenceWriter and records each game's episodes."""

  def __init__(self, writer: SequenceWriter):
    self._writer = writer
    self.current = {}  # slot -> [(action, reward)] of the episode in progress
    self.finished = []  # (slot, [(action, reward)]) in the order episodes ended

  def append(self, slot, step):
    self.current.setdefault(slot, []).append((int(step.action), float(step.reward)))
    self._writer.append(slot, step)

  def end_episode(self, slot, terminal_observation):
    assert terminal_observation["legal_actions"].tolist() == [True] + [False] * (A - 1)
    self.finished.append((slot, self.current.pop(slot)))
    self._writer.end_episode(slot, terminal_observation)

  def flush(self):
    self._writer.flush()

  def close(self):
    self._writer.close()


class CompileCounter:
  """Counts JAX tracing / lowering / compilation events in this process while active."""

  def __init__(self):
    self.events = []  # While active.
    self.inactive_events = []  # Otherwise (the warm-up's: shows the listener works).
    self.active = False

  def __call__(self, event, duration, **kwargs):
    if event.startswith("/jax/core/compile/"):
      (self.events if self.active else self.inactive_events).append(event)


@pytest.fixture(scope="module")
def played(params):
  """A BatchedActor (B = 4) on the tiny train programs, writing to a real Reverb table, with a
  parameter source that changes every fetch and fails every third; played until several
  episodes of several programs ended. The search is wrapped to count its traces."""
  traces = []

  def counting_make_search_fn(networks, search, evaluation=False, jit=True):
    inner = make_search_fn(networks, search, evaluation, jit=False)

    def traced(*args):
      traces.append(1)
      return inner(*args)

    return jax.jit(traced) if jit else traced

  num_games = 4
  server, address = start_server(CONFIG, rate_limiter=reverb.rate_limiters.MinSize(1))
  client = reverb.Client(address)
  writer = RecordingWriter(SequenceWriter(client, CONFIG, num_games))
  source = FlakySource(params)
  variables = VariableClient(source, update_period=5)
  results = []
  offers = []

  def offer(program, actions, episode_return):  # A learner that keeps every offer.
    offers.append((program, list(actions), episode_return))
    return episode_return

  counter = CompileCounter()
  jax.monitoring.register_event_duration_secs_listener(counter)
  try:
    with pytest.MonkeyPatch.context() as patch:
      patch.setattr("malloczero.actors.actor.make_search_fn", counting_make_search_fn)
      actor = BatchedActor(
        NETWORKS,
        CONFIG,
        GamePool(TRAIN_SPECS, CONFIG.game, num_games, seed=1),
        variables,
        writer,
        seed=0,
        on_episode=results.append,
        offer=offer,
      )
    # Warm-up: the first step compiles; play on to one episode end and one parameter swap.
    while not results or variables.num_updates < 2:
      actor.step()
      assert actor.num_steps < 200
    traces_after_warmup = len(traces)
    updates_after_warmup, episodes_after_warmup = variables.num_updates, len(results)
    counter.active = True
    returned = []
    while (
      len(results) < episodes_after_warmup + 2 * num_games
      or len({r.program for r in results}) < 3
      or variables.num_failures < 1
      or variables.num_updates < updates_after_warmup + 2
    ):
      returned.extend(actor.step())
      assert actor.num_steps < 600, "actor made no progress"
    counter.active = False
    writer.flush()
    table_size = client.server_info()[TABLE_NAME].current_size
  finally:
    unregister = getattr(
      jax._src.monitoring,  # pylint: disable=protected-access
      "_unregister_event_duration_listener_by_callback",
      None,
    )
    if unregister is not None:
      unregister(counter)
    counter.active = False
    actor.close(wait=True)
    variables.close()
    writer.close()  # Closed streams let the server stop at once.
    server.stop()
  return dict(
    actor=actor,
    results=results,
    returned=returned,
    writer=writer,
    table_size=table_size,
    traces=traces,
    traces_after_warmup=traces_after_warmup,
    compile_events=counter.events,
    warmup_compile_events=counter.inactive_events,
    variables=variables,
    episodes_after_warmup=episodes_after_warmup,
    updates_after_warmup=updates_after_warmup,
    source=source,
    offers=offers,
  )


@pytest.mark.slow  # Compiles the search or the learner step.
def test_actor_does_not_recompile_across_episodes_and_parameter_updates(played):
  assert played["traces_after_warmup"] == 1
  assert len(played["traces"]) == 1, "the search was traced again"
  assert played["warmup_compile_events"], "the compile listener saw nothing, even the warm-up"
  assert played["compile_events"] == [], "acting steps compiled something after warm-up"
  # What happened after the warm-up: episode ends and parameter swaps (and a failed fetch).
  assert len(played["results"]) > played["episodes_after_warmup"]
  variables = played["variables"]
  assert variables.num_updates >= played["updates_after_warmup"] + 2
  assert variables.num_failures >= 1
  assert isinstance(variables.last_error, ConnectionError)


@pytest.mark.slow  # Compiles the search or the learner step.
def test_actor_writes_one_item_per_step_and_reports_true_episode_results(played):
  actor, writer, results = played["actor"], played["writer"], played["results"]
  assert all(isinstance(r, EpisodeResult) for r in results)
  # step() returns what on_episode is given.
  assert played["returned"] and played["returned"] == results[-len(played["returned"]) :]
  assert actor.num_episodes == len(results) == len(writer.finished)
  assert len({r.program for r in results}) >= 3
  # One replay item per real step: all of a finished episode's, and those of an episode in
  # progress whose L-step window is complete.
  in_progress = sum(max(0, len(steps) - L + 1) for steps in writer.current.values())
  assert played["table_size"] == sum(r.length for r in results) + in_progress
  # Replaying each episode's actions on a fresh game gives the result's return and speed-up.
  for result, (_slot, steps) in zip(results, writer.finished):
    spec = SPECS_BY_NAME[result.program]
    game = game_of(spec)
    timestep = game.reset()
    rewards = []
    for action, written_reward in steps:
      assert not timestep.last()
      timestep = game.step(action)
      rewards.append(timestep.reward)
      assert written_reward == pytest.approx(timestep.reward, rel=1e-6, abs=1e-9)
    assert timestep.last()
    assert result.length == len(steps) == game.num_steps
    assert result.episode_return == pytest.approx(sum(rewards), rel=1e-9, abs=1e-12)
    slow = game.cost_model.slow_only_time
    assert result.episode_return == pytest.approx(
      (slow - game.total_time) / slow, rel=1e-9, abs=1e-12
    )
    assert result.speedup == pytest.approx(slow / game.total_time, rel=1e-9)
    mapping = game.mapping("test")
    assert result.speedup == pytest.approx(
      validate_mapping(spec.workload, spec.hardware, mapping).speedup, rel=1e-6
    )


@pytest.mark.slow  # Compiles the search or the learner step.
def test_actor_offers_exactly_the_games_that_beat_the_best_known(played):
  """Each program's first game, then each game faster than every earlier one of its program, is
  offered with its own moves and return (the fake learner keeps everything it is offered)."""
  actor, writer, results = played["actor"], played["writer"], played["results"]
  best: dict[str, float] = {}
  expected = []
  for result, (_, steps) in zip(results, writer.finished):
    if result.episode_return > best.get(result.program, -np.inf):
      best[result.program] = result.episode_return
      expected.append((result.program, [action for action, _ in steps], result.episode_return))
  assert played["offers"] == expected
  assert actor.num_offers == len(expected) >= len({r.program for r in results})


class PolicyRecordingWriter(RecordingWriter):
  """Also records the policy target each step is written with."""

  def __init__(self, writer: SequenceWriter):
    super().__init__(writer)
    self.policies = {}  # slot -> [policy [A]] of the episode in progress
    self.finished_policies = []  # in the order episodes ended

  def append(self, slot, step):
    self.policies.setdefault(slot, []).append(np.asarray(step.policy).copy())
    super().append(slot, step)

  def end_episode(self, slot, terminal_observation):
    self.finished_policies.append(self.policies.pop(slot))
    super().end_episode(slot, terminal_observation)


@pytest.mark.slow  # Compiles the search.
def test_imitate_gains_only_teaches_msa_where_a_game_that_lost_left_it(params):
  """With `imitate_gains_only`, a game no faster than msa's mapping is written with msa's move
  (one-hot) as the target of every step that left it and the search's weights elsewhere; a game
  faster than msa keeps the search's weights at every step (the actor counts its rewrites). msa's
  move at each step comes from replaying the written actions in a fresh game."""
  config = dataclasses.replace(
    CONFIG, actor=dataclasses.replace(CONFIG.actor, imitate_gains_only=True)
  )
  num_games = 4
  server, address = start_server(config, rate_limiter=reverb.rate_limiters.MinSize(1))
  writer = PolicyRecordingWriter(SequenceWriter(reverb.Client(address), config, num_games))
  variables = VariableClient(FlakySource(noisy(params, seed=4, scale=1.0)), update_period=1000)
  results = []
  actor = BatchedActor(
    NETWORKS,
    config,
    GamePool(TRAIN_SPECS, config.game, num_games, seed=2),
    variables,
    writer,
    seed=0,
    on_episode=results.append,
  )
  try:
    while len(results) < 2 * num_games:
      actor.step()
      assert actor.num_steps < 800, "actor made no progress"
  finally:
    actor.close(wait=True)
    variables.close()
    writer.close()
    server.stop()
  unlearned, outcomes = 0, set()
  for result, (_, steps), policies in zip(results, writer.finished, writer.finished_policies):
    game = game_of(SPECS_BY_NAME[result.program])
    game.reset()
    msa_actions = []
    for action, _reward in steps:
      msa_actions.append(game.msa_action)
      game.step(action)
    beat_msa = game.total_time < game.msa_time
    departed = any(action != m for (action, _), m in zip(steps, msa_actions))
    outcomes.add((beat_msa, departed))
    for (action, _reward), msa_action, policy in zip(steps, msa_actions, policies):
      np.testing.assert_allclose(policy.sum(), 1.0, atol=1e-5)
      one_hot_msa = np.eye(A, dtype=np.float32)[msa_action]
      if not beat_msa and action != msa_action:
        np.testing.assert_array_equal(policy, one_hot_msa)
        unlearned += 1
  # Every rewrite the actor made is one of those: none in a game that beat msa, none where the
  # game played msa's move.
  assert unlearned == actor.num_departures_unlearned > 0
  assert {(True, True), (False, True)} <= outcomes, "no won and lost games that left msa"
