#!/usr/bin/env python
"""Generates the training corpus (suite `corpus`) and the evaluation suite `realistic`.

`corpus`: programs from three front ends, every entry in the train split:
  * the Haiku zoo (JAX) at its default sizes (the default suite's training programs) and at more
    depths, widths, sequence lengths and batch sizes;
  * Keras models (TensorFlow's XLA), none of them `foreign`'s or `realistic`'s, unrolled GRU and
    LSTM layers at other widths, depths and lengths than `foreign`'s among them (part
    `recurrent`, imported after the mosaics);
  * mosaics (env/programs/mosaic.py): windows of the corpus's own compiled programs laid end to
    end, 150 to 20,000 buffers.
  Each program meets both machines at two of 10%, 25% and 50% of its peak (4 entries).
`realistic`: evaluation only, programs of 1,000 to 20,000 buffers from models absent from the
  corpus (Keras applications and a LLaMA-style Haiku decoder, training steps included), on both
  machines at 10% and 25% of peak.
The default suite's held-out models, `foreign`'s and `realistic`'s never enter the corpus
(tests/test_corpus.py checks model names and content hashes).

  .venv/bin/python scripts/make_corpus.py import zoo        # one part; parts run in parallel
  .venv/bin/python scripts/make_corpus.py import keras
  .venv/bin/python scripts/make_corpus.py import mosaic     # after zoo and keras
  .venv/bin/python scripts/make_corpus.py import recurrent
  .venv/bin/python scripts/make_corpus.py manifest          # writes the two suites

`import` writes env/programs/data/workloads/<program>.json.gz and a record per program under
--records (default runs/corpus-records, kept between runs: a program with a record is not
imported again without --force); `manifest` writes the suites' manifests from the records
(env/programs/data/suites/corpus.json and realistic.json).
The output is committed, so users and CI never run this.
"""

from __future__ import annotations

import argparse
import glob
import json
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
from malloczero.env.hardware import load_hardware  # noqa: E402
from malloczero.env.programs import import_model, program_name  # noqa: E402
from malloczero.env.programs.suites import SUITES_DIR, WORKLOAD_DIR, content_hash  # noqa: E402
from malloczero.env.programs.user_suites import (  # noqa: E402
  load_builtin_suites,
  write_builtin_suites,
)
from malloczero.env.workload_json import load_workload, save_workload  # noqa: E402

HARDWARE = ("tpu-v4i-like", "nnpi-like")
# Two capacities per program, cycled over the corpus so that each pair is as common.
CORPUS_CAPACITIES = ((0.10, 0.25), (0.25, 0.50), (0.10, 0.50))
REALISTIC_CAPACITIES = (0.10, 0.25)
REALISTIC_BUFFERS = (1000, 20000)  # Programs of realistic size only.
# The default suite's held-out models (scripts/make_suites.py): never in the corpus.
DEFAULT_HELDOUT = ("mobilenet", "vit", "gru", "deepfm")
DEFAULT_BATCHES_TRAIN = {  # The default suite's training programs: (model, batches, training).
  "resnet50": ((1, 8), True),
  "vgg": ((1, 8), True),
  "unet": ((1, 8), True),
  "wavenet": ((1, 8), True),
  "bert": ((1, 8), True),
  "gpt": ((1, 8), True),
  "transformer_seq2seq": ((1, 8), True),
  "mlp_mixer": ((1, 8), True),
  "lstm": ((1, 16), True),
  "mlp": ((32, 256), True),
}

# Zoo variants: (model, batch, train, config overrides).
ZOO_VARIANTS: tuple[tuple[str, int, bool, dict[str, Any]], ...] = (
  ("gpt", 4, True, {"layers": 8}),
  ("gpt", 2, True, {"layers": 12, "d_model": 384, "heads": 6}),
  ("gpt", 1, True, {"layers": 24}),
  ("gpt", 16, False, {"layers": 2, "d_model": 128, "heads": 2}),
  ("gpt", 1, False, {"layers": 16, "seq_len": 256}),
  ("bert", 4, True, {"layers": 8}),
  ("bert", 1, True, {"layers": 12, "seq_len": 256}),
  ("bert", 32, False, {"layers": 2}),
  ("bert", 1, False, {"layers": 8, "seq_len": 512}),
  ("transformer_seq2seq", 2, True, {"layers": 6}),
  ("transformer_seq2seq", 16, False, {"layers": 1}),
  ("resnet50", 16, True, {"blocks": (2, 2, 2, 2)}),
  ("resnet50", 1, False, {"blocks": (3, 8, 36, 3)}),
  ("resnet50", 2, True, {"blocks": (3, 4, 10, 3), "image_size": 32}),
  ("vgg", 4, True, {"image_size": 64}),
  ("unet", 16, True, {"widths": (16, 32, 64, 128)}),
  ("unet", 1, True, {"widths": (32, 64, 128, 256, 512, 1024), "image_size": 128}),
  ("wavenet", 4, True, {}),
  ("mlp_mixer", 8, True, {"layers": 16}),
  ("mlp_mixer", 32, False, {"layers": 4}),
  ("lstm", 8, True, {"seq_len": 64}),
  ("lstm", 4, True, {"layers": 4}),
  ("mlp", 256, True, {"hidden": (4096, 4096)}),
  ("mlp", 32, True, {"hidden": (256,) * 8}),
  ("mlp", 1024, False, {"hidden": (2048, 2048, 2048, 2048)}),
)
REALISTIC_ZOO: tuple[tuple[str, int, bool, dict[str, Any]], ...] = (
  ("llama", 1, True, {}),
  ("llama", 4, False, {"layers": 32}),
  ("llama", 1, True, {"layers": 24, "seq_len": 128}),
  ("llama", 2, True, {"layers": 8, "d_model": 768, "heads": 12, "d_ff": 2048}),
  ("llama", 2, False, {"layers": 48, "d_model": 256, "heads": 4, "d_ff": 704}),
)


def _text_cnn() -> Any:
  import tensorflow as tf

  layers = tf.keras.layers
  inputs = tf.keras.Input((64,), dtype="int32")
  x = layers.Embedding(4000, 128)(inputs)
  for width in (128, 256, 256):
    x = layers.Conv1D(width, 5, padding="same", activation="relu")(x)
    x = layers.MaxPooling1D(2)(x)
  return tf.keras.Model(inputs, layers.Dense(10)(layers.GlobalMaxPooling1D()(x)))


def _simple_rnn() -> Any:
  import tensorflow as tf

  layers = tf.keras.layers
  inputs = tf.keras.Input((64,), dtype="int32")
  x = layers.Embedding(4000, 64)(inputs)
  x = layers.SimpleRNN(128, return_sequences=True, unroll=True)(x)
  x = layers.SimpleRNN(128, unroll=True)(x)
  return tf.keras.Model(inputs, layers.Dense(10)(x))


def _recurrent(
  cell: str, width: int, layers: int, bidirectional: bool, tokens: int
) -> tuple[Callable[[], Any], str, str]:
  """(builder, input kind, description) of Embedding + `layers` unrolled Keras `cell` layers (GRU,
  LSTM) of `width` units + Dense, on `tokens` token ids."""

  def build() -> Any:
    import tensorflow as tf

    inputs = tf.keras.Input((tokens,), dtype="int32")
    x = tf.keras.layers.Embedding(4000, 64)(inputs)
    for layer in range(layers):
      rnn = getattr(tf.keras.layers, cell)(width, return_sequences=layer < layers - 1, unroll=True)
      x = tf.keras.layers.Bidirectional(rnn)(x) if bidirectional else rnn(x)
    return tf.keras.Model(inputs, tf.keras.layers.Dense(10)(x))

  shape = f"{'bidirectional ' if bidirectional else ''}{cell}({width})"
  stack = f"{layers} {shape}" if layers > 1 else shape
  return build, f"tokens{tokens}", f"Embedding + {stack} (unrolled) + Dense, {tokens} tokens"


def _conv_autoencoder() -> Any:
  import tensorflow as tf

  layers = tf.keras.layers
  inputs = tf.keras.Input((32, 32, 3))
  x = inputs
  for width in (32, 64, 128):
    x = layers.Conv2D(width, 3, strides=2, padding="same", activation="relu")(x)
  for width in (128, 64, 32):
    x = layers.Conv2DTranspose(width, 3, strides=2, padding="same", activation="relu")(x)
  return tf.keras.Model(inputs, layers.Dense(10)(layers.GlobalAveragePooling2D()(x)))


def _keras_mlp() -> Any:
  import tensorflow as tf

  layers = tf.keras.layers
  inputs = tf.keras.Input((32, 32, 3))
  x = layers.Flatten()(inputs)
  for width in (2048, 1024, 1024, 512):
    x = layers.Dense(width, activation="relu")(x)
  return tf.keras.Model(inputs, layers.Dense(10)(x))


# name -> (builder, input kind, what it is)
KERAS_MODELS: dict[str, tuple[Callable[[], Any], str, str]] = {
  "vgg16": application("VGG16", 32),
  "vgg19": application("VGG19", 32),
  "resnet50v2": application("ResNet50V2", 32),
  "resnet152v2": application("ResNet152V2", 32),
  "mobilenetv3l": application("MobileNetV3Large", 32, minimalistic=False),
  "efficientnetb1": application("EfficientNetB1", 32),
  "efficientnetb2": application("EfficientNetB2", 32),
  "densenet201": application("DenseNet201", 32),
  "efficientnetv2b0": application("EfficientNetV2B0", 32),
  "textcnn": (_text_cnn, "tokens64", "Embedding + 3 Conv1D/MaxPool + Dense, 64 tokens"),
  "simplernn": (_simple_rnn, "tokens64", "Embedding + 2 SimpleRNN(128, unrolled), 64 tokens"),
  "convae": (_conv_autoencoder, "image32", "3 strided Conv2D + 3 Conv2DTranspose + Dense"),
  "mlp": (_keras_mlp, "image32", "Flatten + Dense 2048-1024-1024-512 + Dense"),
  # Recurrent layers at widths, depths and lengths other than `foreign`'s GRU(96) and LSTM(128).
  "gru64x2": _recurrent("GRU", 64, 2, False, 48),
  "gru256": _recurrent("GRU", 256, 1, False, 16),
  "bigru128": _recurrent("GRU", 128, 1, True, 24),
  "bilstm64": _recurrent("LSTM", 64, 1, True, 48),
  "lstm192": _recurrent("LSTM", 192, 1, False, 24),
  # The realistic suite's: never in the corpus.
  "resnet101": application("ResNet101", 64),
  "densenet169": application("DenseNet169", 32),
  "inceptionresnetv2": application("InceptionResNetV2", 80),
  "inceptionv3": application("InceptionV3", 80),
  "nasnetmobile": application("NASNetMobile", 32),
  "nasnetlarge": application("NASNetLarge", 32),
  "efficientnetv2s": application("EfficientNetV2S", 64),
}
CORPUS_KERAS: tuple[tuple[str, int, bool], ...] = (
  ("vgg16", 8, True),
  ("vgg19", 4, False),
  ("resnet50v2", 4, True),
  ("resnet152v2", 2, False),
  ("mobilenetv3l", 8, True),
  ("mobilenetv3l", 1, False),
  ("efficientnetb1", 4, False),
  ("efficientnetb2", 2, True),
  ("densenet201", 2, False),
  ("efficientnetv2b0", 8, True),
  ("textcnn", 16, True),
  ("textcnn", 4, False),
  ("simplernn", 8, True),
  ("convae", 8, True),
  ("convae", 2, False),
  ("mlp", 64, True),
)
# Imported after the mosaics, which are cut from the programs above only.
CORPUS_RECURRENT: tuple[tuple[str, int, bool], ...] = (
  ("gru64x2", 8, False),
  ("gru64x2", 8, True),
  ("gru256", 32, False),
  ("bigru128", 4, False),
  ("bigru128", 16, True),
  ("bilstm64", 8, False),
  ("bilstm64", 4, True),
  ("lstm192", 16, False),
)
# Inference but for two training steps: TensorFlow 2.8's XLA took over 10 minutes on 2 cores to
# compile DenseNet169's training step (ResNet101's took 6).
REALISTIC_KERAS: tuple[tuple[str, int, bool], ...] = (
  ("resnet101", 4, True),
  ("inceptionv3", 2, True),
  ("densenet169", 4, False),
  ("inceptionresnetv2", 2, False),
  ("nasnetmobile", 4, False),
  ("nasnetlarge", 2, False),
  ("efficientnetv2s", 4, False),
)
# Mosaic sizes in buffers: log-spaced from 150 to 20,000, two seeds each.
MOSAIC_SIZES = (150, 300, 600, 1200, 2500, 5000, 10000, 20000)
MOSAIC_SEEDS = (0, 1, 2)

_ABBREVIATIONS = {"layers": "L", "d_model": "d", "seq_len": "s", "heads": "h", "d_ff": "f"}


def variant_name(model: str, batch: int, train: bool, overrides: dict[str, Any]) -> str:
  """`gpt-L12-d384-h6-b2-train`: the zoo's program name with the overridden settings."""
  if not overrides:
    return program_name(model, batch, train)
  tags = []
  for key, value in overrides.items():
    text = "x".join(map(str, value)) if isinstance(value, tuple) else str(value)
    tags.append(f"{_ABBREVIATIONS.get(key, key.replace('_', ''))}{text}")
  return f"{model}-{'-'.join(tags)}-b{batch}-{'train' if train else 'infer'}"


def keras_name(model: str, batch: int, train: bool) -> str:
  return f"tf-{model}-b{batch}-{'train' if train else 'infer'}"


KERAS_PARTS = {
  "keras": CORPUS_KERAS,
  "recurrent": CORPUS_RECURRENT,
  "realistic-keras": REALISTIC_KERAS,
}


def _record(workload, **fields) -> dict:
  return {
    **fields,
    "ops": workload.num_ops,
    "buffers": workload.num_buffers,
    "peak_live_bytes": workload.peak_live_bytes,
    "total_flops": float(workload.arrays.flops.sum()),
    "content_sha256": content_hash(workload),
    "source": workload.source,
  }


def _plan(part: str) -> list[tuple[str, Callable[[], dict]]]:
  """(program name, import that saves the workload and returns its record) for a part."""
  plan = []
  if part in ("zoo", "realistic-zoo"):
    if part == "zoo":
      programs = [
        (model, batch, train, {})
        for model, (batches, trains) in DEFAULT_BATCHES_TRAIN.items()
        for batch in batches
        for train in ((False, True) if trains else (False,))
      ] + list(ZOO_VARIANTS)
    else:
      programs = list(REALISTIC_ZOO)
    for model, batch, train, overrides in programs:
      name = variant_name(model, batch, train, overrides)

      def run(model=model, batch=batch, train=train, overrides=overrides, name=name) -> dict:
        path = os.path.join(WORKLOAD_DIR, f"{name}.json.gz")
        known = _manifest_programs().get(name)
        if not overrides and known is not None and os.path.exists(path):
          # A default-suite program, imported by make_suites.py: the same program, not again.
          workload, stats = load_workload(path), known["xla_memory_analysis"]
        else:
          workload, stats = import_model(model, batch, train, overrides=overrides, name=name)
          save_workload(workload, path)
        return _record(
          workload,
          model=model,
          batch=batch,
          train=train,
          tiny=False,
          front_end="jax-haiku",
          config_overrides={
            k: list(v) if isinstance(v, tuple) else v for k, v in overrides.items()
          },
          xla_memory_analysis=stats,
        )

      plan.append((name, run))
  elif part in KERAS_PARTS:
    for model, batch, train in KERAS_PARTS[part]:
      name = keras_name(model, batch, train)

      def run(model=model, batch=batch, train=train, name=name) -> dict:
        import tensorflow as tf

        from malloczero.env.programs.hlo_import import import_hlo_text

        build, kind, description = KERAS_MODELS[model]
        source = f"xla-hlo (tensorflow {tf.__version__} keras, jit_compile, cpu)"
        imported = import_hlo_text(
          keras_hlo(build, kind, batch, train), name, source=source, compile=False
        )
        save_workload(imported.workload, os.path.join(WORKLOAD_DIR, f"{name}.json.gz"))
        return _record(
          imported.workload,
          model=f"tf-{model}",
          batch=batch,
          train=train,
          tiny=False,
          front_end="tensorflow-keras",
          description=description,
          import_notes=list(imported.notes),
        )

      plan.append((name, run))
  elif part == "mosaic":
    for size in MOSAIC_SIZES:
      for seed in MOSAIC_SEEDS:
        name = f"mosaic-n{size}-s{seed}"

        def run(size=size, seed=seed, name=name) -> dict:
          from malloczero.env.programs.mosaic import mosaic_workload

          references = [
            load_workload(os.path.join(WORKLOAD_DIR, f"{p}.json.gz"))
            for p in _compiled_corpus_programs()
          ]
          workload = mosaic_workload(references, size, seed=seed, name=name)
          save_workload(workload, os.path.join(WORKLOAD_DIR, f"{name}.json.gz"))
          return _record(
            workload, model="mosaic", batch=0, train=False, tiny=False, front_end="generated"
          )

        plan.append((name, run))
  else:
    raise SystemExit(f"unknown part {part!r}")
  return plan


def _manifest_programs() -> dict[str, dict]:
  return load_builtin_suites()["programs"]


def _compiled_corpus_programs() -> list[str]:
  names = [n for n, _ in _plan("zoo") + _plan("keras")]
  return [n for n in names if os.path.exists(os.path.join(WORKLOAD_DIR, f"{n}.json.gz"))]


def import_part(part: str, records: str, force: bool) -> int:
  os.makedirs(records, exist_ok=True)
  for name, run in _plan(part):
    path = os.path.join(records, f"{name}.json")
    if os.path.exists(path) and not force:
      continue
    t0 = time.perf_counter()
    try:
      record = run()
    except Exception as e:  # Reported and dropped: a model TF or the importer cannot take.
      print(f"{name}: dropped ({type(e).__name__}: {' '.join(str(e).split())[:300]})", flush=True)
      continue
    record["import_s"] = round(time.perf_counter() - t0, 2)
    write_text(path, json.dumps(record, indent=1, sort_keys=True))
    print(
      f"{name}: {record['ops']} ops, {record['buffers']} buffers, {record['import_s']} s",
      flush=True,
    )
  return 0


def _entries(name: str, record: dict, capacities, split: str) -> list[dict]:
  entries = []
  for hardware in HARDWARE:
    if record["peak_live_bytes"] > load_hardware(hardware).levels[-1].capacity_bytes:
      print(f"{name}: does not fit {hardware}'s slow memory; left out there", flush=True)
      continue
    for fraction in capacities:
      entries.append(
        {
          "name": f"{name}@{hardware}:{int(round(fraction * 100))}%",
          "program": name,
          "hardware": hardware,
          "capacity_fraction": fraction,
          "split": split,
          "model": record["model"],
        }
      )
  return entries


def write_manifest(records: str) -> int:
  manifest = load_builtin_suites()
  found = {}
  for path in sorted(glob.glob(os.path.join(records, "*.json"))):
    with open(path, encoding="utf-8") as f:
      found[os.path.basename(path)[: -len(".json")]] = json.load(f)
  suites = {"corpus": [], "realistic": []}
  for part, suite in (
    ("zoo", "corpus"),
    ("keras", "corpus"),
    ("mosaic", "corpus"),
    ("recurrent", "corpus"),
    ("realistic-zoo", "realistic"),
    ("realistic-keras", "realistic"),
  ):
    for name, _ in _plan(part):
      if name not in found:
        continue
      if suite == "corpus":
        k = len({e["program"] for e in suites["corpus"]})
        entries = _entries(name, found[name], CORPUS_CAPACITIES[k % 3], "train")
      elif REALISTIC_BUFFERS[0] <= found[name]["buffers"] <= REALISTIC_BUFFERS[1]:
        entries = _entries(name, found[name], REALISTIC_CAPACITIES, "heldout")
      else:
        print(f"{name}: {found[name]['buffers']} buffers, outside {REALISTIC_BUFFERS}; left out")
        continue
      manifest["programs"][name] = found[name]
      suites[suite] += entries
  front_ends = sorted({manifest["programs"][e["program"]]["front_end"] for e in suites["corpus"]})
  manifest["suites"]["corpus"] = {
    "description": f"training corpus: {len({e['program'] for e in suites['corpus']})} programs "
    f"({', '.join(front_ends)}), each on both machines at two of 10%, 25% and 50% of peak",
    "training_only": True,
    "entries": suites["corpus"],
  }
  manifest["suites"]["realistic"] = {
    "description": "evaluation only: programs of 1,000-20,000 buffers from models absent from "
    "the corpus (Keras applications, a LLaMA-style Haiku decoder), on both machines at 10% and "
    "25% of peak; every entry held out",
    "evaluation_only": True,
    "entries": suites["realistic"],
  }
  write_builtin_suites(
    {"suites": {s: manifest["suites"][s] for s in suites}, "programs": manifest["programs"]}
  )
  print(
    f"wrote {SUITES_DIR}/{{corpus,realistic}}.json: corpus {len(suites['corpus'])} entries, "
    f"realistic {len(suites['realistic'])} entries"
  )
  return 0


def main() -> int:
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("action", choices=("import", "manifest"))
  parser.add_argument(
    "part",
    nargs="?",
    choices=("zoo", "keras", "mosaic", "recurrent", "realistic-zoo", "realistic-keras"),
  )
  parser.add_argument("--records", default="runs/corpus-records")
  parser.add_argument("--force", action="store_true")
  args = parser.parse_args()
  if args.action == "import":
    if not args.part:
      parser.error("import needs a part")
    return import_part(args.part, args.records, args.force)
  return write_manifest(args.records)


if __name__ == "__main__":
  sys.exit(main())
