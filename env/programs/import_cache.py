"""HLO text modules imported once: their workloads kept on disk, keyed by content and importer.

`solve`, `validate` and `train --workload` take an XLA dump directly. Importing it parses the
module in XLA (a child process), may compile it on the CPU and converts it: seconds to minutes for
a large module, every time. The workload it gives is kept under `default_cache_dir()`, named by
a digest of everything it depends on (`cache_key`): the text's sha256, a stamp of the importer
(`importer_stamp`: the importer's and the workload format's source files, and the versions of the
XLA it parses and compiles with), the workload's name and source line and the compile choice. A
changed module, importer or XLA is a new key; stale entries are never read.

An entry is two files, both written atomically: `DIGEST.json.gz`, a workload file any command can
read (`train`'s nodes load the program from it), and `DIGEST.meta.json`, written last, with the
key, the importer's notes and when it was imported. An entry that cannot be read back whole (a
file missing, damaged or not what its key says) is imported again and rewritten; the directory can
be deleted at any time.
"""

from __future__ import annotations

import codecs
import dataclasses
import datetime
import glob
import hashlib
import json
import os
import re
import time
from importlib import metadata
from typing import Any, Callable, Optional

from malloczero.common.errors import MalloczeroError, WorkloadError
from malloczero.common.files import user_cache_dir, write_text
from malloczero.common.inputs import check_input_file
from malloczero.env.memory_guard import InputTooLargeError, available_bytes
from malloczero.env.workload import Workload
from malloczero.env.workload_json import load_workload, save_workload

CACHE_FORMAT = 1
CACHE_DIR_ENV = "MALLOCZERO_IMPORT_CACHE_DIR"
ENV_DIR = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
# What an import depends on besides its text, relative to env/: the importer and the workload
# format it writes. Their contents count, not their times, so a checkout that changes nothing
# keeps its entries.
IMPORTER_SOURCES = ("programs/hlo_import/*.py", "workload.py", "workload_json.py")
# XLA parses and compiles the module: its version is part of what the workload depends on.
IMPORTER_PACKAGES = ("jax", "jaxlib")
# Peak memory an import needs per byte of HLO text: measured 14-16 B in this process and ~17 B in
# XLA's parser's child process on the zoo's GPT and ResNet-50 training steps (2.2 and 5.3 MB of
# text, peak resident memory), doubled for compiling an unscheduled module on the CPU; beside the
# child's interpreter and XLA.
BYTES_PER_TEXT_BYTE = 64
IMPORT_BASE_BYTES = 200 << 20
_CHUNK = 1 << 20
_HLO_MARK = re.compile(rb"(?:^|\n)[ \t]*(?:HloModule|ENTRY)\b")


def hlo_name(path: str) -> str:
  """The workload name a module file gives: the module's name in one of XLA's dumps
  (`module_0001.jit_step.cpu_after_optimizations.txt` -> `jit_step`; TensorFlow's
  `TIME.module_0000.a_inference_step_50__XlaMustCompile_...cpu_after_optimizations.txt` ->
  `a_inference_step_50`), else the file name up to its first dot."""
  base = os.path.basename(path)
  dump = re.fullmatch(
    r"(?:\d+\.)?module_\d+\.(.+?)\.(?:\w+_)?(?:after|before)_optimizations\.txt", base
  )
  if not dump:
    return base.split(".")[0]
  return dump.group(1).split("__XlaMustCompile")[0]  # TensorFlow's long function names.


def hlo_source(path: str) -> str:
  return f"xla-hlo ({os.path.basename(path)})"


def default_cache_dir() -> str:
  """$MALLOCZERO_IMPORT_CACHE_DIR, else $XDG_CACHE_HOME/malloczero/hlo-imports (default
  ~/.cache/malloczero/hlo-imports), as the baseline cache chooses its own."""
  if os.environ.get(CACHE_DIR_ENV):
    return os.environ[CACHE_DIR_ENV]
  return user_cache_dir("hlo-imports")


def importer_stamp() -> str:
  """A digest of the importer's source files (their contents) and of XLA's version."""
  digest = hashlib.sha256()
  paths = sorted(
    {p for pattern in IMPORTER_SOURCES for p in glob.glob(os.path.join(ENV_DIR, pattern))}
  )
  for path in paths:
    digest.update(os.path.relpath(path, ENV_DIR).encode())
    with open(path, "rb") as f:
      digest.update(hashlib.sha256(f.read()).digest())
  for package in IMPORTER_PACKAGES:
    try:
      version = metadata.version(package)
    except metadata.PackageNotFoundError:
      version = "absent"
    digest.update(f"{package}=={version}".encode())
  return digest.hexdigest()


@dataclasses.dataclass(frozen=True)
class HloFile:
  """An HLO text file, read once in chunks: its digest and size, without holding its text (a
  cached import needs neither the text nor the memory for it)."""

  path: str
  size: int
  sha256: str


def scan_hlo_file(path: str) -> HloFile:
  """The file's digest, after checking in one pass that it is UTF-8 text with an `HloModule` or
  `ENTRY` line; every problem is a one-line WorkloadError naming the file."""
  if not os.path.exists(path):
    raise WorkloadError(f"{path}: no such HLO file")
  check_input_file(path, WorkloadError)
  digest, decoder = hashlib.sha256(), codecs.getincrementaldecoder("utf-8")()
  size, marked, tail = 0, False, b""
  try:
    with open(path, "rb") as f:
      while chunk := f.read(_CHUNK):
        try:
          decoder.decode(chunk)
        except UnicodeDecodeError as e:
          offset = size + e.start - len(e.object) + len(chunk)
          raise WorkloadError(
            f"{path}: not UTF-8 text (byte 0x{e.object[e.start]:02x} at offset {offset}): "
            "an HLO module is text, as XLA prints it"
          ) from None
        digest.update(chunk)
        marked = marked or bool(_HLO_MARK.search(tail + chunk) or (size == 0 and _starts(chunk)))
        tail, size = chunk[-64:], size + len(chunk)
      try:
        decoder.decode(b"", final=True)
      except UnicodeDecodeError:
        raise WorkloadError(f"{path}: not UTF-8 text (it ends inside a character)") from None
  except OSError as e:
    raise WorkloadError(f"{path}: cannot read: {e.strerror or e}") from None
  if size == 0:
    raise WorkloadError(f"{path}: empty file: an HLO module was expected")
  if not marked:
    raise WorkloadError(
      f"{path}: not an HLO text module (no 'HloModule' line and no ENTRY computation): a "
      ".hlo or .txt file is read as HLO text; a workload is a .json or .json.gz file, a "
      "MiniMalloc problem a .csv file"
    )
  return HloFile(path, size, digest.hexdigest())


def _starts(chunk: bytes) -> bool:
  """Whether the file's first chunk opens with a module's first line (after a byte-order mark)."""
  return chunk.removeprefix(codecs.BOM_UTF8).lstrip().startswith((b"HloModule", b"ENTRY"))


def check_import_fits_in_memory(hlo: HloFile) -> None:
  """A one-line refusal of a module this machine cannot import (`BYTES_PER_TEXT_BYTE`), before
  the text is read; without it the out-of-memory killer ends the process with no message."""
  need = IMPORT_BASE_BYTES + BYTES_PER_TEXT_BYTE * hlo.size
  available = available_bytes()
  if available is not None and need > available:
    raise InputTooLargeError(
      f"{hlo.path}: {hlo.size / 1e6:,.0f} MB of HLO text needs about {need / 1e9:.1f} GB of "
      f"memory to import (about {BYTES_PER_TEXT_BYTE} B per byte of text), more than the "
      f"{available / 1e9:.1f} GB this machine has available: import it with `malloczero "
      "import-hlo` on a larger machine and pass the workload file"
    )


def cache_key(hlo: HloFile, name: str, source: str, compile: Optional[bool]) -> dict[str, Any]:
  """Everything an imported workload depends on."""
  return {
    "format": CACHE_FORMAT,
    "text_sha256": hlo.sha256,
    "importer": importer_stamp(),
    "name": name,
    "source": source,
    "compile": compile,
  }


@dataclasses.dataclass(frozen=True)
class Imported:
  """A module's workload, from the cache or imported now. `path` is a workload file holding it
  (None only when the cache could not be written); `notes` are the importer's, kept with the
  entry; `imported` when it was imported (UTC, ISO 8601) and in how many seconds; `dropped` why an
  entry found under its key was not used, `unsaved` why the import could not be kept."""

  workload: Workload
  path: Optional[str]
  notes: tuple[str, ...]
  cached: bool
  imported: str
  seconds: float
  dropped: Optional[str] = None
  unsaved: Optional[str] = None


def import_hlo_file(
  path: str,
  name: str,
  source: str,
  compile: Optional[bool] = None,
  directory: Optional[str] = None,
  reimport: bool = False,
  importer: Optional[Callable[..., Any]] = None,
) -> Imported:
  """The workload of the HLO module in `path`, from `directory`'s cache (default
  `default_cache_dir()`) when an entry for it is there and `reimport` is not asked, else imported
  with `importer` (default `hlo_import.import_hlo_text`) and kept there."""
  hlo = scan_hlo_file(path)
  directory = directory or default_cache_dir()
  key = cache_key(hlo, name, source, compile)
  digest = hashlib.sha256(json.dumps(key, sort_keys=True).encode()).hexdigest()
  workload_path = os.path.join(directory, f"{digest}.json.gz")
  meta_path = os.path.join(directory, f"{digest}.meta.json")
  dropped = None
  if not reimport and (os.path.exists(meta_path) or os.path.exists(workload_path)):
    entry = _read_entry(workload_path, meta_path, key)
    if isinstance(entry, Imported):
      return entry
    dropped = entry
  check_import_fits_in_memory(hlo)
  if importer is None:
    from malloczero.env.programs.hlo_import import import_hlo_text as importer
  from malloczero.common import strict_json

  text = strict_json.read_text(path, WorkloadError)
  start = time.monotonic()
  result = importer(text, name, source=source, compile=compile)
  seconds = time.monotonic() - start
  imported = datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M:%S UTC")
  meta = {"key": key, "notes": list(result.notes), "imported": imported, "seconds": seconds}
  try:
    os.makedirs(directory, exist_ok=True)
    save_workload(result.workload, workload_path)
    write_text(meta_path, json.dumps(meta, indent=1))
  except OSError as e:  # A cache that cannot be written costs the next run an import, no more.
    reason = f"{getattr(e, 'filename', None) or directory}: {e.strerror or e}"
    return Imported(
      result.workload, None, tuple(result.notes), False, imported, seconds, dropped, reason
    )
  return Imported(
    result.workload, workload_path, tuple(result.notes), False, imported, seconds, dropped
  )


def _read_entry(workload_path: str, meta_path: str, key: dict[str, Any]) -> Imported | str:
  """The entry, or why it cannot be used (it is then imported again and rewritten)."""
  try:
    try:
      with open(meta_path, encoding="utf-8") as f:
        meta = json.load(f)
    except ValueError as e:  # Not JSON (a torn or foreign file): name it.
      return f"{meta_path}: {e}"
    if not isinstance(meta, dict) or meta.get("key") != key:
      return f"{meta_path} is not the entry of this module"
    notes = meta["notes"]
    if not isinstance(notes, list) or not all(isinstance(n, str) for n in notes):
      return f"{meta_path}: malformed notes"
    workload = load_workload(workload_path)
    if workload.name != key["name"]:
      return f"{workload_path} holds '{workload.name}', not '{key['name']}'"
    return Imported(
      workload,
      workload_path,
      tuple(notes),
      True,
      str(meta["imported"]),
      float(meta["seconds"]),
    )
  except FileNotFoundError as e:
    return f"{e.filename} is missing"
  except (OSError, ValueError, KeyError, TypeError) as e:
    return str(e).splitlines()[0] if str(e) else type(e).__name__
  except MalloczeroError as e:
    if isinstance(e, MemoryError):  # Too large for this machine: so is importing it again.
      raise
    return str(e)
