"""Learner checkpoints are data: arrays and JSON metadata that loading cannot run; every expected
array is checked, older pickled checkpoints are refused (and converted only with --trust)."""

import io
import os
import pickle
import subprocess
import sys
import zipfile

import jax
import numpy as np
import optax
import pytest

from malloczero.common.errors import MalloczeroError
from malloczero.configs.config import get_config
from malloczero.configs.workdir import CHECKPOINT_FILENAME, LEGACY_CHECKPOINT_FILENAME, WorkDir
from malloczero.env.game import observation_spec
from malloczero.launch import cli
from malloczero.learner.checkpoint import (
  checkpoint_configs,
  checkpoint_steps,
  load_params,
  replace_params,
  restore_state,
  save_state,
)
from malloczero.learner.learner import TrainingState
from malloczero.learner.networks import make_networks
from tests.trained import read_checkpoint, write_checkpoint

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
CONFIG = get_config("tiny")
NETWORKS = make_networks(CONFIG.network, CONFIG.game)


@pytest.fixture(scope="module")
def state():
  example = {k: np.zeros((1, *s.shape), s.dtype) for k, s in observation_spec(CONFIG.game).items()}
  # The networks' parameter shapes, traced without compiling, filled with distinct values.
  shapes = jax.eval_shape(NETWORKS.init, jax.random.PRNGKey(0), example)
  rng = np.random.default_rng(0)
  params = jax.tree_util.tree_map(lambda s: rng.standard_normal(s.shape).astype(s.dtype), shapes)
  opt_state = optax.adam(1e-3).init(params)
  return TrainingState(params, params, opt_state, np.int32(7), jax.random.PRNGKey(1))


@pytest.fixture
def saved(tmp_path, state):
  (tmp_path / "checkpoints").mkdir()
  return save_state(str(tmp_path / "checkpoints"), state, 7, NETWORKS)


def _leaves_equal(a, b):
  return all(
    np.array_equal(x, y) for x, y in zip(jax.tree_util.tree_leaves(a), jax.tree_util.tree_leaves(b))
  )


def test_a_checkpoint_is_arrays_and_json_and_round_trips(saved, state):
  assert os.path.basename(saved) == CHECKPOINT_FILENAME
  with zipfile.ZipFile(saved) as archive:
    assert all(name.endswith(".npy") for name in archive.namelist())
  with np.load(saved, allow_pickle=False) as archive:  # Nothing in it needs unpickling.
    assert all(archive[name].dtype != object for name in archive.files)
  assert checkpoint_steps(saved) == 7
  assert _leaves_equal(load_params(saved), state.params)
  network, game = checkpoint_configs(os.path.dirname(saved))
  assert network == CONFIG.network and game == CONFIG.game
  restored, steps = restore_state(saved, state)
  assert steps == 7 and _leaves_equal(restored.opt_state, state.opt_state)
  assert _leaves_equal(restored.target_params, state.target_params)


def _damaged(saved, tmp_path, edit):
  metadata, arrays = read_checkpoint(saved)
  edit(metadata, arrays)
  file = str(tmp_path / "damaged" / CHECKPOINT_FILENAME)
  write_checkpoint(file, metadata, arrays)
  return file


def test_replaced_params_keep_the_rest_of_the_checkpoint(saved, state, tmp_path):
  fitted = jax.tree_util.tree_map(lambda x: x + 1, state.params)
  file = replace_params(saved, str(tmp_path / "fitted" / CHECKPOINT_FILENAME), fitted)
  assert _leaves_equal(load_params(file), fitted)
  assert _leaves_equal(load_params(file, "target_params"), fitted)
  assert checkpoint_steps(file) == 7 and checkpoint_configs(file) == checkpoint_configs(saved)
  restored, steps = restore_state(file, state)
  assert steps == 7 and _leaves_equal(restored.opt_state, state.opt_state)
  wrong = {"other": np.zeros(3, np.float32)}
  with pytest.raises(MalloczeroError, match="parameters differ"):
    replace_params(saved, str(tmp_path / "wrong" / CHECKPOINT_FILENAME), wrong)
  assert not (tmp_path / "wrong").exists()


@pytest.mark.parametrize(
  "edit, message",
  [
    (lambda m, a: a.pop("params/0"), "array 'params/0' is missing"),
    (lambda m, a: a.pop("opt_state/1"), "array 'opt_state/1' is missing"),
    (lambda m, a: a.pop("rng"), "array 'rng' is missing"),
    (lambda m, a: a.update({"params/0": np.zeros((3, 3))}), "array 'params/0' has shape"),
    (lambda m, a: a.update({"params/1": np.array(["x"])}), "has dtype <U1, not a number"),
    (lambda m, a: m.pop("trees"), "its metadata lacks or garbles"),
    (lambda m, a: m["trees"].pop("params"), "its metadata lacks or garbles"),
    (lambda m, a: m.pop("steps"), "its metadata lacks or garbles"),
    (lambda m, a: m.update(format_version=3), "format version 3"),
    (lambda m, a: m.update(format="something else"), "is not a malloczero learner checkpoint"),
  ],
)
def test_every_missing_or_damaged_part_is_one_line(saved, tmp_path, state, edit, message):
  file = _damaged(saved, tmp_path, edit)
  for read in (load_params, checkpoint_steps, lambda f: restore_state(f, state)):
    with pytest.raises(MalloczeroError, match=message) as error:
      read(file)
    assert "\n" not in str(error.value)


def test_not_a_checkpoint_is_one_line(tmp_path):
  for content in (b"", b"garbage", b"PK\x03\x04 a broken zip"):
    path = tmp_path / CHECKPOINT_FILENAME
    path.write_bytes(content)
    with pytest.raises(MalloczeroError) as error:
      load_params(str(path))
    assert "\n" not in str(error.value)
  with pytest.raises(MalloczeroError, match="no learner checkpoint"):
    load_params(str(tmp_path / "nowhere"))


class _Payload:
  """Unpickling this creates the file named: proof that a load ran the author's code."""

  def __init__(self, marker):
    self.marker = marker

  def __reduce__(self):
    return (open, (self.marker, "w"))


def _crafted_pickle(directory, marker):
  directory.mkdir(parents=True, exist_ok=True)
  with open(directory / LEGACY_CHECKPOINT_FILENAME, "wb") as f:
    pickle.dump({"format": "malloczero-learner-state-v1", "payload": _Payload(str(marker))}, f)
  return directory / LEGACY_CHECKPOINT_FILENAME


def test_a_pickled_checkpoint_is_refused_unread(tmp_path):
  marker = tmp_path / "ran"
  crafted = _crafted_pickle(tmp_path / "run" / "checkpoints", marker)
  from malloczero.actors.agent import find_checkpoint
  from malloczero.system.training import check_workdir

  for read in (
    lambda: load_params(str(crafted)),
    lambda: load_params(str(crafted.parent)),
    lambda: checkpoint_steps(str(crafted.parent)),
    lambda: find_checkpoint(str(tmp_path / "run")),
    lambda: check_workdir(CONFIG, str(tmp_path / "run")),
  ):
    with pytest.raises(MalloczeroError, match="old pickle format.*convert-checkpoint") as error:
      read()
    assert "\n" not in str(error.value)
  assert not marker.exists()


def test_convert_checkpoint_needs_trust_and_converts(tmp_path, saved, state, capsys):
  metadata, arrays = read_checkpoint(saved)
  legacy = {
    "format": "malloczero-learner-state-v1",
    "steps": 7,
    "params": jax.device_get(state.params),
    "target_params": jax.device_get(state.target_params),
    "opt_state_leaves": [np.asarray(x) for x in jax.tree_util.tree_leaves(state.opt_state)],
    "rng": np.asarray(state.rng),
    "network_config": metadata["network_config"],
    "game_config": metadata["game_config"],
  }
  run = tmp_path / "old"
  (run / "checkpoints").mkdir(parents=True)
  with open(WorkDir(str(run)).checkpoints + "/" + LEGACY_CHECKPOINT_FILENAME, "wb") as f:
    pickle.dump(legacy, f)
  assert cli.main(["convert-checkpoint", str(run)]) == 1
  err = capsys.readouterr().err
  assert "--trust" in err and "runs any code" in err and err.count("\n") == 1
  assert not os.path.exists(WorkDir(str(run)).learner_state)
  assert cli.main(["convert-checkpoint", str(run), "--trust"]) == 0
  assert "wrote" in capsys.readouterr().out
  assert checkpoint_steps(str(run / "checkpoints")) == 7
  assert _leaves_equal(load_params(str(run / "checkpoints")), state.params)
  assert cli.main(["convert-checkpoint", str(saved), "--trust"]) == 1  # Not a pickle.
  assert "nothing to convert" in capsys.readouterr().err


@pytest.mark.slow
def test_a_crafted_pickle_runs_nothing_through_solve_evaluate_or_train(tmp_path):
  marker = tmp_path / "ran"
  _crafted_pickle(tmp_path / "run" / "checkpoints", marker)
  workload = os.path.join(REPO, "env", "programs", "data", "workloads", "tiny-vgg-b1-infer.json.gz")
  commands = [
    [
      "solve",
      workload,
      "--hardware",
      "nnpi-like",
      "--solver",
      "agent",
      "--checkpoint",
      str(tmp_path / "run"),
    ],
    [
      "evaluate",
      "--suite",
      "tiny",
      "--solvers",
      "msa",
      "--checkpoint",
      str(tmp_path / "run"),
      "--out",
      str(tmp_path / "evaluation"),
    ],
    [
      "train",
      "--launch",
      "single",
      "--config",
      "tiny",
      "--workdir",
      str(tmp_path / "run"),
      "--max-steps",
      "2",
    ],
  ]
  for command in commands:
    result = subprocess.run(
      [sys.executable, "-m", "malloczero", *command],
      cwd=REPO,
      capture_output=True,
      text=True,
      timeout=300,
    )
    assert result.returncode == 1, (command, result.stderr[-2000:])
    assert result.stderr.startswith("malloczero: error: ") and result.stderr.count("\n") == 1
    assert not marker.exists(), command


def _rewritten(saved: str, path, change) -> str:
  """A copy of the checkpoint `saved` at `path` with `change(name, bytes) -> bytes` applied to
  each member of its zip (None leaves the member as it is)."""
  with zipfile.ZipFile(saved) as source, zipfile.ZipFile(path, "w") as target:
    for info in source.infolist():
      data = source.read(info.filename)
      target.writestr(info.filename, change(info.filename, data) or data)
  return str(path)


def test_a_checkpoint_member_that_is_not_an_array_is_one_line(saved, tmp_path):
  """numpy hands back a member that is not a .npy file (here a pickle) as its raw bytes: refused
  by its kind, before any field of it is read."""
  marker = tmp_path / "ran"
  pickled = pickle.dumps(_Payload(str(marker)))
  for member in ("params/0.npy", "metadata.npy"):
    bad = _rewritten(
      saved,
      tmp_path / f"bad-{member.split('/')[0]}.npz",
      lambda n, _: pickled if n == member else None,
    )
    with pytest.raises(MalloczeroError, match=r"member .* is bytes, not a \.npy array") as error:
      load_params(bad)
    assert "\n" not in str(error.value)
  assert not marker.exists()


def test_nan_parameters_are_refused(saved, tmp_path):
  def poisoned(name, data):
    if name != "params/0.npy":
      return None
    with zipfile.ZipFile(saved) as z, z.open(name) as f:
      array = np.lib.format.read_array(f)
    array = array.copy()
    array.flat[0] = np.nan
    out = io.BytesIO()
    np.lib.format.write_array(out, array)
    return out.getvalue()

  bad = _rewritten(saved, tmp_path / "nan.npz", poisoned)
  with pytest.raises(MalloczeroError, match=r"'params/0' holds NaN or infinite values"):
    load_params(bad)


def test_a_resume_checks_what_it_will_load_before_launching(tmp_path, state):
  """`preflight` (before the work directory is locked, before any node starts) reads the learner
  checkpoint whole and the demonstrations: NaN parameters and a damaged demonstrations file are
  refused in one line there, not 30 s later as a node's exit."""
  from malloczero.system.training import preflight, save_config

  workdir = tmp_path / "run"
  files = WorkDir(str(workdir))
  os.makedirs(files.checkpoints)
  save_config(CONFIG, str(workdir))
  saved = save_state(files.checkpoints, state, 7, NETWORKS)
  preflight(CONFIG, str(workdir), 100)  # A sound run resumes.
  with pytest.raises(MalloczeroError, match="already at learner step 7"):
    preflight(CONFIG, str(workdir), 7)
  demonstrations = os.path.join(files.checkpoints, "demonstrations.json")
  for damaged in (
    '[{"program": 1}',
    '[{"program": "p", "actions": [1], "episode_return": NaN, "source": "agent"}]',
  ):
    with open(demonstrations, "w") as f:
      f.write(damaged)
    with pytest.raises(MalloczeroError, match="demonstrations file .* unusable") as error:
      preflight(CONFIG, str(workdir), 100)
    assert "\n" not in str(error.value)
  os.remove(demonstrations)

  def poisoned(name, data):
    if name != "params/0.npy":
      return None
    with zipfile.ZipFile(saved) as z, z.open(name) as f:
      array = np.lib.format.read_array(f).copy()
    array.flat[0] = np.nan
    out = io.BytesIO()
    np.lib.format.write_array(out, array)
    return out.getvalue()

  poisoned_copy = _rewritten(saved, tmp_path / "nan.npz", poisoned)
  os.replace(poisoned_copy, saved)
  with pytest.raises(MalloczeroError, match="holds NaN or infinite values"):
    preflight(CONFIG, str(workdir), 100)


def test_a_damaged_replay_checkpoint_is_refused_before_launching(tmp_path, state):
  """The checkpoint a real Reverb server wrote is read whole before a resume (every record's CRC
  and decompression); truncated, it is one line that says how to resume without it."""
  from malloczero.system.builder import make_replay_server
  from malloczero.system.training import preflight, save_config

  workdir = tmp_path / "run"
  files = WorkDir(str(workdir))
  os.makedirs(files.checkpoints)
  save_config(CONFIG, str(workdir))
  save_state(files.checkpoints, state, 7, NETWORKS)
  server = make_replay_server(CONFIG, checkpoint_dir=files.replay_checkpoints)
  server.localhost_client().checkpoint()
  server.stop()
  preflight(CONFIG, str(workdir), 100)  # A sound checkpoint resumes.
  (latest,) = os.listdir(files.replay_checkpoints)
  tables = os.path.join(files.replay_checkpoints, latest, "tables.tfrecord")
  with open(tables, "r+b") as f:
    f.truncate(os.path.getsize(tables) // 2)
  with pytest.raises(MalloczeroError) as error:
    preflight(CONFIG, str(workdir), 100)
  message = str(error.value)
  assert message.startswith(f"the replay checkpoint {files.replay_checkpoints}/{latest} is damaged")
  assert "tables.tfrecord: " in message and "\n" not in message
