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
import os
from typing import Callable, Optional, Sequence

import numpy as np

from malloczero.common.units import human_bytes
from malloczero.env.hardware import PRESETS, load_hardware
from malloczero.env.programs.suites import (
  ENTRY_KEYS,
  FORMAT,
  SuiteEntry,
  SuiteFileError,
  content_hash,
  file_sha256,
  load_program_file,
)
from malloczero.env.workload import Workload
from malloczero.env.workload_json import workload_format

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
  return {
    "format": FORMAT,
    "name": name,
    "description": description,
    "evaluation_only": bool(programs) and len(held) == len(programs),
    "training_only": not held,
    "made": {
      "directory": os.path.abspath(directory),
      "hardware": list(hardware),
      "capacities": [float(c) for c in capacities],
      "heldout": float(heldout),
      "seed": int(seed),
    },
    "programs": {
      p.key: {
        "path": p.relative_path,
        "file_sha256": p.file_sha256,
        "format": p.format,
        "content_sha256": content_hash(p.workload),
        "ops": p.workload.num_ops,
        "buffers": p.workload.num_buffers,
        "peak_live_bytes": p.workload.peak_live_bytes,
      }
      for p in programs
    },
    "entries": entries,
  }
