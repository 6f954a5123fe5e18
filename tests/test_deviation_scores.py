"""The deviation probe (research/deviation_scores.py): exact advantages, the networks' scores of the
same moves, and their summary; the script that prints them for checkpoints."""

import dataclasses
import json
import os
import subprocess
import sys

import jax
import numpy as np
import pytest

from malloczero.actors.games import suite_games
from malloczero.common.errors import MalloczeroError
from malloczero.configs.config import get_config
from malloczero.env.cost_model import CostModel
from malloczero.env.game import make_game
from malloczero.env.solvers.evo_msa import decode
from malloczero.learner.probes import ProbeStore
from malloczero.research.deviation_scores import (
  ProbedDecision,
  load_probe_store,
  load_probed,
  network_scores,
  probe_policy_trajectory,
  probe_program,
  save_probed,
  summarise,
)
from malloczero.research.fit_deviations import target_entropy, with_fields

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
GAME = get_config("small").game


@pytest.fixture(scope="module")
def probed():
  spec = suite_games("tiny", "train")[0]
  return spec, probe_program(spec, "train", GAME, 4, seed=0)


def test_advantages_are_msa_finishing_after_one_changed_move(probed):
  spec, decisions = probed
  assert len(decisions) == 4
  steps = [d.step for d in decisions]
  assert steps == sorted(set(steps))
  # The draw is the program's and the seed's alone.
  assert [d.step for d in probe_program(spec, "heldout", GAME, 4, seed=0)] == steps
  model = CostModel(spec.workload, spec.hardware)
  msa_time = decode(model, {}, max_prefetch_starts=GAME.max_prefetch_starts)[0]
  game = make_game(spec.workload, spec.hardware, GAME)
  for d in decisions:
    assert len(d.actions) > 1 and d.msa_action in d.actions
    assert d.observation["legal_actions"][d.actions].all()
    game.reset_segment(d.step, 1)
    key = (game.decision.buffer, game.decision.use)
    for action, advantage in zip(d.actions, d.advantages):
      if action == d.msa_action:
        assert advantage == 0.0
        continue
      time_s = decode(model, {key: int(action)}, max_prefetch_starts=GAME.max_prefetch_starts)[0]
      assert advantage == pytest.approx((msa_time - time_s) / msa_time, rel=1e-9, abs=1e-12)


def _msa_move(observation):
  from malloczero.actors.search import msa_action_mask

  batched = {k: np.asarray(v)[None] for k, v in observation.items()}
  return int(np.argmax(msa_action_mask(batched, GAME)[0]))


def test_msa_as_the_policy_probes_msa_trajectory(probed):
  spec, decisions = probed
  along = probe_policy_trajectory(spec, "train", GAME, 4, _msa_move, seed=0)
  assert [(d.step, d.msa_action) for d in along] == [(d.step, d.msa_action) for d in decisions]
  for a, b in zip(along, decisions):
    np.testing.assert_array_equal(a.actions, b.actions)
    np.testing.assert_allclose(a.advantages, b.advantages, rtol=1e-9, atol=1e-12)
    for key in a.observation:
      np.testing.assert_array_equal(a.observation[key], b.observation[key])


def test_advantages_along_a_departing_trajectory_are_the_games_own():
  """A policy that leaves msa's move at its first real choice: later probes start from that
  departure's states, and their advantages match the incremental game played to the end."""
  spec = suite_games("tiny", "train")[0]
  departed = []  # The step of the departure, once made.

  def policy(observation):
    msa = _msa_move(observation)
    legal = np.flatnonzero(observation["legal_actions"])
    if not departed and len(legal) > 1:
      departed.append(len(played))
      return int(legal[legal != msa][0])
    return msa

  played = []
  along = probe_policy_trajectory(spec, "train", GAME, 3, policy, seed=0)
  game = make_game(spec.workload, spec.hardware, GAME)
  departed.clear()
  timestep = game.reset()
  while not timestep.last():
    played.append(policy(timestep.observation))
    timestep = game.step(played[-1])

  def finished_with_msa(step, action):
    game.reset()
    for move in played[:step]:
      game.step(move)
    timestep = game.step(action)
    while not timestep.last():
      timestep = game.step(game.msa_action)
    return game.total_time

  after = [d for d in along if d.step > departed[0]]
  assert len(along) == 3 and after  # Some probes start after the departure.
  for d in after:
    with_msa = finished_with_msa(d.step, d.msa_action)
    for action, advantage in zip(d.actions, d.advantages):
      expected = (with_msa - finished_with_msa(d.step, int(action))) / game.msa_time
      assert advantage == pytest.approx(expected, rel=1e-9, abs=1e-12)


@pytest.mark.slow  # Compiles the networks' scoring.
def test_network_scores_are_the_prior_and_the_model_one_step_q(probed):
  from malloczero.learner.networks import logits_to_scalar, make_networks

  _, decisions = probed
  networks = make_networks(get_config("small").network, GAME)
  one = {k: v[None] for k, v in decisions[0].observation.items()}
  params = networks.init(jax.random.PRNGKey(1), one)
  prior, q = network_scores(networks, params, decisions, batch=3)  # A padded second batch.
  assert prior.shape == q.shape == (len(decisions), GAME.num_actions)
  for i, d in enumerate(decisions):
    obs = {k: v[None] for k, v in d.observation.items()}
    latent = networks.represent(params, obs)
    expected_prior = networks.predict(params, latent).policy_logits[0]
    np.testing.assert_allclose(prior[i], expected_prior, atol=1e-5)
    action = int(d.actions[-1])
    next_latent, reward_logits = networks.dynamics(params, latent, np.array([action]))
    value = logits_to_scalar(networks.predict(params, next_latent).value_logits, networks.config)
    expected = logits_to_scalar(reward_logits, networks.config) + value
    assert q[i, action] == pytest.approx(float(expected[0]), abs=1e-6)


def test_saved_decisions_load_as_they_were(probed, tmp_path):
  _, decisions = probed
  path = str(tmp_path / "probed.npz")
  save_probed(path, decisions)
  loaded = load_probed(path)
  assert len(loaded) == len(decisions)
  for a, b in zip(loaded, decisions):
    assert (a.program, a.split, a.step, a.msa_action) == (b.program, b.split, b.step, b.msa_action)
    np.testing.assert_array_equal(a.actions, b.actions)
    np.testing.assert_array_equal(a.advantages, b.advantages)
    assert a.observation.keys() == b.observation.keys()
    for key in a.observation:
      np.testing.assert_array_equal(a.observation[key], b.observation[key])


def _decision(actions, advantages, msa_action):
  return ProbedDecision("p", "train", 0, msa_action, np.array(actions), np.array(advantages), {})


def _save_store(decisions, config, directory) -> None:
  store = ProbeStore(config, capacity=len(decisions))
  for d in decisions:
    advantages = np.zeros(config.num_actions, np.float32)
    advantages[d.actions] = d.advantages
    store.add(d.observation, advantages, d.msa_action)
  os.makedirs(directory)
  store.save(str(directory))


def test_a_runs_probe_store_loads_as_training_decisions(probed, tmp_path):
  _, decisions = probed
  _save_store(decisions, GAME, tmp_path / "run" / "checkpoints")
  loaded = load_probe_store(str(tmp_path / "run"), GAME)
  assert len(loaded) == len(decisions)
  for got, want in zip(loaded, decisions):
    assert (got.program, got.split, got.step, got.msa_action) == ("", "train", -1, want.msa_action)
    np.testing.assert_array_equal(got.actions, want.actions)
    np.testing.assert_allclose(got.advantages, want.advantages, rtol=1e-6, atol=1e-9)
    assert got.observation.keys() == want.observation.keys()
    for key, value in want.observation.items():
      np.testing.assert_array_equal(got.observation[key], value)
  # A store of another game's shapes, and no store, are one-line refusals.
  other = dataclasses.replace(GAME, occupancy_bins=2 * GAME.occupancy_bins)
  for run, config in ((tmp_path / "run", other), (tmp_path / "none", GAME)):
    with pytest.raises(MalloczeroError, match="not a probe store of this game") as e:
      load_probe_store(str(run), config)
    assert "\n" not in str(e.value)


def test_the_targets_entropy_is_the_fits_floor():
  def decision(advantages, msa_action=0):
    actions = np.arange(len(advantages))
    return ProbedDecision("p", "train", 0, msa_action, actions, np.asarray(advantages), {})

  ties = decision([0.0, 0.0, 0.0, 0.0])
  assert target_entropy([ties], 1e-3, 0.0) == pytest.approx(np.log(4))
  # msa's move raised by the margin: weights e : 1 : 1 : 1.
  weights = np.array([np.e, 1, 1, 1]) / (np.e + 3)
  assert target_entropy([ties], 1e-3, 1e-3) == pytest.approx(-np.sum(weights * np.log(weights)))
  gain = decision([0.0, 0.5, 0.0])  # One move far ahead: a one-hot target.
  assert target_entropy([gain], 1e-3, 1e-3) == pytest.approx(0.0, abs=1e-9)
  assert target_entropy([ties, gain], 1e-3, 0.0) == pytest.approx(np.log(4) / 2)


def test_the_fits_network_is_the_checkpoints_with_named_fields_changed():
  config = get_config("small").network
  wider = with_fields(config, ["d_model=64", "num_layers=2"])
  assert (wider.d_model, wider.num_layers) == (64, 2)
  assert dataclasses.replace(wider, d_model=config.d_model, num_layers=1) == config
  for bad, why in (
    ("d_model", "expected FIELD=VALUE"),
    ("width=3", "no field"),
    ("d_model=-1", "expected"),
  ):
    with pytest.raises(ValueError, match=why):
      with_fields(config, [bad])
  # A game's fields likewise, the refusal naming --game.
  game = with_fields(GAME, ["pressure_bins=8"], "game")
  assert game == dataclasses.replace(GAME, pressure_bins=8)
  with pytest.raises(ValueError, match="--game width=3: no field 'width' in game"):
    with_fields(GAME, ["width=3"], "game")


def test_summary_counts_ranks_and_picks():
  decisions = [
    # A gainful decision: move 0 beats msa's move 1 by 0.05; move 2 loses.
    _decision([0, 1, 2], [0.05, 0.0, -0.02], msa_action=1),
    # Nothing pays: msa's move is best.
    _decision([0, 1], [-0.01, 0.0], msa_action=1),
  ]
  prior = np.array([[0.0, 1.0, 0.5, 0.0], [0.0, 1.0, 0.0, 0.0]])  # msa's move everywhere.
  q = np.array([[0.04, 0.0, 0.0, 9.0], [0.0, 0.0, 0.0, 9.0]])  # Finds the gain; a tie below.
  s = summarise(decisions, prior, q, min_gap=1e-3)
  assert (s["decisions"], s["gainful"], s["pairs"], s["deviation_pairs"]) == (2, 1, 4, 1)
  assert s["best_gain"] == pytest.approx(0.05) and s["gain_is_option0"] == 1.0
  # Prior: (0 over 1) wrong, (0 over 2) wrong, (1 over 2) right, (1 over 0) right.
  assert s["prior_is_msa"] == 1.0 and s["prior_pairwise"] == pytest.approx(0.5)
  assert s["prior_pairwise_deviations"] == 0.0  # It puts move 2 above move 0.
  assert (s["prior_finds_gain"], s["prior_pick_gain"], s["prior_pick_elsewhere"]) == (0, 0, 0)
  # Model: right, right, a tie (half), a tie (half); action 3 is not legal, so never picked, and
  # the argmax of a tie is the first move (0), so it is never msa's.
  assert s["model_is_msa"] == 0.0 and s["model_pairwise"] == pytest.approx(3 / 4)
  assert s["model_finds_gain"] == 1.0 and s["model_pick_gain"] == pytest.approx(0.05)
  assert s["model_pick_elsewhere"] == pytest.approx(-0.01)
  errors = [0.01, 0.0, 0.02, 0.01, 0.0]
  assert s["model_error"] == pytest.approx(np.mean(errors))
  assert s["advantage_abs"] == pytest.approx(np.mean([0.05, 0.0, 0.02, 0.01, 0.0]))


def _script(*args):
  return subprocess.run(
    [sys.executable, os.path.join(REPO, "scripts", "score_deviations.py"), *args],
    capture_output=True,
    text=True,
    timeout=600,
    cwd=REPO,
  )


@pytest.mark.slow
def test_the_script_scores_a_checkpoint_and_untrained_networks(trained_run, tmp_path):
  out, saved = tmp_path / "probe.json", tmp_path / "probed.npz"
  result = _script(
    "--checkpoint", trained_run["workdir"], "--suite", "tiny", "--decisions", "2", "--untrained",
    "--out", str(out), "--save", str(saved),
  )  # fmt: skip
  assert result.returncode == 0, result.stderr[-2000:]
  rows = json.loads(out.read_text())["rows"]
  # The saved decisions score the same without a single msa pass.
  again = _script(
    "--checkpoint", trained_run["workdir"], "--suite", "tiny", "--load", str(saved), "--untrained",
    "--out", str(tmp_path / "again.json"),
  )  # fmt: skip
  assert again.returncode == 0 and "decisions (" not in again.stderr, again.stderr[-2000:]
  assert json.loads((tmp_path / "again.json").read_text())["rows"] == rows
  # Along the network's own trajectory: as many decisions per program, other states.
  along = _script(
    "--checkpoint", trained_run["workdir"], "--suite", "tiny", "--decisions", "2",
    "--trajectory", trained_run["workdir"], "--save", str(tmp_path / "along.npz"),
  )  # fmt: skip
  assert along.returncode == 0, along.stderr[-2000:]
  assert len(load_probed(str(tmp_path / "along.npz"))) == len(load_probed(str(saved)))
  assert [(r["checkpoint"] == "untrained", r["split"]) for r in rows] == [
    (False, "train"),
    (False, "heldout"),
    (True, "train"),
    (True, "heldout"),
  ]
  for row in rows:
    assert row["decisions"] > 0 and 0.0 <= row["prior_is_msa"] <= 1.0
    assert f"| {row['split']} | {row['decisions']} |" in result.stdout
  # The untrained prior is flat (a zero-initialised output layer): every pair ties.
  assert rows[2]["prior_pairwise"] == 0.5


@pytest.mark.slow
def test_the_script_refuses_bad_input_in_one_line(trained_run, tmp_path):
  result = _script("--checkpoint", str(tmp_path / "nothing"))
  assert result.returncode == 2
  assert result.stderr.count("\n") == 1 and "no learner checkpoint" in result.stderr
  (tmp_path / "garbage.npz").write_text("garbage")
  result = _script("--checkpoint", trained_run["workdir"], "--load", str(tmp_path / "garbage.npz"))
  assert result.returncode == 2
  assert result.stderr.count("\n") == 1 and "cannot read probed decisions" in result.stderr
  result = _script("--checkpoint", trained_run["workdir"], "--trajectory", str(tmp_path / "none"))
  assert result.returncode == 2
  assert result.stderr.count("\n") == 1 and "no learner checkpoint" in result.stderr
  # Every tiny program has more than one buffer: none is left to probe.
  result = _script(
    "--checkpoint", trained_run["workdir"], "--suite", "tiny", "--split", "train",
    "--max-buffers", "1",
  )  # fmt: skip
  assert result.returncode == 2
  assert result.stderr.endswith("error: no decisions probed in the train split\n")


@pytest.mark.slow
def test_the_fit_script_fits_the_prior_to_training_decisions(trained_run, tmp_path):
  probed = [
    d
    for split in ("train", "heldout")
    for spec in suite_games("tiny", split)[:2]
    for d in probe_program(spec, split, GAME, 3, seed=0)
  ]
  path, out = str(tmp_path / "probed.npz"), tmp_path / "fit.json"
  save_probed(path, [d for d in probed if d.split == "heldout"])
  train_path = str(tmp_path / "train.npz")  # Several files: their decisions together.
  save_probed(train_path, [d for d in probed if d.split == "train"])
  result = subprocess.run(
    [
      sys.executable, os.path.join(REPO, "scripts", "fit_deviations.py"), "--probed", path,
      train_path,
      "--checkpoint", trained_run["workdir"], "--steps", "40", "--batch", "8",
      "--report-every", "20", "--out", str(out), "--save-checkpoint", str(tmp_path / "fitted"),
    ],
    capture_output=True, text=True, timeout=600, cwd=REPO,
  )  # fmt: skip
  assert result.returncode == 0, result.stderr[-2000:]
  rows = json.loads(out.read_text())["rows"]
  assert [(r["step"], r["split"]) for r in rows] == [
    (step, split) for step in (0, 20, 40) for split in ("train", "heldout")
  ]
  train_rows = [r for r in rows if r["split"] == "train"]
  assert train_rows[0]["prior_pairwise"] == 0.5  # Fresh: a flat prior, every pair a tie.
  assert train_rows[-1]["loss"] < train_rows[0]["loss"]  # It fits the training decisions.
  assert train_rows[-1]["decisions"] == sum(d.split == "train" for d in probed)
  # The fitted network loads as a run's: the source run's configs and search settings, its own
  # parameters.
  from malloczero.actors.agent import load_agent

  fitted, source = load_agent(str(tmp_path / "fitted")), load_agent(trained_run["workdir"])
  assert (fitted.game, fitted.search) == (source.game, source.search)
  assert fitted.config_file is not None
  leaves = lambda params: jax.tree_util.tree_leaves(params)
  assert not all(np.array_equal(a, b) for a, b in zip(leaves(fitted.params), leaves(source.params)))


@pytest.mark.slow
def test_the_fit_script_fits_a_share_of_runs_probe_stores_with_a_wider_network(
  trained_run, probed, tmp_path
):
  _, decisions = probed
  _save_store(decisions, GAME, tmp_path / "run" / "checkpoints")
  heldout = str(tmp_path / "heldout.npz")
  save_probed(heldout, [dataclasses.replace(d, split="heldout") for d in decisions])
  out = tmp_path / "fit.json"
  result = subprocess.run(
    [
      sys.executable, os.path.join(REPO, "scripts", "fit_deviations.py"), "--probed", heldout,
      "--stores", str(tmp_path / "run"), "--train-decisions", "3", "--network", "d_model=48",
      "--checkpoint", trained_run["workdir"], "--steps", "4", "--batch", "4",
      "--report-every", "4", "--msa-margin", "0.001", "--out", str(out),
    ],
    capture_output=True, text=True, timeout=600, cwd=REPO,
  )  # fmt: skip
  assert result.returncode == 0, result.stderr[-2000:]
  rows = json.loads(out.read_text())["rows"]
  train = [r for r in rows if r["split"] == "train"]
  assert [r["decisions"] for r in train] == [3, 3]
  assert all(r["loss"] >= r["floor"] - 1e-4 for r in rows)
  heldout_floor = [r["floor"] for r in rows if r["split"] == "heldout"][0]
  assert heldout_floor == pytest.approx(target_entropy(decisions, 1e-3, 1e-3), rel=1e-6)
  # More decisions than there are is a one-line refusal.
  result = subprocess.run(
    [
      sys.executable, os.path.join(REPO, "scripts", "fit_deviations.py"), "--probed", heldout,
      "--stores", str(tmp_path / "run"), "--train-decisions", "99",
      "--checkpoint", trained_run["workdir"],
    ],
    capture_output=True, text=True, timeout=600, cwd=REPO,
  )  # fmt: skip
  assert result.returncode == 2 and result.stderr.count("\n") == 1
  assert "only 4 training decisions" in result.stderr


@pytest.mark.slow
def test_the_fit_script_fits_decisions_observed_by_another_game(trained_run, tmp_path):
  from malloczero.research.rollout_oracle import play_rollout_oracle

  # The rollout oracle's decisions on a training and a held-out program, replayed in a game that
  # observes the pressure too (rollout_oracle.py --replay --game).
  pressure_game = dataclasses.replace(GAME, pressure_bins=4)
  paths = []
  for split in ("train", "heldout"):
    spec = suite_games("tiny", split)[0]
    recorded, replayed = [], []
    play_rollout_oracle(spec.workload, spec.hardware, GAME, spec.name, record=recorded, split=split)
    play_rollout_oracle(
      spec.workload, spec.hardware, pressure_game, spec.name, record=replayed, split=split,
      replay={d.step: d for d in recorded},
    )  # fmt: skip
    paths.append(str(tmp_path / f"{split}.npz"))
    save_probed(paths[-1], replayed)

  def fit(*args):
    return subprocess.run(
      [
        sys.executable, os.path.join(REPO, "scripts", "fit_deviations.py"), "--probed", *paths,
        "--checkpoint", trained_run["workdir"], "--steps", "4", "--batch", "4",
        "--report-every", "4", *args,
      ],
      capture_output=True, text=True, timeout=600, cwd=REPO,
    )  # fmt: skip

  out = tmp_path / "fit.json"
  result = fit("--game", "pressure_bins=4", "--out", str(out))
  assert result.returncode == 0, result.stderr[-2000:]
  rows = json.loads(out.read_text())["rows"]
  assert [(r["step"], r["split"]) for r in rows] == [
    (step, split) for step in (0, 4) for split in ("train", "heldout")
  ]
  assert json.loads(out.read_text())["args"]["game"] == ["pressure_bins=4"]
  # The checkpoint's own game does not observe the pressure: its network cannot read these
  # decisions, refused in one line; nor is a changed game written as the checkpoint's.
  result = fit()
  assert result.returncode == 2 and result.stderr.count("\n") == 1
  assert "pressure" in result.stderr and "this game's observation has" in result.stderr
  result = fit("--game", "pressure_bins=4", "--save-checkpoint", str(tmp_path / "fitted"))
  assert result.returncode == 2 and "not with --network or --game" in result.stderr


def test_the_fit_table_gives_each_settings_seeds_together(tmp_path):
  def row(step, split, loss, finds, pick, elsewhere):
    return {
      "step": step, "split": split, "loss": loss, "floor": 1.0, "decisions": 10, "gainful": 2,
      "prior_finds_gain": finds, "prior_pairwise_deviations": 0.6, "prior_pick_gain": pick,
      "prior_pick_elsewhere": elsewhere,
    }  # fmt: skip

  for seed, last in ((1, 1.3), (2, 1.5)):
    rows = [
      row(0, "train", 2.0, 0.0, 0.0, 0.0),
      row(0, "heldout", 1.4, 0.0, 0.0, 0.0),
      row(500, "train", 1.01, 1.0, 0.01, 0.0),
      row(500, "heldout", 1.1, 0.5, 0.004, -0.0001),
      row(1000, "train", 1.0, 1.0, 0.01, 0.0),
      row(1000, "heldout", last, 0.5, 0.004, -0.0001),
    ]
    (tmp_path / f"small-n10-s{seed}.json").write_text(json.dumps({"rows": rows}))
  files = sorted(str(p) for p in tmp_path.glob("*.json"))
  script = os.path.join(REPO, "scripts", "fit_table.py")
  result = subprocess.run([sys.executable, script, *files], capture_output=True, text=True)
  assert result.returncode == 0, result.stderr
  line = result.stdout.splitlines()[-1]
  # Held-out KL last 0.3 and 0.5 (mean 0.4), least 0.1 at step 500; one-move value
  # (2 * 0.004 - 8 * 0.0001) / 10 = 7.2e-4.
  assert line == (
    "| small-n10 | 2 | 10 | 0.000 | 1.00 | 0.400 (0.300 / 0.500) | 0.100 (500 / 500) | "
    "0.50 (0.50 / 0.50) | 0.60 | 7.2 (7.2 / 7.2) |"
  )
  (tmp_path / "bad.json").write_text(json.dumps({"rows": []}))
  result = subprocess.run(
    [sys.executable, script, str(tmp_path / "bad.json")], capture_output=True, text=True
  )
  assert result.returncode == 2 and result.stderr == "error: rows of both splits are needed\n"
