"""The MuZero learner: optax updates on sampled batches, target network, priorities, checkpoints.

One `step()` samples a `Batch` (replay/types.py), runs one jitted SGD step on the MuZero loss
(learner/losses.py), writes the new priorities back to replay and returns metrics. Actors pull
parameters with `get_variables()` (thread-safe: the learner may run in its own thread, as under
Launchpad's courier). The whole training state is checkpointed as one pickle of numpy arrays,
written atomically, and a learner built on a directory that holds one resumes from it.
"""

from __future__ import annotations

import dataclasses
import functools
import logging
import os
import pickle
import threading
import time
from typing import Any, Callable, Iterator, NamedTuple, Optional, Sequence, Union

import chex
import jax
import jax.numpy as jnp
import numpy as np
import optax

from malloczero.configs.config import Config, LearnerConfig
from malloczero.env.errors import MalloczeroError
from malloczero.env.game import observation_spec
from malloczero.learner.losses import muzero_loss
from malloczero.learner.networks import MuZeroNetworks, Observation, Params, make_networks
from malloczero.replay.types import Batch, Step

_log = logging.getLogger("malloczero.learner")

CHECKPOINT_FILENAME = "learner_state.pkl"
_CHECKPOINT_FORMAT = "malloczero-learner-state-v1"

SampleFn = Union[Callable[[], Batch], Iterator[Batch]]
UpdatePrioritiesFn = Callable[[np.ndarray, np.ndarray], None]


class TrainingState(NamedTuple):
  params: Params
  target_params: Params
  opt_state: optax.OptState
  steps: chex.Array   # int32 []: SGD steps taken.
  rng: chex.PRNGKey


# ------------------------------------------------------------------------------ pure pieces

def make_optimizer(config: LearnerConfig) -> optax.GradientTransformation:
  """Global-norm clipping, then AdamW on a linear warm-up / cosine decay (to 10%) schedule."""
  return optax.chain(
      optax.clip_by_global_norm(config.max_grad_norm),
      optax.adamw(learning_rate_schedule(config), weight_decay=config.weight_decay,
                  # Decay weight matrices only: shrinking LayerNorm scales and biases to zero
                  # fights normalisation rather than regularising.
                  mask=lambda params: jax.tree_util.tree_map(lambda x: x.ndim > 1, params)))


def learning_rate_schedule(config: LearnerConfig) -> optax.Schedule:
  """0 -> `learning_rate` over `warmup_steps`, then cosine to 10% over `decay_steps` more."""
  return optax.warmup_cosine_decay_schedule(
      init_value=0.0, peak_value=config.learning_rate, warmup_steps=config.warmup_steps,
      decay_steps=config.warmup_steps + max(config.decay_steps, 1),
      end_value=0.1 * config.learning_rate)


def _batched_observation(observation: Observation) -> Observation:
  """Adds a batch dimension to a single observation (the spec's rank), leaves batches alone."""
  if np.ndim(observation["legal_actions"]) == 1:
    return jax.tree_util.tree_map(lambda x: np.asarray(x)[None], observation)
  return observation


def make_initial_state(networks: MuZeroNetworks, config: Config, rng: chex.PRNGKey,
                       observation_example: Optional[Observation] = None) -> TrainingState:
  """Fresh parameters (target = online), optimizer state, step 0.

  `observation_example` is one observation (leaves shaped as the game's spec) or a batch of them;
  by default zeros of the game's observation spec.
  """
  if observation_example is None:
    observation_example = {k: np.zeros(s.shape, s.dtype)
                           for k, s in observation_spec(config.game).items()}
  init_rng, rng = jax.random.split(rng)
  # Jitted: op-by-op initialisation of the transformer takes seconds on CPU.
  params = jax.jit(networks.init)(init_rng, _batched_observation(observation_example))
  opt_state = jax.jit(make_optimizer(config.learner).init)(params)
  return TrainingState(params=params, target_params=params, opt_state=opt_state,
                       steps=jnp.zeros((), jnp.int32), rng=rng)


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
def make_sgd_step(networks: MuZeroNetworks, config: Config
                  ) -> Callable[[TrainingState, Step, chex.Array],
                                tuple[TrainingState, dict[str, chex.Array], chex.Array]]:
  """Jitted `(state, steps [B, L, ...], importance_weights [B])` -> `(state, metrics,
  priorities [B])`; metrics and priorities are those of the parameters the step started from."""
  learner_config = config.learner
  optimizer = make_optimizer(learner_config)
  schedule = learning_rate_schedule(learner_config)
  period = max(1, learner_config.target_update_period)

  def sgd_step(state: TrainingState, steps: Step, weights: chex.Array):
    def loss_fn(params):
      loss, metrics, priorities = muzero_loss(networks, params, state.target_params, steps,
                                              weights, learner_config)
      return loss, (metrics, priorities)

    (_, (metrics, priorities)), grads = jax.value_and_grad(loss_fn, has_aux=True)(state.params)
    updates, opt_state = optimizer.update(grads, state.opt_state, state.params)
    params = optax.apply_updates(state.params, updates)
    steps_taken = state.steps + 1
    # A periodic hard copy (as in MuZero Reanalyse / Acme's DQN) rather than Polyak averaging.
    copy = steps_taken % period == 0
    target_params = jax.tree_util.tree_map(lambda new, old: jnp.where(copy, new, old),
                                           params, state.target_params)
    rng, _ = jax.random.split(state.rng)
    metrics = dict(metrics, grad_norm=optax.tree.norm(grads),
                   learning_rate=schedule(state.steps))
    new_state = TrainingState(params=params, target_params=target_params, opt_state=opt_state,
                              steps=steps_taken, rng=rng)
    return new_state, metrics, priorities

  return jax.jit(sgd_step)


# ------------------------------------------------------------------------------ checkpoints

def _to_numpy(tree: Any) -> Any:
  return jax.tree_util.tree_map(np.asarray, jax.device_get(tree))


def _checkpoint_file(path: str) -> str:
  return os.path.join(path, CHECKPOINT_FILENAME) if os.path.isdir(path) else path


def _read_checkpoint(path: str) -> dict[str, Any]:
  file = _checkpoint_file(path)
  if not os.path.isfile(file):
    raise MalloczeroError(f"no learner checkpoint at '{path}'")
  try:
    with open(file, "rb") as f:
      payload = pickle.load(f)
  except Exception as e:  # Truncated, not a pickle, unknown classes: all mean unusable.
    raise MalloczeroError(f"learner checkpoint '{file}' is unreadable "
                          f"({type(e).__name__}: {e})".replace("\n", " ")) from e
  if not isinstance(payload, dict) or payload.get("format") != _CHECKPOINT_FORMAT:
    raise MalloczeroError(f"'{file}' is not a malloczero learner checkpoint")
  return payload


def load_params(path: str, which: str = "params") -> Params:
  """Network parameters (numpy) from a checkpoint file or a directory holding one, without
  building a learner; `which` is 'params' or 'target_params'."""
  return _read_checkpoint(path)[which]


def checkpoint_configs(path: str) -> tuple[Any, Any]:
  """(NetworkConfig, GameConfig) a checkpoint's networks were built with."""
  from malloczero.configs.config import NetworkConfig
  from malloczero.env.game import GameConfig
  payload = _read_checkpoint(path)
  try:
    return NetworkConfig(**payload["network_config"]), GameConfig(**payload["game_config"])
  except (KeyError, TypeError) as e:
    raise MalloczeroError(f"learner checkpoint '{_checkpoint_file(path)}' was made by another "
                          f"version of malloczero ({type(e).__name__}: {e})") from e


def check_params_fit(networks: MuZeroNetworks, params: Params, path: str) -> None:
  """Raises MalloczeroError unless `params` have the shapes `networks` expect."""
  example = {k: np.zeros((1, *s.shape), s.dtype) for k, s in observation_spec(networks.game).items()}
  template = jax.eval_shape(networks.init, jax.random.PRNGKey(0), example)
  _check_same_structure(template, params, "parameters", _checkpoint_file(path))


def checkpoint_steps(path: str) -> int:
  """The learner step a checkpoint (file, or directory holding one) was saved at."""
  return int(_read_checkpoint(path)["steps"])


def params_digest(params: Params) -> str:
  """A short SHA-256 of a parameter tree's values (leaf order and dtypes included): equal digests
  mean equal parameters, e.g. a restored learner's and its checkpoint's."""
  import hashlib
  digest = hashlib.sha256()
  for leaf in jax.tree_util.tree_leaves(params):
    array = np.ascontiguousarray(np.asarray(leaf))
    digest.update(str((array.dtype, array.shape)).encode())
    digest.update(array.tobytes())
  return digest.hexdigest()[:16]


def _check_same_structure(template: Any, loaded: Any, what: str, file: str) -> None:
  t_leaves, t_def = jax.tree_util.tree_flatten(template)
  l_leaves, l_def = jax.tree_util.tree_flatten(loaded)
  if t_def != l_def or any(np.shape(a) != np.shape(b) for a, b in zip(t_leaves, l_leaves)):
    raise MalloczeroError(f"learner checkpoint '{file}' does not match this configuration "
                          f"({what} differ in structure or shapes)")


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
    checkpoint_dir: where `learner_state.pkl` is written (every `checkpoint_every_s` inside
      `step()`, and by `save()`); if it already holds one, the learner resumes from it.
    logger: anything with `write(dict)` (an Acme logger), given every step's metrics.
  """

  def __init__(self, networks: MuZeroNetworks, config: Config, sample_fn: SampleFn,
               update_priorities_fn: Optional[UpdatePrioritiesFn] = None, seed: int = 0,
               checkpoint_dir: Optional[str] = None, logger: Any = None):
    self._networks = networks
    self._config = config
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
    weights = importance_weights(batch.probabilities,
                                 self._config.replay.importance_sampling_exponent)
    state, metrics, priorities = self._sgd_step(self._state, batch.steps, weights)
    metrics, priorities = jax.device_get((metrics, priorities))
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
    result["learner_steps_per_s"] = 1.0 / max(elapsed, 1e-9)
    if self._checkpoint_dir and now - self._last_save >= self._config.learner.checkpoint_every_s:
      self.save()
    if self._logger is not None:
      self._logger.write(result)
    return result

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
      cached = (num_steps, _to_numpy(state.params))
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
        out.append(_to_numpy(state.target_params))
      elif name == "steps":
        out.append(np.int64(num_steps))
      else:
        raise KeyError(f"unknown variable '{name}' (have params, target_params, steps)")
    return out

  # -------------------------------------------------------------------------- checkpoints

  def save(self, path: Optional[str] = None) -> str:
    """Writes the training state atomically to `path` (a file, or a directory to hold
    `learner_state.pkl`), by default into the checkpoint directory; returns the file."""
    if path is None:
      if not self._checkpoint_dir:
        raise MalloczeroError("no checkpoint path: pass one to save() or build the learner with "
                              "a checkpoint_dir")
      path = self._checkpoint_dir
    file = _checkpoint_file(path)
    with self._lock:
      state, num_steps = self._state, self._num_steps
    state = _to_numpy(state)
    payload = {
        "format": _CHECKPOINT_FORMAT,
        "steps": num_steps,
        "params": state.params,
        "target_params": state.target_params,
        # Leaves only: optax's state classes are an implementation detail of the installed
        # version; the treedef is rebuilt from a fresh optimizer state on restore.
        "opt_state_leaves": jax.tree_util.tree_leaves(state.opt_state),
        "rng": state.rng,
        "network_config": dataclasses.asdict(self._networks.config),
        "game_config": dataclasses.asdict(self._networks.game),
        "saved_at": time.time(),
    }
    directory = os.path.dirname(os.path.abspath(file))
    os.makedirs(directory, exist_ok=True)
    tmp = f"{file}.tmp.{os.getpid()}.{threading.get_ident()}"
    with open(tmp, "wb") as f:
      pickle.dump(payload, f, protocol=pickle.HIGHEST_PROTOCOL)
      f.flush()
      os.fsync(f.fileno())
    os.replace(tmp, file)  # Readers see the old checkpoint or the new one, never half of one.
    self._last_save = time.monotonic()
    return file

  def restore(self, path: str) -> None:
    """Loads the training state from a checkpoint file or a directory holding one.

    Raises MalloczeroError when it is missing, unreadable or made for other networks."""
    payload = _read_checkpoint(path)
    file = _checkpoint_file(path)
    template = self._state
    _check_same_structure(template.params, payload["params"], "parameters", file)
    _check_same_structure(template.target_params, payload["target_params"], "target parameters",
                          file)
    opt_leaves, opt_def = jax.tree_util.tree_flatten(template.opt_state)
    loaded_leaves = payload["opt_state_leaves"]
    if len(loaded_leaves) != len(opt_leaves) or any(
        np.shape(a) != np.shape(b) for a, b in zip(opt_leaves, loaded_leaves)):
      raise MalloczeroError(f"learner checkpoint '{file}' does not match this configuration "
                            "(optimizer state differs)")
    as_jax = lambda tree: jax.tree_util.tree_map(jnp.asarray, tree)
    state = TrainingState(
        params=as_jax(payload["params"]),
        target_params=as_jax(payload["target_params"]),
        opt_state=jax.tree_util.tree_unflatten(opt_def, [jnp.asarray(x) for x in loaded_leaves]),
        steps=jnp.asarray(payload["steps"], jnp.int32),
        rng=jnp.asarray(payload["rng"]))
    with self._lock:
      self._state = state
      self._num_steps = int(payload["steps"])
      self._numpy_params = None


# ------------------------------------------------------------------------------ benchmarking

def random_batch(config: Config, batch_size: int, seed: int = 0) -> Batch:
  """A random but well-formed batch `[B, L, ...]`: plausible observations and legal masks,
  actions drawn from peaked search policies, and episodes that end at random points inside the
  sequence (terminal state, then zero padding) as the replay writer lays them out."""
  rng = np.random.default_rng(seed)
  game = config.game
  length = config.learner.sequence_length
  num_actions = game.num_actions
  spec = observation_spec(game)
  shape = lambda *s: (batch_size, length) + s
  obs = {k: rng.random(shape(*s.shape), dtype=np.float32) for k, s in spec.items()
         if k != "legal_actions"}
  num_candidates = rng.integers(0, game.num_candidates + 1, shape())                  # [B, L]
  legal = np.arange(num_actions) <= num_candidates[..., None]                         # [B, L, A]
  obs["candidates"][..., 0] = (np.arange(game.num_candidates) < num_candidates[..., None])
  # Episode end: the terminal state sits at index `end` (beyond L: no end in this item).
  end = rng.integers(1, 2 * length, batch_size)
  index = np.arange(length)[None]
  valid = (index < end[:, None]).astype(np.float32)                                   # [B, L]
  terminal = index == end[:, None]
  logits = np.where(legal, 3.0 * rng.standard_normal(shape(num_actions)), -np.inf)
  policy = np.exp(logits - logits.max(-1, keepdims=True))
  policy /= policy.sum(-1, keepdims=True)
  action = (policy.cumsum(-1) < rng.random(shape(1))).sum(-1).clip(0, num_actions - 1)
  reward = (rng.exponential(0.02, shape()) * (action > 0)).astype(np.float32)
  root_value = rng.random(shape(), dtype=np.float32) * 0.5
  # The terminal observation is zeros with action 0 legal; padding is zeros with nothing legal.
  for k in obs:
    obs[k] *= valid.reshape(valid.shape + (1,) * (obs[k].ndim - 2))
  legal = (legal & (valid[..., None] > 0)) | (terminal[..., None] & (np.arange(num_actions) == 0))
  obs["legal_actions"] = legal
  steps = Step(observation=obs, action=(action * valid).astype(np.int32),
               reward=reward * valid, policy=(policy * valid[..., None]).astype(np.float32),
               root_value=root_value * valid, valid=valid)
  keys = np.arange(batch_size, dtype=np.uint64)
  probabilities = rng.uniform(0.5, 1.5, batch_size) / batch_size
  return Batch(steps=steps, keys=keys, probabilities=probabilities)


def learner_updates_per_s(config: Config, batch_size: Optional[int] = None,
                          num_updates: int = 20, num_batches: int = 4) -> float:
  """Learner SGD steps per second on in-memory random batches (no Reverb), after compilation.

  Goes through `MuZeroLearner.step()`, so host-to-device transfer, importance weights and the
  metrics' device-to-host copy are included; sampling from replay is not."""
  if batch_size is not None:
    config = dataclasses.replace(config,
                                 learner=dataclasses.replace(config.learner, batch_size=batch_size))
  batch_size = config.learner.batch_size
  batches = [random_batch(config, batch_size, seed) for seed in range(num_batches)]
  counter = iter(range(1 << 62))
  networks = make_networks(config.network, config.game)
  learner = MuZeroLearner(networks, config, lambda: batches[next(counter) % num_batches],
                          seed=config.seed)
  learner.step()  # Compiles.
  learner.step()
  start = time.perf_counter()
  for _ in range(num_updates):
    learner.step()
  return num_updates / (time.perf_counter() - start)
