"""The trained agent as a solver: `solve --solver agent|portfolio --checkpoint DIR`."""

from __future__ import annotations

import dataclasses
import importlib
import json
import os
import pathlib
import subprocess
import sys

import numpy as np
import pytest

from malloczero.actors import agent as agent_module
from malloczero.actors.agent import (
  GAME_BUILD_PER_MSA_S,
  PLAY_RESERVE_S,
  _play_proposal,
  guided_search,
  load_agent,
  play_with_agent,
  solve_with_agent,
)
from malloczero.actors.games import GameSpec
from malloczero.common.errors import MalloczeroError
from malloczero.configs.workdir import CHECKPOINT_FILENAME, WorkDir
from malloczero.env.cost_model import CostModel
from malloczero.env.placement import Placement
from malloczero.env.programs.suites import WORKLOAD_DIR, get_suite
from malloczero.env.solvers import get_solver, solve
from malloczero.env.solvers.evo import decode, mapping_genomes
from malloczero.env.validator import validate_mapping
from malloczero.learner.proposer import Proposer, fit, label_program, propose, requests_of
from malloczero.learner.proposer.network import NEIGHBOURS
from tests.trained import STEPS, read_checkpoint, write_checkpoint

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module", autouse=True)
def placement_kernel_loaded():
  """evo's jitted decode compiled (a fresh clone's first use, about 5 s) or loaded before the
  tests that time the guided search, as `evaluate` compiles the agent's search before timing."""
  entry = get_suite("tiny").entries[0]
  model = CostModel(*entry.load())
  requests = get_solver("evo").requests(model)
  decode(Placement(model, requests), np.ones(len(requests)))


@pytest.fixture(scope="module")
def workdir(trained_run):
  """A tiny training work directory with a real (briefly trained) learner checkpoint: the
  session's shared run (conftest.py)."""
  return pathlib.Path(trained_run["workdir"])


def _program():
  entry = get_suite("tiny").entries[0]
  workload = entry.workload()
  return entry, workload, entry.hardware_for(workload)


def test_agent_keeps_the_best_of_its_trajectories_and_its_mapping_validates(workdir):
  agent = load_agent(str(workdir))
  assert agent.learner_steps == STEPS and agent.search.eval_num_simulations == 16
  _, workload, hardware = _program()
  result = solve_with_agent(agent, workload, hardware, simulations=4, attempts=3)
  validate_mapping(workload, hardware, result.mapping)
  speedups = result.info["attempt_speedups"]
  # The 3 searched attempts, then the policy's alone.
  assert len(speedups) == 4 and result.info["search_speedup"] == pytest.approx(max(speedups))
  assert result.info["policy_speedup"] == speedups[-1]
  # msa's mapping and the run's proposer's play are candidates too.
  candidates = [*speedups, result.info["msa_speedup"], result.info["proposal_speedup"]]
  assert result.mapping.speedup == pytest.approx(max(candidates))
  assert result.mapping.speedup >= max(result.info["greedy_speedup"], speedups[-1])


def test_the_agent_counts_msa_among_its_attempts_so_it_is_never_slower_than_msa(workdir):
  """On every tiny program: msa's mapping is one more attempt, the info says which attempt won,
  the network's greedy play and its policy's are kept apart, and msa's solve time is in the
  agent's."""
  agent = load_agent(str(workdir))
  entries = get_suite("tiny").entries
  specs = [GameSpec(e.name, *e.load()) for e in entries]
  results = play_with_agent(agent, specs, simulations=4, attempts=2)
  for spec, result in zip(specs, results):
    msa = solve(spec.workload, spec.hardware, "msa")
    validate_mapping(spec.workload, spec.hardware, result.mapping)
    assert result.mapping.estimated_time_s <= msa.mapping.estimated_time_s, spec.name
    info = result.info
    assert info["msa_speedup"] == pytest.approx(msa.mapping.speedup, rel=1e-12)
    assert info["greedy_speedup"] == info["attempt_speedups"][0]
    assert info["policy_speedup"] == info["attempt_speedups"][-1]
    assert len(info["attempt_speedups"]) == 3
    assert info["search_speedup"] == pytest.approx(max(info["attempt_speedups"]))
    # The run's proposer plays too (one decode), reported apart; the best of all is kept.
    assert info["proposal_speedup"] is not None and info["proposal_s"] > 0
    candidates = {"msa": info["msa_speedup"], "proposal": info["proposal_speedup"]}
    candidates |= dict(enumerate(info["attempt_speedups"]))
    assert result.mapping.speedup == pytest.approx(max(candidates.values()), rel=1e-12)
    assert result.mapping.speedup == pytest.approx(candidates[info["best_attempt"]], rel=1e-12)
    if info["best_attempt"] == "msa":
      assert max(info["search_speedup"], info["proposal_speedup"]) < info["msa_speedup"]
    assert result.solve_time_s >= info["msa_solve_s"] + info["proposal_s"]
    assert info["msa_solve_s"] > 0


def test_the_guided_search_starts_from_the_attempts_and_is_timed_in_the_solve(workdir):
  """`search_seconds` with `guide="decisions"`: evo-msa guided by the network after the attempts;
  the result is the best of the attempts, msa and the search, it validates, and the search's
  time is in the solve's. Without the run's proposer: this is the MuZero play's search."""
  agent = dataclasses.replace(load_agent(str(workdir)), proposer=None)
  specs = [GameSpec(e.name, *e.load()) for e in get_suite("tiny").entries[:3]]
  results = play_with_agent(
    agent, specs, simulations=4, attempts=2, search_seconds=0.5, guide="decisions"
  )
  for spec, result in zip(specs, results):
    info = result.info
    validate_mapping(spec.workload, spec.hardware, result.mapping)
    assert info["guided_evaluations"] >= 1 and 0 < info["guided_s"] < 5
    assert info["guided_speedup"] >= info["msa_speedup"] * (1 - 1e-12)  # evo-msa starts at msa.
    best = max(info["guided_speedup"], info["search_speedup"], info["msa_speedup"])
    assert result.mapping.speedup == pytest.approx(best, rel=1e-12)
    assert (info["best_attempt"] == "guided") == (
      info["guided_speedup"] > max(info["search_speedup"], info["msa_speedup"])
    )
    assert result.solve_time_s >= info["guided_s"] + info["msa_solve_s"]


def test_the_guided_search_over_priorities_is_seeded_with_the_plays_mapping(workdir):
  """`guide="priorities"`, the default: evo over request priorities, its population seeded with
  the kept mapping of the play; within the time limit it returns a validated mapping at least as
  fast as the best of the attempts, msa and the proposer's play (its genome seeds the search
  first), and names its space."""
  agent = load_agent(str(workdir))
  assert agent.proposer is not None
  specs = [GameSpec(e.name, *e.load()) for e in get_suite("tiny").entries[:2]]
  results = play_with_agent(agent, specs, simulations=4, attempts=1, search_seconds=0.5)
  for spec, result in zip(specs, results):
    info = result.info
    validate_mapping(spec.workload, spec.hardware, result.mapping)
    assert info["guide"] == "priorities" and info["guided_evaluations"] >= 3
    # The search decoded the proposal first: it is at least that decode.
    assert info["guided_speedup"] >= info["proposal_speedup"] * (1 - 1e-12)
    best = max(info["guided_speedup"], info["search_speedup"], info["msa_speedup"])
    assert result.mapping.speedup == pytest.approx(best, rel=1e-12)
    assert info["guided_s"] < 0.5 + 1.0  # evo's last decode may pass its limit by a decode.
  with pytest.raises(MalloczeroError, match="unknown guided search 'nope'"):
    play_with_agent(agent, specs[:1], simulations=4, attempts=1, search_seconds=0.1, guide="nope")


def test_the_agent_plays_its_runs_proposer_and_reports_it_apart(workdir):
  """The run's proposer (checkpoints/proposer.npz) is loaded with the checkpoint; its play is one
  decode of its proposal (`proposal_speedup`: no search, no msa), a candidate of the agent's; an
  agent whose run has no proposer reports none."""
  agent = load_agent(str(workdir))
  proposer = Proposer.load(WorkDir(str(workdir)).proposer)
  for spec in [GameSpec(e.name, *e.load()) for e in get_suite("tiny").entries[:3]]:
    result = play_with_agent(agent, [spec], simulations=4, attempts=1)[0]
    placement = Placement(*requests_of(spec.workload, spec.hardware))
    genome = propose(proposer, placement.model, placement.requests)
    own = placement.model.slow_only_time / decode(placement, genome)
    assert result.info["proposal_speedup"] == pytest.approx(own, rel=1e-12)
    assert result.mapping.speedup >= own * (1 - 1e-12)
    without = play_with_agent(
      dataclasses.replace(agent, proposer=None), [spec], simulations=4, attempts=1
    )[0]
    assert without.info["proposal_speedup"] is None and "proposal_s" not in without.info
    assert without.info["best_attempt"] != "proposal"


def test_without_a_play_the_guided_search_over_priorities_starts_from_msas_mapping():
  """No network play (`played` None, as when it found no mapping within its share): the search
  over priorities is seeded with msa's mapping's genomes, decoded first, so it is at least as
  fast as the better of their decodes; the search over msa's decisions needs the play."""
  (entry,) = (e for e in get_suite("default").entries if e.name == "vgg-b1-train@nnpi-like:25%")
  workload, hardware = entry.load()
  spec = GameSpec(entry.name, workload, hardware)
  msa = solve(workload, hardware, "msa").mapping
  found, info = guided_search(spec, None, 1.0, msa=msa)
  validate_mapping(workload, hardware, found)
  model = CostModel(workload, hardware)
  requests = get_solver("evo").requests(model)  # the search's: evo's
  decoded = [
    decode(Placement(model, requests), g) for g in mapping_genomes(requests, msa, workload)
  ]
  assert len(decoded) == 3 and found.estimated_time_s <= min(decoded) * (1 + 1e-12)
  assert "initial_best" in info and info["evaluations"] > len(decoded)
  with pytest.raises(ValueError, match="starts from the network's play"):
    guided_search(spec, None, 1.0, guide="decisions", msa=msa)


def test_the_guided_search_starts_from_the_proposal_and_its_neighbours(monkeypatch):
  """The proposal, then its neighbours (the proposal at other thresholds and orders), are the
  search's first genomes: it is at least as fast as the fastest of their decodes."""
  (entry,) = (e for e in get_suite("default").entries if e.name == "vgg-b1-train@nnpi-like:25%")
  spec = GameSpec(entry.name, *entry.load())
  proposer = fit([label_program(spec.workload, spec.hardware, seconds=0.2)], steps=100, batch=128)
  proposal = _play_proposal(proposer, spec)
  assert len(proposal.neighbours) == len(NEIGHBOURS)
  msa = solve(spec.workload, spec.hardware, "msa").mapping
  seeded = []
  real_evo = agent_module.evo

  def recording_evo(placement, **kwargs):
    seeded.extend(kwargs["initial"])
    return real_evo(placement, **kwargs)

  monkeypatch.setattr(agent_module, "evo", recording_evo)
  found, _ = guided_search(spec, None, 1.0, msa=msa, proposal=proposal)
  np.testing.assert_array_equal(seeded[0], proposal.genome)
  for genome in proposal.neighbours:
    assert any(np.array_equal(genome, known) for known in seeded)
  validate_mapping(spec.workload, spec.hardware, found)
  model, requests = proposal.placement.model, proposal.placement.requests
  decoded = [decode(Placement(model, requests), g) for g in (proposal.genome, *proposal.neighbours)]
  assert found.estimated_time_s <= min(decoded) * (1 + 1e-12)


def test_the_ablation_script_runs_the_search_without_the_network_against_an_evaluation(
  tmp_path,
):
  """scripts/guided_search_without_network.py: a row per entry within the limit, never below msa,
  the agent paired against it from an evaluation's rows; a one-line error for a bad suite or a
  directory without an evaluation."""
  script = os.path.join(REPO, "scripts", "guided_search_without_network.py")
  entries = get_suite("tiny").entries
  evaluation = tmp_path / "evaluation"
  evaluation.mkdir()
  rows = [{"entry": e.name, "agent_speedup": 100.0} for e in entries]
  (evaluation / "evaluation.json").write_text(json.dumps({"rows": rows}))
  out = tmp_path / "rows.json"
  done = subprocess.run(
    [sys.executable, script, "--suite", "tiny", "--time-limit", "0.5"]
    + ["--out", str(out), "--against", str(evaluation)],
    capture_output=True,
    text=True,
  )
  assert done.returncode == 0, done.stderr
  found = json.loads(out.read_text())
  assert [r["entry"] for r in found] == [e.name for e in entries]
  for row in found:
    assert row["search_speedup"] >= row["msa_speedup"] and row["evaluations"] >= 1
  assert f"{len(entries)} entries: without the network x msa" in done.stdout
  assert "the agent over it: +" in done.stdout
  for bad in (["--suite", "nope"], ["--suite", "tiny", "--against", str(tmp_path)]):
    failed = subprocess.run([sys.executable, script, *bad], capture_output=True, text=True)
    assert failed.returncode == 2 and failed.stderr.startswith("error: ")
    assert len(failed.stderr.splitlines()) == 1


def test_a_time_limit_gives_the_guided_search_what_the_attempts_and_msa_left(workdir):
  """`time_limit`, per program: the guided search runs for what is left of it after the
  attempts and msa (no search when nothing is left)."""
  agent = load_agent(str(workdir))
  specs = [GameSpec(e.name, *e.load()) for e in get_suite("tiny").entries[:2]]
  before = play_with_agent(agent, specs, simulations=4, attempts=1)
  spent = max(r.solve_time_s for r in before)
  limit = spent + 1.0
  results = play_with_agent(agent, specs, simulations=4, attempts=1, time_limit=limit)
  for spec, result in zip(specs, results):
    info = result.info
    validate_mapping(spec.workload, spec.hardware, result.mapping)
    assert info["guided_evaluations"] >= 1 and info["guided_budget_s"] > 0
    # The solve before the search (attempts, msa) and the search's budget make up the limit.
    before_search = result.solve_time_s - info["guided_s"]
    assert before_search + info["guided_budget_s"] == pytest.approx(limit, rel=1e-9)
  none_left = play_with_agent(agent, specs, simulations=4, attempts=1, time_limit=1e-3)
  for spec, result in zip(specs, none_left):
    info = result.info
    assert "guided_s" not in info and info["best_attempt"] == "msa"
    # No room for play: msa's mapping, and no trajectory of the network's to report.
    assert info["cut_short"] == "2 of 2 trajectories unfinished at the time limit"
    assert info["greedy_speedup"] is None and info["policy_speedup"] is None
    assert info["attempt_speedups"] == [None, None] and info["search_speedup"] is None
    validate_mapping(spec.workload, spec.hardware, result.mapping)


def test_a_time_limit_stops_the_attempts_between_search_calls(workdir, monkeypatch):
  """The attempts stop at the deadline the time limit leaves them (a clock that ticks once a
  look): the trajectories unfinished then are dropped and said to be, the network's own play
  among them, and the answer is the best finished one or msa's mapping, validated. The decision
  guide gives the attempts all that msa leaves (`PLAY_SHARE`), so no guided search follows.
  Without the run's proposer, whose one decode would otherwise follow the attempts."""
  agent = dataclasses.replace(load_agent(str(workdir)), proposer=None)
  entry, workload, hardware = _program()
  spec = GameSpec(entry.name, workload, hardware)
  msa = solve(spec.workload, spec.hardware, "msa")
  whole = play_with_agent(agent, [spec], simulations=4, attempts=3, msa=[msa])[0]
  assert "cut_short" not in whole.info and None not in whole.info["attempt_speedups"]
  ticks = iter(range(10**6))
  monkeypatch.setattr(
    importlib.import_module("malloczero.env.solvers.time_limit"), "clock", lambda: next(ticks)
  )
  # 12 looks at the clock: the 3 copies beyond the greedy one built, then a few search rounds.
  limit = msa.solve_time_s + PLAY_RESERVE_S + 12
  cut = play_with_agent(
    agent, [spec], simulations=4, attempts=3, msa=[msa], time_limit=limit, guide="decisions"
  )[0]
  info = cut.info
  assert info["cut_short"] == "4 of 4 trajectories unfinished at the time limit"
  assert info["attempt_speedups"] == [None] * 4 and info["greedy_speedup"] is None
  assert info["best_attempt"] == "msa" and "guided_s" not in info
  assert cut.mapping.estimated_time_s == msa.mapping.estimated_time_s
  validate_mapping(spec.workload, spec.hardware, cut.mapping)
  # Building the games replays msa through them, which no deadline stops: when what is left is
  # less than GAME_BUILD_PER_MSA_S msa solve times, no game is built at all.
  slow_msa = dataclasses.replace(msa, solve_time_s=10.0)
  limit = 10.0 + PLAY_RESERVE_S + GAME_BUILD_PER_MSA_S * 10.0 - 1
  unbuilt = play_with_agent(
    agent, [spec], 4, 3, msa=[slow_msa], time_limit=limit, guide="decisions"
  )[0]
  assert unbuilt.info["cut_short"] == "4 of 4 trajectories unfinished at the time limit"
  ticks_before = next(ticks)
  play_with_agent(agent, [spec], 4, 3, msa=[slow_msa], time_limit=limit, guide="decisions")
  assert next(ticks) - ticks_before <= 3  # The clock read for the start and the share only.


def test_solve_cli_agent_and_portfolio(workdir, tmp_path):
  entry, workload, hardware = _program()
  path = os.path.join(WORKLOAD_DIR, f"{entry.program}.json.gz")
  capacity = [f"--capacity={lv.name}={lv.capacity_bytes}" for lv in hardware.levels[:-1]]
  common = [
    sys.executable,
    "-m",
    "malloczero",
    "solve",
    path,
    "--hardware",
    entry.hardware,
    *capacity,
    "--checkpoint",
    str(workdir),
    "--simulations",
    "4",
    "--attempts",
    "2",
  ]
  out, plot = tmp_path / "map.json", tmp_path / "map.png"
  result = subprocess.run(
    common
    + ["--solver", "agent", "--out", str(out), "--plot", str(plot), "--search-seconds", "0.5"],
    cwd=REPO,
    capture_output=True,
    text=True,
    timeout=300,
  )
  assert result.returncode == 0, result.stderr[-2000:]
  assert result.stdout.startswith("agent: ") and f"checkpoint step {STEPS}" in result.stdout
  assert "guided search" in result.stdout and " s of its 0.5 s)" in result.stdout
  assert "proposer alone" in result.stdout
  assert out.exists() and plot.exists()
  validated = subprocess.run(
    [sys.executable, "-m", "malloczero", "validate", path, str(out), *capacity],
    cwd=REPO,
    capture_output=True,
    text=True,
  )
  assert validated.returncode == 0, validated.stderr

  # A limit on the whole solve replaces --search-seconds: the attempts and msa use all of this
  # one, so no guided search runs, though --search-seconds alone would give it 5 s.
  result = subprocess.run(
    common + ["--solver", "portfolio", "--search-seconds", "5", "--agent-time-limit", "1e-3"],
    cwd=REPO,
    capture_output=True,
    text=True,
    timeout=300,
  )
  assert result.returncode == 0, result.stderr[-2000:]
  assert "greedy alone" in result.stdout and "search alone" in result.stdout
  assert "policy alone" in result.stdout and "best of 3 trajectories" in result.stdout
  lines = result.stdout.splitlines()
  assert lines[0].startswith("agent: ") and lines[1].startswith("msa: ")
  assert "guided search" not in lines[0]
  assert lines[2].startswith("portfolio: ")
  msa = solve(workload, hardware, "msa").mapping.speedup
  won = float(lines[2].split("(")[1].split("x")[0])
  assert won >= msa - 5e-4  # Printed with 3 decimals.
  assert lines[2].split()[1] in ("agent", "msa")


def test_missing_or_incompatible_checkpoint_is_a_one_line_error(workdir, tmp_path):
  with pytest.raises(MalloczeroError, match="no learner checkpoint"):
    load_agent(str(tmp_path / "nowhere"))
  metadata, arrays = read_checkpoint(workdir / "checkpoints" / CHECKPOINT_FILENAME)
  metadata["network_config"]["d_model"] = 48  # Networks these parameters do not fit.
  write_checkpoint(str(tmp_path / "other" / "checkpoints" / CHECKPOINT_FILENAME), metadata, arrays)
  with pytest.raises(MalloczeroError, match="does not match"):
    load_agent(str(tmp_path / "other"))
  entry, _, _ = _program()
  path = os.path.join(WORKLOAD_DIR, f"{entry.program}.json.gz")
  for extra in (["--checkpoint", str(tmp_path / "other")], []):
    result = subprocess.run(
      [
        sys.executable,
        "-m",
        "malloczero",
        "solve",
        path,
        "--hardware",
        entry.hardware,
        "--solver",
        "agent",
        *extra,
      ],
      cwd=REPO,
      capture_output=True,
      text=True,
      timeout=300,
    )
    assert result.returncode == 1
    assert result.stderr.startswith("malloczero: error: ") and result.stderr.count("\n") == 1


def _copy_without_config(workdir, tmp_path, config_text=None):
  """A copy of the run's checkpoint whose config.json is missing or replaced by `config_text`."""
  import shutil

  copy = tmp_path / "copy"
  (copy / "checkpoints").mkdir(parents=True)
  shutil.copy(workdir / "checkpoints" / CHECKPOINT_FILENAME, copy / "checkpoints")
  if config_text is not None:
    (copy / "config.json").write_text(config_text)
  return copy


def test_corrupt_or_missing_run_config_is_one_line_in_solve_and_evaluate(workdir, tmp_path):
  """A corrupt config.json used to end in a traceback; a missing one silently meant the default
  search settings."""
  entry, _, _ = _program()
  path = os.path.join(WORKLOAD_DIR, f"{entry.program}.json.gz")
  commands = (
    [
      "solve",
      path,
      "--hardware",
      entry.hardware,
      "--solver",
      "agent",
      "--simulations",
      "2",
      "--attempts",
      "1",
      "--checkpoint",
    ],
    [
      "evaluate",
      "--suite",
      "tiny",
      "--solvers",
      "msa",
      "--limit",
      "1",
      "--simulations",
      "2",
      "--attempts",
      "1",
      "--out",
      str(tmp_path / "never"),
      "--checkpoint",
    ],
  )
  for text, message in (
    ('{"search": {"num_simu', "JSONDecodeError"),
    ("[1, 2]", "no 'search' object"),
    ('{"search": {"num_simulations": "many"}}', "'num_simulations' must be"),
    ('{"search": {"simulations": 4}}', "unknown search settings 'simulations'"),
    ('{"search": {"gumbel_scale": 1e400}}', "'gumbel_scale' must be a finite"),
  ):
    copy = _copy_without_config(workdir, tmp_path / str(abs(hash(text))), text)
    with pytest.raises(MalloczeroError, match=message):
      load_agent(str(copy))
    for command in commands:
      result = subprocess.run(
        [sys.executable, "-m", "malloczero", *command, str(copy)],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=300,
      )
      assert result.returncode == 1, result.stderr[-2000:]
      assert result.stderr.startswith("malloczero: error: run config ")
      assert result.stderr.count("\n") == 1 and message in result.stderr, result.stderr
  assert not (tmp_path / "never").exists()
  beyond = _copy_without_config(
    workdir, tmp_path / "beyond", '{"search": {"num_simulations": 5000}}'
  )
  with pytest.raises(
    MalloczeroError, match="num_simulations must be an integer >= 0 at most 1,024"
  ):
    load_agent(str(beyond))

  copy = _copy_without_config(workdir, tmp_path / "missing")
  agent = load_agent(str(copy))
  assert agent.config_file is None and agent.search_notice().startswith("no config.json beside")
  assert load_agent(str(workdir)).search_notice() is None
  for command in commands:
    result = subprocess.run(
      [sys.executable, "-m", "malloczero", *command, str(copy)],
      cwd=REPO,
      capture_output=True,
      text=True,
      timeout=300,
    )
    assert result.returncode == 0, result.stderr[-2000:]
    notices = [line for line in result.stderr.splitlines() if line.startswith("malloczero: ")]
    assert len(notices) == 1, result.stderr
    assert notices[0].startswith("malloczero: notice: no config.json beside the checkpoint")
    assert (
      "using the default search settings (evaluation search 32 simulations, 8 considered "
      "actions, Gumbel scale 1, Q spread floor 0.1 (0.01 in the sampled attempts), msa prior "
      "logit 0)" in notices[0]
    )
