"""Keras models compiled by TensorFlow's XLA, for the suite scripts (make_foreign_suite.py,
make_corpus.py): a builder of `keras.applications` image models and the optimised HLO of a
model's inference or training step. TensorFlow is imported only when a model is built."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any


def image_model(app: str, size: int, **kwargs: Any) -> Callable[[], Any]:
  def build() -> Any:
    import tensorflow as tf

    cls = getattr(tf.keras.applications, app)
    shape = (size, size, 3)
    try:  # Logits, for the training step's loss.
      return cls(input_shape=shape, weights=None, classes=10, classifier_activation=None, **kwargs)
    except TypeError:  # DenseNet in TF 2.8 has no classifier_activation: its own top, in logits.
      base = cls(input_shape=shape, weights=None, include_top=False, pooling="avg", **kwargs)
      return tf.keras.Model(base.input, tf.keras.layers.Dense(10)(base.output))

  return build


def application(app: str, size: int, **kwargs: Any) -> tuple[Callable[[], Any], str, str]:
  """(builder, input kind, description) of `keras.applications.<app>` on size x size images."""
  return (
    image_model(app, size, **kwargs),
    f"image{size}",
    f"keras.applications.{app}, {size}x{size}",
  )


def optimized_hlo(build: Callable[[], Any], kind: str, batch: int, train: bool) -> str:
  """TensorFlow's XLA-optimised HLO text of the Keras model `build()`'s inference or SGD training
  step on a batch of `kind` inputs (`image32`: 32x32x3 images, `tokens64`: 64 token ids)."""
  import tensorflow as tf

  tf.keras.utils.set_random_seed(0)
  net = build()
  if kind.startswith("image"):
    size = int(kind.removeprefix("image"))
    x = tf.random.uniform((batch, size, size, 3))
  else:
    x = tf.random.uniform((batch, int(kind.removeprefix("tokens"))), 0, 1000, dtype=tf.int32)
  if not train:
    fn = tf.function(lambda x: net(x, training=False), jit_compile=True)
    return fn.experimental_get_compiler_ir(x)(stage="optimized_hlo")
  y = tf.zeros((batch,), dtype=tf.int32)
  loss_fn = tf.keras.losses.SparseCategoricalCrossentropy(from_logits=True)

  def step(x: Any, y: Any) -> Any:
    with tf.GradientTape() as tape:
      loss = loss_fn(y, net(x, training=True))
    grads = tape.gradient(loss, net.trainable_variables)
    for v, g in zip(net.trainable_variables, grads):
      v.assign_sub(0.01 * tf.convert_to_tensor(g))
    return loss

  fn = tf.function(step, jit_compile=True)
  return fn.experimental_get_compiler_ir(x, y)(stage="optimized_hlo")
