"""evo-msa (env/solvers/evo_msa.py): evolution over deviations from msa's decisions, in the game's
own decision space. It starts from msa, so it is never slower; deviations are decisions of the
game; its mapping is a trajectory the game can play."""

import importlib
import itertools

import numpy as np
import pytest

from malloczero.env import MsaGame, validate_mapping
from malloczero.env.cost_model import CostModel
from malloczero.env.msa.algorithm import msa_allocations
from malloczero.env.programs.suites import get_suite
from malloczero.env.solvers import solve
from malloczero.env.solvers.evo_msa import decode, evo_msa, mutate_with_deferral
from malloczero.env.solvers.registry import BASELINES
from malloczero.evaluation.baseline_cache import BaselineCache
from malloczero.launch import cli
from malloczero.launch.flags import solver_options
from tests.test_msa_steps import same_allocations


def tiny(name: str):
  (entry,) = [e for e in get_suite("tiny").entries if e.name == name]
  return entry.load()


def test_one_evaluation_is_msa_and_more_are_never_slower():
  workload, hardware = tiny("tiny-gpt-b1-infer@tpu-v4i-like:25%")
  model = CostModel(workload, hardware)
  mapping, info = evo_msa(model, evaluations=1)
  expected, _ = msa_allocations(workload, hardware)
  assert same_allocations(mapping.to_arrays(workload), expected)
  assert info["evaluations"] == 1 and info["deviations_from_msa"] == 0
  searched, info = evo_msa(model, evaluations=30, seed=1)
  assert info["evaluations"] == 30
  assert searched.estimated_time_s <= info["msa_time_s"]
  validate_mapping(workload, hardware, searched)


def test_finds_a_faster_trajectory_than_msa_and_the_game_replays_it():
  """On tiny-vgg msa prefetches what it should not: a few changed decisions are faster. The
  deviations are moves of the game: replaying them in MsaGame gives the same time."""
  workload, hardware = tiny("tiny-vgg-b1-infer@tpu-v4i-like:25%")
  model = CostModel(workload, hardware)
  mapping, info = evo_msa(model, evaluations=40, seed=0)
  assert mapping.estimated_time_s < info["msa_time_s"] * 0.99
  assert info["deviations_from_msa"] >= 1
  report = validate_mapping(workload, hardware, mapping)
  assert report.estimated_time_s == pytest.approx(mapping.estimated_time_s, rel=1e-9)
  # Replay: the deviations are the game's actions at those decisions, msa's everywhere else.
  deviations = {(b, u): slot for b, u, slot in info["deviations"]}
  assert len(deviations) == info["deviations_from_msa"]
  game = MsaGame(workload, hardware)
  timestep, total, taken = game.reset(), 0.0, 0
  while not timestep.last():
    slot = deviations.get((game.decision.buffer, game.decision.use))
    if slot is not None and timestep.observation["legal_actions"][slot]:
      taken += 1
    else:
      slot = game.msa_action
    timestep = game.step(slot)
    total += timestep.reward
  assert taken == len(deviations)
  assert same_allocations(game.allocations(), mapping.to_arrays(workload))
  assert game.total_time == pytest.approx(mapping.estimated_time_s, rel=1e-9)
  assert total == pytest.approx(1 - mapping.estimated_time_s / game.msa_time, rel=1e-9)


def test_a_deviation_to_slot_0_leaves_that_use_in_default_memory():
  workload, hardware = tiny("tiny-mlp-b2-train@tpu-v4i-like:25%")
  model = CostModel(workload, hardware)
  _, msa_segments, choices, _ = decode(model, {})
  # A decision where msa prefetches: send that use to default memory instead.
  buffer, use, slots, msa_slot = next(c for c in choices if c[3] >= 2)
  _, segments, _, taken = decode(model, {(buffer, use): 0, (-1, -1): 1})
  assert taken == {(buffer, use): 0}  # A decision that never comes up is no deviation.
  fetched = lambda a: {(int(b), int(d)) for b, d in zip(a.buffer, a.prefetch_done) if d >= 0}
  assert (buffer, use) in fetched(msa_segments) and (buffer, use) not in fetched(segments)


def test_a_zero_time_limit_still_returns_msas_mapping():
  workload, hardware = tiny("tiny-mlp-b2-train@nnpi-like:25%")
  result = solve(workload, hardware, "evo-msa", time_limit_s=0.0)
  assert result.info["evaluations"] == 1 and result.info["stopped_by_time_limit"]
  msa = solve(workload, hardware, "msa")
  assert result.mapping.estimated_time_s == pytest.approx(msa.mapping.estimated_time_s, rel=1e-12)


def test_with_skip_below_it_changes_only_decisions_worth_deciding():
  workload, hardware = tiny("tiny-vgg-b1-infer@tpu-v4i-like:25%")
  model = CostModel(workload, hardware)
  _, _, every, _ = decode(model, {})
  _, _, worth, _ = decode(model, {}, skip_below=1e-3)
  assert 0 < len(worth) < len(every)
  assert {(b, u) for b, u, _, _ in worth} <= {(b, u) for b, u, _, _ in every}
  mapping, info = evo_msa(model, evaluations=20, seed=0, skip_below=1e-3)
  assert {(b, u) for b, u, _ in info["deviations"]} <= {(b, u) for b, u, _, _ in worth}
  assert mapping.estimated_time_s <= info["msa_time_s"]


@pytest.mark.slow  # Integration-sized: subprocesses, compiles or every solver.
def test_without_an_evaluation_budget_it_searches_until_its_time_limit():
  """evo-msa's budget is its time limit: it used to stop at evo's 120 decodes with most of its
  time left."""
  workload, hardware = tiny("tiny-vgg-b1-infer@tpu-v4i-like:25%")
  result = solve(workload, hardware, "evo-msa", time_limit_s=1.5, seed=0)
  assert result.info["stopped_by_time_limit"]
  assert result.info["evaluations"] > 1
  assert 0.5 < result.solve_time_s <= 1.5 + 0.5
  msa = solve(workload, hardware, "msa")
  assert result.mapping.estimated_time_s <= msa.mapping.estimated_time_s


def test_an_initial_genome_is_decoded_first_and_kept_when_it_is_the_best():
  """The agent solver's guided search starts from the agent's trajectories: a known faster
  genome given as `initial` is decoded right after msa, and with no more budget it is the
  result."""
  workload, hardware = tiny("tiny-vgg-b1-infer@tpu-v4i-like:25%")
  model = CostModel(workload, hardware)
  found, info = evo_msa(model, evaluations=40, seed=0)
  genome = {(b, u): slot for b, u, slot in info["deviations"]}
  again, again_info = evo_msa(model, evaluations=2, initial=[genome], solver="agent")
  assert again_info["evaluations"] == 2 and again.solver == "agent"
  assert again.estimated_time_s == pytest.approx(found.estimated_time_s, rel=1e-12)


def test_proposals_steer_the_mutations_to_the_decisions_and_slots_they_favour():
  """A guide sure of one decision and one slot there: most mutations change that decision to
  that slot; a quarter of the picks stay uniform, so the others are still tried."""
  import numpy as np

  from malloczero.env.solvers.evo_msa import UNIFORM_SHARE, mutate

  workload, hardware = tiny("tiny-gpt-b1-infer@tpu-v4i-like:25%")
  _, _, choices, _ = decode(CostModel(workload, hardware), {})
  buffer, use, slots, msa_slot = next(c for c in choices if len(c[2]) >= 3)
  wanted = int(slots[slots != msa_slot][-1])
  policy = np.zeros(10)
  policy[wanted] = 0.9
  policy[msa_slot] = 0.1
  proposals = {(b, u): np.eye(10)[m] for b, u, _, m in choices}  # Sure of msa elsewhere.
  proposals[(buffer, use)] = policy
  rng = np.random.default_rng(0)
  children = [mutate({}, choices, rng, proposals) for _ in range(400)]
  hits = np.mean([child.get((buffer, use)) == wanted for child in children])
  assert hits > 1 - UNIFORM_SHARE - 0.1
  unguided = [mutate({}, choices, rng) for _ in range(400)]
  assert np.mean([child.get((buffer, use)) == wanted for child in unguided]) < 0.2


# The defer measurement (docs/results/defer-measurement.md): genomes that also defer buffers.


def test_with_defer_one_evaluation_is_msa_and_more_are_never_slower_and_seeded():
  workload, hardware = tiny("tiny-vgg-b1-infer@tpu-v4i-like:25%")
  model = CostModel(workload, hardware)
  first, info = evo_msa(model, evaluations=1, defer=True)
  expected, _ = msa_allocations(workload, hardware)
  assert same_allocations(first.to_arrays(workload), expected)
  assert info["deferred_buffers"] == 0 and info["deferred"] == []
  searched, info = evo_msa(model, evaluations=40, seed=3, defer=True)
  assert info["evaluations"] == 40 and searched.estimated_time_s <= info["msa_time_s"]
  assert info["deferred_buffers"] == len(info["deferred"])
  validate_mapping(workload, hardware, searched)
  again, again_info = evo_msa(model, evaluations=40, seed=3, defer=True)
  assert again_info == info
  assert same_allocations(again.to_arrays(workload), searched.to_arrays(workload))
  # The best genome replays: its deviations and deferrals decode to the same time.
  genome = {(b, u): slot for b, u, slot in info["deviations"]}
  time_s, _, _, _ = decode(model, genome, deferred=frozenset(info["deferred"]))
  assert time_s == pytest.approx(searched.estimated_time_s, rel=1e-12)


def test_defer_off_searches_exactly_as_before():
  """Without `defer` no deferral is drawn: the random stream, hence the search, is unchanged,
  and the info has no deferral counts."""
  workload, hardware = tiny("tiny-vgg-b1-infer@tpu-v4i-like:25%")
  model = CostModel(workload, hardware)
  _, info = evo_msa(model, evaluations=24, seed=0)
  _, explicit = evo_msa(model, evaluations=24, seed=0, defer=False)
  assert info == explicit and "deferred_buffers" not in info


def test_a_deferral_mutation_toggles_a_buffer_that_offers_a_choice():
  workload, hardware = tiny("tiny-mlp-b2-train@tpu-v4i-like:25%")
  model = CostModel(workload, hardware)
  _, _, choices, _ = decode(model, {})
  offering = {b for b, _, _, _ in choices}
  rng = np.random.default_rng(0)
  deferred_seen: set[int] = set()
  for _ in range(200):
    child, deferred = mutate_with_deferral({}, frozenset(), choices, rng)
    assert deferred <= offering and len(deferred) <= 4
    assert all((b, u) in {(c[0], c[1]) for c in choices} for b, u in child)
    deferred_seen |= deferred
  assert deferred_seen  # Some picks defer (a quarter of them)...
  undone = [mutate_with_deferral({}, frozenset({-7}), [], rng)[1] for _ in range(50)]
  assert frozenset() in undone  # ...and a deferral can be undone with no choice left.


def test_defer_and_decodes_are_evo_msa_flags_and_keyed_apart_in_the_baseline_cache():
  args = cli.build_parser().parse_args(["solve", "w.json", "--defer", "--decodes", "5"])
  options = solver_options(args, BASELINES["evo-msa"])
  assert options["defer"] is True and options["decodes"] == 5
  off = solver_options(cli.build_parser().parse_args(["solve", "w.json"]), BASELINES["evo-msa"])
  assert off["defer"] is False and off["decodes"] is None
  workload, hardware = tiny("tiny-mlp-b2-train@tpu-v4i-like:25%")
  cache = BaselineCache(None)
  key = lambda o: cache.key(workload, hardware, "evo-msa", o)
  keys = [key(options), key(dict(options, defer=False))]
  assert cache.path(keys[0]) != cache.path(keys[1])
  result = solve(workload, hardware, "evo-msa", decodes=3, defer=True, time_limit_s=100.0)
  assert result.info["evaluations"] == 3 and "deferred_buffers" in result.info


def test_with_no_time_for_a_decode_it_returns_msas_own_mapping_from_the_jitted_loop(monkeypatch):
  """Where the limit left after msa's jitted loop could not hold a decode through the decision
  process (`DECISION_PROCESS_RATIO` times as long), evo-msa answers with msa's own mapping and
  says so; with time for one, it searches as before. The clock ticks a second per reading."""
  evo_msa_module = importlib.import_module("malloczero.env.solvers.evo_msa")

  ticks = itertools.count()
  monkeypatch.setattr(
    importlib.import_module("malloczero.env.solvers.time_limit"),
    "clock",
    lambda: float(next(ticks)),
  )
  workload, hardware = tiny("tiny-mlp-b2-train@nnpi-like:25%")
  model = CostModel(workload, hardware)
  msa = solve(workload, hardware, "msa").mapping.estimated_time_s
  limit = evo_msa_module.DECISION_PROCESS_RATIO  # Less than that once the loop's second is gone.
  mapping, info = evo_msa(model, time_limit_s=limit)
  assert info["cut_short"].startswith("time limit: no decode") and info["evaluations"] == 1
  assert info["stopped_by_time_limit"] and mapping.solver == "evo-msa"
  assert mapping.estimated_time_s == pytest.approx(msa, rel=1e-12)
  mapping, info = evo_msa(model, time_limit_s=1000.0, evaluations=3)
  assert "cut_short" not in info and info["evaluations"] == 3
