"""malloczero: the proposer, a network that proposes evo's request priorities.

REGAL (Paliwal et al., "Reinforced Genetic Algorithm Learning for Optimizing Computation Graphs",
ICLR 2020, section 3) lets a network propose per-node parameters that a heuristic decodes, and
refines around the proposals with a genetic algorithm; EGRL seeds its evolutionary population
with its policy's proposals. Here small MLPs (an ensemble, their chances averaged) see one of
evo's requests at a time and predict whether evo's best mapping places it, fitted with more weight
on the requests that save more; its play is one decode of what it proposes (the requests
it expects placed first), and the agent's guided search starts from that proposal. Why: the msa
game's network, fitted to exact one-move advantages, plays msa on programs it did not train on,
while this one carries (docs/results/README.md, "A network that proposes evo's priorities").

  features.py  `request_features`: `[R, F]` per request, in units that do not grow with the
               program and with nothing of any mapping
  network.py   `Proposer` (the MLPs, saved as a plain .npz), `fit`, `request_weights`,
               `proposal_genome` and its `neighbour_genomes`, `auc`
  labels.py    `label_program`, `Labels` (the committed corpus labels, `BUILTIN_LABELS`, one bit
               per request) and `labelled_programs`, the fit's input
  play.py      `propose` and `play_proposal`: the genome, and its one decode
  tuning.py    `tune`: the fitted members' last layers moved by evolution strategies on one
               decode's speed over msa, the measure the proposer's play is judged by

Where the rest of the system hooks in: system/training.py `fit_run_proposer` fits and tunes it
before a run trains (`proposer` section of the config) into WORKDIR/checkpoints/proposer.npz;
actors/agent.py `load_agent` loads it beside the checkpoint and `play_with_agent` plays it first
(`proposal_speedup`, reported apart as the network's own play) and seeds the guided search with it.
"""

from malloczero.learner.proposer.features import FEATURES, request_features, requests_of
from malloczero.learner.proposer.labels import (
  BUILTIN_LABELS,
  Labels,
  fingerprint,
  label_program,
  labelled_programs,
  labels_of,
)
from malloczero.learner.proposer.network import (
  HIDDEN,
  Proposer,
  auc,
  fit,
  neighbour_genomes,
  proposal_genome,
)
from malloczero.learner.proposer.play import play_proposal, propose
from malloczero.learner.proposer.tuning import TuningSettings, tune, tuning_targets

__all__ = [
  "BUILTIN_LABELS",
  "FEATURES",
  "HIDDEN",
  "Labels",
  "Proposer",
  "TuningSettings",
  "auc",
  "fingerprint",
  "fit",
  "label_program",
  "labelled_programs",
  "labels_of",
  "neighbour_genomes",
  "play_proposal",
  "proposal_genome",
  "propose",
  "request_features",
  "requests_of",
  "tune",
  "tuning_targets",
]
