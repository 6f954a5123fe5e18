#!/usr/bin/env python
"""Scores checkpoints' networks against the exact advantages of deviations from msa, per split of
a suite (research/score_deviations.py, whose docstring shows the uses).

  .venv/bin/python scripts/score_deviations.py --checkpoint runs/a runs/b --suite default
"""

from __future__ import annotations

import sys

from malloczero.research.score_deviations import main

if __name__ == "__main__":
  sys.exit(main())
