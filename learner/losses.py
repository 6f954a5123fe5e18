"""The MuZero loss: unroll the model K steps from a sampled state and fit every unrolled state.

A replay item holds `L = K + n + 1` consecutive steps (replay/types.py). From step 0 the learner
represents the observation, unrolls the dynamics with the stored actions 0..K-1 and, at each of
the K + 1 unrolled states k, fits:

  value   z_k = sum_{i<n} discount^i reward[k+i] valid[k+i]
                + discount^n valid[k+n] v_target(observation[k+n])      (0 at/after the terminal)
  reward  reward[k] for the dynamics step k -> k+1                     (0 after the terminal)
  policy  the search's action weights at k                             (real states only)
  legal   the game's legal mask at k                                   (real and terminal states)

`v_target` is the target network's value, except for demonstration items (`exact_values`, see
learner/demonstrations/), whose stored `root_value` is the exact return still to come. The
bootstrap is dropped when state k+n is the terminal state or padding (valid == 0): the
terminal value is 0 by definition, so only real states bootstrap. The target and the priorities
sent back to replay are replay/targets.py's, which the actors' replay writer also uses for its
initial priorities, so both are on one scale. Value and reward losses are still applied past the
end, with target 0, as in MuZero, so that the model learns that nothing more is to be had there.

Everything is in raw return units (normalised time saved); `scalar_to_probs` scales and
squashes for the categorical heads. The policy loss at probed decisions, which the learner's step
adds to this one, is learner/probes/loss.py's.
"""

from __future__ import annotations

from typing import Any

import chex
import jax
import jax.numpy as jnp
import optax

from malloczero.configs.config import LearnerConfig
from malloczero.learner.networks import (
  MuZeroNetworks,
  Params,
  logits_to_scalar,
  scalar_to_probs,
)
from malloczero.replay.targets import priority, value_targets
from malloczero.replay.types import Step

# MuZero halves the gradient entering the latent at each dynamics step, so the representation's
# gradient does not grow with the number of unroll steps.
DYNAMICS_GRADIENT_SCALE = 0.5


def scale_gradient(x: chex.Array, scale: float) -> chex.Array:
  """Identity in the forward pass; multiplies the gradient by `scale` in the backward pass."""
  return x * scale + jax.lax.stop_gradient(x) * (1.0 - scale)


def cross_entropy(logits: chex.Array, target_probs: chex.Array) -> chex.Array:
  """`[..., C]` logits and target distributions -> `[...]` cross-entropies."""
  return -jnp.sum(target_probs * jax.nn.log_softmax(logits), axis=-1)


def _take(tree: Any, index: Any) -> Any:
  return jax.tree_util.tree_map(lambda x: x[:, index], tree)


def muzero_loss(
  networks: MuZeroNetworks,
  params: Params,
  target_params: Params,
  steps: Step,
  importance_weights: chex.Array,
  config: LearnerConfig,
  exact_values: chex.Array | None = None,
) -> tuple[chex.Array, dict[str, chex.Array], chex.Array]:
  """The MuZero loss of one batch.

  Args:
    networks: the Haiku networks.
    params: online parameters (differentiated).
    target_params: parameters of the target network, used only for bootstrap values.
    steps: a `Step` with leaves `[B, L, ...]`, `L >= K + n + 1`.
    importance_weights: `[B]` per-item loss weights (prioritised replay correction).
    config: uses `unroll_steps`, `td_steps`, `discount`, `value_loss_weight`,
      `policy_loss_weight` and `legality_loss_weight`.
    exact_values: `[B]` bool, items whose stored `root_value`s are exact returns to go
      (demonstrations): their bootstrap values are those instead of the target network's.

  Returns:
    (loss, metrics, priorities): the importance-weighted mean loss (scalar), a dict of scalar
    metrics, and the new priorities `[B]` = |z_0 - predicted value at state 0| + epsilon in raw
    units.
  """
  k_steps, n = config.unroll_steps, config.td_steps
  net_cfg = networks.config
  batch_size = steps.valid.shape[0]
  valid = steps.valid.astype(jnp.float32)  # [B, L]
  rewards = steps.reward.astype(jnp.float32)  # [B, L]

  # Bootstrap values of states n .. n+K with the target network, all in one batched call.
  boot_obs = jax.tree_util.tree_map(
    lambda x: x[:, n : n + k_steps + 1].reshape((batch_size * (k_steps + 1),) + x.shape[2:]),
    steps.observation,
  )
  boot_pred = networks.predict(target_params, networks.represent(target_params, boot_obs))
  boot = logits_to_scalar(boot_pred.value_logits, net_cfg).reshape(batch_size, k_steps + 1)
  if exact_values is not None:
    stored = steps.root_value[:, n : n + k_steps + 1].astype(jnp.float32)
    boot = jnp.where(exact_values[:, None], stored, boot)
  bootstrap_values = jnp.zeros_like(rewards).at[:, n : n + k_steps + 1].set(boot)
  z = value_targets(rewards, valid, bootstrap_values, k_steps, n, config.discount)  # [B, K+1]
  z = jax.lax.stop_gradient(z)

  # Unroll the model from state 0 with the actions that were taken (0 past the end, as stored).
  # A scan rather than a Python loop: the dynamics and prediction graphs compile once, not K times.
  latent = networks.represent(params, _take(steps.observation, 0))
  root = networks.predict(params, latent)

  def unroll(latent, action):
    latent, r_logits = networks.dynamics(params, latent, action)
    latent = scale_gradient(latent, DYNAMICS_GRADIENT_SCALE)
    return latent, (networks.predict(params, latent), r_logits)

  actions = jnp.swapaxes(steps.action[:, :k_steps].astype(jnp.int32), 0, 1)  # [K, B]
  _, (unrolled, reward_logits) = jax.lax.scan(unroll, latent, actions)
  join = lambda first, rest: jnp.concatenate([first[:, None], jnp.swapaxes(rest, 0, 1)], 1)
  policy_logits = join(root.policy_logits, unrolled.policy_logits)  # [B, K+1, A]
  value_logits = join(root.value_logits, unrolled.value_logits)  # [B, K+1, S]
  legality_logits = join(root.legality_logits, unrolled.legality_logits)  # [B, K+1, A]
  reward_logits = jnp.swapaxes(reward_logits, 0, 1)  # [B, K, S]

  # Value: every unrolled state, target 0 at and past the terminal.
  value_loss = cross_entropy(value_logits, scalar_to_probs(z, net_cfg)).mean(-1)  # [B]

  # Reward: every dynamics step; the terminal state and padding carry reward 0.
  if k_steps:
    reward_targets = rewards[:, :k_steps] * valid[:, :k_steps]
    reward_loss = cross_entropy(reward_logits, scalar_to_probs(reward_targets, net_cfg)).mean(
      -1
    )  # [B]
  else:
    reward_loss = jnp.zeros((batch_size,), jnp.float32)

  # Policy: only where a search ran (real states); averaged over all K + 1 states like the others
  # so that every unroll step carries the same weight.
  policy_mask = valid[:, : k_steps + 1]  # [B, K+1]
  policy_target = steps.policy[:, : k_steps + 1].astype(jnp.float32)
  policy_ce = cross_entropy(policy_logits, policy_target)  # [B, K+1]
  policy_loss = (policy_ce * policy_mask).sum(-1) / (k_steps + 1)  # [B]

  # Legality: real states and the terminal state; padding has no legal action at all (action 0 is
  # always legal in a real or terminal state), which is how it is told apart.
  legal = steps.observation["legal_actions"][:, : k_steps + 1].astype(jnp.float32)  # [B, K+1, A]
  legality_mask = (legal.max(-1) > 0).astype(jnp.float32)  # [B, K+1]
  legality_bce = optax.sigmoid_binary_cross_entropy(legality_logits, legal).mean(-1)  # [B, K+1]
  legality_loss = (legality_bce * legality_mask).sum(-1) / (k_steps + 1)  # [B]

  per_item = (
    config.value_loss_weight * value_loss
    + reward_loss
    + config.policy_loss_weight * policy_loss
    + config.legality_loss_weight * legality_loss
  )  # [B]
  loss = jnp.mean(importance_weights.astype(jnp.float32) * per_item)

  predicted_value = logits_to_scalar(value_logits[:, 0], net_cfg)  # [B]
  priorities = priority(z[:, 0], predicted_value)
  priorities = jax.lax.stop_gradient(priorities)

  # Diagnostics.
  log_policy = jax.nn.log_softmax(policy_logits[:, 0])
  entropy = -jnp.sum(jnp.exp(log_policy) * log_policy, -1)  # [B]
  root_mask = valid[:, 0]
  correct = ((legality_logits > 0) == (legal > 0.5)).astype(jnp.float32).mean(-1)  # [B, K+1]
  safe_div = lambda a, b: a / jnp.maximum(b, 1.0)
  metrics = {
    "loss": loss,
    "unweighted_loss": per_item.mean(),
    "value_loss": value_loss.mean(),
    "reward_loss": reward_loss.mean(),
    "policy_loss": policy_loss.mean(),
    "legality_loss": legality_loss.mean(),
    "value_target": z[:, 0].mean(),
    "value_prediction": predicted_value.mean(),
    "value_error": jnp.abs(z[:, 0] - predicted_value).mean(),
    # What the value error is measured against: the typical size of a target (with the advantage
    # reward, of an advantage over msa); the value resolves advantages only while it is smaller.
    "value_target_abs": jnp.abs(z[:, 0]).mean(),
    "policy_entropy": safe_div((entropy * root_mask).sum(), root_mask.sum()),
    "legality_accuracy": safe_div((correct * legality_mask).sum(), legality_mask.sum()),
    "priority": priorities.mean(),
  }
  return loss, metrics, priorities
