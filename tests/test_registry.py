"""The solver registry: one record per solver, from which `solve`, the command line's flags and the
evaluation cache are derived; and the cache of baseline results itself."""

import dataclasses
import gzip
import os

import pytest

from malloczero.env.programs.suites import get_suite
from malloczero.env.solvers import registry, solve
from malloczero.env.solvers.registry import BASELINES, SOLVERS, option_fields
from malloczero.evaluation.baseline_cache import BaselineCache
from malloczero.launch import cli
from malloczero.launch.flags import FlagError, solver_options
from malloczero.launch.solvers import ALL_SOLVERS


def _entry():
  workload, hardware = get_suite("tiny").entries[0].load()
  return workload, hardware


def test_a_flag_shared_by_several_solvers_has_one_default_and_one_check():
  for name, users in option_fields(ALL_SOLVERS.values()).items():
    flags = {(f.metadata["flag"], f.metadata["check"], f.default) for _, f in users}
    assert len(flags) == 1, f"{name}: {sorted(map(str, flags))}"


def test_every_option_of_every_solver_is_a_flag_of_solve_and_reaches_the_solver():
  parser = cli.build_parser()
  args = parser.parse_args(
    [
      "solve",
      "w.json",
      "--time-limit",
      "3",
      "--seed",
      "5",
      "--evaluations",
      "7",
      "--workers",
      "1",
      "--skip-below",
      "0.25",
      "--msa-option",
      "max_outstanding_prefetches=2",
    ]
  )
  for solver in ALL_SOLVERS.values():
    if not solver.takes_msa_options:  # --msa-option is refused, not ignored, by the others.
      with pytest.raises(FlagError, match="--msa-option is for msa, evo-msa"):
        solver_options(args, solver)
      args.msa_option = None
      options = solver_options(args, solver)
      args.msa_option = [("max_outstanding_prefetches", "2")]
    else:
      options = solver_options(args, solver)
    fields = {f.name for f in dataclasses.fields(solver.options)}
    assert fields <= set(options), solver.name
    expected = {"time_limit_s": 3.0, "seed": 5, "evaluations": 7, "workers": 1, "skip_below": 0.25}
    for name in fields & set(expected):
      assert options[name] == expected[name], (solver.name, name)
    assert ("max_outstanding_prefetches" in options) == solver.takes_msa_options, solver.name
  help_text = parser._subparsers._group_actions[0].choices["solve"].format_help()
  for users in option_fields(ALL_SOLVERS.values()).values():
    assert users[0][1].metadata["flag"] in help_text
  for solver in ALL_SOLVERS:
    assert solver in help_text


@pytest.mark.slow  # Integration-sized: subprocesses, compiles or every solver.
def test_every_baseline_solves_through_its_record():
  workload, hardware = _entry()
  for name in SOLVERS:
    spec = BASELINES[name]
    options = spec.make_options({"time_limit_s": 2.0, "evaluations": 4})
    result = solve(workload, hardware, name, **options)
    # The record says whether the mapping is msa's segments or placed requests.
    has_segments = any(a["request"] < 0 for a in result.mapping.allocations)
    assert not has_segments or spec.segments, name


def test_the_cache_reuses_a_result_and_keys_it_by_everything_it_depends_on(tmp_path, monkeypatch):
  workload, hardware = _entry()
  cache = BaselineCache(str(tmp_path))
  first = cache.solve(workload, hardware, "evo", evaluations=6, seed=1)
  again = cache.solve(workload, hardware, "evo", evaluations=6, seed=1)
  assert (cache.solved, cache.reused) == (1, 1)
  assert again.mapping.to_dict() == first.mapping.to_dict()
  assert again.solve_time_s == pytest.approx(first.solve_time_s)
  assert again.info["evaluations"] == first.info["evaluations"]
  cache.solve(workload, hardware, "evo", evaluations=6, seed=2)  # Another option.
  cache.solve(
    workload,
    hardware.with_fast_capacity(hardware.fast_capacity_bytes // 2),
    "evo",
    evaluations=6,
    seed=1,
  )  # Another capacity.
  assert (cache.solved, cache.reused) == (3, 1)
  # A new version of the solver invalidates what the old one left.
  monkeypatch.setitem(BASELINES, "evo", dataclasses.replace(BASELINES["evo"], version=99))
  cache.solve(workload, hardware, "evo", evaluations=6, seed=1)
  assert (cache.solved, cache.reused) == (4, 1)


def test_a_damaged_cache_entry_is_solved_again_and_rewritten(tmp_path):
  workload, hardware = _entry()
  cache = BaselineCache(str(tmp_path))
  cache.solve(workload, hardware, "msa")
  path = cache.path(cache.key(workload, hardware, "msa", {}))
  with gzip.open(path, "wt") as f:
    f.write('{"key": "truncated')
  result = cache.solve(workload, hardware, "msa")
  assert (cache.solved, cache.reused) == (2, 0)
  assert result.mapping.to_dict() == solve(workload, hardware, "msa").mapping.to_dict()
  assert cache.solve(workload, hardware, "msa") and cache.reused == 1
  assert os.path.getsize(path) > 100


@pytest.mark.parametrize("directory", [True, False], ids=["cached", "no cache"])
def test_a_solver_without_a_time_limit_is_timed_warm(tmp_path, monkeypatch, directory):
  """msa's solve time is its work, not its kernels' first compilation in the process: the
  result kept is timed on a second solve; a time-limited solve is solved once."""
  from malloczero.evaluation import baseline_cache

  workload, hardware = _entry()
  calls = []

  def recorded(*args, **kwargs):
    calls.append(solve(*args, **kwargs))
    return calls[-1]

  monkeypatch.setattr(baseline_cache, "solve", recorded)
  cache = BaselineCache(str(tmp_path) if directory else None)
  result = cache.solve(workload, hardware, "msa")
  assert len(calls) == 2 and result.solve_time_s == calls[1].solve_time_s
  assert result.mapping.to_dict() == calls[0].mapping.to_dict()
  cache.solve(workload, hardware, "greedy", time_limit_s=5.0)
  assert len(calls) == 3


def test_a_cache_without_a_directory_keeps_nothing():
  workload, hardware = _entry()
  cache = BaselineCache(None)
  cache.solve(workload, hardware, "greedy")
  cache.solve(workload, hardware, "greedy")
  assert (cache.solved, cache.reused) == (2, 0)


def test_a_second_evaluate_solves_nothing_again_and_says_so(tmp_path, capsys, monkeypatch):
  monkeypatch.setenv("MALLOCZERO_BASELINE_CACHE_DIR", str(tmp_path / "cache"))
  argv = [
    "evaluate",
    "--suite",
    "tiny",
    "--solvers",
    "msa,greedy,evo",
    "--limit",
    "2",
    "--evaluations",
    "6",
  ]
  assert cli.main(argv + ["--out", str(tmp_path / "first")]) == 0
  assert "0 result(s) reused" in capsys.readouterr().out
  assert cli.main(argv + ["--out", str(tmp_path / "second")]) == 0
  out = capsys.readouterr().out
  assert "6 result(s) reused" in out and ", 0 solved" in out
  first = (tmp_path / "first" / "evaluation.csv").read_text()
  assert (tmp_path / "second" / "evaluation.csv").read_text() == first
  assert cli.main(argv + ["--out", str(tmp_path / "third"), "--no-cache"]) == 0
  assert "reused" not in capsys.readouterr().out


def test_registry_options_are_frozen_dataclasses_with_flags():
  for solver in ALL_SOLVERS.values():
    assert solver.kind in registry.KINDS
    assert dataclasses.is_dataclass(solver.options)
    assert solver.options.__dataclass_params__.frozen
    for field in dataclasses.fields(solver.options):
      assert field.metadata["flag"].startswith("--") and field.metadata["check"] in registry.CHECKS
