"""The proposer's tuning (learner/proposer/tuning.py): evolution strategies on the members' last
layers, judged by one decode's speed over msa; and a run that tunes the proposer it fits."""

import numpy as np
import pytest

from malloczero.common.errors import MalloczeroError
from malloczero.configs.config import get_config, with_section
from malloczero.configs.workdir import WorkDir
from malloczero.env.placement import Placement
from malloczero.env.solvers.evo import decode
from malloczero.learner.proposer import (
  BUILTIN_LABELS,
  Labels,
  Proposer,
  fit,
  labelled_programs,
  proposal_genome,
)
from malloczero.learner.proposer.tuning import (
  TuningSettings,
  centred_ranks,
  es_search,
  last_layers,
  log_speedup_over_msa,
  mean_fitness,
  target_chance,
  tune,
  tuning_targets,
  with_last_layers,
)
from malloczero.system.training import fit_run_proposer


@pytest.fixture(scope="module")
def corpus_programs():
  """Six of the committed corpus labels' smaller programs, with their placements."""
  labels = Labels.load(BUILTIN_LABELS)
  small = [i for i, flags in enumerate(labels.placed) if 200 <= len(flags) <= 600][:6]
  subset = Labels(
    labels.suite,
    tuple(labels.entries[i] for i in small),
    tuple(labels.placed[i] for i in small),
    tuple(labels.fingerprints[i] for i in small),
    labels.msa[small],
    labels.evo[small],
    labels.seconds,
  )
  return labelled_programs(subset, placements=True)


@pytest.fixture(scope="module")
def fitted(corpus_programs):
  return fit(corpus_programs, seed=0, steps=200, batch=512, members=2)


def test_the_tuning_sees_the_proposers_own_chances_and_decodes_against_msa(corpus_programs, fitted):
  targets = tuning_targets(fitted, corpus_programs)
  theta = last_layers(fitted)
  assert theta.shape == (len(fitted.members) * 129,)
  for program, target in zip(corpus_programs, targets):
    np.testing.assert_allclose(
      target_chance(target, theta), fitted.placed_chance(program["features"]), atol=1e-5
    )
    # The fitness is the log of one decode of the proposal's speed-up over msa's.
    placement = Placement(program["placement"].model, program["placement"].requests)
    chance = fitted.placed_chance(program["features"])
    speedup = placement.model.slow_only_time / decode(placement, proposal_genome(chance))
    assert log_speedup_over_msa(target, theta) == pytest.approx(
      np.log(speedup / program["msa"]), abs=1e-9
    )
  same = with_last_layers(fitted, theta)
  np.testing.assert_allclose(
    same.placed_chance(corpus_programs[0]["features"]),
    fitted.placed_chance(corpus_programs[0]["features"]),
    rtol=1e-6,
  )
  with pytest.raises(MalloczeroError, match="placements=True"):
    tuning_targets(fitted, [{k: p[k] for k in ("features", "placed")} for p in corpus_programs])


def test_centred_ranks_span_minus_a_half_to_a_half_whatever_the_scale():
  np.testing.assert_allclose(centred_ranks(np.array([3.0, -100.0, 7.0])), [0.0, -0.5, 0.5])
  np.testing.assert_allclose(
    centred_ranks(np.array([0.1, 0.2, 0.3, 0.4])), centred_ranks(np.array([1, 20, 300, 4000]))
  )
  assert centred_ranks(np.array([5.0])).tolist() == [0.0]


def test_evolution_strategies_climb_a_fitness_whose_best_is_known():
  target = np.array([1.0, -2.0, 0.5, 3.0])
  seen_items = []

  def fitness(thetas, items):
    assert thetas.shape == (16, 4)
    # Rows 2k and 2k + 1 mirror each other about the current parameters.
    centre = (thetas[0::2] + thetas[1::2]) / 2
    np.testing.assert_allclose(centre, np.broadcast_to(centre[0], centre.shape), atol=1e-12)
    seen_items.append(items)
    return -np.sum((thetas - target) ** 2, axis=1)

  settings = TuningSettings(steps=300, pairs=8, batch=2, sigma=0.1, learning_rate=0.05)
  start = np.zeros(4)
  found = es_search(fitness, start, np.ones(4), settings, num_items=5, seed=0)
  assert np.linalg.norm(found - target) < 0.1 * np.linalg.norm(start - target)
  # Each step scores all its perturbations on one draw of distinct items.
  assert len(seen_items) == 300
  assert all(len(set(items)) == 2 and max(items) < 5 for items in seen_items)


def test_tuning_moves_only_the_last_layers_and_reports_each_steps_fitness(
  corpus_programs, fitted, tmp_path
):
  targets = tuning_targets(fitted, corpus_programs)
  reports = []
  settings = TuningSettings(steps=3, pairs=2, batch=4)
  tuned = tune(fitted, targets, settings, seed=1, progress=lambda *r: reports.append(r))
  assert [step for step, _, _ in reports] == [1, 2, 3]
  assert all(-1.0 < fitness < 1.0 for _, _, fitness in reports)
  np.testing.assert_array_equal(last_layers(reports[-1][1]), last_layers(tuned))
  assert not np.array_equal(last_layers(tuned), last_layers(fitted))
  for before, after in zip(fitted.members, tuned.members):
    for layer in ("proposer/~/linear_0", "proposer/~/linear_1"):
      for name in ("w", "b"):
        np.testing.assert_array_equal(before[layer][name], after[layer][name])
  # It saves and loads as any proposer, and plays what the tuning judged.
  path = str(tmp_path / "tuned.npz")
  tuned.save(path)
  loaded = Proposer.load(path)
  chance = loaded.placed_chance(corpus_programs[0]["features"])
  np.testing.assert_allclose(chance, target_chance(targets[0], last_layers(tuned)), atol=1e-5)
  # Decoded in two forked workers, the same steps to the last bit.
  forked = tune(fitted, targets, settings, seed=1, workers=2)
  np.testing.assert_array_equal(last_layers(forked), last_layers(tuned))
  # Zero steps leave the proposer as it was.
  same = tune(fitted, targets, TuningSettings(steps=0))
  np.testing.assert_array_equal(last_layers(same), last_layers(fitted))
  assert mean_fitness(targets, last_layers(fitted)) == pytest.approx(
    np.mean([log_speedup_over_msa(t, last_layers(fitted)) for t in targets])
  )
  with pytest.raises(MalloczeroError, match="no labelled programs"):
    tune(fitted, [], settings)
  with pytest.raises(MalloczeroError, match="positive pairs"):
    TuningSettings(pairs=0)


def test_a_run_tunes_the_proposer_it_fits(tmp_path):
  """With `proposer.tune_steps`, `train`'s fit goes on to tune the fitted proposer's last layers
  before saving it: the same hidden layers as the untuned fit of the same seed, other last
  layers."""
  config = get_config("tiny")
  plain, tuned = str(tmp_path / "plain"), str(tmp_path / "tuned")
  fit_run_proposer(with_section(config, "proposer", tune_steps=0), plain, lambda text: None)
  lines: list[str] = []
  tuning = with_section(config, "proposer", tune_steps=2, tune_pairs=2, tune_batch=2)
  fit_run_proposer(tuning, tuned, lines.append)
  assert any("tuning its last layers" in line for line in lines)
  assert any("tuning step 2/2, perturbations' geomean" in line for line in lines)
  assert lines[-1].startswith(f"proposer: saved {WorkDir(tuned).proposer}")
  before, after = Proposer.load(WorkDir(plain).proposer), Proposer.load(WorkDir(tuned).proposer)
  np.testing.assert_array_equal(before.mean, after.mean)
  for a, b in zip(before.members, after.members):
    np.testing.assert_array_equal(a["proposer/~/linear_1"]["w"], b["proposer/~/linear_1"]["w"])
  assert not np.array_equal(last_layers(before), last_layers(after))


def test_a_runs_tuning_stops_at_its_share_of_the_runs_time_limit(tmp_path):
  """The fit and the tuning may take `PROPOSER_SHARE` of the run's `--max-seconds`: past it no
  tuning step starts, and the run says how many it made."""
  config = get_config("tiny")
  lines: list[str] = []
  long = with_section(config, "proposer", tune_steps=1000, tune_pairs=2, tune_batch=2)
  fit_run_proposer(long, str(tmp_path / "short"), lines.append, max_seconds=1e-3)
  assert any("tuning stopped after 0 of 1000 steps" in line for line in lines)
  untuned = str(tmp_path / "untuned")
  fit_run_proposer(with_section(config, "proposer", tune_steps=0), untuned, lambda text: None)
  np.testing.assert_array_equal(
    last_layers(Proposer.load(WorkDir(str(tmp_path / "short")).proposer)),
    last_layers(Proposer.load(WorkDir(untuned).proposer)),
  )
