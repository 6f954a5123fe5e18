#!/usr/bin/env python
"""Prints how the training corpus covers the programs the agent is judged on: per-feature
quantiles (5% / 50% / 95%) over the programs of `corpus` against the default suite's held-out
split, `foreign` and `realistic`, and the share of each suite's programs inside the corpus's
range (evaluation/coverage.py).

  .venv/bin/python scripts/corpus_coverage.py --out docs/results/corpus/coverage.md
"""

from __future__ import annotations

import argparse
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from malloczero.common.files import write_text  # noqa: E402
from malloczero.env.programs.suites import WORKLOAD_DIR, get_suite  # noqa: E402
from malloczero.env.workload_json import load_workload  # noqa: E402
from malloczero.evaluation.coverage import (  # noqa: E402
  coverage,
  coverage_markdown,
  program_features,
)

EVALUATED = {"default held-out": ("default", "heldout"), "foreign": ("foreign", "all")}
EVALUATED["realistic"] = ("realistic", "all")


def _features(suite: str, split: str) -> list[dict[str, float]]:
  programs = sorted({e.program for e in get_suite(suite).split(split).entries})
  return [
    program_features(load_workload(os.path.join(WORKLOAD_DIR, f"{p}.json.gz"))) for p in programs
  ]


def main() -> int:
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("--out", help="also write the table (markdown) here")
  args = parser.parse_args()
  corpus = _features("corpus", "train")
  evaluated = {name: _features(*where) for name, where in EVALUATED.items()}
  counts = ", ".join(f"{name} {len(v)}" for name, v in evaluated.items())
  text = (
    f"Programs: corpus {len(corpus)}, {counts}. Quantiles 5% / 50% / 95% over programs; "
    "*inside*: the share of the suite's programs within the corpus's [min, max].\n\n"
    + coverage_markdown(coverage(corpus, evaluated), list(evaluated))
  )
  print(text, end="")
  if args.out:
    write_text(args.out, text)
  return 0


if __name__ == "__main__":
  sys.exit(main())
