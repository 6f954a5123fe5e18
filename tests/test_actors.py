"""Actors: the batched Gumbel MuZero search, the batched actor writing to a real Reverb server, the
variable client and greedy evaluation, on the tiny suite's real XLA programs."""

import dataclasses
import threading
import time

import jax
import numpy as np
import pytest
import reverb

from malloczero.actors.actor import BatchedActor, EpisodeResult, stack_observations
from malloczero.actors.games import GamePool, program_specs, suite_games, training_specs
from malloczero.actors.greedy_play import evaluate_params, play_programs
from malloczero.actors.search import make_search_fn
from malloczero.actors.variable_client import VariableClient
from malloczero.configs.config import get_config
from malloczero.env import make_game, validate_mapping
from malloczero.learner.learner import make_initial_state
from malloczero.learner.networks import logits_to_scalar, make_networks
from malloczero.replay import TABLE_NAME, SequenceWriter, start_server

CONFIG = get_config("tiny")
NETWORKS = make_networks(CONFIG.network, CONFIG.game)  # Shared: compiled functions are reused.
A = CONFIG.game.num_actions
L = CONFIG.learner.sequence_length
TRAIN_SPECS = suite_games("tiny", "train")
ALL_SPECS = suite_games("tiny", "all")
SPECS_BY_NAME = {s.name: s for s in ALL_SPECS}


@pytest.fixture(scope="module")
def params():
  return make_initial_state(NETWORKS, CONFIG, jax.random.PRNGKey(0)).params


def noisy(params, seed: int, scale: float = 1.0):
  """Parameters with large random perturbations: peaked priors on arbitrary (often illegal)
  actions and a legality head that is wrong about them, so masking is really exercised."""
  leaves, treedef = jax.tree_util.tree_flatten(params)
  rng = np.random.default_rng(seed)
  return jax.tree_util.tree_unflatten(
    treedef,
    [np.asarray(x) + scale * rng.standard_normal(np.shape(x)).astype(np.float32) for x in leaves],
  )


def _game(spec):
  return make_game(spec.workload, spec.hardware, CONFIG.game)


def _all_default_moves(spec) -> int:
  game = _game(spec)
  timestep, moves = game.reset(), 0
  while not timestep.last():
    timestep, moves = game.step(0), moves + 1
  return moves


def real_observations():
  """[B = 8] observations of real games: fresh starts, mid-episode states after random legal
  moves, a terminal observation (only action 0 legal), and real states whose legal mask has
  been narrowed to {0, k} (the search must respect the mask whatever the features say)."""
  rng = np.random.default_rng(0)
  observations = []
  for spec in TRAIN_SPECS[:3]:
    observations.append(_game(spec).reset().observation)
  for spec, moves in ((TRAIN_SPECS[0], 7), (TRAIN_SPECS[2], 15), (TRAIN_SPECS[3], 30)):
    game = _game(spec)
    obs = game.reset().observation
    for _ in range(moves):
      obs = game.step(int(rng.choice(np.flatnonzero(obs["legal_actions"])))).observation
    observations.append(obs)
  game = _game(TRAIN_SPECS[4])
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
  game = _game(ALL_SPECS[0])
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
  observation = stack_observations([_game(ALL_SPECS[0]).reset().observation])
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
    game = _game(spec)
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
    game = _game(SPECS_BY_NAME[result.program])
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


# ------------------------------------------------------------------------------ variable client


class BlockingSource:
  """The first fetch returns at once; later ones wait until the test releases them."""

  def __init__(self):
    self.release = threading.Event()
    self.started = threading.Event()
    self.finished = threading.Event()
    self.fail = False
    self.calls = 0

  def get_variables(self):
    self.calls += 1
    if self.calls == 1:
      return {"version": np.int32(1)}
    self.started.set()
    assert self.release.wait(30), "the test never released the fetch"
    self.finished.set()
    if self.fail:
      raise RuntimeError("fetch failed")
    return {"version": np.int32(self.calls)}


def _update_until(client, predicate, timeout_s=10.0):
  deadline = time.monotonic() + timeout_s
  while not predicate():
    assert time.monotonic() < deadline, "the fetched parameters never arrived"
    client.update()
    time.sleep(0.01)


def test_variable_client_update_never_waits_for_the_source():
  source = BlockingSource()
  client = VariableClient(source, update_period=1, device_put=False)
  try:
    assert int(client.params["version"]) == 1  # The first access waits for parameters.
    client.update()  # Starts a fetch that blocks in the source...
    assert source.started.wait(10)
    assert not source.finished.is_set()  # ...and update() returned while it still does.
    for _ in range(5):
      client.update()  # Acting goes on with the old parameters.
      assert int(client.params["version"]) == 1
    assert client.num_updates == 1
    source.release.set()
    _update_until(client, lambda: int(client.params["version"]) == 2)
    assert client.num_updates == 2 and client.num_failures == 0 and client.last_error is None
  finally:
    source.release.set()
    client.close()


def test_variable_client_survives_a_failing_source():
  source = BlockingSource()
  source.fail = True
  source.release.set()
  client = VariableClient(source, update_period=1, device_put=False)
  try:
    assert int(client.params["version"]) == 1
    _update_until(client, lambda: client.num_failures >= 3)
    assert int(client.params["version"]) == 1  # Failed fetches keep the old parameters.
    assert isinstance(client.last_error, RuntimeError)
    assert client.num_updates == 1
    source.fail = False  # The source recovers: fetches resume.
    _update_until(client, lambda: int(client.params["version"]) > 1)
    assert client.num_updates == 2
  finally:
    client.close()


def test_variable_client_fetches_every_update_period_calls():
  class Counting:
    calls = 0

    def get_variables(self):
      Counting.calls += 1
      return Counting.calls

  client = VariableClient(Counting(), update_period=4, device_put=False)
  try:
    assert client.params == 1
    for _ in range(3):
      client.update()
    time.sleep(0.05)
    assert Counting.calls == 1  # Not due yet.
    _update_until(client, lambda: client.params == 2)
  finally:
    client.close()


# ------------------------------------------------------------------------------ evaluation


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
    assert 1 <= result.requests <= _all_default_moves(spec)
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
