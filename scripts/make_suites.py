#!/usr/bin/env python
"""Generates the built-in suites: compiles the model zoo with XLA (CPU), imports each program,
and writes env/programs/data/workloads/<program>.json.gz and the suites' manifests,
env/programs/data/suites/<suite>.json (the one format of every suite, env/programs/user_suites.py).

  .venv/bin/python scripts/make_suites.py            # all suites (a few minutes on 2 cores)
  .venv/bin/python scripts/make_suites.py --only tiny

The output is committed, so users and CI never need to run this. Programs already present are
re-imported only with --force.
"""

from __future__ import annotations

import argparse
import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from rich.progress import Progress  # noqa: E402

from malloczero.env.programs import import_model, program_name  # noqa: E402
from malloczero.env.programs.suites import SUITES_DIR, WORKLOAD_DIR  # noqa: E402
from malloczero.env.programs.user_suites import (  # noqa: E402
  load_builtin_suites,
  write_builtin_suites,
)
from malloczero.env.programs.zoo import MODELS  # noqa: E402
from malloczero.env.workload_json import load_workload, save_workload  # noqa: E402

# Held-out models, one per family where possible: never trained on, to measure generalisation.
HELDOUT_MODELS = {"default": ("mobilenet", "vit", "gru", "deepfm"), "tiny": ("lstm",)}
# (hardware, fraction of peak live bytes) cycled over each model's programs so that every model
# meets both machines and several levels of contention.
CONFIGS = (
  ("tpu-v4i-like", 0.25),
  ("nnpi-like", 0.25),
  ("tpu-v4i-like", 0.10),
  ("nnpi-like", 0.50),
  ("tpu-v4i-like", 0.50),
  ("nnpi-like", 0.10),
)
# tiny: small versions of four models, for tests and CI.
TINY_PROGRAMS = (("mlp", 2, True), ("gpt", 1, False), ("vgg", 1, False), ("lstm", 1, True))


def default_programs():
  for model, spec in MODELS.items():
    for batch in spec.default_batches:
      for train in (False, True) if spec.supports_training else (False,):
        yield model, batch, train


def entry(suite, model, program, hardware, fraction):
  return {
    "name": f"{program}@{hardware}:{int(round(fraction * 100))}%",
    "program": program,
    "hardware": hardware,
    "capacity_fraction": fraction,
    "split": "heldout" if model in HELDOUT_MODELS[suite] else "train",
    "model": model,
  }


def main() -> int:
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("--only", choices=("tiny", "default"))
  parser.add_argument("--force", action="store_true")
  args = parser.parse_args()
  os.makedirs(WORKLOAD_DIR, exist_ok=True)
  manifest = load_builtin_suites()
  plan = {}
  if args.only in (None, "tiny"):
    plan["tiny"] = [(m, b, t, True) for m, b, t in TINY_PROGRAMS]
  if args.only in (None, "default"):
    plan["default"] = [(m, b, t, False) for m, b, t in default_programs()]
  with Progress() as progress:
    for suite, programs in plan.items():
      task = progress.add_task(f"suite {suite}", total=len(programs))
      entries = []
      per_model_count: dict[str, int] = {}
      for model, batch, train, tiny in programs:
        name = program_name(model, batch, train, tiny)
        path = os.path.join(WORKLOAD_DIR, f"{name}.json.gz")
        progress.update(task, description=f"suite {suite}: {name}")
        t0 = time.perf_counter()
        if args.force or not os.path.exists(path) or name not in manifest["programs"]:
          workload, stats = import_model(model, batch, train, tiny=tiny)
          save_workload(workload, path)
          manifest["programs"][name] = {
            "model": model,
            "batch": batch,
            "train": train,
            "tiny": tiny,
            "ops": workload.num_ops,
            "buffers": workload.num_buffers,
            "peak_live_bytes": workload.peak_live_bytes,
            "total_flops": float(workload.arrays.flops.sum()),
            "xla_memory_analysis": stats,
            "import_s": round(time.perf_counter() - t0, 2),
            "source": workload.source,
          }
        else:
          workload = load_workload(path)
        k = per_model_count.get(model, 0)
        per_model_count[model] = k + 1
        if suite == "tiny":
          configs = [CONFIGS[0]] + ([CONFIGS[1]] if k == 0 and model in ("mlp", "gpt") else [])
        else:
          configs = [CONFIGS[(k + sum(map(ord, model))) % len(CONFIGS)]]
        entries += [entry(suite, model, name, hw, frac) for hw, frac in configs]
        progress.advance(task)
      descriptions = {
        "tiny": "small XLA programs of four zoo models, for tests and CI",
        "default": f"{len(MODELS)} Haiku models compiled by XLA (CPU), inference and training "
        "steps at two batch sizes, each at a contended fast capacity",
      }
      manifest["suites"][suite] = {"description": descriptions[suite], "entries": entries}
  written = write_builtin_suites(manifest)
  total = sum(os.path.getsize(os.path.join(WORKLOAD_DIR, p)) for p in os.listdir(WORKLOAD_DIR))
  print(
    f"wrote {len(written)} manifests in {SUITES_DIR}: "
    f"{sum(len(s['entries']) for s in manifest['suites'].values())} entries, "
    f"{len(manifest['programs'])} programs, {total / 2**20:.1f} MiB of workloads"
  )
  return 0


if __name__ == "__main__":
  sys.exit(main())
