"""Replay: SequenceWriter items, their initial priorities, the Sampler and the rate limiter, against
a real in-process Reverb server."""

import dataclasses
import threading

import numpy as np
import pytest
import reverb
import tree

from malloczero.configs.config import get_config
from malloczero.env.game import GameConfig
from malloczero.replay import (
  PRIORITY_EPSILON,
  TABLE_NAME,
  Batch,
  Sampler,
  SequenceWriter,
  Step,
  WriterStopped,
  error_buffer,
  make_table,
  sequence_signature,
  start_server,
  step_spec,
)

GAME = GameConfig(num_candidates=3, occupancy_bins=4, lookahead=2, max_fast_levels=1)


def small_config(
  min_size_to_sample=1, batch_size=8, unroll_steps=1, td_steps=2, demonstration_fraction=0.0
):
  """L = unroll + td + 1 = 4 by default: short enough for episodes longer than L. No
  demonstrations by default: the sampler's batches are then whole learner batches."""
  config = get_config("tiny")
  return dataclasses.replace(
    config,
    game=GAME,
    learner=dataclasses.replace(
      config.learner,
      batch_size=batch_size,
      unroll_steps=unroll_steps,
      td_steps=td_steps,
      demonstration_fraction=demonstration_fraction,
    ),
    replay=dataclasses.replace(
      config.replay, min_size_to_sample=min_size_to_sample, max_size=1000, prefetch=1
    ),
  )


def make_episode(game: int, episode: int, length: int):
  """Deterministic steps; `request[:3] = (game, episode, t + 1)` identifies each step."""
  spec = step_spec(GAME)
  steps = []
  for t in range(length):
    seed = 1000 * game + 100 * episode + t
    obs = {
      k: np.full(s.shape, seed + 0.5, s.dtype)
      for k, s in spec.observation.items()
      if k != "legal_actions"
    }
    obs["request"][:3] = (game, episode, t + 1)
    obs["legal_actions"] = np.arange(GAME.num_actions) <= t % GAME.num_actions
    policy = np.zeros(GAME.num_actions, np.float32)
    policy[t % GAME.num_actions] = 1.0
    steps.append(
      Step(
        observation=obs,
        action=np.int32(t % GAME.num_actions),
        reward=np.float32(0.25 * (t + 1) + game),
        policy=policy,
        root_value=np.float32(np.sin(seed)),
        valid=np.float32(1.0),
      )
    )
  terminal = {
    k: np.full(s.shape, -(1000 * game + 100 * episode + 7), s.dtype)
    for k, s in spec.observation.items()
  }
  terminal["legal_actions"] = np.arange(GAME.num_actions) == 0
  return steps, terminal


def expected_priority(steps, t, n):
  rewards = [float(s.reward) for s in steps]
  values = [float(s.root_value) for s in steps]
  target = sum(rewards[t : t + n]) + (values[t + n] if t + n < len(steps) else 0.0)
  return abs(target - values[t]) + PRIORITY_EPSILON


def check_item(item: Step, steps, terminal, t, length):
  """`item` (leaves [L, ...]) is the window t..t+L-1 of the episode `steps` + terminal + padding."""
  T = len(steps)
  for i in range(length):
    at = tree.map_structure(lambda x: x[i], item)
    if t + i < T:
      want = steps[t + i]
    elif t + i == T:
      want = tree.map_structure(np.zeros_like, steps[0])._replace(
        observation=terminal, valid=np.float32(0)
      )
    else:
      want = tree.map_structure(np.zeros_like, steps[0])._replace(valid=np.float32(0))
    tree.map_structure(
      lambda got, w: np.testing.assert_array_equal(got, w, f"t={t} i={i}"), at, want
    )


def identify(item: Step):
  """(game, episode, t) of an item's first step."""
  game, episode, t1 = item.observation["request"][0, :3]
  return int(game), int(episode), int(t1) - 1


@pytest.fixture
def queue_server():
  """A FIFO table under TABLE_NAME that hands back every item once, in insertion order."""
  config = small_config()
  table = reverb.Table(
    name=TABLE_NAME,
    sampler=reverb.selectors.Fifo(),
    remover=reverb.selectors.Fifo(),
    max_size=10_000,
    max_times_sampled=1,
    rate_limiter=reverb.rate_limiters.MinSize(1),
    signature=sequence_signature(config),
  )
  server = reverb.Server(tables=[table])
  yield config, reverb.Client(f"localhost:{server.port}")
  server.stop()


def table_size(client):
  return client.server_info()[TABLE_NAME].current_size


def drain(client, config, count):
  """All `count` items in the table as (item with leaves [L, ...], priority)."""
  signature = sequence_signature(config)
  out = []
  for sample in client.sample(
    TABLE_NAME, num_samples=count, emit_timesteps=False, unpack_as_table_signature=True
  ):
    out.append((tree.unflatten_as(signature, tree.flatten(sample.data)), sample.info.priority))
  assert table_size(client) == 0
  return out


def test_episode_items_priorities_and_reset(queue_server):
  config, client = queue_server
  L, n = config.learner.sequence_length, config.learner.td_steps
  writer = SequenceWriter(client, config, num_games=1)
  # Episodes one after the other in the same game also check the per-episode reset.
  for episode, T in enumerate([1, 3, L + 3, L, 2]):
    steps, terminal = make_episode(0, episode, T)
    for step in steps:
      writer.append(0, step._replace(valid=np.float32(0.0)))  # The writer sets valid itself.
    writer.end_episode(0, terminal)
    assert table_size(client) == T, f"T={T}"
    items = drain(client, config, T)
    for t, (item, priority) in enumerate(items):
      assert identify(item) == (0, episode, t)
      assert item.action.shape == (L,) and item.policy.shape == (L, GAME.num_actions)
      check_item(item, steps, terminal, t, L)
      assert priority == pytest.approx(expected_priority(steps, t, n), rel=1e-6), f"T={T} t={t}"
  writer.close()


def one_episode_priorities(config, client, length):
  """Writes one episode of `length` steps; returns its items' priorities, rewards and values."""
  writer = SequenceWriter(client, config, num_games=1)
  steps, terminal = make_episode(0, 0, length)
  for step in steps:
    writer.append(0, step)
  writer.end_episode(0, terminal)
  priorities = [p for _, p in drain(client, config, length)]
  rewards = np.array([s.reward for s in steps], np.float64)
  values = np.array([s.root_value for s in steps], np.float64)
  return priorities, rewards, values


def test_priority_with_full_n_step_window(queue_server):
  """A long episode: early items bootstrap from root_value[t+n], late ones are truncated."""
  config, client = queue_server
  n = config.learner.td_steps
  priorities, rewards, values = one_episode_priorities(config, client, 12)
  assert priorities[0] == pytest.approx(abs(rewards[:n].sum() + values[n] - values[0]) + 1e-3)
  assert priorities[-1] == pytest.approx(abs(rewards[-1] - values[-1]) + 1e-3)


def test_initial_priorities_use_the_learners_discount(queue_server):
  """Initial priorities are the learner's n-step target (discounted) against the root value."""
  config, client = queue_server
  config = dataclasses.replace(config, learner=dataclasses.replace(config.learner, discount=0.5))
  n = config.learner.td_steps
  priorities, rewards, values = one_episode_priorities(config, client, 6)
  weights = 0.5 ** np.arange(n)
  assert priorities[0] == pytest.approx(
    abs(rewards[:n] @ weights + 0.5**n * values[n] - values[0]) + PRIORITY_EPSILON
  )
  assert priorities[-1] == pytest.approx(abs(rewards[-1] - values[-1]) + PRIORITY_EPSILON)


def test_interleaved_games_do_not_mix(queue_server):
  config, client = queue_server
  L = config.learner.sequence_length
  writer = SequenceWriter(client, config, num_games=3)
  episodes = {
    (0, 0): make_episode(0, 0, L + 2),
    (1, 0): make_episode(1, 0, 2),
    (1, 1): make_episode(1, 1, 3),
    (2, 0): make_episode(2, 0, 1),
  }
  # Game 0 plays one long episode while game 1 finishes one and starts the next; game 2 is short.
  schedule = [
    (0, 0),
    (1, 0),
    (2, 0),
    (0, 0),
    (1, 0),
    (0, 0),
    (1, 1),
    (0, 0),
    (1, 1),
    (0, 0),
    (1, 1),
    (0, 0),
  ]
  cursor = {key: 0 for key in episodes}
  for key in schedule:
    steps, terminal = episodes[key]
    writer.append(key[0], steps[cursor[key]])
    cursor[key] += 1
    if cursor[key] == len(steps):
      writer.end_episode(key[0], terminal)
  assert all(cursor[key] == len(episodes[key][0]) for key in episodes)
  total = sum(len(steps) for steps, _ in episodes.values())
  assert table_size(client) == total
  seen = set()
  for item, priority in drain(client, config, total):
    game, episode, t = identify(item)
    steps, terminal = episodes[(game, episode)]
    check_item(item, steps, terminal, t, L)
    assert priority == pytest.approx(expected_priority(steps, t, config.learner.td_steps), rel=1e-6)
    seen.add((game, episode, t))
  assert seen == {(*key, t) for key, (steps, _) in episodes.items() for t in range(len(steps))}
  writer.close()


def test_sampler_batches_and_priority_updates():
  config = small_config(batch_size=8)
  L, B = config.learner.sequence_length, config.learner.batch_size
  server, address = start_server(config, rate_limiter=reverb.rate_limiters.MinSize(1))
  writer = SequenceWriter(reverb.Client(address), config, num_games=2)
  episodes = {(0, 0): make_episode(0, 0, 5), (1, 0): make_episode(1, 0, 6)}
  for (game, _), (steps, terminal) in episodes.items():
    for step in steps:
      writer.append(game, step)
    writer.end_episode(game, terminal)
  sampler = Sampler(address, config)
  batch = sampler.sample()
  assert isinstance(batch, Batch) and isinstance(batch.steps, Step)
  spec = step_spec(GAME)
  assert set(batch.steps.observation) == set(spec.observation)
  for got, s in zip(tree.flatten(batch.steps), tree.flatten(spec)):
    assert got.shape == (B, L, *s.shape) and got.dtype == s.dtype, s.name
  assert batch.keys.shape == (B,) and batch.keys.dtype == np.uint64
  assert batch.probabilities.shape == (B,) and batch.probabilities.dtype == np.float64
  assert np.all((batch.probabilities > 0) & (batch.probabilities <= 1))
  for b in range(B):
    item = tree.map_structure(lambda x: x[b], batch.steps)
    game, episode, t = identify(item)
    steps, terminal = episodes[(game, episode)]
    check_item(item, steps, terminal, t, L)

  # Zero priority everywhere but one item: from then on only that item is sampled.
  keys = set(np.unique(batch.keys).tolist())
  while len(keys) < 11:  # Collect every key (11 items) to zero the others as well.
    keys |= set(sampler.sample().keys.tolist())
  target = batch.keys[0]
  sampler.update_priorities(
    np.array(sorted(keys), np.uint64), [1.0 if k == target else 0.0 for k in sorted(keys)]
  )
  sampler.close()  # Drops batches prefetched under the old priorities.
  batch = sampler.sample()
  np.testing.assert_array_equal(batch.keys, np.full(B, target, np.uint64))
  np.testing.assert_allclose(batch.probabilities, 1.0)
  with pytest.raises(ValueError):
    sampler.update_priorities([1, 2], [1.0])
  sampler.close()
  writer.close()
  server.stop()


def test_rate_limiter_blocks_until_min_size():
  config = small_config(min_size_to_sample=5, batch_size=4)
  server, address = start_server(config)
  writer = SequenceWriter(reverb.Client(address), config, num_games=1)
  steps, terminal = make_episode(0, 0, 3)
  for step in steps:
    writer.append(0, step)
  writer.end_episode(0, terminal)
  sampler = Sampler(address, config, rate_limiter_timeout_ms=200)
  with pytest.raises(TimeoutError):
    sampler.sample()  # 3 items < min_size_to_sample = 5.
  steps, terminal = make_episode(0, 1, 3)
  for step in steps:
    writer.append(0, step)
  writer.end_episode(0, terminal)
  assert sampler.sample().keys.shape == (4,)  # 6 items: sampling is allowed now.
  sampler.close()
  writer.close()
  server.stop()


@pytest.mark.slow
def test_writer_blocked_by_the_rate_limiter_gives_up_when_told_to_stop():
  """With no learner sampling, inserts stop once the table is ahead of the samples-per-insert
  budget; a writer told to stop must raise instead of waiting forever."""
  config = small_config(min_size_to_sample=2)
  server, address = start_server(config)
  stopping = []
  writer = SequenceWriter(
    reverb.Client(address), config, num_games=1, should_stop=lambda: bool(stopping)
  )
  steps, terminal = make_episode(0, 0, 200)
  # Writes block after about min size + error buffer items; the stop request comes later.
  timer = threading.Timer(2.0, stopping.append, [True])
  timer.start()
  with pytest.raises(WriterStopped):
    for step in steps:
      writer.append(0, step)
    writer.end_episode(0, terminal)
  assert stopping, "the writer gave up before it was told to stop"
  assert table_size(reverb.Client(address)) < 50
  server.stop()


@pytest.mark.parametrize("preset", ["tiny", "small", "large"])
def test_tables_build_for_presets(preset):
  config = get_config(preset)
  table = make_table(config)
  assert table.name == TABLE_NAME
  info = table.info
  assert info.max_size == config.replay.max_size
  assert info.rate_limiter_info.min_size_to_sample == config.replay.min_size_to_sample
  # Reverb's lower bound on the buffer holds even with zero tolerance.
  zero = dataclasses.replace(
    config, replay=dataclasses.replace(config.replay, samples_per_insert_tolerance=0.0)
  )
  assert error_buffer(zero) >= max(1.0, config.replay.samples_per_insert)
  make_table(zero)
