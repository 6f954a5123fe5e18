#!/usr/bin/env python
"""Collects evo's placed flags, fits the request-priority proposer, decodes its proposals once and
seeds evo with them (research/priority_proposer.py, whose docstring says why).

  .venv/bin/python scripts/priority_proposer.py collect --suite corpus --out data/corpus
  .venv/bin/python scripts/priority_proposer.py fit --data data/corpus --seed 1 --out p1.npz
  .venv/bin/python scripts/priority_proposer.py decode --params p1.npz --suite realistic
  .venv/bin/python scripts/priority_proposer.py search --params p1.npz --suite realistic
"""

from __future__ import annotations

import sys

from malloczero.research.priority_proposer import main

if __name__ == "__main__":
  sys.exit(main())
