"""The Reverb table that holds MuZero sequences, and an in-process server for tests and tools.

One prioritised table of `Step` sequences with leaves `[L, ...]`
(L = LearnerConfig.sequence_length), FIFO eviction, and a samples-per-insert rate limiter that
keeps the learner from over-fitting a small buffer and the actors from running far ahead of it.
"""

from __future__ import annotations

from typing import Optional

import reverb
import tensorflow as tf
import tree

from malloczero.configs.config import Config
from malloczero.replay.types import Step, step_spec

TABLE_NAME = "priority_table"


def sequence_signature(config: Config) -> Step:
  """Table signature: `step_spec` with a leading `[L]` dimension, as `tf.TensorSpec`s."""
  length = config.learner.sequence_length
  return tree.map_structure(
    lambda s: tf.TensorSpec((length, *s.shape), tf.as_dtype(s.dtype), s.name),
    step_spec(config.game),
  )


def error_buffer(config: Config) -> float:
  """Half-width of the rate limiter's tolerated samples-per-insert error, in samples.

  `samples_per_insert_tolerance` is a fraction of `min_size_to_sample * samples_per_insert`
  (as in Acme). Reverb rejects a scalar buffer below `max(1, samples_per_insert)` (the
  range `2 * error_buffer` must be >= `2 * max(1, samples_per_insert)`, otherwise one insert or
  one sample could jump over the whole window and block both sides forever); we floor it at twice
  that minimum, Acme's choice, so that tiny test tables with small `min_size_to_sample` still get a
  window in which a learner and an actor can make progress concurrently.
  """
  replay = config.replay
  buffer = (
    replay.min_size_to_sample * replay.samples_per_insert * replay.samples_per_insert_tolerance
  )
  return float(max(buffer, 2.0 * max(1.0, replay.samples_per_insert)))


def make_rate_limiter(config: Config) -> reverb.rate_limiters.RateLimiter:
  """`SampleToInsertRatio` from `config.replay`; sampling blocks below `min_size_to_sample`."""
  replay = config.replay
  return reverb.rate_limiters.SampleToInsertRatio(
    samples_per_insert=replay.samples_per_insert,
    min_size_to_sample=replay.min_size_to_sample,
    error_buffer=error_buffer(config),
  )


def make_table(
  config: Config, rate_limiter: Optional[reverb.rate_limiters.RateLimiter] = None
) -> reverb.Table:
  """The prioritised replay table (`TABLE_NAME`) for `config`.

  Args:
    config: the agent config; uses `replay`, `learner.sequence_length` and `game`.
    rate_limiter: overrides the config's `SampleToInsertRatio` (e.g. `MinSize(1)` in tools).
  """
  replay = config.replay
  return reverb.Table(
    name=TABLE_NAME,
    sampler=reverb.selectors.Prioritized(replay.priority_exponent),
    remover=reverb.selectors.Fifo(),
    max_size=replay.max_size,
    rate_limiter=rate_limiter if rate_limiter is not None else make_rate_limiter(config),
    signature=sequence_signature(config),
  )


def start_server(
  config: Config,
  port: Optional[int] = None,
  rate_limiter: Optional[reverb.rate_limiters.RateLimiter] = None,
) -> tuple[reverb.Server, str]:
  """Starts an in-process Reverb server holding `make_table(config)`.

  Returns:
    The server (keep a reference: it stops when garbage-collected) and its address
    `"localhost:PORT"`. `port=None` picks a free port.
  """
  server = reverb.Server(tables=[make_table(config, rate_limiter)], port=port)
  return server, f"localhost:{server.port}"
