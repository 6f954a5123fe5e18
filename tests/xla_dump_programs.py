"""Small JAX programs compiled by XLA on the CPU with its dump on, so that the importer can be
checked against XLA's own buffer assignment and live ranges: a training step inside one `call`
(as a GPU command buffer holds a whole step), a scan (a `while` loop of known trip count), nested
loops, and a `cond`; and a `tf.while_loop` compiled by TensorFlow's XLA. Each runs in a child
process (XLA reads XLA_FLAGS once per process): `python -m tests.xla_dump_programs DIR [NAME ...]`
writes, per program, the optimised module `DIR/module_*.jit_NAME.cpu_after_optimizations.txt`
and its `-buffer-assignment.txt`. `dump_programs` does that from a test.

XLA's call inliner is turned off (`--xla_disable_hlo_passes=call-inliner`), so that a nested
`jax.jit` stays a `call` after optimisation, as command buffers and other backends' calls do.
"""

from __future__ import annotations

import glob
import os
import subprocess
import sys

FLAGS = "--xla_dump_hlo_as_text --xla_disable_hlo_passes=call-inliner"
WIDTH, BATCH, LAYERS = 128, 32, 12


def _args(name):
  import jax
  import jax.numpy as jnp

  f32 = lambda *s: jax.ShapeDtypeStruct(s, jnp.float32)
  x, y = f32(BATCH, WIDTH), f32(BATCH, WIDTH)
  if name in ("called_step",):
    return f32(WIDTH, 2 * WIDTH), f32(2 * WIDTH, WIDTH), x, y
  if name == "branchy_step":
    return f32(WIDTH, WIDTH), x, jax.ShapeDtypeStruct((), jnp.int32)
  return f32(LAYERS, WIDTH, WIDTH), x, y


def called_step(w1, w2, x, y):
  """A whole SGD training step of a two-layer MLP, inside one call."""
  import jax
  import jax.numpy as jnp

  @jax.jit
  def step(w1, w2, x, y):
    def loss(w1, w2):
      return jnp.mean((jnp.tanh(x @ w1) @ w2 - y) ** 2)

    g1, g2 = jax.grad(loss, argnums=(0, 1))(w1, w2)
    return w1 - 0.1 * g1, w2 - 0.1 * g2

  return step(w1, w2, x, y)


def _scan_loss(ws, x, y):
  import jax
  import jax.numpy as jnp

  h, _ = jax.lax.scan(lambda h, w: (jnp.tanh(h @ w), None), x, ws)
  return jnp.mean((h - y) ** 2)


def scanned_step(ws, x, y):
  """An SGD step of a 12-layer MLP whose layers are a scan: two while loops (forward and
  backward), trip count 12."""
  import jax

  return ws - 0.1 * jax.grad(_scan_loss)(ws, x, y)


def nested_step(ws, x, y):
  """Three passes of the scanned layers inside a fori_loop: loops nested two deep."""
  import jax
  import jax.numpy as jnp

  def layers(h, ws):
    h, _ = jax.lax.scan(lambda h, w: (jnp.tanh(h @ w), None), h, ws)
    return h

  h = jax.lax.fori_loop(0, 3, lambda i, h: layers(h, ws) + 0.5 * h, x)
  return jnp.mean((h - y) ** 2)


def branchy_step(w, x, i):
  """A `switch` on a traced index: a conditional with three branches."""
  import jax
  import jax.numpy as jnp

  return jax.lax.switch(i, [lambda x: jnp.tanh(x @ w), lambda x: (x @ w) @ w, lambda x: x * 2.0], x)


PROGRAMS = {f.__name__: f for f in (called_step, scanned_step, nested_step, branchy_step)}


def dump_programs(directory: str, names: list[str] | None = None) -> dict[str, str]:
  """Compiles the named programs (all by default) in a child process with XLA's dump on;
  returns each one's `*after_optimizations.txt` path."""
  names = list(names or PROGRAMS)
  env = dict(os.environ, XLA_FLAGS=f"--xla_dump_to={directory} {FLAGS}", JAX_PLATFORMS="cpu")
  root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
  subprocess.run(
    [sys.executable, "-m", "tests.xla_dump_programs", directory, *names],
    cwd=root,
    env=env,
    check=True,
    capture_output=True,
  )
  found = {}
  for name in names:
    paths = glob.glob(os.path.join(directory, f"module_*.jit_{name}.cpu_after_optimizations.txt"))
    assert len(paths) == 1, (name, paths)
    found[name] = paths[0]
  return found


TF_LOOP = """
import tensorflow as tf

@tf.function(jit_compile=True)
def step(w, x):
  def body(i, h):
    return i + 1, tf.tanh(tf.matmul(h, w))
  _, h = tf.while_loop(lambda i, h: i < 10, body, (tf.constant(0), x))
  return tf.reduce_sum(h * h)

step(tf.ones((128, 128)), tf.ones((32, 128)))
"""


def dump_tf_loop(directory: str) -> str:
  """A `tf.while_loop` compiled by TensorFlow's own XLA (`jit_compile=True`) with XLA's dump on;
  returns its `*after_optimizations.txt` path. TensorFlow 2.8's XLA prints an older buffer
  assignment and no trip count."""
  env = dict(
    os.environ,
    XLA_FLAGS=f"--xla_dump_to={directory} --xla_dump_hlo_as_text",
    TF_CPP_MIN_LOG_LEVEL="2",
    CUDA_VISIBLE_DEVICES="",
  )
  subprocess.run([sys.executable, "-c", TF_LOOP], env=env, check=True, capture_output=True)
  (path,) = glob.glob(os.path.join(directory, "*.cpu_after_optimizations.txt"))
  return path


def main(argv: list[str]) -> None:
  import jax

  for name in argv[1:] or list(PROGRAMS):
    jax.jit(PROGRAMS[name]).lower(*_args(name)).compile()


if __name__ == "__main__":
  main(sys.argv[1:])
