"""The learner's fit at probed decisions: the policy's cross-entropy to targets built from each
legal move's exact advantage over msa (learner/probes/prober.py).

The learner's step (learner/learner.py `make_sgd_step`) adds `probe_policy_loss`, weighted by
`probes.loss_weight`, to the MuZero loss of each batch once the probe store holds any.
"""

from __future__ import annotations

import chex
import jax
import jax.numpy as jnp

from malloczero.learner.losses import cross_entropy
from malloczero.learner.networks import ILLEGAL_LOGIT, MuZeroNetworks, Params


def advantage_targets(
  advantages: chex.Array,
  legal: chex.Array,
  temperature: float,
  msa_actions: chex.Array | None = None,
  msa_margin: float = 0.0,
) -> chex.Array:
  """`[N, A]` exact advantages over msa and legal masks -> `[N, A]` policy targets:
  softmax(advantage / temperature) over the legal moves, 0 elsewhere, msa's moves `[N]` raised
  by `msa_margin` first."""
  if msa_actions is not None:
    advantages = advantages + msa_margin * jax.nn.one_hot(msa_actions, advantages.shape[-1])
  scores = jnp.where(legal, advantages / temperature, -jnp.inf)
  return jax.nn.softmax(scores, axis=-1)


def probe_policy_loss(
  networks: MuZeroNetworks,
  params: Params,
  observation: dict[str, chex.Array],
  advantages: chex.Array,
  msa_actions: chex.Array,
  temperature: float,
  msa_margin: float = 0.0,
) -> tuple[chex.Array, dict[str, chex.Array]]:
  """The policy's cross-entropy to `advantage_targets` at probed decisions (the prober's),
  msa's move's advantage raised by `msa_margin` in the targets.

  Args:
    observation: the decisions' observations, leaves `[P, ...]`.
    advantages: `[P, A]` each move's exact advantage over msa (0 at illegal slots).
    msa_actions: `[P]` msa's move at each.
    temperature: of the targets' softmax, in advantage units.
    msa_margin: a move other than msa's is preferred only where it gains more than this: many
      moves tie msa's exactly at a decision, and a whole game's departures at ties take it
      into states no probe was drawn from.

  Returns:
    (mean loss, metrics): among them what the policy's legal argmax would earn there
    (`probe_pick_advantage`) against the best move (`probe_best_advantage`).
  """
  legal = observation["legal_actions"] > 0
  advantages = advantages.astype(jnp.float32)
  logits = networks.predict(params, networks.represent(params, observation)).policy_logits
  logits = jnp.where(legal, logits, ILLEGAL_LOGIT)
  target = advantage_targets(advantages, legal, temperature, msa_actions, msa_margin)
  loss = cross_entropy(logits, target).mean()
  pick = jnp.take_along_axis(advantages, jnp.argmax(logits, -1)[:, None], -1)[:, 0]
  best = jnp.max(jnp.where(legal, advantages, -jnp.inf), -1)
  return loss, {
    "probe_policy_loss": loss,
    "probe_pick_advantage": pick.mean(),
    "probe_best_advantage": best.mean(),
  }
