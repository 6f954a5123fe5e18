"""Reanalyse: fresh policy targets for replayed actor states, from a search with the learner's
current parameters (MuZero Reanalyse: Schrittwieser et al. 2021, "Online and Offline
Reinforcement Learning by Planning with a Learned Model", section 3 and appendix A; the value
half of it, bootstrapping with the target network, is the loss's own: learner/losses.py).

Why: an actor's stored target is the search of the parameters it held when it played, which
falls behind as the learner moves on (a replay of 100,000 items holds minutes of play); a search
with the current parameters gives the policy a target from what the network knows now.

What keeps its stored target:
* self-imitation targets: msa's move, one-hot, written where a game that did not beat msa left
  it (actors/actor.py `_write_episode`; a one-hot target on a move other than the one played).
  They say what msa does; a search of the network must not overwrite them, or the departures
  self-imitation keeps out of the targets would come back through reanalyse;
* states that are not real (the terminal state and padding: no search target at all);
* demonstrations (the learner reanalyses only the items it samples from replay).
"""

from __future__ import annotations

from typing import Any, Callable, NamedTuple

import chex
import jax
import jax.numpy as jnp

from malloczero.learner.networks import Observation, Params

# A stored target at least this peaked on a move other than the one played is a self-imitation
# target (a search's own weights put at most about 1 - 1e-3 on one move of several legal ones).
ONE_HOT = 1.0 - 1e-6


class ReanalyseOutput(NamedTuple):
  policy: chex.Array  # [R, T, A]: the targets, fresh where `reanalysed`, stored elsewhere.
  reanalysed: chex.Array  # [R, T] bool: the states whose target the search replaced.
  shift: chex.Array  # [R, T]: total variation between stored and fresh targets (0 if kept).


# The actors' training search, unjitted: `(params, rng, observation [N, ...])` -> an output with
# `action_weights [N, A]` (actors/search.py `make_search_fn(..., evaluation=False, jit=False)`;
# the system's builder passes it in, as the learner does not import the actors).
SearchFn = Callable[[Params, chex.PRNGKey, Observation], Any]

ReanalyseFn = Callable[
  [Params, chex.PRNGKey, Observation, chex.Array, chex.Array, chex.Array], ReanalyseOutput
]


def self_imitation_targets(policy: chex.Array, action: chex.Array) -> chex.Array:
  """`[R, T]` bool: states whose stored target `[R, T, A]` is one-hot on a move other than the
  one played `[R, T]` (msa's move where the game left it)."""
  played = jnp.take_along_axis(policy, action[..., None].astype(jnp.int32), -1)[..., 0]
  return (policy.max(-1) >= ONE_HOT) & (played < ONE_HOT)


def make_reanalyse_fn(search_fn: SearchFn) -> ReanalyseFn:
  """Jitted `(params, rng, observation [R, T, ...], policy [R, T, A], action [R, T], valid
  [R, T]) -> ReanalyseOutput`: `search_fn` (the actors' training search: its simulations and
  Gumbel noise) run on all R x T states at once."""

  def reanalyse(params, rng, observation, policy, action, valid):
    rows, length = valid.shape
    flat = jax.tree_util.tree_map(lambda x: x.reshape((rows * length,) + x.shape[2:]), observation)
    fresh = search_fn(params, rng, flat).action_weights.reshape(policy.shape)
    replace = (valid > 0) & ~self_imitation_targets(policy, action)
    targets = jnp.where(replace[..., None], fresh, policy)
    shift = 0.5 * jnp.abs(targets - policy).sum(-1)
    return ReanalyseOutput(targets, replace, shift)

  return jax.jit(reanalyse)
