"""malloczero: demonstrations, the best game known per training program, in every learner batch.

A demonstration is one complete game of a training program, kept as its moves: at first msa's
own play, then any faster game an actor or an evaluation offers. Each learner batch holds
windows of them beside the replay items, fitted to their moves (behaviour cloning) and to
their exact returns (`store.py` says why).

The feature's own code is here:
  store.py  `Demonstrations`: the best `Demonstration` per program, replayed from its moves on
            `offer` (`demonstration_steps`; msa's own play from `heuristic_actions`), sampled
            as windows, saved beside the checkpoint (`DEMONSTRATIONS_FILENAME`, JSON)
  batch.py  `mix_demonstrations`: a batch's demonstration windows after its sampled items;
            `demonstration_metrics`: what the learner logs of them

The config fields that steer it: `learner.demonstration_fraction` (the share of each batch;
0 turns demonstrations off, `learner.demonstration_batch` is the count) and
`learner.demonstration_departures` (the share of windows placed where a demonstration leaves
msa's move).

Where the rest of the system hooks in:
  actors    actors/actor.py `BatchedActor._maybe_offer` offers a finished game that beat the
            best return known for its program, through `offer` (the learner's
            `offer_demonstration`); system/training.py `LearningCurve` offers the evaluation's
            games of the training programs
  learner   learner/learner.py `MuZeroLearner.offer_demonstration` (through system/nodes.py
            `LearnerNode.offer_demonstration` in a Launchpad run), `MuZeroLearner.step` (calls
            `mix_demonstrations` and `demonstration_metrics`), `MuZeroLearner.save` /
            `restore` (with the checkpoint); learner/losses.py `muzero_loss` bootstraps the
            items marked `exact_values` with their stored returns
  system    system/builder.py `make_demonstrations` builds the store, with `write_best_mapping`
            writing each program's best mapping to the work directory's best/, and
            `make_learner` adds msa's play of every program in a background thread
"""

from malloczero.learner.demonstrations.batch import demonstration_metrics, mix_demonstrations
from malloczero.learner.demonstrations.store import (
  DEMONSTRATIONS_FILENAME,
  RETURN_TOLERANCE,
  Demonstration,
  Demonstrations,
  demonstration_steps,
  heuristic_actions,
  read_demonstrations,
)

__all__ = [
  "DEMONSTRATIONS_FILENAME",
  "Demonstration",
  "Demonstrations",
  "RETURN_TOLERANCE",
  "demonstration_metrics",
  "demonstration_steps",
  "heuristic_actions",
  "mix_demonstrations",
  "read_demonstrations",
]
