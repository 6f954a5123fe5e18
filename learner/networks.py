"""MuZero networks in Haiku: representation, dynamics and prediction.

The representation reads the observation as tokens (the current request, one token per fast level's
occupancy profile, the K candidate placements, the look-ahead requests and, when the game observes
it, one token per fast level's pressure, env/game/pressure.py) through a small pre-norm
transformer encoder, so that candidates are compared with each other and with what is coming rather
than flattened into one vector. Dynamics and prediction are residual MLPs on the latent state; they
run once per search simulation, so they are kept cheap.

Value and reward heads are categorical: scalars `x` (raw units: normalised time saved) are encoded
as
`two_hot(signed_hyperbolic(value_scale * x))` over `support_size` bins on `[-limit, limit]`,
both written to keep float32 precision on small values (`signed_hyperbolic` below says why).

Illegal actions inside the search tree: mctx masks only the root. The prediction network has a
legality head `[B, A]` trained (binary cross-entropy) against the game's legal masks of the unrolled
states; `masked_policy_logits` pushes the prior of actions it predicts illegal to a large negative
number, which under Gumbel MuZero's deterministic interior selection means they are never expanded.
Action 0 (leave the buffer in slow memory) is always legal, so a node always has a legal child.
"""

from __future__ import annotations

from typing import Any, Callable, NamedTuple

import chex
import haiku as hk
import jax
import jax.numpy as jnp
import numpy as np

from malloczero.configs.config import NetworkConfig
from malloczero.env.game import GameConfig

Params = Any
Observation = dict[str, chex.Array]

ILLEGAL_LOGIT = -1e9


class Prediction(NamedTuple):
  policy_logits: chex.Array  # [B, A]
  value_logits: chex.Array  # [B, S]
  legality_logits: chex.Array  # [B, A]


class MuZeroNetworks(NamedTuple):
  """Pure functions over one parameter tree (hk.multi_transform).

  init(rng, observation [B, ...]) -> params
  represent(params, observation [B, ...]) -> latent [B, D]
  predict(params, latent [B, D]) -> Prediction
  dynamics(params, latent [B, D], action [B] int) -> (next latent [B, D], reward logits [B, S])
  """

  init: Callable[[chex.PRNGKey, Observation], Params]
  represent: Callable[[Params, Observation], chex.Array]
  predict: Callable[[Params, chex.Array], Prediction]
  dynamics: Callable[[Params, chex.Array, chex.Array], tuple[chex.Array, chex.Array]]
  config: NetworkConfig
  game: GameConfig


# ------------------------------------------------------------------------------ value transform

# The value transform h (Pohlen et al. 2018, "Observe and Look Further"; rlax.signed_hyperbolic) and
# the two-hot encoding, written so that float32 keeps the small numbers this game is made of (median
# reward 2.6e-5 on the default suite, 41% below 1e-5; docs/results/archive.md 3.7): rlax's h
# computes sqrt(|x| + 1) - 1 and its inverse a difference of two numbers near 500, both cancelling
# (a perfect two-hot of 1e-6 decoded to -6.1e-6), and rlax's two-hot adds 1e-5 to a denominator.
TRANSFORM_EPS = 1e-3


def signed_hyperbolic(x: chex.Array, eps: float = TRANSFORM_EPS) -> chex.Array:
  """h(x) = sign(x) (sqrt(|x| + 1) - 1) + eps x, with sqrt(|x| + 1) - 1 as |x| / (sqrt(|x| + 1)
  + 1), which has no cancellation."""
  magnitude = jnp.abs(x)
  return jnp.sign(x) * magnitude / (jnp.sqrt(magnitude + 1.0) + 1.0) + eps * x


def signed_parabolic(y: chex.Array, eps: float = TRANSFORM_EPS) -> chex.Array:
  """The inverse of `signed_hyperbolic`: with s = sqrt(|x| + 1) - 1, |x| = s (s + 2) and |y| =
  eps s^2 + (1 + 2 eps) s, so s is that quadratic's positive root, taken in the form
  2 |y| / (b + sqrt(b^2 + 4 eps |y|)) (b = 1 + 2 eps), which has no cancellation."""
  magnitude = jnp.abs(y)
  b = 1.0 + 2.0 * eps
  s = 2.0 * magnitude / (b + jnp.sqrt(b * b + 4.0 * eps * magnitude))
  return jnp.sign(y) * s * (s + 2.0)


def _support(config: NetworkConfig) -> np.ndarray:
  """[S] the bins' values (float64 linspace, so the middle bin of an odd support is ~0)."""
  return np.linspace(-config.support_limit, config.support_limit, config.support_size).astype(
    np.float32
  )


def scalar_to_probs(x: chex.Array, config: NetworkConfig) -> chex.Array:
  """Raw-unit scalars `[...]` -> two-hot probabilities `[..., S]`: the mass split between the
  two bins around h(value_scale x), each bin's share its distance from the other bin's value
  (measured from those values, not from the support's end, so a small value keeps its
  precision; the shares sum to 1 up to float32 rounding)."""
  support = jnp.asarray(_support(config))
  size = config.support_size
  width = 2.0 * config.support_limit / (size - 1)
  scaled = jnp.clip(
    signed_hyperbolic(config.value_scale * x), -config.support_limit, config.support_limit
  )
  lower = jnp.clip(jnp.floor((scaled + config.support_limit) / width), 0, size - 2)
  lower = lower.astype(jnp.int32)
  # The division above rounds (3 - 5e-8 is 3 in float32): step to the bin that holds `scaled`.
  lower = jnp.where(scaled < support[lower], lower - 1, lower)
  lower = jnp.clip(
    jnp.where(scaled > support[jnp.clip(lower + 1, 0, size - 1)], lower + 1, lower), 0, size - 2
  )
  # Each share from its own distance (not 1 - the other), so that the small one is exact.
  upper_share = jnp.clip((scaled - support[lower]) / width, 0.0, 1.0)
  lower_share = jnp.clip((support[lower + 1] - scaled) / width, 0.0, 1.0)
  return (
    jax.nn.one_hot(lower, size, dtype=scaled.dtype) * lower_share[..., None]
    + jax.nn.one_hot(lower + 1, size, dtype=scaled.dtype) * upper_share[..., None]
  )


def logits_to_scalar(logits: chex.Array, config: NetworkConfig) -> chex.Array:
  """Categorical logits `[..., S]` -> raw-unit scalars `[...]`."""
  scaled = jnp.sum(jax.nn.softmax(logits) * jnp.asarray(_support(config)), axis=-1)
  return signed_parabolic(scaled) / config.value_scale


def masked_policy_logits(prediction: Prediction) -> chex.Array:
  """Policy logits `[B, A]` with predicted-illegal actions removed (action 0 always kept)."""
  legal = prediction.legality_logits > 0.0
  legal = legal.at[:, 0].set(True)
  return jnp.where(legal, prediction.policy_logits, ILLEGAL_LOGIT)


# ------------------------------------------------------------------------------ modules


def _min_max_normalise(x: chex.Array) -> chex.Array:
  """Scale each latent to [0, 1], as in MuZero, so dynamics unrolls keep a fixed range."""
  low = x.min(axis=-1, keepdims=True)
  high = x.max(axis=-1, keepdims=True)
  return (x - low) / jnp.maximum(high - low, 1e-5)


class _EncoderLayer(hk.Module):
  def __init__(self, config: NetworkConfig, name: str | None = None):
    super().__init__(name=name)
    self._config = config

  def __call__(self, tokens: chex.Array) -> chex.Array:  # [B, T, d] -> [B, T, d]
    d = self._config.d_model
    heads = self._config.num_heads
    normed = hk.LayerNorm(-1, True, True)(tokens)
    attention = hk.MultiHeadAttention(
      heads, d // heads, w_init=hk.initializers.VarianceScaling(1.0), model_size=d
    )
    tokens = tokens + attention(normed, normed, normed)
    normed = hk.LayerNorm(-1, True, True)(tokens)
    return tokens + hk.nets.MLP([2 * d, d])(normed)


def _tokens(observation: Observation, config: NetworkConfig, game: GameConfig) -> chex.Array:
  """Embeds each observation part as tokens `[B, 1 + F + K + M (+ F), d]` with a type/slot
  embedding (the last F: the pressure, when the game observes it)."""
  d = config.d_model
  request = hk.Linear(d, name="embed_request")(observation["request"])[:, None]  # [B, 1, d]
  occupancy = hk.Linear(d, name="embed_occupancy")(observation["occupancy"])  # [B, F, d]
  candidates = hk.Linear(d, name="embed_candidates")(observation["candidates"])  # [B, K, d]
  lookahead = hk.Linear(d, name="embed_lookahead")(observation["lookahead"])  # [B, M, d]
  parts = [request, occupancy, candidates, lookahead]
  if game.pressure_bins:  # msa's fill over the segment and the program, a token per level.
    parts.append(hk.Linear(d, name="embed_pressure")(observation["pressure"]))  # [B, F, d]
  tokens = jnp.concatenate(parts, axis=1)
  # One learned embedding per slot: tells levels, candidate ranks and look-ahead distance apart.
  slots = hk.get_parameter(
    "slot_embedding", (tokens.shape[1], d), init=hk.initializers.TruncatedNormal(0.02)
  )
  return tokens + slots[None]


def _representation(
  observation: Observation, config: NetworkConfig, game: GameConfig
) -> chex.Array:
  tokens = _tokens(observation, config, game)
  for i in range(config.num_layers):
    tokens = _EncoderLayer(config, name=f"encoder_{i}")(tokens)
  tokens = hk.LayerNorm(-1, True, True, name="encoder_norm")(tokens)
  # A narrow projection per token keeps which-candidate-is-which without a huge flatten.
  narrow = hk.Linear(8, name="token_projection")(tokens)  # [B, T, 8]
  flat = narrow.reshape(narrow.shape[0], -1)
  pooled = tokens.mean(axis=1)
  latent = hk.Linear(config.latent_dim, name="to_latent")(jnp.concatenate([flat, pooled], -1))
  return _min_max_normalise(latent)


def _residual_mlp(x: chex.Array, hidden: int, name: str) -> chex.Array:
  with hk.experimental.name_scope(name):
    h = hk.LayerNorm(-1, True, True)(x)
    h = hk.nets.MLP([hidden, x.shape[-1]])(h)
  return x + h


def _dynamics(
  latent: chex.Array, action: chex.Array, config: NetworkConfig, game: GameConfig
) -> tuple[chex.Array, chex.Array]:
  one_hot = jax.nn.one_hot(action, game.num_actions, dtype=latent.dtype)
  x = hk.Linear(config.latent_dim, name="dynamics_in")(jnp.concatenate([latent, one_hot], -1))
  x = jax.nn.relu(x)
  x = _residual_mlp(x, config.hidden_dim, "dynamics_block")
  next_latent = _min_max_normalise(latent + hk.Linear(config.latent_dim, name="dynamics_out")(x))
  reward_logits = hk.nets.MLP([config.hidden_dim // 2, config.support_size], name="reward_head")(x)
  return next_latent, reward_logits


def _prediction(latent: chex.Array, config: NetworkConfig, game: GameConfig) -> Prediction:
  x = jax.nn.relu(hk.Linear(config.hidden_dim, name="prediction_in")(latent))
  x = _residual_mlp(x, config.hidden_dim, "prediction_block")
  policy = hk.Linear(game.num_actions, name="policy_head", w_init=jnp.zeros)(x)
  value = hk.Linear(config.support_size, name="value_head", w_init=jnp.zeros)(x)
  legality = hk.Linear(game.num_actions, name="legality_head")(x)
  return Prediction(policy, value, legality)


def make_networks(config: NetworkConfig, game: GameConfig) -> MuZeroNetworks:
  """Builds the three MuZero functions sharing one parameter tree."""
  if config.d_model % config.num_heads:
    raise ValueError(f"d_model {config.d_model} is not divisible by num_heads {config.num_heads}")

  def forward():
    def represent(observation):
      return _representation(observation, config, game)

    def predict(latent):
      return _prediction(latent, config, game)

    def dynamics(latent, action):
      return _dynamics(latent, action, config, game)

    def init(observation):
      latent = represent(observation)
      next_latent, _ = dynamics(latent, jnp.zeros(latent.shape[:1], jnp.int32))
      return predict(next_latent)

    return init, (represent, predict, dynamics)

  transformed = hk.without_apply_rng(hk.multi_transform(forward))
  represent, predict, dynamics = transformed.apply
  return MuZeroNetworks(
    init=transformed.init,
    represent=represent,
    predict=predict,
    dynamics=dynamics,
    config=config,
    game=game,
  )
