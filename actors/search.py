"""One jitted Gumbel MuZero search for a whole batch of games (mctx).

In evaluation mode the root's prior can be pulled toward msa's own move
(`SearchConfig.eval_msa_prior_logit`: added to the logit of the slot msa takes, which the msa
game's observation marks), so that the greedy search leaves msa only where its Q-values favour
another move by more than that. Training searches do not add it: their action weights are the
policy targets, and a bias fed back through them would grow each generation until the policy is
msa's (inside the tree the network's own prior is used either way: unrolled states have no
observation to read msa's move from).

The search call has fixed shapes (`[B, ...]` observations, `B` fixed per actor), so it is compiled
once per actor and never again. Illegal actions are masked at the root by mctx (`invalid_actions`)
and inside the tree by the networks' legality head (see learner/networks.py).
"""

from __future__ import annotations

import functools
from typing import Callable, NamedTuple

import chex
import jax
import jax.numpy as jnp
import mctx

from malloczero.configs.config import SearchConfig
from malloczero.env.game import GameConfig
from malloczero.learner.networks import (
  MuZeroNetworks,
  Params,
  logits_to_scalar,
  masked_policy_logits,
)


class SearchOutput(NamedTuple):
  action: chex.Array  # [B] int32: the move to play.
  action_weights: chex.Array  # [B, A]: the improved policy, the learner's policy target.
  root_value: chex.Array  # [B]: the search's value of the root, raw return units.


SearchFn = Callable[[Params, chex.PRNGKey, dict], SearchOutput]


def msa_action_mask(observation: dict, game: GameConfig) -> chex.Array:
  """`[B, A]` one-hot of the slot msa itself takes, read from the msa game's observation
  (`request[msa_takes_option0]` for slot 0, `candidates[:, msa_choice]` for the others)."""
  layout = game.layout
  option0 = observation["request"][:, layout.request.index("msa_takes_option0")]
  others = observation["candidates"][:, :, layout.candidate.index("msa_choice")]
  return jnp.concatenate([option0[:, None], others], axis=-1).astype(jnp.float32)


def make_search_fn(
  networks: MuZeroNetworks, search: SearchConfig, evaluation: bool = False, jit: bool = True
) -> SearchFn:
  """`search(params, rng, observation [B, ...]) -> SearchOutput`.

  Training mode samples root actions with Gumbel noise (exploration); evaluation mode uses
  `eval_num_simulations`, `eval_q_spread_floor` and no noise, so its choice is the deterministic,
  greedy one. With 0 simulations there is no search: the move is the network's policy alone (its
  legal argmax in evaluation mode, a sample from it with Gumbel noise otherwise), `action_weights`
  the policy and `root_value` the network's value, so that the network's own play can be
  reported apart from what the search adds (`evaluate --simulations 0`).
  """
  net_config = networks.config
  num_simulations = search.eval_num_simulations if evaluation else search.num_simulations
  gumbel_scale = 0.0 if evaluation else search.gumbel_scale
  # mctx rescales each node's completed Q-values to [0, 1] by their spread; a spread below the
  # floor is not stretched, so differences the model cannot resolve stay small policy changes.
  floor = search.eval_q_spread_floor if evaluation else search.q_spread_floor
  qtransform = functools.partial(mctx.qtransform_completed_by_mix_value, epsilon=max(floor, 1e-8))

  def recurrent_fn(params, rng, action, latent):
    del rng
    next_latent, reward_logits = networks.dynamics(params, latent, action)
    prediction = networks.predict(params, next_latent)
    output = mctx.RecurrentFnOutput(
      reward=logits_to_scalar(reward_logits, net_config),
      discount=jnp.ones(action.shape, jnp.float32),  # Episodic, undiscounted.
      prior_logits=masked_policy_logits(prediction),
      value=logits_to_scalar(prediction.value_logits, net_config),
    )
    return output, next_latent

  msa_bias = search.eval_msa_prior_logit if evaluation and networks.game.decisions == "msa" else 0.0

  def search_fn(params, rng, observation):
    latent = networks.represent(params, observation)
    prediction = networks.predict(params, latent)
    prior_logits = prediction.policy_logits
    if msa_bias:
      prior_logits = prior_logits + msa_bias * msa_action_mask(observation, networks.game)
    root_value = logits_to_scalar(prediction.value_logits, net_config)
    if num_simulations == 0:
      return _policy_alone(rng, prior_logits, observation["legal_actions"], root_value)
    root = mctx.RootFnOutput(prior_logits=prior_logits, value=root_value, embedding=latent)
    output = mctx.gumbel_muzero_policy(
      params,
      rng,
      root,
      recurrent_fn,
      num_simulations=num_simulations,
      invalid_actions=~observation["legal_actions"],
      max_num_considered_actions=search.max_num_considered_actions,
      gumbel_scale=gumbel_scale,
      qtransform=qtransform,
    )
    return SearchOutput(
      action=output.action.astype(jnp.int32),
      action_weights=output.action_weights,
      root_value=output.search_tree.summary().value,
    )

  def _policy_alone(rng, prior_logits, legal, root_value):
    logits = jnp.where(legal, prior_logits, -jnp.inf)
    noise = gumbel_scale * jax.random.gumbel(rng, logits.shape, logits.dtype)
    return SearchOutput(
      action=jnp.argmax(logits + noise, axis=-1).astype(jnp.int32),
      action_weights=jax.nn.softmax(logits, axis=-1),
      root_value=root_value,
    )

  return jax.jit(search_fn) if jit else search_fn
