#!/usr/bin/env python
"""Fits a network's prior to the exact advantages of probed decisions and scores it on the
held-out programs (research/fit_deviations.py, whose docstring shows the uses).

  .venv/bin/python scripts/fit_deviations.py --probed probed.npz --checkpoint runs/a
"""

from __future__ import annotations

import sys

from malloczero.research.fit_deviations import main

if __name__ == "__main__":
  sys.exit(main())
