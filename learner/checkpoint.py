"""The learner's checkpoint: arrays in an `.npz` file and JSON metadata, written atomically.

Kept apart from the learner so that readers of a checkpoint (the agent solver, the launcher's
resume check, the reports) need not know how the learner steps. A checkpoint holds the training
state's leaves and the network and game configs it was made with; the optimiser state is stored as
leaves only, because optax's state classes are an implementation detail of the installed version
(the tree is rebuilt from a fresh optimiser state on restore).

Checkpoints are meant to be shared (`evaluate --checkpoint`, `solve --solver agent`, a cloud run
copied home), so reading one must never run its author's code: the file is a zip of `.npy`
arrays read with `allow_pickle=False`, whose only structure is the JSON metadata (format version,
step, configs, the key path of every parameter). Every expected array is checked by name, dtype
and shape; each failure is one line. Checkpoints of the older pickle format are refused with the
command that converts them (`malloczero convert-checkpoint --trust`), the one place a pickle is
ever read, and only when the user asks for it.
"""

from __future__ import annotations

import dataclasses
import hashlib
import io
import json
import os
import re
import time
import zipfile
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

from malloczero.common.errors import MalloczeroError
from malloczero.common.files import atomic_write
from malloczero.common.inputs import check_input_file
from malloczero.configs.workdir import CHECKPOINT_FILENAME, LEGACY_CHECKPOINT_FILENAME
from malloczero.env.game import observation_spec
from malloczero.learner.networks import MuZeroNetworks, Params

__all__ = [
  "CHECKPOINT_FILENAME",
  "candidate_checkpoints",
  "candidate_file",
  "check_params_fit",
  "checkpoint_configs",
  "checkpoint_file",
  "checkpoint_steps",
  "convert_legacy_checkpoint",
  "load_params",
  "params_digest",
  "refuse_legacy",
  "restore_state",
  "save_state",
  "to_numpy",
]

CHECKPOINT_FORMAT = "malloczero-learner-state"
CHECKPOINT_FORMAT_VERSION = 2
_METADATA = "metadata"
# The parameter trees stored, each under `<tree>/<index>` in the order of its metadata's paths.
_PARAM_TREES = ("params", "target_params")


def to_numpy(tree: Any) -> Any:
  return jax.tree_util.tree_map(np.asarray, jax.device_get(tree))


def checkpoint_file(path: str) -> str:
  """A checkpoint file, or the directory that holds `CHECKPOINT_FILENAME` -> the file."""
  return os.path.join(path, CHECKPOINT_FILENAME) if os.path.isdir(path) else path


def _legacy_file(path: str) -> str | None:
  """The pickle checkpoint at `path` (a directory holding one, or the file), if that is what it
  is."""
  candidate = os.path.join(path, LEGACY_CHECKPOINT_FILENAME) if os.path.isdir(path) else path
  if not os.path.isfile(candidate):
    return None
  with open(candidate, "rb") as f:
    head = f.read(2)
  return candidate if head[:1] == b"\x80" else None  # Every pickle protocol >= 2 starts so.


def refuse_legacy(path: str) -> None:
  """Raises MalloczeroError, saying how to convert it, if `path` (a file, or a directory holding
  one) is a checkpoint of the older pickle format; does nothing otherwise."""
  legacy = _legacy_file(path)
  if legacy:
    _refuse_legacy(legacy)


def _refuse_legacy(file: str) -> None:
  raise MalloczeroError(
    f"'{file}' is a checkpoint in the old pickle format, which can run any code its author put "
    "in it when loaded, so it is not read; if you trust where it came from, convert it with "
    f"'malloczero convert-checkpoint {file} --trust'"
  )


def _flatten(tree: Any, what: str, prefix: tuple[str, ...] = ()) -> list[tuple[list[str], Any]]:
  """Nested dicts with string keys (Haiku's parameters) -> [(key path, leaf)], keys sorted."""
  if isinstance(tree, dict):
    found = []
    for key in sorted(tree):
      if not isinstance(key, str):
        raise TypeError(f"{what}: a key is a {type(key).__name__}, not a string")
      found += _flatten(tree[key], what, prefix + (key,))
    return found
  return [(list(prefix), tree)]


def _unflatten(paths: list[list[str]], leaves: list[np.ndarray]) -> dict[str, Any]:
  tree: dict[str, Any] = {}
  for path, leaf in zip(paths, leaves):
    node = tree
    for key in path[:-1]:
      node = node.setdefault(key, {})
    node[path[-1]] = leaf
  return tree


def _payload_bytes(arrays: dict[str, np.ndarray], metadata: dict[str, Any]) -> bytes:
  buffer = io.BytesIO()
  encoded = np.frombuffer(json.dumps(metadata).encode("utf-8"), np.uint8)
  np.savez(buffer, **{_METADATA: encoded}, **arrays)
  return buffer.getvalue()


class _Checkpoint(NamedTuple):
  """A checkpoint as read: its metadata and arrays, every one checked against the metadata."""

  file: str
  metadata: dict[str, Any]
  trees: dict[str, Any]  # "params", "target_params": nested dicts of numpy arrays.
  opt_state_leaves: list[np.ndarray]
  rng: np.ndarray

  @property
  def steps(self) -> int:
    return int(self.metadata["steps"])


def _bad(file: str, why: str) -> MalloczeroError:
  return MalloczeroError(f"learner checkpoint '{file}' is unusable: {why}")


def _read(path: str) -> _Checkpoint:
  file = checkpoint_file(path)
  if not os.path.isfile(file):
    refuse_legacy(path)
    raise MalloczeroError(f"no learner checkpoint at '{path}'")
  if not zipfile.is_zipfile(file):
    if _legacy_file(file):
      _refuse_legacy(file)
    raise MalloczeroError(f"'{file}' is not a malloczero learner checkpoint")
  check_input_file(file, MalloczeroError)
  try:
    with np.load(file, allow_pickle=False) as archive:
      arrays = {name: archive[name] for name in archive.files}
  except Exception as e:  # A damaged zip or .npy, or an object array (refused, never unpickled).
    raise _bad(file, f"{type(e).__name__}: {e}".replace("\n", " ")) from None
  # numpy hands back a member that is not a .npy file (a pickle, text) as its raw bytes.
  for name, member in arrays.items():
    if not isinstance(member, np.ndarray):
      raise _bad(file, f"member '{name}' is {type(member).__name__}, not a .npy array")
  try:
    metadata = json.loads(arrays.pop(_METADATA).tobytes().decode("utf-8"))
  except (KeyError, ValueError) as e:
    raise MalloczeroError(
      f"'{file}' is not a malloczero learner checkpoint (no readable metadata: {type(e).__name__})"
    ) from None
  if not isinstance(metadata, dict) or metadata.get("format") != CHECKPOINT_FORMAT:
    raise MalloczeroError(f"'{file}' is not a malloczero learner checkpoint")
  if metadata.get("format_version") != CHECKPOINT_FORMAT_VERSION:
    raise _bad(
      file,
      f"format version {metadata.get('format_version')!r}; this malloczero reads "
      f"version {CHECKPOINT_FORMAT_VERSION}",
    )
  return _Checkpoint(file, metadata, *_checked_arrays(file, metadata, arrays))


def _expect(arrays: dict[str, np.ndarray], name: str, file: str, shape: Any = None) -> np.ndarray:
  if name not in arrays:
    raise _bad(file, f"array '{name}' is missing")
  array = arrays[name]
  if array.dtype.kind not in "biuf":
    raise _bad(file, f"array '{name}' has dtype {array.dtype}, not a number")
  if shape is not None and list(array.shape) != list(shape):
    raise _bad(
      file, f"array '{name}' has shape {list(array.shape)}, the metadata says {list(shape)}"
    )
  # A diverged run's NaN parameters would play and train silently on garbage.
  if array.dtype.kind == "f" and not np.isfinite(array).all():
    raise _bad(file, f"array '{name}' holds NaN or infinite values (did the run diverge?)")
  return array


def _checked_arrays(file: str, metadata: dict[str, Any], arrays: dict[str, np.ndarray]):
  """The metadata's trees rebuilt from `arrays`, each array checked by name, dtype and shape."""
  try:
    int(metadata["steps"])
    layouts = {tree: metadata["trees"][tree] for tree in _PARAM_TREES}
    opt_shapes = metadata["opt_state_shapes"]
    for layout in layouts.values():
      if not all(
        isinstance(p, list) and p and all(isinstance(k, str) for k in p) for p in layout["paths"]
      ) or len(layout["paths"]) != len(layout["shapes"]):
        raise ValueError("a parameter tree's paths and shapes disagree")
  except (KeyError, TypeError, ValueError) as e:
    raise _bad(file, f"its metadata lacks or garbles {e}") from None
  trees = {}
  for tree, layout in layouts.items():
    leaves = [
      _expect(arrays, f"{tree}/{i}", file, shape) for i, shape in enumerate(layout["shapes"])
    ]
    trees[tree] = _unflatten(layout["paths"], leaves)
  opt_leaves = [
    _expect(arrays, f"opt_state/{i}", file, shape) for i, shape in enumerate(opt_shapes)
  ]
  rng = _expect(arrays, "rng", file)
  return trees, opt_leaves, rng


def save_state(path: str, state: NamedTuple, num_steps: int, networks: MuZeroNetworks) -> str:
  """Writes a learner's `TrainingState` (numpy or jax) atomically to `path`, a file or a directory
  to hold `CHECKPOINT_FILENAME`; returns the file."""
  state = to_numpy(state)
  return _write(
    checkpoint_file(path),
    {"params": state.params, "target_params": state.target_params},
    jax.tree_util.tree_leaves(state.opt_state),
    state.rng,
    num_steps,
    dataclasses.asdict(networks.config),
    dataclasses.asdict(networks.game),
  )


def _write(
  file: str,
  trees: dict[str, Any],
  opt_leaves: list[Any],
  rng: Any,
  num_steps: int,
  network_config: dict[str, Any],
  game_config: dict[str, Any],
) -> str:
  arrays: dict[str, np.ndarray] = {}
  layouts = {}
  for name in _PARAM_TREES:
    flat = _flatten(trees[name], name)
    layouts[name] = {
      "paths": [path for path, _ in flat],
      "shapes": [list(np.shape(leaf)) for _, leaf in flat],
    }
    arrays.update({f"{name}/{i}": np.asarray(leaf) for i, (_, leaf) in enumerate(flat)})
  arrays.update({f"opt_state/{i}": np.asarray(leaf) for i, leaf in enumerate(opt_leaves)})
  arrays["rng"] = np.asarray(rng)
  metadata = {
    "format": CHECKPOINT_FORMAT,
    "format_version": CHECKPOINT_FORMAT_VERSION,
    "steps": int(num_steps),
    "trees": layouts,
    "opt_state_shapes": [list(np.shape(leaf)) for leaf in opt_leaves],
    "network_config": network_config,
    "game_config": game_config,
    "saved_at": time.time(),
  }
  data = _payload_bytes(arrays, metadata)
  os.makedirs(os.path.dirname(os.path.abspath(file)), exist_ok=True)
  # Readers see the old checkpoint or the new one, never half of one.
  with atomic_write(file, "wb", fsync=True) as f:
    f.write(data)
  return file


def restore_state(path: str, template: NamedTuple) -> tuple[Any, int]:
  """(training state, step) from a checkpoint, as jax arrays in the structure of `template` (a
  freshly initialised `TrainingState` of the same networks and optimiser).

  Raises MalloczeroError when it is missing, unreadable or made for other networks."""
  checkpoint = _read(path)
  file = checkpoint.file
  _check_same_structure(template.params, checkpoint.trees["params"], "parameters", file)
  _check_same_structure(
    template.target_params, checkpoint.trees["target_params"], "target parameters", file
  )
  opt_leaves, opt_def = jax.tree_util.tree_flatten(template.opt_state)
  loaded_leaves = checkpoint.opt_state_leaves
  if len(loaded_leaves) != len(opt_leaves) or any(
    np.shape(a) != np.shape(b) for a, b in zip(opt_leaves, loaded_leaves)
  ):
    raise MalloczeroError(
      f"learner checkpoint '{file}' does not match this configuration (optimizer state differs)"
    )
  as_jax = lambda tree: jax.tree_util.tree_map(jnp.asarray, tree)
  state = template._replace(
    params=as_jax(checkpoint.trees["params"]),
    target_params=as_jax(checkpoint.trees["target_params"]),
    opt_state=jax.tree_util.tree_unflatten(opt_def, [jnp.asarray(x) for x in loaded_leaves]),
    steps=jnp.asarray(checkpoint.steps, jnp.int32),
    rng=jnp.asarray(checkpoint.rng),
  )
  return state, checkpoint.steps


def replace_params(source: str, destination: str, params: Params) -> str:
  """Writes a copy of the checkpoint `source` (a file or a directory holding one) to
  `destination` (the same) with `params` as its parameters and target parameters; its step,
  optimizer state and configs are the source's. For networks fitted outside a training run
  (scripts/fit_deviations.py), so that `evaluate` and `solve --solver agent` load them as they
  load a run's. Returns the file written."""
  checkpoint = _read(source)
  params = to_numpy(params)
  _check_same_structure(checkpoint.trees["params"], params, "parameters", checkpoint.file)
  return _write(
    checkpoint_file(destination),
    {"params": params, "target_params": params},
    checkpoint.opt_state_leaves,
    checkpoint.rng,
    checkpoint.steps,
    checkpoint.metadata["network_config"],
    checkpoint.metadata["game_config"],
  )


def load_params(path: str, which: str = "params") -> Params:
  """Network parameters (numpy) from a checkpoint file or a directory holding one, without
  building a learner; `which` is 'params' or 'target_params'."""
  return _read(path).trees[which]


def checkpoint_configs(path: str) -> tuple[Any, Any]:
  """(NetworkConfig, GameConfig) a checkpoint's networks were built with."""
  from malloczero.configs.config import NetworkConfig
  from malloczero.env.game import GameConfig

  metadata = _read(path).metadata
  try:
    return NetworkConfig(**metadata["network_config"]), GameConfig(**metadata["game_config"])
  except (KeyError, TypeError, ValueError) as e:
    raise MalloczeroError(
      f"learner checkpoint '{checkpoint_file(path)}' was made by another "
      f"version of malloczero ({type(e).__name__}: {e})"
    ) from e


def check_params_fit(networks: MuZeroNetworks, params: Params, path: str) -> None:
  """Raises MalloczeroError unless `params` have the shapes `networks` expect."""
  example = {
    k: np.zeros((1, *s.shape), s.dtype) for k, s in observation_spec(networks.game).items()
  }
  template = jax.eval_shape(networks.init, jax.random.PRNGKey(0), example)
  _check_same_structure(template, params, "parameters", checkpoint_file(path))


_CANDIDATE = re.compile(r"learner_state_(\d+)\.npz")


def candidate_file(directory: str, steps: int) -> str:
  """The checkpoint a learner keeps at `steps` for selection; `candidate_checkpoints` lists them."""
  return os.path.join(directory, f"learner_state_{steps:09d}.npz")


def candidate_checkpoints(directory: str) -> list[tuple[int, str]]:
  """[(learner step, file)] of the checkpoints a learner kept for selection in `directory`
  (`candidate_file` names them), oldest first; none if the directory does not exist."""
  if not os.path.isdir(directory):
    return []
  found = [(_CANDIDATE.fullmatch(name), name) for name in os.listdir(directory)]
  return sorted((int(m.group(1)), os.path.join(directory, name)) for m, name in found if m)


def checkpoint_steps(path: str) -> int:
  """The learner step a checkpoint (file, or directory holding one) was saved at."""
  return _read(path).steps


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
    raise MalloczeroError(
      f"learner checkpoint '{file}' does not match this configuration "
      f"({what} differ in structure or shapes)"
    )


def convert_legacy_checkpoint(source: str, destination: str | None = None) -> str:
  """Reads a pickle checkpoint (the older format) and writes it in this format beside it (or to
  `destination`); returns the file written. Unpickling runs whatever code the file's author put
  in it: only the command line's `convert-checkpoint --trust` calls this."""
  import pickle

  legacy = _legacy_file(source)
  if legacy is None:
    raise MalloczeroError(f"'{source}' is not a pickle checkpoint (nothing to convert)")
  try:
    with open(legacy, "rb") as f:
      payload = pickle.load(f)  # The user vouched for this file (--trust).
    if not isinstance(payload, dict) or payload.get("format") != "malloczero-learner-state-v1":
      raise ValueError("not a malloczero learner checkpoint")
    game = dict(payload["game_config"])
    # Pickle checkpoints written before the msa game existed played requests and do not say so.
    game.setdefault("decisions", "requests")
    destination = destination or os.path.join(os.path.dirname(legacy), CHECKPOINT_FILENAME)
    return _write(
      destination,
      {"params": payload["params"], "target_params": payload["target_params"]},
      list(payload["opt_state_leaves"]),
      payload["rng"],
      int(payload["steps"]),
      dict(payload["network_config"]),
      game,
    )
  except MalloczeroError:
    raise
  except Exception as e:  # Whatever the pickle held: one line.
    raise MalloczeroError(
      f"cannot convert '{legacy}': {type(e).__name__}: {e}".replace("\n", " ")
    ) from None
