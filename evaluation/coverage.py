"""Whether a training corpus covers the programs a model is judged on: per-program features in
units that do not grow with the program, their quantiles per suite, and the share of evaluation
programs inside the corpus's range of each feature (`scripts/corpus_coverage.py` prints them)."""

from __future__ import annotations

import dataclasses
from typing import Callable, Mapping, Sequence

import numpy as np

from malloczero.env.workload import Workload


@dataclasses.dataclass(frozen=True)
class Feature:
  name: str
  description: str
  measure: Callable[[Workload], float]


def _bytes_moved_per_op(w: Workload) -> np.ndarray:
  """[T] bytes each op reads and writes."""
  a = w.arrays
  return np.bincount(a.incidence_op, weights=a.incidence_bytes, minlength=w.num_ops)


def _lifetimes(w: Workload) -> np.ndarray:
  """[N] each buffer's live range as a share of the program's ops."""
  a = w.arrays
  return (a.live_end - a.live_start) / max(1, w.num_ops)


def _intensity(w: Workload) -> float:
  moved = _bytes_moved_per_op(w)
  keep = moved > 0
  return float(np.median(np.log10(np.maximum(w.arrays.flops[keep], 1.0) / moved[keep])))


FEATURES: tuple[Feature, ...] = (
  Feature("buffers", "buffers (log10)", lambda w: float(np.log10(w.num_buffers))),
  Feature("ops_per_buffer", "ops per buffer", lambda w: w.num_ops / w.num_buffers),
  Feature(
    "peak_mib", "peak live bytes, MiB (log10)", lambda w: float(np.log10(w.peak_live_bytes / 2**20))
  ),
  Feature(
    "median_size_of_peak",
    "median buffer size over peak live bytes (log10)",
    lambda w: float(np.log10(np.median(w.arrays.sizes) / w.peak_live_bytes)),
  ),
  Feature(
    "largest_of_peak",
    "largest buffer over peak live bytes",
    lambda w: float(w.arrays.sizes.max() / w.peak_live_bytes),
  ),
  Feature(
    "prefetched_bytes",
    "share of bytes in parameters and inputs",
    lambda w: float(w.arrays.sizes[w.arrays.is_prefetched].sum() / w.arrays.sizes.sum()),
  ),
  Feature(
    "uses_per_buffer",
    "ops touching a buffer, mean",
    lambda w: len(w.arrays.incidence_op) / w.num_buffers,
  ),
  Feature(
    "median_lifetime",
    "median live range, share of the program (log10)",
    lambda w: float(np.log10(max(np.median(_lifetimes(w)), 1e-6))),
  ),
  Feature(
    "long_lived",
    "share of buffers live over more than 10% of the program",
    lambda w: float(np.mean(_lifetimes(w) > 0.1)),
  ),
  Feature(
    "live_buffers",
    "buffers live at an op, mean (log10)",
    lambda w: float(np.log10(max(1e-9, np.sum(_lifetimes(w))))),
  ),
  Feature("intensity", "flops per byte moved, median over ops (log10)", _intensity),
)
QUANTILES = (0.05, 0.5, 0.95)


def program_features(workload: Workload) -> dict[str, float]:
  """{feature name: value} for one program (`FEATURES`)."""
  return {f.name: float(f.measure(workload)) for f in FEATURES}


def coverage(
  corpus: Sequence[Mapping[str, float]], evaluated: Mapping[str, Sequence[Mapping[str, float]]]
) -> list[dict]:
  """Per feature: the corpus's and each evaluated suite's quantiles (`QUANTILES`) over its
  programs, and the share of each evaluated suite's programs within the corpus's [min, max].

  `corpus` and `evaluated[suite]` hold `program_features` dicts, one per program."""
  rows = []
  for f in FEATURES:
    values = np.array([p[f.name] for p in corpus])
    row = {"feature": f.name, "description": f.description}
    row["corpus"] = np.quantile(values, QUANTILES).tolist()
    for suite, programs in evaluated.items():
      theirs = np.array([p[f.name] for p in programs])
      row[suite] = np.quantile(theirs, QUANTILES).tolist()
      row[f"{suite}_inside"] = float(np.mean((theirs >= values.min()) & (theirs <= values.max())))
    rows.append(row)
  return rows


def coverage_markdown(rows: list[dict], suites: Sequence[str]) -> str:
  """The table of `coverage`: quantiles as `5% / 50% / 95%`, and the share inside the corpus's
  range per evaluated suite."""
  fmt = lambda q: " / ".join(f"{v:.3g}" for v in q)
  header = ["feature", "corpus"] + list(suites) + [f"{s} inside" for s in suites]
  lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
  for row in rows:
    cells = [row["description"], fmt(row["corpus"])] + [fmt(row[s]) for s in suites]
    cells += [f"{row[f'{s}_inside']:.0%}" for s in suites]
    lines.append("| " + " | ".join(cells) + " |")
  return "\n".join(lines) + "\n"
