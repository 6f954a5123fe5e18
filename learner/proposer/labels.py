"""The proposer's labels: which requests evo's best mapping places, per program of a suite.

The labels come from the search itself (`label_program`: evo seeded with msa's mapping, run for a
few seconds), as expert iteration's apprentice learns from its expert (Anthony et al., "Thinking
Fast and Slow with Deep Learning and Tree Search", NeurIPS 2017). Collecting them on the training
corpus's 364 entries of at most 12,000 requests costs about 14 minutes of 2 cores, so they are
committed (`BUILTIN_LABELS`) and `malloczero train` fits the proposer from them. Only the placed
flags are stored, one bit per request: the features are recomputed from the program, whose
requests must still be the labelled ones (`fingerprint`); a changed program is refused rather
than fitted to another's labels.
"""

from __future__ import annotations

import dataclasses
import hashlib
import os
from typing import Callable, Optional, Sequence

import numpy as np

from malloczero.common.errors import MalloczeroError
from malloczero.env.hardware import Hardware
from malloczero.env.placement import Placement
from malloczero.env.requests import Requests
from malloczero.env.workload import Workload
from malloczero.learner.proposer.features import request_features, request_saving, requests_of
from malloczero.learner.proposer.network import Proposer, proposal_genome

BUILTIN_LABELS = os.path.join(os.path.dirname(__file__), "data", "corpus_labels.npz")
# The command that rewrites BUILTIN_LABELS: named by the error of a stale label.
COLLECT_COMMAND = "scripts/priority_proposer.py collect --suite corpus --out DIR"


def fingerprint(requests: Requests) -> str:
  """16 hex digits of the requests' sizes and windows: labels fit only the requests they label."""
  digest = hashlib.sha256()
  for column in (requests.size, requests.start, requests.end, requests.buffer):
    digest.update(np.ascontiguousarray(column, dtype=np.int64).tobytes())
  return digest.hexdigest()[:16]


def label_program(
  workload: Workload,
  hardware: Hardware,
  seconds: float,
  seed: int = 0,
  proposer: Optional[Proposer] = None,
) -> dict[str, np.ndarray]:
  """One program's labels: whether evo's best mapping (evo seeded with msa's mapping, run for
  `seconds`) places each of its `[R]` requests; with msa's and evo's speed-ups over all-slow, the
  decodes evo made and the requests' `fingerprint`; `features` `[R, F]` too.

  With a `proposer`, its proposal starts evo's population, before msa's mapping: expert
  iteration's next round, the expert's search seeded with the apprentice's play."""
  from malloczero.env.solvers import solve
  from malloczero.env.solvers.evo import evo, mapping_genomes

  model, requests = requests_of(workload, hardware)
  msa = solve(workload, hardware, "msa").mapping
  placement = Placement(model, requests)
  features = request_features(model, requests)
  initial = mapping_genomes(requests, msa, workload)
  if proposer is not None:
    initial.insert(0, proposal_genome(proposer.placed_chance(features)))
  info = evo(
    placement,
    evaluations=10**9,
    time_limit_s=seconds,
    seed=seed,
    initial=initial,
    initial_first=proposer is not None,
  )
  placed = np.zeros(len(requests), bool)
  placed[placement.request_indices()] = True
  return {
    "features": features,
    "saving": request_saving(requests),
    "placed": placed,
    "msa": np.float64(msa.speedup),
    "evo": np.float64(model.slow_only_time / placement.total_time),
    "evaluations": np.int64(info["evaluations"]),
    "fingerprint": np.str_(fingerprint(requests)),
  }


@dataclasses.dataclass(frozen=True)
class Labels:
  """Labelled programs of one suite: `entries` `[P]` names, `placed` `[P]` flag arrays `[R_p]`,
  `fingerprints` `[P]`, `msa` and `evo` `[P]` speed-ups over all-slow."""

  suite: str
  entries: tuple[str, ...]
  placed: tuple[np.ndarray, ...]
  fingerprints: tuple[str, ...]
  msa: np.ndarray
  evo: np.ndarray
  seconds: float

  def save(self, path: str) -> None:
    """One `.npz`, the flags packed to bits; written whole or not at all."""
    counts = np.array([len(p) for p in self.placed], np.int64)
    tmp = path + ".tmp.npz"
    np.savez_compressed(
      tmp,
      suite=np.str_(self.suite),
      entries=np.array(self.entries, dtype=str),
      counts=counts,
      placed_bits=np.packbits(np.concatenate(self.placed).astype(bool)),
      fingerprints=np.array(self.fingerprints, dtype=str),
      msa=np.asarray(self.msa, np.float64),
      evo=np.asarray(self.evo, np.float64),
      seconds=np.float64(self.seconds),
    )
    os.replace(tmp, path)

  @classmethod
  def load(cls, path: str) -> "Labels":
    """`save`'s file; anything else is a one-line MalloczeroError."""
    try:
      with np.load(path, allow_pickle=False) as saved:
        counts = saved["counts"]
        flags = np.unpackbits(saved["placed_bits"], count=int(counts.sum())).astype(bool)
        labels = cls(
          suite=str(saved["suite"]),
          entries=tuple(str(e) for e in saved["entries"]),
          placed=tuple(np.split(flags, np.cumsum(counts)[:-1])),
          fingerprints=tuple(str(f) for f in saved["fingerprints"]),
          msa=saved["msa"],
          evo=saved["evo"],
          seconds=float(saved["seconds"]),
        )
    except (OSError, ValueError, KeyError) as e:
      raise MalloczeroError(f"cannot read the labels '{path}' ({e})".replace("\n", " ")) from None
    if not len(labels.entries) == len(labels.fingerprints) == len(counts) == len(labels.msa):
      raise MalloczeroError(f"the labels '{path}' are inconsistent: one row per entry expected")
    return labels


def labels_of(
  suite: str, labelled: Sequence[tuple[str, dict[str, np.ndarray]]], seconds: float
) -> Labels:
  """`Labels` of `label_program`'s results, by entry name."""
  return Labels(
    suite=suite,
    entries=tuple(name for name, _ in labelled),
    placed=tuple(data["placed"] for _, data in labelled),
    fingerprints=tuple(str(data["fingerprint"]) for _, data in labelled),
    msa=np.array([float(data["msa"]) for _, data in labelled]),
    evo=np.array([float(data["evo"]) for _, data in labelled]),
    seconds=seconds,
  )


def labelled_programs(
  labels: Labels,
  max_programs: int = 0,
  seed: int = 0,
  progress: Optional[Callable[[int, int], None]] = None,
  placements: bool = False,
) -> list[dict]:
  """The labelled programs as `fit` takes them (`features` `[R, F]`, `saving` and `placed` `[R]`):
  all, or `max_programs` drawn with `seed`. Each program is loaded from its suite and must have
  the labelled requests; `progress(done, total)` after each. With `placements`, each also has
  the `placement` of its requests and `msa`, msa's speed-up over all-slow, which the tuning
  (tuning.py) decodes against."""
  from malloczero.env.programs.suites import get_suite

  by_name = {entry.name: entry for entry in get_suite(labels.suite).entries}
  rows = np.arange(len(labels.entries))
  if 0 < max_programs < len(rows):
    rows = np.sort(np.random.default_rng(seed).choice(rows, max_programs, replace=False))
  programs = []
  for done, row in enumerate(rows, 1):
    name = labels.entries[row]
    if name not in by_name:
      raise MalloczeroError(
        f"the proposer's labels name '{name}', which suite '{labels.suite}' no longer has: "
        f"collect them again ({COLLECT_COMMAND})"
      )
    workload, hardware = by_name[name].load()
    model, requests = requests_of(workload, hardware)
    if fingerprint(requests) != labels.fingerprints[row]:
      raise MalloczeroError(
        f"the proposer's labels of '{name}' are stale: its requests changed since they were "
        f"collected ({COLLECT_COMMAND})"
      )
    program = {
      "features": request_features(model, requests),
      "saving": request_saving(requests),
      "placed": labels.placed[row],
    }
    if placements:
      program.update(placement=Placement(model, requests), msa=float(labels.msa[row]))
    programs.append(program)
    if progress is not None:
      progress(done, len(rows))
  return programs
