"""Single-process training on the tiny suite with a real Reverb server and a real learner thread:
it learns, its evaluations are valid, it resumes from its checkpoint, and it refuses a corrupt one.

One training run, shared with every other test that needs a trained checkpoint (`trained_run` in
conftest.py, built once per session by tests/trained.py), serves most tests; it takes about a
minute on 2 CPU cores. The resume test resumes a copy of it. The runs share one `make_networks`
result, so a resumed run reuses the compiled initialisation, SGD step and evaluation search
instead of compiling them again (the networks are pure functions of their configs, so this
changes nothing else).
"""

import dataclasses
import json
import os
import shutil
import threading

import numpy as np
import pytest

from malloczero.actors.games import suite_games
from malloczero.env import MalloczeroError, validate_mapping
from malloczero.env.game import return_speedup
from malloczero.evaluation.suite import TIE_TOLERANCE, geomean
from malloczero.learner.checkpoint import CHECKPOINT_FILENAME
from malloczero.system import single_process
from malloczero.system.single_process import train_single_process
from tests.trained import (
  CONFIG,
  EVAL_EVERY,
  STEPS,
  cached_make_networks,
  checkpoint_steps,
  read_csv,
  train,
)

pytestmark = pytest.mark.slow

RESUMED_STEPS = STEPS + 20


@pytest.fixture(scope="module")
def trained(trained_run):
  """The shared run, and what it left in its work directory (read before any test resumes a
  copy of it)."""
  return trained_run


def train_rows(rows):
  return [r for r in rows if r["split"] == "train"]


def test_learner_loss_falls(trained):
  log = trained["learner_log"]
  assert [int(float(r["learner_steps"])) for r in log] == list(range(1, STEPS + 1))
  loss = np.array([float(r["loss"]) for r in log])
  assert np.isfinite(loss).all()
  first, last = loss[:5].mean(), loss[-10:].mean()
  assert last < 0.5 * first, f"loss did not fall: first steps {first:.3f}, last steps {last:.3f}"


def test_agent_beats_untrained_and_random_baseline(trained):
  result, rows = trained["result"], train_rows(trained["curve_rows"])
  assert result.learner_steps == STEPS == trained["checkpoint_steps"]
  assert result.actor_steps > 0 and result.episodes > 0
  # Evaluated at the start, about every EVAL_EVERY steps (the learner runs on while the actor
  # finishes its step, so a point may land a few steps late) and at the end.
  steps = [int(r["learner_steps"]) for r in rows]
  assert steps[0] == 0 and steps[-1] == STEPS and steps == sorted(set(steps))
  initial, final = float(rows[0]["geomean_speedup"]), float(rows[-1]["geomean_speedup"])
  baselines = trained["baselines"]["random"]
  random = geomean([baselines[s.name] for s in suite_games("tiny", "train")])
  assert final > random, f"trained agent {final:.3f} <= random baseline {random:.3f}"
  assert final > 1.2 * initial, f"trained agent {final:.3f} vs untrained {initial:.3f}"
  # The result carries the curve as written to the CSV.
  assert [(int(r["learner_steps"]), r["split"]) for r in trained["curve_rows"]] == [
    (int(r["learner_steps"]), r["split"]) for r in result.curve
  ]


def test_final_evaluation_mappings_are_valid(trained):
  latest, rows = trained["latest"], trained["curve_rows"]
  assert set(latest) == {"train", "heldout"}
  for split, results in latest.items():
    specs = suite_games("tiny", split)
    assert [r.program for r in results] == [s.name for s in specs]
    for spec, r in zip(specs, results):
      report = validate_mapping(spec.workload, spec.hardware, r.mapping)
      assert r.speedup == pytest.approx(report.speedup, rel=1e-6)
    last = [row for row in rows if row["split"] == split][-1]
    assert int(last["learner_steps"]) == STEPS
    # The curve's columns: the evaluation search's greedy game, and the policy alone's; the
    # mapping kept is the faster of the two.
    msa = trained["baselines"]["msa"]
    for column, speedups in (
      ("", [r.greedy_speedup for r in results]),
      ("policy_", [r.policy_speedup for r in results]),
    ):
      assert float(last[f"{column}geomean_speedup"]) == pytest.approx(geomean(speedups))
      at_least_msa = sum(s / msa[r.program] >= 1 - TIE_TOLERANCE for s, r in zip(speedups, results))
      assert int(last[f"{column}beats_msa"]) == at_least_msa
    for r in results:
      assert r.speedup == pytest.approx(max(r.greedy_speedup, r.policy_speedup))


def test_demonstrations_hold_each_training_programs_best_known_game(trained):
  """The run kept a demonstration per training program (msa's play, or a faster game the agent
  found, whose mapping is then in best/ and valid), none slower than msa."""
  from malloczero.env.mapping import load_mapping

  workdir = trained["workdir"]
  with open(os.path.join(workdir, "checkpoints", "demonstrations.json"), encoding="utf-8") as f:
    demonstrations = {d["program"]: d for d in json.load(f)}
  specs = suite_games("tiny", "train")
  assert set(demonstrations) == {s.name for s in specs}
  msa = trained["baselines"]["msa"]
  for spec in specs:
    found = demonstrations[spec.name]
    speedup = return_speedup(CONFIG.game, found["episode_return"], msa[spec.name])
    assert speedup >= msa[spec.name] * (1 - 1e-9), spec.name
    best = os.path.join(workdir, "best", f"{spec.name}.json")
    assert os.path.exists(best) == (found["source"] == "agent"), spec.name
    if found["source"] == "agent":
      report = validate_mapping(spec.workload, spec.hardware, load_mapping(best))
      assert report.speedup == pytest.approx(speedup, rel=1e-6)


def test_resume_continues_from_checkpoint(trained, tmp_path):
  """The resumed run also turns reanalyse on, as `train --set learner.reanalyse_fraction` at a
  resume would: the builder gives the learner the actors' search, and the learner's log gains
  its columns."""
  workdir = str(tmp_path / "run")  # A copy: the shared run stays as it was trained.
  shutil.copytree(trained["workdir"], workdir)
  reanalysing = dataclasses.replace(
    CONFIG, learner=dataclasses.replace(CONFIG.learner, reanalyse_fraction=0.5)
  )
  result, _ = train(workdir, RESUMED_STEPS, reanalysing)
  assert result.learner_steps == RESUMED_STEPS == checkpoint_steps(workdir)
  log = read_csv(os.path.join(workdir, "logs", "learner", "logs.csv"))
  steps = [int(float(r["learner_steps"])) for r in log]
  # The learner went on from step STEPS + 1, not from 1, and every row kept its columns: the
  # earlier rows are blank in the new ones, the resumed rows reanalysed part of their batches.
  assert steps == list(range(1, RESUMED_STEPS + 1))
  assert [r["loss"] for r in log[:STEPS]] == [r["loss"] for r in trained["learner_log"]]
  assert {r["reanalysed_share"] for r in log[:STEPS]} == {""}
  shares = [float(r["reanalysed_share"]) for r in log[STEPS:]]
  assert all(0.0 <= share <= 1.0 for share in shares) and max(shares) > 0.0, shares
  rows = read_csv(os.path.join(workdir, "learning_curve.csv"))
  before = trained["curve_rows"]
  assert rows[: len(before)] == before
  assert {int(r["learner_steps"]) for r in rows[len(before) :]} == {RESUMED_STEPS}
  assert {r["split"] for r in rows[len(before) :]} == {"train", "heldout"}
  for name in ("config.json", "learning_curve.png", "baselines.json"):
    assert os.path.getsize(os.path.join(workdir, name)) > 0
  with open(os.path.join(workdir, "config.json"), encoding="utf-8") as f:
    assert json.load(f)["name"] == "tiny"


def test_checkpoint_selection_keeps_the_fastest_on_training_programs(trained, tmp_path):
  """The final evaluation reports, of the kept checkpoints, the one whose greedy play is fastest
  on the training programs, the latest of equals; what it measured is in selection.json."""
  import jax

  from malloczero.configs.workdir import WorkDir
  from malloczero.evaluation.report import write_final_report
  from malloczero.evaluation.selection import select_checkpoint
  from malloczero.learner.checkpoint import (
    candidate_checkpoints,
    candidate_file,
    restore_state,
    save_state,
  )
  from malloczero.learner.learner import make_initial_state

  workdir = str(tmp_path / "run")  # A copy: the shared run stays as it was trained.
  shutil.copytree(trained["workdir"], workdir)
  files = WorkDir(workdir)
  assert [steps for steps, _ in candidate_checkpoints(files.candidates)] == [EVAL_EVERY, STEPS]
  networks = cached_make_networks(CONFIG.network, CONFIG.game)
  untrained = make_initial_state(networks, CONFIG, jax.random.PRNGKey(1))
  final, _ = restore_state(files.learner_state, untrained)
  earlier = candidate_file(files.candidates, EVAL_EVERY)

  def selection():
    with open(files.selection, encoding="utf-8") as f:
      return json.load(f)

  # Equal parameters at steps EVAL_EVERY and STEPS: a tie, which goes to the latest.
  save_state(earlier, final, EVAL_EVERY, networks)
  lines = []
  assert select_checkpoint(CONFIG, workdir, lines.append) == files.learner_state
  tie = selection()
  assert [r["learner_steps"] for r in tie["candidates"]] == [EVAL_EVERY, STEPS]
  earlier_score, final_score = (r["train_greedy_geomean"] for r in tie["candidates"])
  assert earlier_score == final_score
  assert tie["selected_steps"] == STEPS and tie["split"] == "train"
  assert tie["programs"] == len(suite_games("tiny", "train"))
  assert len(lines) == 1 and lines[0].startswith("checkpoint selection on the")

  # The final checkpoint untrained: the trained one of step EVAL_EVERY is chosen and reported.
  save_state(files.learner_state, untrained, STEPS, networks)
  assert select_checkpoint(CONFIG, workdir, lines.append) == earlier
  chosen = selection()
  trained_score, untrained_score = (r["train_greedy_geomean"] for r in chosen["candidates"])
  assert chosen["selected_steps"] == EVAL_EVERY and trained_score > untrained_score
  report = write_final_report(CONFIG, workdir, lines.append)
  (agent,) = report["agents"]
  assert (agent["learner_steps"], agent["checkpoint"]) == (EVAL_EVERY, earlier)
  assert f"learner step {EVAL_EVERY}" in report["title"]
  # The network's own play in the final report: its greedy search's and its policy's alone.
  for split in ("train", "heldout"):
    figures = report["summary"][split]
    assert figures["agent_geomean_speedup"] >= figures["agent_geomean_policy_speedup"]
    outcomes = [figures[f"agent_policy_{n}"] for n in ("wins", "ties", "losses")]
    assert sum(outcomes) == figures["entries"]
  assert any("policy alone" in line for line in lines)


def test_corrupt_checkpoint_fails_with_one_line_and_is_kept(trained, tmp_path, monkeypatch):
  monkeypatch.setattr(single_process, "make_networks", cached_make_networks)
  with open(os.path.join(trained["workdir"], "checkpoints", CHECKPOINT_FILENAME), "rb") as f:
    good = f.read()
  corrupt = good[: len(good) // 2]  # Truncated.
  file = tmp_path / "checkpoints" / CHECKPOINT_FILENAME
  file.parent.mkdir()
  file.write_bytes(corrupt)
  with pytest.raises(MalloczeroError) as error:
    train_single_process(CONFIG, str(tmp_path), max_learner_steps=5, print_fn=None)
  message = str(error.value)
  assert "\n" not in message and CHECKPOINT_FILENAME in message
  assert file.read_bytes() == corrupt
  assert not (tmp_path / "learning_curve.csv").exists()


def test_max_seconds_stops_while_the_learner_waits_for_data(tmp_path, monkeypatch):
  """The run ends on max_seconds while the table is below its minimum size, so the learner
  thread is blocked sampling: the trainer must still return (it used to hang joining it)."""
  monkeypatch.setattr(single_process, "make_networks", cached_make_networks)
  outcome = {}

  def run():
    try:
      outcome["result"] = train_single_process(
        CONFIG, str(tmp_path), max_learner_steps=STEPS, max_seconds=1.0, print_fn=None
      )
    except BaseException as e:  # pylint: disable=broad-except
      outcome["error"] = e

  thread = threading.Thread(target=run, daemon=True)
  thread.start()
  thread.join(120)
  assert not thread.is_alive(), "train_single_process did not return after max_seconds"
  assert "error" not in outcome, outcome.get("error")
  result = outcome["result"]
  assert result.learner_steps < STEPS
  assert checkpoint_steps(str(tmp_path)) == result.learner_steps
  assert int(result.curve[-1]["learner_steps"]) == result.learner_steps
