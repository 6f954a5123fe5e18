"""The rollout oracle (research/rollout_oracle.py): msa's one-step lookahead policy, the ceiling of
the probes' targets, and the script that plays it through a suite."""

import csv
import os
import subprocess
import sys

import pytest

from malloczero.actors.games import suite_games
from malloczero.configs.config import get_config
from malloczero.env.cost_model import CostModel
from malloczero.env.solvers.evo_msa import decode
from malloczero.research.deviation_scores import load_probed
from malloczero.research.rollout_oracle import estimated_decodes, play_rollout_oracle

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
GAME = get_config("small").game


@pytest.mark.parametrize("index", [0, 3])
def test_the_oracle_is_never_slower_than_msa_and_its_departures_are_its_mapping(index):
  spec = suite_games("tiny", "train")[index]
  play, departures = play_rollout_oracle(spec.workload, spec.hardware, GAME, spec.name)
  model = CostModel(spec.workload, spec.hardware)

  def time_of(genome):
    return decode(model, genome, max_prefetch_starts=GAME.max_prefetch_starts)[0]

  assert play.msa_time == pytest.approx(time_of({}), rel=1e-12)
  assert play.oracle_time == pytest.approx(time_of(departures), rel=1e-12)
  # On these programs a departure that msa finishes faster exists (probes find them), and the
  # oracle takes it: strictly faster than msa, one departure per changed decision.
  assert play.oracle_time < play.msa_time
  assert play.departures == len(departures) > 0
  assert play.decisions < play.decodes


def test_each_departure_is_the_best_move_there_given_the_ones_before():
  spec = suite_games("tiny", "train")[0]
  _, departures = play_rollout_oracle(spec.workload, spec.hardware, GAME, spec.name)
  model = CostModel(spec.workload, spec.hardware)

  def time_of(genome):
    return decode(model, genome, max_prefetch_starts=GAME.max_prefetch_starts)[0]

  # Undoing any one departure (msa's move there, the later departures kept) is no faster.
  best = time_of(departures)
  for key in departures:
    rest = {k: v for k, v in departures.items() if k != key}
    assert time_of(rest) >= best


def test_recorded_decisions_are_the_oracles_with_each_moves_exact_advantage():
  spec = suite_games("tiny", "train")[1]
  recorded = []
  play, departures = play_rollout_oracle(
    spec.workload, spec.hardware, GAME, spec.name, min_gain=0.0, record=recorded, split="heldout"
  )
  assert len(recorded) == play.decisions and {d.split for d in recorded} == {"heldout"}
  steps = [d.step for d in recorded]
  assert steps == sorted(set(steps))
  for d in recorded:
    assert len(d.actions) > 1 and d.observation["legal_actions"][d.actions].all()
    assert d.advantages[list(d.actions).index(d.msa_action)] == 0.0
  # With no minimum gain the oracle leaves msa's move exactly where some move's advantage is
  # positive, and its gains over msa add up to its whole game's.
  assert sum(d.advantages.max() > 0 for d in recorded) == len(departures) > 0
  total = sum(d.advantages.max() for d in recorded if d.advantages.max() > 0)
  assert total == pytest.approx(1 - play.oracle_time / play.msa_time, rel=1e-9)


def run_script(*args):
  return subprocess.run(
    [sys.executable, os.path.join(REPO, "scripts", "rollout_oracle.py"), *args],
    capture_output=True,
    text=True,
    cwd=REPO,
  )


def test_the_script_writes_a_row_per_program_it_can_afford_and_saves_their_decisions(tmp_path):
  out, saved = tmp_path / "oracle.csv", tmp_path / "oracle.npz"
  split_of = {s.name: split for split in ("train", "heldout") for s in suite_games("tiny", split)}
  result = run_script("--suite", "tiny", "--split", "all", "--out", str(out), "--save", str(saved))
  assert result.returncode == 0, result.stderr
  rows = list(csv.DictReader(out.open()))
  assert [r["entry"] for r in rows] == list(split_of)
  assert all(float(r["oracle_vs_msa"]) >= 1.0 for r in rows)
  assert "over 6 of 6 programs" in result.stdout
  decisions = load_probed(str(saved))
  assert len(decisions) == sum(int(r["decisions"]) for r in rows)
  assert {(d.program, d.split) for d in decisions} == set(split_of.items())

  # --max-decodes leaves out the programs that would cost more, and says so.
  cheap = [
    s.name
    for s in suite_games("tiny", "train")
    if estimated_decodes(s.workload, s.hardware, GAME) <= 150
  ]
  result = run_script("--suite", "tiny", "--split", "train", "--max-decodes", "150")
  assert result.returncode == 0, result.stderr
  assert 0 < len(cheap) < 5 and f"over {len(cheap)} of 5 programs" in result.stdout
  assert result.stdout.count("> --max-decodes") == 5 - len(cheap)


def test_a_replay_plays_the_recording_again_observed_by_another_game(tmp_path):
  recorded, replayed = tmp_path / "recorded.npz", tmp_path / "replayed.npz"
  first, again = tmp_path / "first.csv", tmp_path / "again.csv"
  result = run_script(
    "--suite", "tiny", "--split", "train", "--save", str(recorded), "--out", str(first)
  )  # fmt: skip
  assert result.returncode == 0, result.stderr
  result = run_script(
    "--suite", "tiny", "--split", "all", "--replay", str(recorded), "--game", "pressure_bins=4",
    "--save", str(replayed), "--out", str(again),
  )  # fmt: skip
  assert result.returncode == 0, result.stderr
  # The same games from the recorded advantages, no msa pass spent; the held-out programs,
  # absent from the recording, skipped and said so.
  played, replay_rows = list(csv.DictReader(first.open())), list(csv.DictReader(again.open()))
  same = ("entry", "msa_time", "oracle_time", "decisions", "departures")
  assert [[r[k] for k in same] for r in replay_rows] == [[r[k] for k in same] for r in played]
  assert {r["decodes"] for r in replay_rows} == {"0"} and {r["decodes"] for r in played} != {"0"}
  assert result.stdout.count("(not in --replay)") == len(suite_games("tiny", "heldout"))
  # The same decisions, each move's advantage as recorded, observed with the pressure as well.
  before, after = load_probed(str(recorded)), load_probed(str(replayed))
  assert [(d.program, d.step, list(d.actions)) for d in after] == [
    (d.program, d.step, list(d.actions)) for d in before
  ]
  assert all((a.advantages == b.advantages).all() for a, b in zip(after, before))
  assert all(a.observation["pressure"].shape == (GAME.max_fast_levels, 8) for a in after)
  for a, b in zip(after, before):
    assert set(b.observation) == set(a.observation) - {"pressure"}
    assert all((a.observation[k] == b.observation[k]).all() for k in b.observation)

  # A game with other rules does not reach the recorded decisions: refused in one line.
  result = run_script(
    "--suite", "tiny", "--split", "train", "--replay", str(recorded), "--game",
    "max_prefetch_starts=2",
  )  # fmt: skip
  assert result.returncode == 2 and result.stderr.count("\n") == 1
  assert "is not the recording's" in result.stderr and "Traceback" not in result.stderr


@pytest.mark.parametrize(
  "args, message",
  [
    (("--max-decodes", "0"), "--max-decodes must be positive"),
    (("--suite", "nonesuch"), "nonesuch"),
    (("--suite", "tiny", "--split", "train", "--max-decodes", "1"), "no program within"),
    (("--suite", "tiny", "--replay", "nonesuch.npz"), "cannot read recorded decisions"),
    (("--suite", "tiny", "--game", "bogus=1"), "--game bogus=1: no field 'bogus' in game"),
    (("--suite", "tiny", "--game", "pressure_bins"), "expected FIELD=VALUE"),
  ],
)
def test_the_script_refuses_bad_input_in_one_line(args, message):
  result = run_script(*args)
  assert result.returncode == 2
  assert message in result.stderr and "Traceback" not in result.stderr
