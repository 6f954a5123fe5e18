"""The MuZero learner: optax updates on sampled batches, target network, priorities, checkpoints.

One `step()` samples a `Batch` (replay/types.py), runs one jitted SGD step on the MuZero loss
(learner/losses.py), writes the new priorities back to replay and returns metrics. Actors pull
parameters with `get_variables()` (thread-safe: the learner may run in its own thread, as under
Launchpad's courier). The whole training state is checkpointed (learner/checkpoint.py), and a
learner built on a directory that holds a checkpoint resumes from it.
"""

from __future__ import annotations

import functools
import logging
import os
import threading
import time
from typing import Any, Callable, Iterator, NamedTuple, Optional, Sequence, Union

import chex
import jax
import jax.numpy as jnp
import numpy as np
import optax

from malloczero.common.errors import MalloczeroError
from malloczero.configs.config import Config, LearnerConfig
from malloczero.env.game import observation_spec
from malloczero.learner.checkpoint import (
  CHECKPOINT_FILENAME,
  candidate_checkpoints,
  candidate_file,
  restore_state,
  save_state,
  to_numpy,
)
from malloczero.learner.demonstrations import (
  Demonstrations,
  demonstration_metrics,
  mix_demonstrations,
)
from malloczero.learner.losses import muzero_loss
from malloczero.learner.networks import MuZeroNetworks, Observation, Params
from malloczero.learner.probes import ProbeStore, probe_policy_loss
from malloczero.learner.reanalyse import ReanalyseFn, SearchFn, make_reanalyse_fn
from malloczero.replay.types import Batch, Step

_log = logging.getLogger("malloczero.learner")

SampleFn = Union[Callable[[], Batch], Iterator[Batch]]
UpdatePrioritiesFn = Callable[[np.ndarray, np.ndarray], None]


class TrainingState(NamedTuple):
  params: Params
  target_params: Params
  opt_state: optax.OptState
  steps: chex.Array  # int32 []: SGD steps taken.
  rng: chex.PRNGKey


# ------------------------------------------------------------------------------ pure pieces


def make_optimizer(config: LearnerConfig) -> optax.GradientTransformation:
  """Global-norm clipping, then AdamW on a linear warm-up / cosine decay (to 10%) schedule."""
  return optax.chain(
    optax.clip_by_global_norm(config.max_grad_norm),
    optax.adamw(
      learning_rate_schedule(config),
      weight_decay=config.weight_decay,
      # Decay weight matrices only: shrinking LayerNorm scales and biases to zero
      # fights normalisation rather than regularising.
      mask=lambda params: jax.tree_util.tree_map(lambda x: x.ndim > 1, params),
    ),
  )


def learning_rate_schedule(config: LearnerConfig) -> optax.Schedule:
  """0 -> `learning_rate` over `warmup_steps`, then cosine to 10% over `decay_steps` more."""
  return optax.warmup_cosine_decay_schedule(
    init_value=0.0,
    peak_value=config.learning_rate,
    warmup_steps=config.warmup_steps,
    decay_steps=config.warmup_steps + max(config.decay_steps, 1),
    end_value=0.1 * config.learning_rate,
  )


def _batched_observation(observation: Observation) -> Observation:
  """Adds a batch dimension to a single observation (the spec's rank), leaves batches alone."""
  if np.ndim(observation["legal_actions"]) == 1:
    return jax.tree_util.tree_map(lambda x: np.asarray(x)[None], observation)
  return observation


def make_initial_state(
  networks: MuZeroNetworks,
  config: Config,
  rng: chex.PRNGKey,
  observation_example: Optional[Observation] = None,
) -> TrainingState:
  """Fresh parameters (target = online), optimizer state, step 0.

  `observation_example` is one observation (leaves shaped as the game's spec) or a batch of them;
  by default zeros of the game's observation spec.
  """
  if observation_example is None:
    observation_example = {
      k: np.zeros(s.shape, s.dtype) for k, s in observation_spec(config.game).items()
    }
  init_rng, rng = jax.random.split(rng)
  # Jitted: op-by-op initialisation of the transformer takes seconds on CPU.
  params = jax.jit(networks.init)(init_rng, _batched_observation(observation_example))
  opt_state = jax.jit(make_optimizer(config.learner).init)(params)
  return TrainingState(
    params=params,
    target_params=params,
    opt_state=opt_state,
    steps=jnp.zeros((), jnp.int32),
    rng=rng,
  )


def importance_weights(probabilities: np.ndarray, exponent: float) -> np.ndarray:
  """Prioritised-replay correction `(1 / (N p))^beta / max`, `[B]` float32 in (0, 1].

  After normalising by the maximum, N (the replay size) cancels: the weights are
  `(p_min / p)^beta` over the batch, so no table size is needed. Non-positive or non-finite
  probabilities (e.g. a uniform sampler that reports none) count as uniform.
  """
  p = np.asarray(probabilities, np.float64)
  if p.size == 0 or not np.all(np.isfinite(p) & (p > 0)):
    return np.ones(p.shape, np.float32)
  return ((p.min() / p) ** exponent).astype(np.float32)


# Cached: the step is a pure function of (networks, config), and learners built with the same
# pair (a restarted learner, tests) then share one compiled executable instead of re-compiling.
@functools.lru_cache(maxsize=8)
def make_sgd_step(
  networks: MuZeroNetworks, config: Config
) -> Callable[..., tuple[TrainingState, dict[str, chex.Array], chex.Array]]:
  """Jitted `(state, steps [B, L, ...], importance_weights [B], exact_values [B] bool = None,
  probes = None)` -> `(state, metrics, priorities [B])`; metrics and priorities are those of the
  parameters the step started from. `exact_values` marks demonstration items, `probes` is
  (observations `[P, ...]`, exact advantages `[P, A]`, msa's moves `[P]`) of probed decisions
  (learner/losses.py, learner/probes/loss.py)."""
  learner_config = config.learner
  optimizer = make_optimizer(learner_config)
  schedule = learning_rate_schedule(learner_config)
  period = max(1, learner_config.target_update_period)

  def sgd_step(
    state: TrainingState,
    steps: Step,
    weights: chex.Array,
    exact_values: Optional[chex.Array] = None,
    probes: Optional[tuple[dict[str, chex.Array], chex.Array, chex.Array]] = None,
  ):
    def loss_fn(params):
      loss, metrics, priorities = muzero_loss(
        networks, params, state.target_params, steps, weights, learner_config, exact_values
      )
      if probes is not None:
        probe_loss, probe_metrics = probe_policy_loss(
          networks,
          params,
          *probes,
          config.probes.temperature,
          config.probes.msa_margin,
        )
        loss = loss + config.probes.loss_weight * probe_loss
        metrics = dict(metrics, **probe_metrics, loss=loss)
      return loss, (metrics, priorities)

    (_, (metrics, priorities)), grads = jax.value_and_grad(loss_fn, has_aux=True)(state.params)
    updates, opt_state = optimizer.update(grads, state.opt_state, state.params)
    params = optax.apply_updates(state.params, updates)
    steps_taken = state.steps + 1
    # A periodic hard copy (as in MuZero Reanalyse / Acme's DQN) rather than Polyak averaging.
    copy = steps_taken % period == 0
    target_params = jax.tree_util.tree_map(
      lambda new, old: jnp.where(copy, new, old), params, state.target_params
    )
    rng, _ = jax.random.split(state.rng)
    metrics = dict(metrics, grad_norm=optax.tree.norm(grads), learning_rate=schedule(state.steps))
    new_state = TrainingState(
      params=params, target_params=target_params, opt_state=opt_state, steps=steps_taken, rng=rng
    )
    return new_state, metrics, priorities

  return jax.jit(sgd_step)


# ------------------------------------------------------------------------------ the learner


class MuZeroLearner:
  """Samples batches, updates parameters, writes back priorities, checkpoints itself.

  Args:
    networks: from `make_networks(config.network, config.game)`.
    config: the agent config; uses `learner`, `replay.importance_sampling_exponent`, `game`.
    sample_fn: a callable returning a `Batch`, or an iterator of them.
    update_priorities_fn: called as `fn(keys [B] uint64, priorities [B] float64)` after each
      step, or None (e.g. uniform replay).
    seed: seeds the parameter initialisation.
    checkpoint_dir: where `learner_state.npz` is written (every `checkpoint_every_s` inside
      `step()`, and by `save()`); if it already holds one, the learner resumes from it.
    logger: anything with `write(dict)` (an Acme logger), given every step's metrics.
    demonstrations: the best trajectory per training program (learner/demonstrations/); each
      batch then holds `learner.demonstration_batch` windows of them after the sampled items
      (fitted to their exact returns), and they are saved and restored with the checkpoint.
    candidates_dir: with `config.select_checkpoints` above 1, where a checkpoint is kept every
      `config.eval_every_steps` steps for the final evaluation's selection (the newest
      `select_checkpoints` of them; older ones are deleted).
    probes: probed decisions (learner/probes/store.py) the actors offer (`offer_probe`); once
      it holds any, each batch also fits the policy at `probes.batch` of them, and they are
      saved and restored with the checkpoint.

  With `learner.reanalyse_fraction` above 0, the first `learner.reanalyse_batch` sampled items
  of each batch get fresh policy targets at states 0..K from `reanalyse_search` (the actors'
  training search, unjitted) with the current parameters before the step (learner/reanalyse.py).
  """

  def __init__(
    self,
    networks: MuZeroNetworks,
    config: Config,
    sample_fn: SampleFn,
    update_priorities_fn: Optional[UpdatePrioritiesFn] = None,
    seed: int = 0,
    checkpoint_dir: Optional[str] = None,
    logger: Any = None,
    demonstrations: Optional[Demonstrations] = None,
    candidates_dir: Optional[str] = None,
    reanalyse_search: Optional[SearchFn] = None,
    probes: Optional[ProbeStore] = None,
  ):
    self._networks = networks
    self._candidates_dir = candidates_dir if config.select_checkpoints > 1 else None
    self._config = config
    self._demonstrations = demonstrations
    self._probes = probes
    if hasattr(sample_fn, "__next__"):
      iterator = sample_fn
      self._sample = lambda: next(iterator)
    elif callable(sample_fn):
      self._sample = sample_fn
    else:
      raise TypeError(f"sample_fn must be callable or an iterator, got {type(sample_fn).__name__}")
    self._update_priorities = update_priorities_fn
    self._checkpoint_dir = checkpoint_dir
    self._logger = logger
    self._sgd_step = make_sgd_step(networks, config)
    self._reanalyse: Optional[ReanalyseFn] = None
    if config.learner.reanalyse_batch:
      if reanalyse_search is None:
        raise ValueError("reanalyse_fraction > 0 needs the search to reanalyse with")
      self._reanalyse = make_reanalyse_fn(reanalyse_search)
    self._reanalyse_rng = jax.random.PRNGKey(seed + 1)
    self._lock = threading.Lock()  # Guards _state swaps against get_variables/save in threads.
    self._state = make_initial_state(networks, config, jax.random.PRNGKey(seed))
    self._num_steps = 0
    self._numpy_params: Optional[tuple[int, Params]] = None  # (step, params) cache for actors.
    self._last_save = time.monotonic()
    self._last_step_end: Optional[float] = None
    if checkpoint_dir:
      os.makedirs(checkpoint_dir, exist_ok=True)
      file = os.path.join(checkpoint_dir, CHECKPOINT_FILENAME)
      if os.path.exists(file):
        self.restore(file)
        _log.info("learner resumed from %s at step %d", file, self._num_steps)

  # -------------------------------------------------------------------------- properties

  @property
  def state(self) -> TrainingState:
    with self._lock:
      return self._state

  @property
  def num_steps(self) -> int:
    return self._num_steps

  # -------------------------------------------------------------------------- training

  def step(self) -> dict[str, float]:
    """One SGD step on a sampled batch; returns its metrics as Python floats."""
    start = time.monotonic()
    batch = self._sample()
    weights = importance_weights(
      batch.probabilities, self._config.replay.importance_sampling_exponent
    )
    steps, exact_values = batch.steps, None
    num_sampled = len(weights)
    reanalysed: dict[str, float] = {}
    if self._reanalyse is not None:
      steps, reanalysed = self._reanalysed(steps)
    num_demonstrations = self._config.learner.demonstration_batch
    if self._demonstrations is not None and num_demonstrations:
      steps, weights, exact_values = mix_demonstrations(
        self._demonstrations, num_demonstrations, steps, weights
      )
    probes = None
    if self._probes is not None and len(self._probes):
      probes = self._probes.sample(self._config.probes.batch)
    state, metrics, priorities = self._sgd_step(self._state, steps, weights, exact_values, probes)
    metrics, priorities = jax.device_get((metrics, priorities))
    priorities = priorities[:num_sampled]
    with self._lock:
      self._state = state
      self._num_steps += 1
    if self._update_priorities is not None:
      self._update_priorities(np.asarray(batch.keys), np.asarray(priorities, np.float64))
    now = time.monotonic()
    # Time between consecutive steps, so waiting on the replay's rate limiter counts.
    elapsed = now - (self._last_step_end if self._last_step_end is not None else start)
    self._last_step_end = now
    result = {k: float(v) for k, v in metrics.items()}
    result["learner_steps"] = float(self._num_steps)
    result.update(reanalysed)
    if self._demonstrations is not None:
      result.update(demonstration_metrics(self._demonstrations))
    if self._probes is not None:
      result["probes"] = float(len(self._probes))
    result["learner_steps_per_s"] = 1.0 / max(elapsed, 1e-9)
    if self._checkpoint_dir and now - self._last_save >= self._config.learner.checkpoint_every_s:
      self.save()
    if self._candidates_dir and self._num_steps % self._config.eval_every_steps == 0:
      self._keep_candidate()
    if self._logger is not None:
      self._logger.write(result)
    return result

  def _reanalysed(self, steps: Step) -> tuple[Step, dict[str, float]]:
    """The sampled steps with the first `reanalyse_batch` items' policy targets at states 0..K
    searched again with the current parameters, and what that changed: the share of those
    states reanalysed and the mean total variation of their targets."""
    rows, states = self._config.learner.reanalyse_batch, self._config.learner.unroll_steps + 1
    head = lambda x: x[:rows, :states]
    self._reanalyse_rng, key = jax.random.split(self._reanalyse_rng)
    output = self._reanalyse(
      self._state.params,
      key,
      jax.tree_util.tree_map(head, steps.observation),
      head(steps.policy),
      head(steps.action),
      head(steps.valid),
    )
    fresh, replaced, shift = jax.device_get(output)
    policy = np.array(steps.policy, np.float32)
    policy[:rows, :states] = fresh
    real = max(float(np.sum(head(steps.valid) > 0)), 1.0)
    count = float(replaced.sum())
    metrics = {
      "reanalysed_share": count / real,
      "reanalyse_policy_shift": float(shift.sum()) / max(count, 1.0),
    }
    return steps._replace(policy=policy), metrics

  def run(self, num_steps: Optional[int] = None) -> dict[str, float]:
    """Runs `num_steps` steps (default: up to `config.max_learner_steps`), saves if it has a
    checkpoint directory, and returns the last metrics."""
    if num_steps is None:
      num_steps = max(0, self._config.max_learner_steps - self._num_steps)
    metrics: dict[str, float] = {}
    for _ in range(num_steps):
      metrics = self.step()
    if self._checkpoint_dir:
      self.save()
    return metrics

  # -------------------------------------------------------------------------- variables

  def get_variables(self, names: Optional[Sequence[str]] = None) -> Any:
    """Numpy parameters for actors.

    With `names=None` returns the online params tree. With a sequence of names (Acme's
    `VariableSource` convention) returns a list with one entry per name, each 'params',
    'target_params' or 'steps'.
    """
    with self._lock:
      state, num_steps = self._state, self._num_steps
      cached = self._numpy_params
    if cached is None or cached[0] != num_steps:
      # Device-to-host outside the lock: jax arrays are immutable, so `state` stays intact.
      cached = (num_steps, to_numpy(state.params))
      with self._lock:
        if self._numpy_params is None or self._numpy_params[0] < num_steps:
          self._numpy_params = cached
    if names is None:
      return cached[1]
    out = []
    for name in names:
      if name == "params":
        out.append(cached[1])
      elif name == "target_params":
        out.append(to_numpy(state.target_params))
      elif name == "steps":
        out.append(np.int64(num_steps))
      else:
        raise KeyError(f"unknown variable '{name}' (have params, target_params, steps)")
    return out

  # -------------------------------------------------------------------------- checkpoints

  def save(self, path: Optional[str] = None) -> str:
    """Writes the training state atomically to `path` (a file, or a directory to hold
    `learner_state.npz`), by default into the checkpoint directory; returns the file."""
    if path is None:
      if not self._checkpoint_dir:
        raise MalloczeroError(
          "no checkpoint path: pass one to save() or build the learner with a checkpoint_dir"
        )
      path = self._checkpoint_dir
    with self._lock:
      state, num_steps = self._state, self._num_steps
    file = save_state(path, state, num_steps, self._networks)
    if self._demonstrations is not None:
      self._demonstrations.save(os.path.dirname(file))
    if self._probes is not None:
      self._probes.save(os.path.dirname(file))
    self._last_save = time.monotonic()
    return file

  def _keep_candidate(self) -> None:
    """Saves this step's state for the final evaluation's selection; keeps the newest
    `select_checkpoints` such checkpoints."""
    with self._lock:
      state, num_steps = self._state, self._num_steps
    save_state(candidate_file(self._candidates_dir, num_steps), state, num_steps, self._networks)
    for _, stale in candidate_checkpoints(self._candidates_dir)[: -self._config.select_checkpoints]:
      os.remove(stale)

  def restore(self, path: str) -> None:
    """Loads the training state from a checkpoint file or a directory holding one.

    Raises MalloczeroError when it is missing, unreadable or made for other networks."""
    state, num_steps = restore_state(path, self._state)
    with self._lock:
      self._state = state
      self._num_steps = num_steps
      self._numpy_params = None
    directory = path if os.path.isdir(path) else os.path.dirname(path)
    if self._demonstrations is not None:
      self._demonstrations.restore(directory)
    if self._probes is not None:
      self._probes.restore(directory)

  def offer_demonstration(
    self, program: str, actions: Sequence[int], episode_return: float
  ) -> float:
    """A game the agent played (an actor's or an evaluation's), offered as `program`'s
    demonstration (learner/demonstrations/store.py `Demonstrations.offer`); returns the best
    return now known for `program` (+inf when this learner keeps no demonstrations, so the actor
    stops offering), as for a program the store does not keep (`learner.demonstration_programs`)."""
    if self._demonstrations is None or not self._demonstrations.holds(program):
      return float("inf")
    return self._demonstrations.offer(program, actions, episode_return, "agent")

  def offer_probe(self, observation: dict[str, Any], advantages: Any, msa_action: int) -> int:
    """A decision an actor probed (learner/probes/prober.py): its observation, each action
    slot's exact advantage over msa `[A]` (arrays or nested lists) and msa's move; returns the
    number of probes stored (0 when this learner keeps none). Raises ValueError for one whose
    shapes are not this run's."""
    if self._probes is None:
      return 0
    return self._probes.add(observation, advantages, msa_action)
