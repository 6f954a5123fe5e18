"""The proposer's own play: one decode of the genome it proposes, no search and no msa mapping."""

from __future__ import annotations

import numpy as np

from malloczero.env.cost_model import CostModel
from malloczero.env.placement import Placement
from malloczero.env.requests import Requests
from malloczero.env.solvers.evo import decode
from malloczero.learner.proposer.features import request_features
from malloczero.learner.proposer.network import Proposer, proposal_genome


def propose(proposer: Proposer, model: CostModel, requests: Requests) -> np.ndarray:
  """`[R]` the priority genome the network proposes for `requests`."""
  return proposal_genome(proposer.placed_chance(request_features(model, requests)))


def play_proposal(proposer: Proposer, placement: Placement) -> tuple[np.ndarray, np.ndarray]:
  """Decodes the proposal into `placement` (which then holds its mapping); returns the genome
  `[R]` and the network's chances `[R]` it came from."""
  chance = proposer.placed_chance(request_features(placement.model, placement.requests))
  genome = proposal_genome(chance)
  decode(placement, genome)
  return genome, chance
