"""A zoo of real ML models built with Haiku, whose jitted programs XLA compiles into workloads.

`build_program(name, batch, train)` returns `(fn, example_args)` such that
`jax.jit(fn).lower(*example_args).compile()` is the program; `compiled_hlo_text(...)` returns that
program's optimised, scheduled HLO text (the input of `env.programs.hlo_import`).

Programs
  * Inference (`train=False`): `fn(params, inputs) -> outputs`, the forward pass in evaluation
    mode (batch norm uses its moving averages).
  * Training (`train=True`): one full training step
    `fn(params, opt_state, inputs, targets) -> (new_params, new_opt_state, loss)`: the forward
    pass in training mode, `jax.value_and_grad` of a real loss, and an optax update (Adam, or
    SGD with momentum 0.9 for the classic image classifiers and the MLP, as each is usually
    trained; see `optimizer` in the registry). The output `new_params` / `new_opt_state` have
    the same tree structure, shapes and dtypes as the inputs `params` / `opt_state`.

`params`
  Created by `hk.transform_with_state(...).init` (so `example_args` hold real float32 arrays).
  For a model without mutable state (no batch norm) `params` is Haiku's ordinary parameter
  mapping. For a model with batch norm (`resnet50`, `mobilenet`) it is
  `{"params": <trainable parameters>, "state": <batch-norm moving statistics>}` (the state
  also holds Haiku's int32 moving-average step counters): the training
  step differentiates the first and returns the updated second, and the optimiser state covers
  the trainable parameters only.

Inputs are int32 token/id arrays or float32 arrays, generated from `seed` with numpy; targets
are int32 labels (or float32 regression targets for `gru`). No model uses dropout or any other
randomness inside the step, so programs are deterministic functions of their arguments.

Sizes are modest so that XLA on a 2-core CPU compiles each program in seconds (images of
32x32 or 64x64, reduced depth or width where a model's description says so), but each
architecture keeps its real structure. `tiny=True` builds a very small version of every model
(one or two layers, narrow widths) that compiles in about a second, for tests; `TINY_MODELS`
describes those.
"""

from __future__ import annotations

import dataclasses
import math
from typing import Any, Callable, Mapping

import haiku as hk
import jax
import jax.numpy as jnp
import numpy as np
import optax

from malloczero.common.errors import WorkloadError


@dataclasses.dataclass(frozen=True)
class ModelSpec:
  """One model of the zoo: what `build_program(name, ...)` builds."""

  name: str  # e.g. "resnet50"
  family: str  # "convnet", "transformer", "recurrent", "mlp" or "recommender"
  description: str
  default_batches: tuple[int, int]  # two batch sizes used by the suites, e.g. (1, 8)
  supports_training: bool


# ------------------------------------------------------------------------------------------------
# Shared building blocks.


def _trunc(stddev: float = 0.02) -> hk.initializers.Initializer:
  return hk.initializers.TruncatedNormal(stddev=stddev)


def _layer_norm(name: str | None = None) -> hk.LayerNorm:
  return hk.LayerNorm(axis=-1, create_scale=True, create_offset=True, name=name)


def _attention(d_model: int, num_heads: int, name: str) -> hk.MultiHeadAttention:
  return hk.MultiHeadAttention(
    num_heads=num_heads,
    key_size=d_model // num_heads,
    model_size=d_model,
    w_init=_trunc(),
    name=name,
  )


def _feed_forward(x: jax.Array, d_ff: int, activation: Callable, name: str) -> jax.Array:
  with hk.name_scope(name):
    d_model = x.shape[-1]
    h = hk.Linear(d_ff, w_init=_trunc(), name="fc1")(x)
    h = activation(h)
    return hk.Linear(d_model, w_init=_trunc(), name="fc2")(h)


def _post_ln_layer(x, mask, d_ff, num_heads, name, memory=None, memory_mask=None):
  """Original (BERT / 'Attention is all you need') layer: sublayer -> residual add -> LayerNorm."""
  d_model = x.shape[-1]
  with hk.name_scope(name):
    x = _layer_norm("ln_attn")(x + _attention(d_model, num_heads, "self_attn")(x, x, x, mask))
    if memory is not None:
      attn = _attention(d_model, num_heads, "cross_attn")(x, memory, memory, memory_mask)
      x = _layer_norm("ln_cross")(x + attn)
    return _layer_norm("ln_ffn")(x + _feed_forward(x, d_ff, jax.nn.gelu, "ffn"))


def _pre_ln_layer(x, mask, d_ff, num_heads, name):
  """GPT-2 / ViT layer: LayerNorm -> sublayer -> residual add."""
  d_model = x.shape[-1]
  with hk.name_scope(name):
    h = _layer_norm("ln_attn")(x)
    x = x + _attention(d_model, num_heads, "self_attn")(h, h, h, mask)
    h = _layer_norm("ln_ffn")(x)
    return x + _feed_forward(h, d_ff, jax.nn.gelu, "ffn")


def _causal_mask(length: int) -> jax.Array:
  return jnp.tril(jnp.ones((1, 1, length, length), dtype=bool))


def _sinusoid(length: int, d_model: int) -> np.ndarray:
  position = np.arange(length)[:, None]
  div = np.exp(np.arange(0, d_model, 2) * (-math.log(10000.0) / d_model))
  table = np.zeros((length, d_model), np.float32)
  table[:, 0::2] = np.sin(position * div)
  table[:, 1::2] = np.cos(position * div)
  return table


def _xent(logits: jax.Array, labels: jax.Array, weights: jax.Array | None = None) -> jax.Array:
  losses = optax.softmax_cross_entropy_with_integer_labels(logits, labels)
  if weights is None:
    return jnp.mean(losses)
  return jnp.sum(losses * weights) / jnp.maximum(jnp.sum(weights), 1.0)


# ------------------------------------------------------------------------------------------------
# The models. Each is a `_Model`: a Haiku forward function `forward(cfg, inputs, is_training)`, a
# batch maker `make_batch(cfg, batch, rng) -> (inputs, targets)`, a loss
# `loss(cfg, outputs, targets)`, an optimiser, and a full-size and a tiny config.


@dataclasses.dataclass(frozen=True)
class _Model:
  name: str
  family: str
  description: str
  tiny_description: str
  default_batches: tuple[int, int]
  forward: Callable[[Mapping[str, Any], Any, bool], Any]
  make_batch: Callable[[Mapping[str, Any], int, np.random.Generator], tuple[Any, Any]]
  loss: Callable[[Mapping[str, Any], Any, Any], jax.Array]
  optimizer: str  # "adam" or "sgd" (momentum 0.9)
  learning_rate: float
  full: Mapping[str, Any]
  tiny: Mapping[str, Any]
  supports_training: bool = True


def _images(cfg, batch, rng):
  size, classes = cfg["image_size"], cfg["num_classes"]
  x = rng.standard_normal((batch, size, size, 3), dtype=np.float32)
  y = rng.integers(0, classes, size=(batch,), dtype=np.int32)
  return x, y


def _classification_loss(cfg, logits, labels):
  del cfg
  return _xent(logits, labels)


# --- resnet50 -------------------------------------------------------------------------------------


def _resnet_forward(cfg, images, is_training):
  net = hk.nets.ResNet(
    blocks_per_group=cfg["blocks"],
    num_classes=cfg["num_classes"],
    bottleneck=True,
    channels_per_group=cfg["channels"],
    use_projection=(True,) * len(cfg["blocks"]),
    name="resnet",
  )
  return net(images, is_training=is_training)


_RESNET50 = _Model(
  name="resnet50",
  family="convnet",
  description=(
    "ResNet-50 v1 (hk.nets.ResNet: 7x7 stem, max-pool, bottleneck blocks [3,4,6,3] "
    "with widths 256-2048, batch norm, 1000-way head) on 64x64 RGB images"
  ),
  tiny_description=(
    "ResNet with bottleneck blocks [1,1,1,1], widths 16-128, 32x32 images, 10 classes"
  ),
  default_batches=(1, 8),
  forward=_resnet_forward,
  make_batch=_images,
  loss=_classification_loss,
  optimizer="sgd",
  learning_rate=0.1,
  full=dict(blocks=(3, 4, 6, 3), channels=(256, 512, 1024, 2048), image_size=64, num_classes=1000),
  tiny=dict(blocks=(1, 1, 1, 1), channels=(16, 32, 64, 128), image_size=32, num_classes=10),
)


# --- mobilenet ------------------------------------------------------------------------------------


def _mobilenet_forward(cfg, images, is_training):
  net = hk.nets.MobileNetV1(
    strides=cfg["strides"],
    channels=cfg["channels"],
    num_classes=cfg["num_classes"],
    use_bn=True,
    name="mobilenet_v1",
  )
  return net(images, is_training=is_training)


_MOBILENET = _Model(
  name="mobilenet",
  family="convnet",
  description=(
    "MobileNet v1 (hk.nets.MobileNetV1: 13 depthwise-separable conv blocks, widths "
    "64-1024, batch norm, global average pool, 1000-way head) on 64x64 RGB images"
  ),
  tiny_description="MobileNet v1 with 3 depthwise-separable blocks (widths 16-64), 32x32 images",
  default_batches=(1, 8),
  forward=_mobilenet_forward,
  make_batch=_images,
  loss=_classification_loss,
  optimizer="sgd",
  learning_rate=0.05,
  full=dict(
    strides=(1, 2, 1, 2, 1, 2, 1, 1, 1, 1, 1, 2, 1),
    channels=(64, 128, 128, 256, 256, 512, 512, 512, 512, 512, 512, 1024, 1024),
    image_size=64,
    num_classes=1000,
  ),
  tiny=dict(strides=(1, 2, 2), channels=(16, 32, 64), image_size=32, num_classes=10),
)


# --- vgg ------------------------------------------------------------------------------------------


def _vgg_forward(cfg, images, is_training):
  del is_training
  x = images
  conv_index = 0
  for width in cfg["layers"]:
    if width == "M":
      x = hk.max_pool(x, window_shape=(1, 2, 2, 1), strides=(1, 2, 2, 1), padding="VALID")
    else:
      x = jax.nn.relu(hk.Conv2D(width, 3, name=f"conv{conv_index}")(x))
      conv_index += 1
  x = hk.Flatten()(x)
  for i, width in enumerate(cfg["classifier"]):
    x = jax.nn.relu(hk.Linear(width, name=f"fc{i}")(x))
  return hk.Linear(cfg["num_classes"], name="logits")(x)


_VGG = _Model(
  name="vgg",
  family="convnet",
  description=(
    "VGG-16 (13 3x3 convs in 5 stages with widths 64-512 and max-pools, no batch "
    "norm) on 32x32 RGB images with the CIFAR-style classifier 512-512-10"
  ),
  tiny_description="VGG-style net: convs 8-M-16-M-32-M, classifier 32-10, 16x16 images",
  default_batches=(1, 8),
  forward=_vgg_forward,
  make_batch=_images,
  loss=_classification_loss,
  optimizer="sgd",
  learning_rate=0.01,
  full=dict(
    layers=(64, 64, "M", 128, 128, "M", 256, 256, 256, "M", 512, 512, 512, "M", 512, 512, 512, "M"),
    classifier=(512, 512),
    image_size=32,
    num_classes=10,
  ),
  tiny=dict(layers=(8, "M", 16, "M", 32, "M"), classifier=(32,), image_size=16, num_classes=10),
)


# --- unet -----------------------------------------------------------------------------------------


def _unet_forward(cfg, images, is_training):
  del is_training

  def double_conv(x, width, name):
    with hk.name_scope(name):
      x = jax.nn.relu(hk.Conv2D(width, 3, name="conv1")(x))
      return jax.nn.relu(hk.Conv2D(width, 3, name="conv2")(x))

  x = images
  skips = []
  widths = cfg["widths"]
  for level, width in enumerate(widths[:-1]):
    x = double_conv(x, width, f"down{level}")
    skips.append(x)
    x = hk.max_pool(x, window_shape=(1, 2, 2, 1), strides=(1, 2, 2, 1), padding="VALID")
  x = double_conv(x, widths[-1], "bottleneck")
  for level in reversed(range(len(widths) - 1)):
    width = widths[level]
    x = hk.Conv2DTranspose(width, kernel_shape=2, stride=2, name=f"upconv{level}")(x)
    x = jnp.concatenate([skips[level], x], axis=-1)
    x = double_conv(x, width, f"up{level}")
  return hk.Conv2D(cfg["num_classes"], 1, name="head")(x)


def _segmentation_batch(cfg, batch, rng):
  size, classes = cfg["image_size"], cfg["num_classes"]
  x = rng.standard_normal((batch, size, size, 3), dtype=np.float32)
  y = rng.integers(0, classes, size=(batch, size, size), dtype=np.int32)
  return x, y


_UNET = _Model(
  name="unet",
  family="convnet",
  description=(
    "U-Net (4 down levels of two 3x3 convs + max-pool with widths 32-256, a 512-wide "
    "bottleneck, 4 up levels of 2x2 transposed conv + skip concat + two 3x3 convs, "
    "1x1 head; half the original widths) segmenting 64x64 RGB images into 4 classes"
  ),
  tiny_description="U-Net with 1 down/up level (widths 8, 16), 16x16 images, 2 classes",
  default_batches=(1, 8),
  forward=_unet_forward,
  make_batch=_segmentation_batch,
  loss=_classification_loss,
  optimizer="adam",
  learning_rate=1e-3,
  full=dict(widths=(32, 64, 128, 256, 512), image_size=64, num_classes=4),
  tiny=dict(widths=(8, 16), image_size=16, num_classes=2),
)


# --- wavenet --------------------------------------------------------------------------------------


def _wavenet_forward(cfg, samples, is_training):
  """Mu-law sample ids -> one-hot -> causal conv -> gated dilated residual stacks -> skip head."""
  del is_training
  res, skip, levels = cfg["residual_channels"], cfg["skip_channels"], cfg["quantization"]
  x = jax.nn.one_hot(samples, levels, dtype=jnp.float32)
  x = hk.Conv1D(res, 2, padding=hk.pad.causal, name="causal_conv")(x)
  skip_sum = 0.0
  for stack in range(cfg["stacks"]):
    for i in range(cfg["layers_per_stack"]):
      with hk.name_scope(f"block_{stack}_{i}"):
        dilation = 2**i
        h = hk.Conv1D(2 * res, 2, rate=dilation, padding=hk.pad.causal, name="dilated")(x)
        filt, gate = jnp.split(h, 2, axis=-1)
        h = jnp.tanh(filt) * jax.nn.sigmoid(gate)
        skip_sum = skip_sum + hk.Conv1D(skip, 1, name="skip")(h)
        x = x + hk.Conv1D(res, 1, name="residual")(h)
  h = jax.nn.relu(skip_sum)
  h = jax.nn.relu(hk.Conv1D(skip, 1, name="head1")(h))
  return hk.Conv1D(levels, 1, name="head2")(h)


def _wavenet_batch(cfg, batch, rng):
  ids = rng.integers(0, cfg["quantization"], size=(batch, cfg["length"] + 1), dtype=np.int32)
  return ids[:, :-1], ids[:, 1:]


_WAVENET = _Model(
  name="wavenet",
  family="convnet",
  description=(
    "WaveNet (one-hot 256-level mu-law input, causal conv, 2 stacks of 8 gated "
    "dilated causal conv layers with dilations 1-128, 64 residual / 128 skip "
    "channels, 2-layer 1x1 head) predicting the next sample of 1024-sample audio"
  ),
  tiny_description=(
    "WaveNet with 1 stack of 3 dilated layers, 8/16 channels, 32 levels, 64 samples"
  ),
  default_batches=(1, 8),
  forward=_wavenet_forward,
  make_batch=_wavenet_batch,
  loss=_classification_loss,
  optimizer="adam",
  learning_rate=1e-3,
  full=dict(
    residual_channels=64,
    skip_channels=128,
    quantization=256,
    stacks=2,
    layers_per_stack=8,
    length=1024,
  ),
  tiny=dict(
    residual_channels=8, skip_channels=16, quantization=32, stacks=1, layers_per_stack=3, length=64
  ),
)


# --- bert -----------------------------------------------------------------------------------------


def _bert_forward(cfg, inputs, is_training):
  del is_training
  d, vocab, length = cfg["d_model"], cfg["vocab"], cfg["seq_len"]
  tokens, segments = inputs["tokens"], inputs["segments"]
  embed = hk.Embed(vocab, d, w_init=_trunc(), name="token_embed")
  positions = hk.get_parameter("position_embed", [length, d], init=_trunc())
  segment_embed = hk.Embed(2, d, w_init=_trunc(), name="segment_embed")
  x = embed(tokens) + positions[None] + segment_embed(segments)
  x = _layer_norm("embed_ln")(x)
  mask = (tokens > 0)[:, None, None, :]  # padding mask: token id 0 is [PAD]
  for i in range(cfg["layers"]):
    x = _post_ln_layer(x, mask, cfg["d_ff"], cfg["heads"], f"layer_{i}")
  # Masked-LM head: dense + gelu + LayerNorm, then the output projection tied to the embedding.
  with hk.name_scope("mlm_head"):
    h = jax.nn.gelu(hk.Linear(d, w_init=_trunc(), name="transform")(x))
    h = _layer_norm("ln")(h)
    bias = hk.get_parameter("output_bias", [vocab], init=jnp.zeros)
    return jnp.einsum("bsd,vd->bsv", h, embed.embeddings) + bias


def _bert_batch(cfg, batch, rng):
  length, vocab = cfg["seq_len"], cfg["vocab"]
  labels = rng.integers(1, vocab, size=(batch, length), dtype=np.int32)
  masked = rng.random((batch, length)) < 0.15
  masked[:, 0] = True  # at least one prediction per sequence
  tokens = np.where(masked, 3, labels).astype(np.int32)  # id 3 plays [MASK]
  segments = (np.arange(length)[None, :] >= length // 2).astype(np.int32).repeat(batch, 0)
  inputs = {"tokens": tokens, "segments": segments}
  targets = {"labels": labels, "weights": masked.astype(np.float32)}
  return inputs, targets


def _bert_loss(cfg, logits, targets):
  del cfg
  return _xent(logits, targets["labels"], targets["weights"])


_BERT = _Model(
  name="bert",
  family="transformer",
  description=(
    "BERT-style encoder (token + position + segment embeddings, 4 post-LN layers of "
    "4-head self-attention and a GELU MLP, d=256, d_ff=1024, vocab 8192; BERT-Mini "
    "size) with a tied masked-LM head, on 128-token sequences"
  ),
  tiny_description="BERT-style encoder, 1 layer, d=32, 2 heads, vocab 64, 16 tokens",
  default_batches=(1, 8),
  forward=_bert_forward,
  make_batch=_bert_batch,
  loss=_bert_loss,
  optimizer="adam",
  learning_rate=1e-4,
  full=dict(layers=4, d_model=256, heads=4, d_ff=1024, vocab=8192, seq_len=128),
  tiny=dict(layers=1, d_model=32, heads=2, d_ff=64, vocab=64, seq_len=16),
)


# --- gpt ------------------------------------------------------------------------------------------


def _gpt_forward(cfg, tokens, is_training):
  del is_training
  d, vocab, length = cfg["d_model"], cfg["vocab"], cfg["seq_len"]
  embed = hk.Embed(vocab, d, w_init=_trunc(), name="token_embed")
  positions = hk.get_parameter("position_embed", [length, d], init=_trunc(0.01))
  x = embed(tokens) + positions[None]
  mask = _causal_mask(length)
  for i in range(cfg["layers"]):
    x = _pre_ln_layer(x, mask, 4 * d, cfg["heads"], f"layer_{i}")
  x = _layer_norm("final_ln")(x)
  return jnp.einsum("bsd,vd->bsv", x, embed.embeddings)  # LM head tied to the embedding


def _lm_batch(cfg, batch, rng):
  ids = rng.integers(0, cfg["vocab"], size=(batch, cfg["seq_len"] + 1), dtype=np.int32)
  return ids[:, :-1], ids[:, 1:]


_GPT = _Model(
  name="gpt",
  family="transformer",
  description=(
    "GPT-2-style decoder (token + learned position embeddings, 4 pre-LN layers of "
    "causal 4-head self-attention and a GELU MLP, d=256, vocab 8192, final "
    "LayerNorm, tied LM head) predicting the next token of 128-token sequences"
  ),
  tiny_description="GPT-style decoder, 1 layer, d=32, 2 heads, vocab 64, 16 tokens",
  default_batches=(1, 8),
  forward=_gpt_forward,
  make_batch=_lm_batch,
  loss=_classification_loss,
  optimizer="adam",
  learning_rate=3e-4,
  full=dict(layers=4, d_model=256, heads=4, vocab=8192, seq_len=128),
  tiny=dict(layers=1, d_model=32, heads=2, vocab=64, seq_len=16),
)


# --- vit ------------------------------------------------------------------------------------------


def _vit_forward(cfg, images, is_training):
  del is_training
  d, patch = cfg["d_model"], cfg["patch"]
  x = hk.Conv2D(d, kernel_shape=patch, stride=patch, padding="VALID", name="patch_embed")(images)
  batch = x.shape[0]
  x = x.reshape(batch, -1, d)
  cls = hk.get_parameter("cls_token", [1, 1, d], init=jnp.zeros)
  x = jnp.concatenate([jnp.broadcast_to(cls, (batch, 1, d)), x], axis=1)
  x = x + hk.get_parameter("position_embed", [1, x.shape[1], d], init=_trunc())
  for i in range(cfg["layers"]):
    x = _pre_ln_layer(x, None, 4 * d, cfg["heads"], f"layer_{i}")
  x = _layer_norm("final_ln")(x)
  return hk.Linear(cfg["num_classes"], name="head")(x[:, 0])


_VIT = _Model(
  name="vit",
  family="transformer",
  description=(
    "Vision Transformer (4x4 patch embedding, class token, learned position "
    "embeddings, pre-LN encoder with ViT-Tiny widths d=192, 3 heads, MLP 768, "
    "depth reduced 12 -> 6, classifier on the class token) on 32x32 RGB images, "
    "100 classes"
  ),
  tiny_description="ViT with 1 layer, d=32, 2 heads, 8x8 patches of 16x16 images",
  default_batches=(1, 8),
  forward=_vit_forward,
  make_batch=_images,
  loss=_classification_loss,
  optimizer="adam",
  learning_rate=1e-3,
  full=dict(layers=6, d_model=192, heads=3, patch=4, image_size=32, num_classes=100),
  tiny=dict(layers=1, d_model=32, heads=2, patch=8, image_size=16, num_classes=10),
)


# --- mlp_mixer ------------------------------------------------------------------------------------


def _mixer_forward(cfg, images, is_training):
  del is_training
  c, patch = cfg["channels"], cfg["patch"]
  x = hk.Conv2D(c, kernel_shape=patch, stride=patch, padding="VALID", name="stem")(images)
  x = x.reshape(x.shape[0], -1, c)  # [batch, tokens, channels]
  for i in range(cfg["layers"]):
    with hk.name_scope(f"mixer_block_{i}"):
      h = _layer_norm("ln_token")(x)
      h = jnp.swapaxes(h, 1, 2)  # mix across tokens
      h = _feed_forward(h, cfg["token_mlp"], jax.nn.gelu, "token_mixing")
      x = x + jnp.swapaxes(h, 1, 2)
      h = _layer_norm("ln_channel")(x)
      x = x + _feed_forward(h, cfg["channel_mlp"], jax.nn.gelu, "channel_mixing")
  x = _layer_norm("pre_head_ln")(x)
  return hk.Linear(cfg["num_classes"], name="head")(jnp.mean(x, axis=1))


_MLP_MIXER = _Model(
  name="mlp_mixer",
  family="mlp",
  description=(
    "MLP-Mixer (4x4 patch stem, 8 mixer blocks of token-mixing MLP 128 and "
    "channel-mixing MLP 1024 with LayerNorm and residuals, 256 channels; Mixer-S "
    "depth with half its widths, global average pool head) on 32x32 RGB images"
  ),
  tiny_description="MLP-Mixer with 1 block, 16 channels, 8x8 patches of 16x16 images",
  default_batches=(1, 8),
  forward=_mixer_forward,
  make_batch=_images,
  loss=_classification_loss,
  optimizer="adam",
  learning_rate=1e-3,
  full=dict(
    layers=8, channels=256, token_mlp=128, channel_mlp=1024, patch=4, image_size=32, num_classes=100
  ),
  tiny=dict(
    layers=1, channels=16, token_mlp=8, channel_mlp=32, patch=8, image_size=16, num_classes=10
  ),
)


# --- transformer_seq2seq --------------------------------------------------------------------------


def _seq2seq_forward(cfg, inputs, is_training):
  del is_training
  d, vocab = cfg["d_model"], cfg["vocab"]
  source, target_in = inputs["source"], inputs["target_in"]
  embed = hk.Embed(vocab, d, w_init=_trunc(d**-0.5), name="shared_embed")
  scale = math.sqrt(d)
  src = embed(source) * scale + _sinusoid(source.shape[1], d)[None]
  tgt = embed(target_in) * scale + _sinusoid(target_in.shape[1], d)[None]
  src_mask = (source > 0)[:, None, None, :]
  with hk.name_scope("encoder"):
    for i in range(cfg["layers"]):
      src = _post_ln_layer(src, src_mask, cfg["d_ff"], cfg["heads"], f"layer_{i}")
  causal = _causal_mask(target_in.shape[1])
  with hk.name_scope("decoder"):
    for i in range(cfg["layers"]):
      tgt = _post_ln_layer(
        tgt, causal, cfg["d_ff"], cfg["heads"], f"layer_{i}", memory=src, memory_mask=src_mask
      )
  return jnp.einsum("bsd,vd->bsv", tgt, embed.embeddings)


def _seq2seq_batch(cfg, batch, rng):
  vocab = cfg["vocab"]
  source = rng.integers(1, vocab, size=(batch, cfg["src_len"]), dtype=np.int32)
  target = rng.integers(1, vocab, size=(batch, cfg["tgt_len"] + 1), dtype=np.int32)
  return {"source": source, "target_in": target[:, :-1]}, target[:, 1:]


_SEQ2SEQ = _Model(
  name="transformer_seq2seq",
  family="transformer",
  description=(
    "Encoder-decoder Transformer ('Attention is all you need': shared embeddings, "
    "sinusoidal positions, post-LN, 3 encoder + 3 decoder layers with cross-"
    "attention, d=256, 4 heads, d_ff=1024, vocab 8000; base depth halved) "
    "translating 64-token sources with teacher-forced 64-token targets"
  ),
  tiny_description="Encoder-decoder Transformer, 1+1 layers, d=32, 2 heads, vocab 64, 8 tokens",
  default_batches=(1, 8),
  forward=_seq2seq_forward,
  make_batch=_seq2seq_batch,
  loss=_classification_loss,
  optimizer="adam",
  learning_rate=3e-4,
  full=dict(layers=3, d_model=256, heads=4, d_ff=1024, vocab=8000, src_len=64, tgt_len=64),
  tiny=dict(layers=1, d_model=32, heads=2, d_ff=64, vocab=64, src_len=8, tgt_len=8),
)


# --- lstm (static unroll) ------------------------------------------------------------------------


def _lstm_forward(cfg, tokens, is_training):
  """Character LM; `hk.static_unroll` so every time step is its own ops in the schedule."""
  del is_training
  x = hk.Embed(cfg["vocab"], cfg["embed"], name="embed")(tokens)
  core = hk.DeepRNN([hk.LSTM(cfg["hidden"], name=f"lstm_{i}") for i in range(cfg["layers"])])
  state = core.initial_state(tokens.shape[0])
  outputs, _ = hk.static_unroll(core, x, state, time_major=False)
  return hk.Linear(cfg["vocab"], name="logits")(outputs)


_LSTM = _Model(
  name="lstm",
  family="recurrent",
  description=(
    "2-layer LSTM character language model (byte embedding 128, hidden 256, "
    "hk.static_unroll: the 32 time steps are unrolled into straight-line ops, no "
    "while loop) predicting the next of 32 bytes"
  ),
  tiny_description="1-layer LSTM LM, hidden 16, vocab 32, 4 steps (static unroll)",
  default_batches=(1, 16),
  forward=_lstm_forward,
  make_batch=_lm_batch,
  loss=_classification_loss,
  optimizer="adam",
  learning_rate=1e-3,
  full=dict(layers=2, embed=128, hidden=256, vocab=256, seq_len=32),
  tiny=dict(layers=1, embed=8, hidden=16, vocab=32, seq_len=4),
)


# --- gru (dynamic unroll) -------------------------------------------------------------------------


def _gru_forward(cfg, series, is_training):
  """Sequence regression; `hk.dynamic_unroll` (lax.scan), so XLA emits one `while` loop."""
  del is_training
  x = jax.nn.relu(hk.Linear(cfg["hidden"], name="input_proj")(series))
  core = hk.DeepRNN([hk.GRU(cfg["hidden"], name=f"gru_{i}") for i in range(cfg["layers"])])
  state = core.initial_state(series.shape[0])
  outputs, _ = hk.dynamic_unroll(core, x, state, time_major=False)
  return hk.Linear(cfg["features"], name="readout")(outputs)


def _series_batch(cfg, batch, rng):
  series = rng.standard_normal((batch, cfg["seq_len"] + 1, cfg["features"]), dtype=np.float32)
  return series[:, :-1], series[:, 1:]


def _mse_loss(cfg, predictions, targets):
  del cfg
  return jnp.mean(jnp.square(predictions - targets))


_GRU = _Model(
  name="gru",
  family="recurrent",
  description=(
    "2-layer GRU (hidden 256, hk.dynamic_unroll = lax.scan: one XLA while loop "
    "over 128 steps) forecasting the next step of a 32-feature time series (MSE)"
  ),
  tiny_description="1-layer GRU, hidden 16, 4 features, 8 steps (dynamic unroll)",
  default_batches=(1, 16),
  forward=_gru_forward,
  make_batch=_series_batch,
  loss=_mse_loss,
  optimizer="adam",
  learning_rate=1e-3,
  full=dict(layers=2, hidden=256, features=32, seq_len=128),
  tiny=dict(layers=1, hidden=16, features=4, seq_len=8),
)


# --- mlp ------------------------------------------------------------------------------------------


def _mlp_forward(cfg, x, is_training):
  del is_training
  return hk.nets.MLP(list(cfg["hidden"]) + [cfg["num_classes"]], name="mlp")(x)


def _vector_batch(cfg, batch, rng):
  x = rng.standard_normal((batch, cfg["inputs"]), dtype=np.float32)
  y = rng.integers(0, cfg["num_classes"], size=(batch,), dtype=np.int32)
  return x, y


_MLP = _Model(
  name="mlp",
  family="mlp",
  description="MLP classifier 784-1024-1024-512-10 with ReLU (MNIST-sized inputs)",
  tiny_description="MLP 16-32-32-4",
  default_batches=(8, 128),
  forward=_mlp_forward,
  make_batch=_vector_batch,
  loss=_classification_loss,
  optimizer="sgd",
  learning_rate=0.01,
  full=dict(inputs=784, hidden=(1024, 1024, 512), num_classes=10),
  tiny=dict(inputs=16, hidden=(32, 32), num_classes=4),
)


# --- deepfm ---------------------------------------------------------------------------------------


def _deepfm_forward(cfg, inputs, is_training):
  """DeepFM: a shared (per-field offset) embedding table feeds an FM and a deep MLP."""
  del is_training
  fields, vocab, k = cfg["sparse_fields"], cfg["vocab_per_field"], cfg["embed"]
  ids = inputs["sparse"] + (jnp.arange(fields, dtype=jnp.int32) * vocab)[None, :]
  dense = inputs["dense"]
  table = hk.Embed(fields * vocab, k, w_init=_trunc(0.01), name="embeddings")
  linear_table = hk.Embed(fields * vocab, 1, w_init=jnp.zeros, name="linear_weights")
  v = table(ids)  # [batch, fields, k]
  first_order = (
    jnp.sum(linear_table(ids)[..., 0], axis=1) + hk.Linear(1, name="dense_linear")(dense)[:, 0]
  )
  sum_v = jnp.sum(v, axis=1)
  second_order = 0.5 * jnp.sum(jnp.square(sum_v) - jnp.sum(jnp.square(v), axis=1), axis=1)
  deep_in = jnp.concatenate([v.reshape(v.shape[0], -1), dense], axis=1)
  deep = hk.nets.MLP(list(cfg["deep"]) + [1], name="deep")(deep_in)[:, 0]
  return first_order + second_order + deep  # click logit, [batch]


def _deepfm_batch(cfg, batch, rng):
  sparse = rng.integers(
    0, cfg["vocab_per_field"], size=(batch, cfg["sparse_fields"]), dtype=np.int32
  )
  dense = rng.standard_normal((batch, cfg["dense_fields"]), dtype=np.float32)
  clicks = (rng.random(batch) < 0.25).astype(np.float32)
  return {"sparse": sparse, "dense": dense}, clicks


def _bce_loss(cfg, logits, labels):
  del cfg
  return jnp.mean(optax.sigmoid_binary_cross_entropy(logits, labels))


_DEEPFM = _Model(
  name="deepfm",
  family="recommender",
  description=(
    "DeepFM click-through model (Criteo layout: 26 sparse fields x 10000 ids in one "
    "embedding table of dim 16 plus a first-order table, 13 dense features, "
    "factorization-machine interactions + a 400-400-400 deep MLP); "
    "embedding-gather heavy"
  ),
  tiny_description="DeepFM with 4 sparse fields x 50 ids, dim 4, 3 dense features, MLP 16",
  default_batches=(32, 256),
  forward=_deepfm_forward,
  make_batch=_deepfm_batch,
  loss=_bce_loss,
  optimizer="adam",
  learning_rate=1e-3,
  full=dict(
    sparse_fields=26, vocab_per_field=10000, embed=16, dense_fields=13, deep=(400, 400, 400)
  ),
  tiny=dict(sparse_fields=4, vocab_per_field=50, embed=4, dense_fields=3, deep=(16,)),
)


# --- llama (kept out of the default suite and the training corpus) ------------------------------


def _rms_norm(name: str) -> hk.RMSNorm:
  return hk.RMSNorm(axis=-1, eps=1e-6, name=name)


def _rotary(x: jax.Array) -> jax.Array:
  """Rotary position embedding (Su et al., 2021, RoFormer, eq. 34) of x: [B, S, H, K]."""
  length, half = x.shape[1], x.shape[-1] // 2
  inv_freq = 1.0 / (10000.0 ** (np.arange(half, dtype=np.float32) / half))
  angles = np.arange(length, dtype=np.float32)[:, None] * inv_freq[None, :]  # [S, K/2]
  cos, sin = jnp.asarray(np.cos(angles))[None, :, None], jnp.asarray(np.sin(angles))[None, :, None]
  first, second = x[..., :half], x[..., half:]
  return jnp.concatenate([first * cos - second * sin, first * sin + second * cos], axis=-1)


def _llama_layer(x, mask, cfg, name):
  """LLaMA block (Touvron et al., 2023, section 2.2): pre-RMSNorm, causal attention with rotary
  queries and keys and no biases, pre-RMSNorm SwiGLU MLP."""
  d, heads = x.shape[-1], cfg["heads"]
  key_size = d // heads
  linear = lambda n, size: hk.Linear(size, with_bias=False, w_init=_trunc(), name=n)
  with hk.name_scope(name):
    h = _rms_norm("attn_norm")(x)
    split = lambda y: y.reshape(*y.shape[:2], heads, key_size)
    q, k, v = (split(linear(n, d)(h)) for n in ("q", "k", "v"))
    q, k = _rotary(q), _rotary(k)
    logits = jnp.einsum("bshk,bthk->bhst", q, k) / math.sqrt(key_size)
    weights = jax.nn.softmax(jnp.where(mask, logits, -1e30), axis=-1)
    attended = jnp.einsum("bhst,bthk->bshk", weights, v).reshape(x.shape)
    x = x + linear("o", d)(attended)
    h = _rms_norm("mlp_norm")(x)
    gated = jax.nn.silu(linear("gate", cfg["d_ff"])(h)) * linear("up", cfg["d_ff"])(h)
    return x + linear("down", d)(gated)


def _llama_forward(cfg, tokens, is_training):
  del is_training
  x = hk.Embed(cfg["vocab"], cfg["d_model"], w_init=_trunc(), name="token_embed")(tokens)
  mask = _causal_mask(cfg["seq_len"])
  for i in range(cfg["layers"]):
    x = _llama_layer(x, mask, cfg, f"layer_{i}")
  x = _rms_norm("final_norm")(x)
  return hk.Linear(cfg["vocab"], with_bias=False, w_init=_trunc(), name="lm_head")(x)


_LLAMA = _Model(
  name="llama",
  family="transformer",
  description=(
    "LLaMA-style decoder (RMSNorm, rotary positions, bias-free causal 8-head attention, SwiGLU "
    "MLP, untied LM head), 12 layers, d=512, d_ff=1408, vocab 8192, on 256-token sequences"
  ),
  tiny_description="LLaMA-style decoder, 1 layer, d=32, 2 heads, vocab 64, 16 tokens",
  default_batches=(1, 4),
  forward=_llama_forward,
  make_batch=_lm_batch,
  loss=_classification_loss,
  optimizer="adam",
  learning_rate=3e-4,
  full=dict(layers=12, d_model=512, heads=8, d_ff=1408, vocab=8192, seq_len=256),
  tiny=dict(layers=1, d_model=32, heads=2, d_ff=64, vocab=64, seq_len=16),
)


_ALL = (
  _RESNET50,
  _MOBILENET,
  _VGG,
  _UNET,
  _WAVENET,
  _BERT,
  _GPT,
  _VIT,
  _SEQ2SEQ,
  _MLP_MIXER,
  _LSTM,
  _GRU,
  _MLP,
  _DEEPFM,
)
# Models outside the default suite: the `realistic` suite's, kept out of the training corpus.
_EXTRA = (_LLAMA,)
_REGISTRY: dict[str, _Model] = {m.name: m for m in _ALL + _EXTRA}


def _specs(models: tuple[_Model, ...], tiny: bool = False) -> dict[str, ModelSpec]:
  return {
    m.name: ModelSpec(
      name=m.name,
      family=m.family,
      description=m.tiny_description if tiny else m.description,
      default_batches=(1, 2) if tiny else m.default_batches,
      supports_training=m.supports_training,
    )
    for m in models
  }


MODELS: dict[str, ModelSpec] = _specs(_ALL)
EXTRA_MODELS: dict[str, ModelSpec] = _specs(_EXTRA)

# The `tiny=True` versions (same names), for tests: each compiles in about a second.
TINY_MODELS: dict[str, ModelSpec] = _specs(_ALL + _EXTRA, tiny=True)


# ------------------------------------------------------------------------------------------------
# Programs.


def _lookup(name: str) -> _Model:
  model = _REGISTRY.get(name)
  if model is None:
    raise WorkloadError(f"unknown model {name!r}; known models: {', '.join(sorted(_REGISTRY))}")
  return model


def _optimizer(model: _Model) -> optax.GradientTransformation:
  if model.optimizer == "adam":
    return optax.adam(model.learning_rate)
  return optax.sgd(model.learning_rate, momentum=0.9)


# XLA options for compiling the (throw-away) initialisation program: it runs once, so a fast,
# unoptimised compile beats both an optimised one and Haiku's op-by-op eager init (which compiles
# every primitive for every parameter shape).
_FAST_COMPILE = {"xla_backend_optimization_level": 0, "xla_llvm_disable_expensive_passes": True}


def _init(transformed: hk.TransformedWithState, seed: int, inputs: Any):
  """`transformed.init(PRNGKey(seed), inputs, is_training=True)`, compiled as one program."""
  key = jax.random.PRNGKey(seed)
  init = jax.jit(transformed.init, static_argnums=2)
  try:
    compiled = init.lower(key, inputs, True).compile(compiler_options=_FAST_COMPILE)
  except Exception:  # pylint: disable=broad-except  # an XLA without these options: plain jit
    return init(key, inputs, True)
  return compiled(key, inputs)


def model_config(name: str, tiny: bool = False, overrides: Mapping[str, Any] | None = None) -> dict:
  """The model's full (or tiny) config with `overrides` (e.g. `{"layers": 12}`) applied; an
  override of a key the model does not have is refused."""
  model = _lookup(name)
  cfg = dict(model.tiny if tiny else model.full)
  unknown = sorted(set(overrides or {}) - set(cfg))
  if unknown:
    raise WorkloadError(
      f"model {name!r} has no setting {', '.join(unknown)} (it has {', '.join(sorted(cfg))})"
    )
  cfg.update(overrides or {})
  return cfg


def build_program(
  name: str,
  batch: int,
  train: bool,
  seed: int = 0,
  tiny: bool = False,
  overrides: Mapping[str, Any] | None = None,
) -> tuple[Callable, tuple]:
  """Returns (fn, example_args) such that jax.jit(fn).lower(*example_args).compile() is the program.

  Inference: fn(params, inputs) -> outputs. Training (train=True): one full training step
  fn(params, opt_state, inputs, targets) -> (new_params, new_opt_state, loss): forward + backward
  (jax.grad of a real loss) + an optax update (adam or sgd with momentum). Parameters are
  created with hk.transform_with_state(...).init, so example_args hold real arrays (float32);
  see the module docstring for the layout of `params` of models with batch norm. `tiny=True`
  builds the small test version of the model (`TINY_MODELS`); `overrides` replace settings of
  its config (`model_config`), for the training corpus's deeper, wider or longer variants.
  """
  model = _lookup(name)
  if isinstance(batch, bool) or not isinstance(batch, (int, np.integer)) or batch < 1:
    raise WorkloadError(f"batch size must be a positive integer, got {batch!r}")
  if train and not model.supports_training:
    raise WorkloadError(f"model {name!r} has no training program")
  cfg = model_config(name, tiny, overrides)

  def forward(inputs, is_training):
    return model.forward(cfg, inputs, is_training)

  transformed = hk.without_apply_rng(hk.transform_with_state(forward))
  rng = np.random.default_rng(seed)
  inputs, targets = jax.tree_util.tree_map(jnp.asarray, model.make_batch(cfg, int(batch), rng))
  params, state = _init(transformed, seed, inputs)
  stateful = bool(jax.tree_util.tree_leaves(state))

  def split(variables):
    return (variables["params"], variables["state"]) if stateful else (variables, state)

  def join(p, s):
    return {"params": p, "state": s} if stateful else p

  variables = join(params, state)

  if not train:

    def infer(variables, inputs):
      p, s = split(variables)
      outputs, _ = transformed.apply(p, s, inputs, False)
      return outputs

    return infer, (variables, inputs)

  optimizer = _optimizer(model)
  opt_state = optimizer.init(params)

  def train_step(variables, opt_state, inputs, targets):
    p, s = split(variables)

    def loss_fn(p):
      outputs, new_s = transformed.apply(p, s, inputs, True)
      return model.loss(cfg, outputs, targets), new_s

    (loss, new_s), grads = jax.value_and_grad(loss_fn, has_aux=True)(p)
    updates, new_opt_state = optimizer.update(grads, opt_state, p)
    new_p = optax.apply_updates(p, updates)
    return join(new_p, new_s if stateful else s), new_opt_state, loss

  return train_step, (variables, opt_state, inputs, targets)


def compiled_hlo_text(name: str, batch: int, train: bool, seed: int = 0, tiny: bool = False) -> str:
  """The optimised, scheduled HLO text of the model's program as XLA compiles it here."""
  fn, args = build_program(name, batch, train, seed=seed, tiny=tiny)
  return jax.jit(fn).lower(*args).compile().as_text()
