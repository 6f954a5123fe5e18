#!/usr/bin/env python
"""Generates the `foreign` suite: Keras models (TensorFlow's front end, not the project's Haiku
zoo) compiled by XLA through `tf.function(jit_compile=True)` on the CPU, imported with the
project's HLO importer, and written as env/programs/data/workloads/tf-<program>.json.gz plus the
`foreign` suite's manifest, env/programs/data/suites/foreign.json.

  .venv/bin/python scripts/make_foreign_suite.py            # a few minutes on 2 cores
  .venv/bin/python scripts/make_foreign_suite.py --only tf-lstm-b8-infer --force

Every model is built with `weights=None` (random initial weights, nothing downloaded). The HLO
is TensorFlow's optimised module (`experimental_get_compiler_ir(...)(stage="optimized_hlo")`:
fused and scheduled by TensorFlow's own XLA). TensorFlow prints it without `is_scheduled=true`,
but its instructions are printed in the order of the schedule XLA used (checked against the
`HloLiveRange` instruction sequence of the buffer-assignment dump), so it is imported with
`compile=False`: the print order is the schedule and nothing is recompiled by the installed
jaxlib. The suite is for evaluation only: every entry is in the held-out split.

The output is committed, so users and CI never need TensorFlow to use the suite.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from collections.abc import Callable
from typing import Any

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
os.environ.setdefault("CUDA_VISIBLE_DEVICES", "")

from keras_programs import application  # noqa: E402
from keras_programs import optimized_hlo as keras_hlo  # noqa: E402

from malloczero.common.files import write_text  # noqa: E402
from malloczero.env.programs.suites import SUITES_DIR, WORKLOAD_DIR  # noqa: E402
from malloczero.env.programs.user_suites import (  # noqa: E402
  load_builtin_suites,
  write_builtin_suites,
)
from malloczero.env.workload_json import save_workload  # noqa: E402

SUITE = "foreign"
FRONT_END = "tensorflow-keras"
# Every program meets both machines at a quarter of its peak live bytes.
CONFIGS = (("tpu-v4i-like", 0.25), ("nnpi-like", 0.25))


def _lstm_text() -> Any:
  import tensorflow as tf

  inputs = tf.keras.Input((32,), dtype="int32")
  x = tf.keras.layers.Embedding(2000, 64)(inputs)
  # Unrolled (Keras's own option): XLA's while loop would hide the 32 steps in one op.
  x = tf.keras.layers.LSTM(128, return_sequences=True, unroll=True)(x)
  x = tf.keras.layers.LSTM(128, unroll=True)(x)
  return tf.keras.Model(inputs, tf.keras.layers.Dense(10)(x))


def _gru_text() -> Any:
  import tensorflow as tf

  inputs = tf.keras.Input((32,), dtype="int32")
  x = tf.keras.layers.Embedding(2000, 64)(inputs)
  x = tf.keras.layers.Bidirectional(tf.keras.layers.GRU(96, unroll=True))(x)
  return tf.keras.Model(inputs, tf.keras.layers.Dense(10)(x))


def _transformer() -> Any:
  import tensorflow as tf

  layers = tf.keras.layers
  inputs = tf.keras.Input((64,), dtype="int32")
  x = layers.Embedding(4000, 128)(inputs)
  for _ in range(4):
    attended = layers.MultiHeadAttention(num_heads=4, key_dim=32)(x, x)
    x = layers.LayerNormalization()(x + attended)
    hidden = layers.Dense(512, activation="gelu")(x)
    x = layers.LayerNormalization()(x + layers.Dense(128)(hidden))
  x = layers.GlobalAveragePooling1D()(x)
  return tf.keras.Model(inputs, layers.Dense(10)(x))


# name -> (builder, input kind, what it is)
MODELS: dict[str, tuple[Callable[[], Any], str, str]] = {
  "mobilenetv2": application("MobileNetV2", 32),
  "mobilenetv3s": application("MobileNetV3Small", 32, minimalistic=False),
  "resnet50": application("ResNet50", 32),
  "densenet121": application("DenseNet121", 32),
  "efficientnetb0": application("EfficientNetB0", 32),
  "lstm": (_lstm_text, "tokens32", "Embedding + 2 LSTM(128, unrolled) + Dense, 32 tokens"),
  "gru": (_gru_text, "tokens32", "Embedding + bidirectional GRU(96, unrolled) + Dense, 32 tokens"),
  "transformer": (
    _transformer,
    "tokens64",
    "4 encoder blocks (MultiHeadAttention 4x32, LayerNorm, GELU MLP 512), 64 tokens",
  ),
}
# (model, batch, train)
PROGRAMS: tuple[tuple[str, int, bool], ...] = (
  ("mobilenetv2", 1, False),
  ("mobilenetv3s", 1, False),
  ("resnet50", 1, False),
  ("densenet121", 1, False),
  ("efficientnetb0", 1, False),
  ("lstm", 8, False),
  ("lstm", 8, True),
  ("gru", 8, False),
  ("transformer", 2, False),
  ("transformer", 2, True),
  ("gru", 8, True),
)


def program_name(model: str, batch: int, train: bool) -> str:
  return f"tf-{model}-b{batch}-{'train' if train else 'infer'}"


def optimized_hlo(model: str, batch: int, train: bool) -> str:
  """TensorFlow's XLA-optimised HLO text of the model's inference or SGD training step."""
  build, kind, _ = MODELS[model]
  return keras_hlo(build, kind, batch, train)


def main() -> int:
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("--only", nargs="*", help="program names to (re)build (default: all)")
  parser.add_argument("--force", action="store_true", help="re-import programs already present")
  parser.add_argument("--hlo-dir", help="also keep each program's HLO text here")
  args = parser.parse_args()
  import tensorflow as tf

  from malloczero.env.programs.hlo_import import import_hlo_text

  os.makedirs(WORKLOAD_DIR, exist_ok=True)
  manifest = load_builtin_suites()
  source = f"xla-hlo (tensorflow {tf.__version__} keras, jit_compile, cpu)"
  entries, dropped = [], []
  for model, batch, train in PROGRAMS:
    name = program_name(model, batch, train)
    path = os.path.join(WORKLOAD_DIR, f"{name}.json.gz")
    wanted = args.only is None or name in args.only
    if wanted and (args.force or not os.path.exists(path) or name not in manifest["programs"]):
      t0 = time.perf_counter()
      try:
        text = optimized_hlo(model, batch, train)
        if args.hlo_dir:
          os.makedirs(args.hlo_dir, exist_ok=True)
          write_text(os.path.join(args.hlo_dir, f"{name}.hlo.txt"), text)
        imported = import_hlo_text(text, name, source=source, compile=False)
      except Exception as e:  # Reported and dropped: a model TF or the importer cannot take.
        reason = " ".join(str(e).split())[:300]
        print(f"{name}: dropped ({type(e).__name__}: {reason})", flush=True)
        dropped.append(name)
        continue
      workload = imported.workload
      save_workload(workload, path)
      manifest["programs"][name] = {
        "model": f"tf-{model}",
        "batch": batch,
        "train": train,
        "tiny": False,
        "front_end": FRONT_END,
        "description": MODELS[model][2],
        "ops": workload.num_ops,
        "buffers": workload.num_buffers,
        "peak_live_bytes": workload.peak_live_bytes,
        "total_flops": float(workload.arrays.flops.sum()),
        "import_notes": list(imported.notes),
        "import_s": round(time.perf_counter() - t0, 2),
        "source": workload.source,
      }
      p = manifest["programs"][name]
      print(f"{name}: {p['ops']} ops, {p['buffers']} buffers, {p['import_s']} s", flush=True)
    if name not in manifest["programs"]:
      continue
    for hardware, fraction in CONFIGS:
      entries.append(
        {
          "name": f"{name}@{hardware}:{int(round(fraction * 100))}%",
          "program": name,
          "hardware": hardware,
          "capacity_fraction": fraction,
          "split": "heldout",
          "model": f"tf-{model}",
        }
      )
  models = sorted({e["model"] for e in entries})
  manifest["suites"][SUITE] = {
    "description": f"evaluation only: {len(models)} Keras models (TensorFlow {tf.__version__}, "
    "weights=None) compiled by XLA through jit_compile (CPU), on both machines at 25% of peak; "
    "every entry held out",
    "evaluation_only": True,
    "entries": entries,
  }
  write_builtin_suites({**manifest, "suites": {SUITE: manifest["suites"][SUITE]}})
  print(
    f"wrote {SUITES_DIR}/{SUITE}.json: suite '{SUITE}' with {len(entries)} entries of "
    f"{len({e['program'] for e in entries})} programs"
    + (f"; dropped {', '.join(dropped)}" if dropped else "")
  )
  return 0


if __name__ == "__main__":
  sys.exit(main())
