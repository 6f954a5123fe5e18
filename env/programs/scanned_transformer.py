"""A decoder-only transformer's training step whose layers are one `lax.scan`, compiled by XLA.

This is how JAX language models are written (MaxText, Pax: the layers' weights stacked and the
stack scanned), so XLA's optimised module holds the whole network in two `while` loops (forward
and backward) of one trip per layer. `scanned_transformer_hlo(layers=100)` compiles it on the
CPU and returns the optimised, scheduled module's text, the program `bench` imports and maps to
measure the importer on loops at depth. bf16 weights and activations, one SGD step.
"""

from __future__ import annotations

import dataclasses


@dataclasses.dataclass(frozen=True)
class TransformerShape:
  """The network and batch: `layers` blocks of causal self-attention and a GELU MLP."""

  layers: int = 100
  width: int = 512
  heads: int = 8
  mlp: int = 2048
  sequence: int = 512
  batch: int = 4
  vocabulary: int = 8192


def _step_fn(shape: TransformerShape):
  import jax
  import jax.numpy as jnp

  def layer(x, w):
    wq, wk, wv, wo, w1, w2 = w
    b, s, d = x.shape
    h = shape.heads
    y = x / (jnp.sqrt(jnp.mean(jnp.square(x), axis=-1, keepdims=True)) + 1e-6)
    q, k, v = ((y @ m).reshape(b, s, h, d // h).transpose(0, 2, 1, 3) for m in (wq, wk, wv))
    scores = (q @ k.transpose(0, 1, 3, 2)) / jnp.sqrt(d // h).astype(x.dtype)
    causal = jnp.tril(jnp.ones((s, s), bool))
    attention = jax.nn.softmax(jnp.where(causal, scores, -1e4), axis=-1) @ v
    x = x + attention.transpose(0, 2, 1, 3).reshape(b, s, d) @ wo
    return x + jax.nn.gelu(x @ w1) @ w2, None

  def loss(params, tokens):
    embedding, stack = params
    x = embedding[tokens]
    x, _ = jax.lax.scan(layer, x, stack)
    logits = x @ embedding.T
    labels = jax.nn.one_hot(tokens, shape.vocabulary, dtype=logits.dtype)
    return -jnp.mean(jnp.sum(labels * jax.nn.log_softmax(logits), axis=-1))

  def step(params, tokens):
    grads = jax.grad(loss)(params, tokens)
    return jax.tree_util.tree_map(lambda p, g: p - 1e-3 * g, params, grads)

  return step


def scanned_transformer_hlo(shape: TransformerShape = TransformerShape()) -> str:
  """The optimised, scheduled HLO text of one training step, compiled by XLA on the CPU from
  abstract arguments (nothing is allocated)."""
  import jax
  import jax.numpy as jnp

  bf16 = lambda *dims: jax.ShapeDtypeStruct(dims, jnp.bfloat16)
  d, f, n = shape.width, shape.mlp, shape.layers
  params = (
    bf16(shape.vocabulary, d),
    (bf16(n, d, d), bf16(n, d, d), bf16(n, d, d), bf16(n, d, d), bf16(n, d, f), bf16(n, f, d)),
  )
  tokens = jax.ShapeDtypeStruct((shape.batch, shape.sequence), jnp.int32)
  with jax.default_device(jax.devices("cpu")[0]):
    return jax.jit(_step_fn(shape)).lower(params, tokens).compile().as_text()
