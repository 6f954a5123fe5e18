"""malloczero: evaluation (see docs/design.md): solvers and trained agents measured on suites, and
what shows the results.

  suite.py           every program of a suite solved by baselines and played by checkpoints
  baseline_cache.py  baseline results kept between evaluations, keyed by what they depend on
  baselines.py       the cheap baselines a training run compares with (its baselines.json)
  learning_curve.py  greedy evaluations over a training run (learning_curve.csv and .png)
  selection.py       the checkpoint a run reports, chosen on its training programs
  best_mappings.py   a training program's best mapping so far, validated, with its picture
  report.py          Markdown, CSV and JSON reports of an evaluation or a finished run
  plots.py           pictures: memory maps, speed-up bars, learning curves (matplotlib)
  console.py         the console tables of `evaluate` and `train` (rich)

The Launchpad wiring (malloczero.system) keeps a run's baselines, learning curve, best mappings
and final report with these modules and draws nothing itself; a baseline-only command (`solve
--plot`) draws with plots.py and never loads the wiring.
"""
