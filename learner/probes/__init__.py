"""malloczero: probes, exact one-move advantages over msa fitted as policy targets.

A probe is one decision of msa's game with the exact advantage over msa of every legal move
there: each move is played once and msa finishes the program, so no value estimate enters
(`prober.py` says why that matters). Probes need the msa game (`game.decisions == "msa"`).

The feature's own code is here:
  prober.py  `Prober`: draws a training program and a decision (on msa's trajectory, or for a
             share of the probes on the network's own, `greedy_policies`) and measures it
             (`Probe`); `one_move_advantages` and `advantages_after`, the measurements alone
  store.py   `ProbeStore`: the learner's ring of probed decisions, sampled into every batch
             and saved beside its checkpoint (`PROBES_FILENAME`, a plain `.npz`)
  loss.py    `probe_policy_loss`: the policy's cross-entropy to `advantage_targets`,
             softmax(advantage / temperature) over the legal moves

The config fields that steer it, all in the `probes` section (configs/config.py `ProbeConfig`,
`train --set probes.FIELD=VALUE`): `share` (the share of each actor's time spent probing; 0
turns probes off), `on_policy` (the share drawn along the network's trajectory), and `batch`,
`capacity`, `temperature`, `msa_margin`, `loss_weight` (the learner's side).

Where the rest of the system hooks in:
  actors    actors/actor.py `BatchedActor._probe_while_due` probes while below its share of the
            actor's time and sends each probe with `offer_probe`; system/builder.py
            `make_actor` gives the actor its `Prober`
  learner   learner/learner.py `MuZeroLearner.offer_probe` adds a probe to the store (through
            system/nodes.py `LearnerNode.offer_probe` in a Launchpad run), `MuZeroLearner.step`
            samples `probes.batch` of them, `make_sgd_step` adds `probe_policy_loss` to
            the MuZero loss, and `MuZeroLearner.save` / `restore` keep the store with the
            checkpoint; system/builder.py `make_probe_store` builds the store
"""

from malloczero.learner.probes.loss import advantage_targets, probe_policy_loss
from malloczero.learner.probes.prober import (
  Policy,
  Probe,
  Prober,
  ProgramSpec,
  advantages_after,
  greedy_policies,
  one_move_advantages,
)
from malloczero.learner.probes.store import PROBES_FILENAME, ProbeStore

__all__ = [
  "PROBES_FILENAME",
  "Policy",
  "Probe",
  "ProbeStore",
  "Prober",
  "ProgramSpec",
  "advantage_targets",
  "advantages_after",
  "greedy_policies",
  "one_move_advantages",
  "probe_policy_loss",
]
