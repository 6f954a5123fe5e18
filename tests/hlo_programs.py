"""Programs the importer's tests compile with XLA (shared by test_hlo_import*.py): a three-layer
MLP (inference and a training step) and a small CNN, as functions (the module fixtures are
test_hlo_import.py's)."""

import jax
import jax.numpy as jnp

BATCH = 8
DIMS = (32, 64, 64, 10)  # Three dense layers.


def _mlp(params, x):
  for w, b in params[:-1]:
    x = jax.nn.relu(x @ w + b)
  w, b = params[-1]
  return x @ w + b


def _loss(params, x, y):
  return jnp.mean((_mlp(params, x) - y) ** 2)


def _train_step(params, x, y):
  grads = jax.grad(_loss)(params, x, y)
  return jax.tree_util.tree_map(lambda p, g: p - 0.1 * g, params, grads)


def _mlp_args(batch=BATCH, dims=DIMS):
  params = [
    (jnp.ones((a, b), jnp.float32), jnp.ones((b,), jnp.float32))
    for a, b in zip(dims[:-1], dims[1:])
  ]
  return params, jnp.ones((batch, dims[0])), jnp.ones((batch, dims[-1]))


def _matmul_flops(batch=BATCH, dims=DIMS, training=False):
  """Forward: 2*B*in*out per layer. Backward: the weight gradient of every layer, and the
  input gradient of every layer but the first (x needs no gradient)."""
  layers = [2 * batch * a * b for a, b in zip(dims[:-1], dims[1:])]
  return sum(layers) + (sum(layers) + sum(layers[1:]) if training else 0)


def _conv(x, k, stride=1, groups=1):
  return jax.lax.conv_general_dilated(
    x,
    k,
    (stride, stride),
    "SAME",
    dimension_numbers=("NHWC", "HWIO", "NHWC"),
    feature_group_count=groups,
  )


def _cnn(params, x):
  h = jax.nn.relu(_conv(x, params[0]))
  h = jax.nn.relu(_conv(h, params[1], stride=2))
  return _conv(h, params[2], groups=4).mean()


CNN_PARAMS = [
  jax.ShapeDtypeStruct(s, jnp.float32) for s in [(3, 3, 3, 16), (3, 3, 16, 32), (3, 3, 8, 32)]
]
CNN_INPUT = jax.ShapeDtypeStruct((4, 32, 32, 3), jnp.float32)
# 2 * N * Ho * Wo * Cout * KH * KW * (Cin per group), per convolution.
CNN_CONV_FLOPS = [
  2 * 4 * 32 * 32 * 16 * 9 * 3,
  2 * 4 * 16 * 16 * 32 * 9 * 16,
  2 * 4 * 16 * 16 * 32 * 9 * 8,
]
