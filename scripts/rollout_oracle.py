#!/usr/bin/env python
"""Plays the rollout oracle (the ceiling of the probes' targets) through a suite's programs
(research/rollout_oracle.py, whose docstring says why).

  .venv/bin/python scripts/rollout_oracle.py --suite default --split heldout --out oracle.csv
"""

from __future__ import annotations

import sys

from malloczero.research.rollout_oracle import main

if __name__ == "__main__":
  sys.exit(main())
