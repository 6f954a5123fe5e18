"""User suites: a directory of programs made into a suite manifest (`malloczero suite make`).

A compiler team's corpus is a directory of dumps: HLO text modules (`.hlo`, `.txt`), workload
files (`.json`, `.json.gz`) and MiniMalloc problems (`.csv`). `make_suite` pairs every program
with each machine and each fraction of its peak live bytes, holds out a seeded share of the
*programs* (every entry of a held-out program is held out, as the built-ins split by model), and
writes a manifest that `train --suite`, `evaluate --suite` and `suite show` take in place of a
built-in suite's name (env/programs/suites.py `get_suite`).

The manifest names each program by its path relative to the manifest, so a directory moved
together with its manifest still works, and keeps each file's sha256: a program file that is
missing or changed since the suite was made is refused in one line that names it, since the
suite's caches, learning curves and checkpoints would otherwise mix two programs under one name.
"""

from __future__ import annotations

import dataclasses
import json
import os
from typing import Callable, Optional, Sequence

import numpy as np

from malloczero.common.files import write_text
from malloczero.common.units import human_bytes
from malloczero.env.hardware import PRESETS, load_hardware
from malloczero.env.programs.suites import (
  DATA_DIR,
  ENTRY_KEYS,
  FORMAT,
  MEASURED_KEYS,
  SUITES_DIR,
  WORKLOAD_DIR,
  SuiteEntry,
  SuiteFileError,
  builtin_manifest,
  content_hash,
  file_sha256,
  load_program_file,
  program_summary,
)
from malloczero.env.workload import Workload
from malloczero.env.workload_json import load_workload, workload_format

# Longest first: `x.json.gz` is a workload, not a `.gz` file.
PROGRAM_EXTENSIONS = (".json.gz", ".json", ".csv", ".hlo", ".txt")


def program_key(relative_path: str) -> str:
  """The program's name in the suite: its path under the directory without the extension
  (`bert/step.hlo` -> `bert/step`)."""
  for extension in PROGRAM_EXTENSIONS:
    if relative_path.endswith(extension):
      relative_path = relative_path[: -len(extension)]
      break
  return relative_path.replace(os.sep, "/")


def program_files(directory: str) -> list[str]:
  """The program files under `directory` (recursively, hidden entries skipped), relative to it
  and sorted; a file of another kind is refused, naming it and the kinds taken."""
  if not os.path.isdir(directory):
    raise SuiteFileError(
      f"{directory}: no such directory"
      if not os.path.exists(directory)
      else f"{directory}: not a directory; give the directory that holds the programs"
    )
  found = []
  for root, dirs, files in os.walk(directory):
    dirs[:] = sorted(d for d in dirs if not d.startswith("."))
    for name in sorted(files):
      if name.startswith("."):
        continue
      path = os.path.join(root, name)
      if not name.endswith(PROGRAM_EXTENSIONS):
        raise SuiteFileError(
          f"{path}: unknown program format; a suite's directory holds HLO text modules (.hlo, "
          ".txt), workload files (.json, .json.gz) and MiniMalloc problems (.csv) only"
        )
      found.append(os.path.relpath(path, directory))
  if not found:
    raise SuiteFileError(
      f"{directory}: no programs (.hlo, .txt, .json, .json.gz or .csv files) in it"
    )
  keys: dict[str, str] = {}
  for relative in found:
    key = program_key(relative)
    if key in keys:
      raise SuiteFileError(
        f"{os.path.join(directory, relative)} and {os.path.join(directory, keys[key])} are both "
        f"program '{key}': keep one of them"
      )
    keys[key] = relative
  return found


@dataclasses.dataclass(frozen=True)
class MadeProgram:
  """One program of a suite being made, with what the manifest keeps of it."""

  key: str
  relative_path: str  # To the manifest's directory.
  file_sha256: str
  format: str
  workload: Workload


def _split_programs(keys: Sequence[str], heldout: float, seed: int) -> set[str]:
  """The held-out share of the programs, drawn with `seed`: at least one program on each side
  whenever both sides are asked for and there are two programs."""
  count = int(round(heldout * len(keys)))
  if 0.0 < heldout and count == 0 and len(keys) > 1:
    count = 1
  if heldout < 1.0 and count == len(keys) and len(keys) > 1:
    count = len(keys) - 1
  order = np.random.default_rng(seed).permutation(len(keys))
  return {keys[i] for i in order[:count]}


def _hardware_label(hardware: str) -> str:
  return hardware if hardware in PRESETS else os.path.basename(hardware).split(".")[0]


def make_suite(
  directory: str,
  hardware: Sequence[str],
  capacities: Sequence[float],
  heldout: float,
  out: str,
  seed: int = 0,
  name: Optional[str] = None,
  on_program: Optional[Callable[[str, int, int], None]] = None,
) -> dict:
  """The manifest of a suite of `directory`'s programs (see the module docstring), for a file at
  `out` (program paths are relative to it); `on_program(relative_path, i, n)` is called before
  each program is loaded. Every problem is a one-line MalloczeroError."""
  if not hardware:
    raise SuiteFileError("--hardware: name at least one machine")
  if not capacities or any(not 0.0 < c <= 1.0 for c in capacities):
    raise SuiteFileError(
      f"--capacities {','.join(f'{c:g}' for c in capacities)}: give fractions of each program's "
      "peak live bytes in (0, 1], e.g. 0.1,0.25"
    )
  if not 0.0 <= heldout <= 1.0:
    raise SuiteFileError(f"--heldout {heldout:g}: give the share of programs held out, in [0, 1]")
  for spec in hardware:
    load_hardware(spec)
  machines = [spec if spec in PRESETS else os.path.abspath(spec) for spec in hardware]
  relative_paths = program_files(directory)
  manifest_dir = os.path.dirname(os.path.abspath(out))
  programs = []
  for i, relative in enumerate(relative_paths):
    path = os.path.join(directory, relative)
    if on_program is not None:
      on_program(relative, i, len(relative_paths))
    programs.append(
      MadeProgram(
        program_key(relative),
        os.path.relpath(os.path.abspath(path), manifest_dir),
        file_sha256(path),
        workload_format(path),
        load_program_file(path),
      )
    )
  held = _split_programs([p.key for p in programs], heldout, seed)
  entries = []
  for program in programs:
    for spec in machines:
      for fraction in capacities:
        entry = SuiteEntry(
          name=f"{program.key}@{_hardware_label(spec)}:{fraction * 100:g}%",
          program=program.key,
          hardware=spec,
          capacity_fraction=float(fraction),
          split="heldout" if program.key in held else "train",
          model=program.key,
        )
        entry.hardware_for(program.workload)  # A machine that cannot hold the program fails here.
        entries.append({k: getattr(entry, k) for k in sorted(ENTRY_KEYS)})
  name = name or os.path.basename(out).split(".")[0]
  peaks = [p.workload.peak_live_bytes for p in programs]
  buffers = [p.workload.num_buffers for p in programs]
  description = (
    f"{len(programs)} programs of {os.path.abspath(directory)} ({min(buffers):,}-"
    f"{max(buffers):,} buffers, peak {human_bytes(min(peaks))}-{human_bytes(max(peaks))}) on "
    f"{', '.join(map(_hardware_label, machines))} at "
    f"{', '.join(f'{c * 100:g}%' for c in capacities)} of peak; {len(held)} held out"
  )
  made = {
    "directory": os.path.abspath(directory),
    "hardware": list(hardware),
    "capacities": [float(c) for c in capacities],
    "heldout": float(heldout),
    "seed": int(seed),
  }
  return suite_manifest(
    name,
    description,
    programs,
    entries,
    evaluation_only=bool(programs) and len(held) == len(programs),
    training_only=not held,
    made=made,
  )


def program_record(program: MadeProgram, info: Optional[dict] = None) -> dict:
  """What a manifest keeps of a program: its file, its size and its content hash, and what its
  maker recorded of it (`info`)."""
  record = {
    "path": program.relative_path,
    "file_sha256": program.file_sha256,
    "format": program.format,
    "content_sha256": content_hash(program.workload),
    "ops": program.workload.num_ops,
    "buffers": program.workload.num_buffers,
    "peak_live_bytes": program.workload.peak_live_bytes,
  }
  return {**record, "info": info} if info else record


def suite_manifest(
  name: str,
  description: str,
  programs: Sequence[MadeProgram],
  entries: Sequence[dict],
  evaluation_only: bool = False,
  training_only: bool = False,
  made: Optional[dict] = None,
  info: Optional[dict[str, dict]] = None,
) -> dict:
  """A suite manifest (`FORMAT`): the one format of user suites (`make_suite`) and of the
  built-in ones (`write_builtin_suites`)."""
  manifest = {
    "format": FORMAT,
    "name": name,
    "description": description,
    "evaluation_only": evaluation_only,
    "training_only": training_only,
    "programs": {p.key: program_record(p, (info or {}).get(p.key)) for p in programs},
    "entries": [{k: e[k] for k in sorted(ENTRY_KEYS)} for e in entries],
  }
  return {**manifest, "made": made} if made else manifest


def load_builtin_suites(data_dir: str = DATA_DIR) -> dict:
  """The built-in suites as their generators (scripts/make_*.py) edit them: {"suites": {name:
  {"description", "entries", "evaluation_only"?, "training_only"?}}, "programs": {program: what
  its generator recorded}}. A data directory of before the one format (one `suites.json`) is
  read as it was."""
  legacy = os.path.join(data_dir, "suites.json")
  if os.path.exists(legacy):
    with open(legacy, encoding="utf-8") as f:
      return json.load(f)
  collected: dict = {"suites": {}, "programs": {}}
  directory = os.path.join(data_dir, "suites")
  for file in sorted(os.listdir(directory)) if os.path.isdir(directory) else ():
    if not file.endswith(".json"):
      continue
    manifest = builtin_manifest(file[: -len(".json")], data_dir)
    suite = {"description": manifest["description"], "entries": manifest["entries"]}
    for flag in ("evaluation_only", "training_only"):
      if manifest.get(flag):
        suite[flag] = True
    collected["suites"][manifest["name"]] = suite
    for key, program in manifest["programs"].items():
      collected["programs"][key] = program_summary(program)
  return collected


def write_builtin_suites(collected: dict, directory: str = SUITES_DIR) -> list[str]:
  """Writes every suite of `collected` (`load_builtin_suites`' shape) as its manifest in
  `directory`, its programs the workload files WORKLOAD_DIR holds; returns the paths written."""
  os.makedirs(directory, exist_ok=True)
  written = []
  for name, suite in collected["suites"].items():
    out = os.path.join(directory, f"{name}.json")
    programs = []
    for key in sorted({e["program"] for e in suite["entries"]}):
      path = os.path.join(WORKLOAD_DIR, f"{key}.json.gz")
      programs.append(
        MadeProgram(
          key, os.path.relpath(path, directory), file_sha256(path), "json", load_workload(path)
        )
      )
    info = {
      key: {k: v for k, v in collected["programs"].get(key, {}).items() if k not in MEASURED_KEYS}
      for key in (p.key for p in programs)
    }
    manifest = suite_manifest(
      name,
      suite["description"],
      programs,
      suite["entries"],
      evaluation_only=bool(suite.get("evaluation_only")),
      training_only=bool(suite.get("training_only")),
      info=info,
    )
    write_text(out, json.dumps(manifest, indent=1, sort_keys=True) + "\n")
    written.append(out)
  return written
