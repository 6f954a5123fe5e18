"""malloczero: research (see docs/design.md): analyses of what a trained network knows, apart from
the training system and its reports.

  deviation_scores.py  exact one-move advantages over msa at sampled decisions, and a network's
                       prior and model scored against them
  score_deviations.py  the scoring run over checkpoints and a suite (scripts/score_deviations.py)
  fit_deviations.py    a prior fitted by supervision alone to those advantages
                       (scripts/fit_deviations.py)
"""
