"""Input files read whole: regular files only, and no larger than a limit checked before reading.

Every file a command reads whole (workloads, MiniMalloc CSVs, mappings, hardware files, HLO text,
manifests, run configurations, checkpoints) goes through `read_input_bytes`. Why: `open().read()`
on `/dev/zero` reads without end, on a FIFO waits for a writer, and on a gzip bomb decompresses
into all of memory before anything looks at the content. Here the path is refused in one line,
as the caller's own error class, when it is not a regular file, when it is larger than
`max_input_bytes()`, or, for `.gz`, when it decompresses to more than that; decompression stops
at the limit. `MALLOCZERO_MAX_INPUT_BYTES` raises (or lowers) the limit.
"""

from __future__ import annotations

import gzip
import os
import stat
import zlib
from typing import Type

from malloczero.common.errors import MalloczeroError

MAX_INPUT_ENV = "MALLOCZERO_MAX_INPUT_BYTES"
# The largest input read whole by default: well above the largest program this project imports
# (a 100,000-buffer workload is about 30 MB of JSON, an LLM training step's HLO text about
# 100 MB), well below what reading it takes of a 24 GiB machine.
DEFAULT_MAX_INPUT_BYTES = 1 << 30
_CHUNK = 1 << 20


def max_input_bytes() -> int:
  """$MALLOCZERO_MAX_INPUT_BYTES (a positive integer), else `DEFAULT_MAX_INPUT_BYTES`."""
  text = os.environ.get(MAX_INPUT_ENV, "").strip()
  if not text:
    return DEFAULT_MAX_INPUT_BYTES
  try:
    value = int(text)
  except ValueError:
    value = 0
  if value <= 0:
    raise MalloczeroError(
      f"{MAX_INPUT_ENV}={text!r}: give the largest input file to read, in bytes (a positive "
      "integer)"
    )
  return value


def _kind(mode: int) -> str:
  for test, name in (
    (stat.S_ISDIR, "a directory"),
    (stat.S_ISFIFO, "a FIFO"),
    (stat.S_ISCHR, "a character device"),
    (stat.S_ISBLK, "a block device"),
    (stat.S_ISSOCK, "a socket"),
  ):
    if test(mode):
      return name
  return "not a regular file"


def _too_large(path: str, what: str, limit: int) -> str:
  return (
    f"{path}: {what} more than {limit:,} bytes, the largest input read whole (set "
    f"{MAX_INPUT_ENV} to read larger files)"
  )


def check_input_file(path: str, error: Type[MalloczeroError]) -> int:
  """Refuses `path` in one line (`error`) unless it is a regular file within the size limit;
  returns its size in bytes. Never opens it, so a FIFO does not block."""
  try:
    info = os.stat(path)
  except FileNotFoundError:
    raise error(f"{path}: no such file") from None
  except OSError as e:
    raise error(f"{path}: cannot read: {e.strerror or e}") from None
  if not stat.S_ISREG(info.st_mode):
    raise error(f"{path}: {_kind(info.st_mode)}, not a file: give a regular file")
  limit = max_input_bytes()
  if info.st_size > limit:
    raise error(_too_large(path, f"{info.st_size:,} bytes,", limit))
  return info.st_size


def read_input_bytes(path: str | os.PathLike, error: Type[MalloczeroError]) -> bytes:
  """The bytes of `path`, decompressed when it ends in `.gz`, refused in one line (`error`) when
  it is not a regular file, is too large or decompresses to too much, or cannot be read."""
  path = os.fspath(path)
  check_input_file(path, error)
  limit = max_input_bytes()
  try:
    if not path.endswith(".gz"):
      with open(path, "rb") as f:
        data = f.read(limit + 1)
      if len(data) > limit:  # Grew since it was checked.
        raise error(_too_large(path, "it holds", limit))
      return data
    parts, total = [], 0
    with gzip.open(path, "rb") as f:
      while True:
        part = f.read(_CHUNK)
        if not part:
          break
        total += len(part)
        if total > limit:
          raise error(_too_large(path, "it decompresses to", limit))
        parts.append(part)
    return b"".join(parts)
  except (OSError, EOFError, zlib.error) as e:
    raise error(
      f"{path}: cannot read: {str(e).splitlines()[0] if str(e) else type(e).__name__}"
    ) from None


def read_input_text(path: str | os.PathLike, error: Type[MalloczeroError]) -> str:
  """`read_input_bytes` decoded as UTF-8; a file that is not UTF-8 is refused in one line."""
  path = os.fspath(path)
  raw = read_input_bytes(path, error)
  try:
    return raw.decode("utf-8")
  except UnicodeDecodeError as e:
    raise error(
      f"{path}: not UTF-8 text (byte 0x{e.object[e.start]:02x} at offset {e.start}): "
      "is it the right file?"
    ) from None
