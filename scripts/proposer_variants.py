#!/usr/bin/env python
"""Changes to the proposer's play aimed at its worst entries, measured and not adopted
(research/proposer_variants.py, whose docstring says why).

  .venv/bin/python scripts/proposer_variants.py chances --seed 1 --out cv1.npz
  .venv/bin/python scripts/proposer_variants.py decode --chances cv1.npz --out corpus1.csv
  .venv/bin/python scripts/proposer_variants.py stack --chances cv1.npz --params p1.npz --seed 1 \
      --out stacked1
"""

from __future__ import annotations

import sys

from malloczero.research.proposer_variants import main

if __name__ == "__main__":
  sys.exit(main())
