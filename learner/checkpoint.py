"""The learner's checkpoint: one pickle of numpy arrays, written atomically.

Kept apart from the learner so that readers of a checkpoint (the agent solver, the launcher's
resume check, the reports) need not know how the learner steps. A checkpoint holds the training
state's leaves and the network and game configs it was made with; the optimiser state is stored as
leaves only, because optax's state classes are an implementation detail of the installed version
(the tree is rebuilt from a fresh optimiser state on restore).
"""

from __future__ import annotations

import dataclasses
import hashlib
import os
import pickle
import time
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

from malloczero.configs.workdir import CHECKPOINT_FILENAME
from malloczero.common.errors import MalloczeroError
from malloczero.common.files import atomic_write
from malloczero.env.game import observation_spec
from malloczero.learner.networks import MuZeroNetworks, Params

__all__ = ["CHECKPOINT_FILENAME", "check_params_fit", "checkpoint_configs", "checkpoint_file",
           "checkpoint_steps", "load_params", "params_digest", "restore_state", "save_state",
           "to_numpy"]

_CHECKPOINT_FORMAT = "malloczero-learner-state-v1"


def to_numpy(tree: Any) -> Any:
  return jax.tree_util.tree_map(np.asarray, jax.device_get(tree))


def checkpoint_file(path: str) -> str:
  """A checkpoint file, or the directory that holds `CHECKPOINT_FILENAME` -> the file."""
  return os.path.join(path, CHECKPOINT_FILENAME) if os.path.isdir(path) else path


def _read(path: str) -> dict[str, Any]:
  file = checkpoint_file(path)
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


def save_state(path: str, state: NamedTuple, num_steps: int, networks: MuZeroNetworks) -> str:
  """Writes a learner's `TrainingState` (numpy or jax) atomically to `path`, a file or a directory
  to hold `CHECKPOINT_FILENAME`; returns the file."""
  file = checkpoint_file(path)
  state = to_numpy(state)
  payload = {
      "format": _CHECKPOINT_FORMAT,
      "steps": num_steps,
      "params": state.params,
      "target_params": state.target_params,
      "opt_state_leaves": jax.tree_util.tree_leaves(state.opt_state),
      "rng": state.rng,
      "network_config": dataclasses.asdict(networks.config),
      "game_config": dataclasses.asdict(networks.game),
      "saved_at": time.time(),
  }
  os.makedirs(os.path.dirname(os.path.abspath(file)), exist_ok=True)
  # Readers see the old checkpoint or the new one, never half of one.
  with atomic_write(file, "wb", fsync=True) as f:
    pickle.dump(payload, f, protocol=pickle.HIGHEST_PROTOCOL)
  return file


def restore_state(path: str, template: NamedTuple) -> tuple[Any, int]:
  """(training state, step) from a checkpoint, as jax arrays in the structure of `template` (a
  freshly initialised `TrainingState` of the same networks and optimiser).

  Raises MalloczeroError when it is missing, unreadable or made for other networks."""
  payload = _read(path)
  file = checkpoint_file(path)
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
  state = template._replace(
      params=as_jax(payload["params"]),
      target_params=as_jax(payload["target_params"]),
      opt_state=jax.tree_util.tree_unflatten(opt_def, [jnp.asarray(x) for x in loaded_leaves]),
      steps=jnp.asarray(payload["steps"], jnp.int32),
      rng=jnp.asarray(payload["rng"]))
  return state, int(payload["steps"])


def load_params(path: str, which: str = "params") -> Params:
  """Network parameters (numpy) from a checkpoint file or a directory holding one, without
  building a learner; `which` is 'params' or 'target_params'."""
  return _read(path)[which]


def checkpoint_configs(path: str) -> tuple[Any, Any]:
  """(NetworkConfig, GameConfig) a checkpoint's networks were built with."""
  from malloczero.configs.config import NetworkConfig
  from malloczero.env.game import GameConfig
  payload = _read(path)
  try:
    # Checkpoints written before the msa game existed played requests and do not say so.
    game = dict(payload["game_config"])
    game.setdefault("decisions", "requests")
    return NetworkConfig(**payload["network_config"]), GameConfig(**game)
  except (KeyError, TypeError) as e:
    raise MalloczeroError(f"learner checkpoint '{checkpoint_file(path)}' was made by another "
                          f"version of malloczero ({type(e).__name__}: {e})") from e


def check_params_fit(networks: MuZeroNetworks, params: Params, path: str) -> None:
  """Raises MalloczeroError unless `params` have the shapes `networks` expect."""
  example = {k: np.zeros((1, *s.shape), s.dtype) for k, s in observation_spec(networks.game).items()}
  template = jax.eval_shape(networks.init, jax.random.PRNGKey(0), example)
  _check_same_structure(template, params, "parameters", checkpoint_file(path))


def checkpoint_steps(path: str) -> int:
  """The learner step a checkpoint (file, or directory holding one) was saved at."""
  return int(_read(path)["steps"])


def params_digest(params: Params) -> str:
  """A short SHA-256 of a parameter tree's values (leaf order and dtypes included): equal digests
  mean equal parameters, e.g. a restored learner's and its checkpoint's."""
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
