#!/usr/bin/env python
"""How much of evo-msa's gain over msa survives as XLA's own msa overrides, per entry of a suite
(research/xla_round_trip.py, whose docstring says how).

  .venv/bin/python scripts/xla_round_trip.py --suite default --time-limit 5 --out DIR
"""

from __future__ import annotations

import sys

from malloczero.research.xla_round_trip import main

if __name__ == "__main__":
  sys.exit(main())
