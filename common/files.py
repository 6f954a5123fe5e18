"""Output files: checked before the work that fills them, written atomically after it.

Every command names its outputs up front (`--out`, `--plot`, `--workdir`) and runs for seconds to
hours before it writes them, so a path that cannot be written is refused first, in one line
(`check_output_file`, `check_output_dir`). Every file the project writes goes through
`atomic_write`: a temporary file in the destination's directory, renamed over the destination
once complete, so a reader (or a crash) sees the old file or the new one, never half of one, and
a failed write leaves nothing behind.

It lives in `env`, the bottom of the import order, so that every package can use it.
"""

from __future__ import annotations

import contextlib
import os
import secrets
import threading
from typing import IO, Iterator, Optional, Sequence

from malloczero.common.errors import MalloczeroError


class OutputError(MalloczeroError, OSError):
  """An output path cannot be written (the message names the path and why)."""


def _reason(e: OSError) -> str:
  return e.strerror or str(e)


def _probe_writable(directory: str) -> Optional[str]:
  """None if a file can be created in `directory`, else why not. Creating one is the only reliable
  test: `os.access` says yes to root on /proc and on read-only bind mounts."""
  probe = os.path.join(directory, f".malloczero-probe-{os.getpid()}-{secrets.token_hex(4)}")
  try:
    os.close(os.open(probe, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o600))
  except OSError as e:
    return _reason(e)
  with contextlib.suppress(OSError):
    os.unlink(probe)
  return None


def check_output_file(
  path: str | os.PathLike, what: str = "--out", extensions: Optional[Sequence[str]] = None
) -> str:
  """Raises OutputError unless `path` can be written as a file: it is not a directory, its
  directory exists and accepts new files, and (when `extensions` is given) it ends in one of them.
  Returns the path as a string."""
  path = os.fspath(path)
  if not path:
    raise OutputError(f"{what}: empty path")
  if extensions is not None:
    extension = os.path.splitext(path)[1].lstrip(".").lower()
    if extension not in extensions:
      found = f"'.{extension}'" if extension else "no extension"
      raise OutputError(
        f"{what} {path}: {found}; a picture needs one of {', '.join('.' + e for e in extensions)}"
      )
  if os.path.isdir(path):
    raise OutputError(f"{what} {path}: is a directory; give a file name")
  directory = os.path.dirname(os.path.abspath(path))
  if not os.path.isdir(directory):
    raise OutputError(
      f"{what} {path}: directory {directory} does not exist"
      if not os.path.exists(directory)
      else f"{what} {path}: {directory} is not a directory"
    )
  if os.path.exists(path) and not os.path.isfile(path):
    # A device or a pipe (/dev/null, /dev/stdout): written in place, so it must be writable.
    if not os.access(path, os.W_OK):
      raise OutputError(f"{what} {path}: not writable")
    return path
  why = _probe_writable(directory)
  if why:
    raise OutputError(f"{what} {path}: cannot create a file in {directory}: {why}")
  return path


def _same_file(a: str, b: str) -> bool:
  try:
    return os.path.samefile(a, b)
  except OSError:  # One of them does not exist (yet): the same path all the same?
    return os.path.realpath(a) == os.path.realpath(b)


def check_distinct_files(
  outputs: Sequence[tuple[str, Optional[str]]], inputs: Sequence[str]
) -> None:
  """Raises OutputError when an output (`(flag, path)`, None: not asked for) is one of `inputs`
  (it would be overwritten, silently, by what was read from it) or the same file as another
  output (one would overwrite the other)."""
  given = [(flag, os.fspath(path)) for flag, path in outputs if path]
  for flag, path in given:
    for source in inputs:
      if source and _same_file(path, os.fspath(source)):
        raise OutputError(f"{flag} {path}: is an input of this command; write somewhere else")
  for i, (flag, path) in enumerate(given):
    for other_flag, other in given[i + 1 :]:
      if _same_file(path, other):
        raise OutputError(f"{flag} and {other_flag} are the same file ({path}): give two names")


def check_output_dir(path: str | os.PathLike, what: str = "--out") -> str:
  """Raises OutputError unless `path` is a writable directory or one that can be created (its
  nearest existing ancestor is a writable directory). Nothing is created. Returns the path."""
  path = os.fspath(path)
  if not path:
    raise OutputError(f"{what}: empty path")
  if os.path.exists(path) and not os.path.isdir(path):
    raise OutputError(f"{what} {path}: is a file, not a directory")
  ancestor = os.path.abspath(path)
  while not os.path.exists(ancestor):
    ancestor = os.path.dirname(ancestor)
  if not os.path.isdir(ancestor):
    raise OutputError(f"{what} {path}: cannot create it: {ancestor} is a file")
  why = _probe_writable(ancestor)
  if why:
    raise OutputError(
      f"{what} {path}: cannot "
      f"{'write in it' if ancestor == os.path.abspath(path) else 'create it'}: "
      f"{why}"
    )
  return path


@contextlib.contextmanager
def atomic_write(
  path: str | os.PathLike, mode: str = "w", fsync: bool = False, **open_kwargs
) -> Iterator[IO]:
  """`open(path, mode)` that writes a temporary file beside `path` and renames it over `path` when
  the block ends without an exception; on one, the temporary file is removed and `path` is
  untouched. `mode` is "w" or "wb"; `open_kwargs` go to `open` (text mode defaults to UTF-8).
  `fsync` makes the data durable before the rename (checkpoints). A device or pipe (/dev/null) is
  written in place. An OSError becomes an OutputError naming the path."""
  if mode not in ("w", "wb"):
    raise ValueError(f"atomic_write: mode must be 'w' or 'wb', not {mode!r}")
  path = os.fspath(path)
  if "b" not in mode:
    open_kwargs.setdefault("encoding", "utf-8")
  if os.path.exists(path) and not os.path.isfile(path) and not os.path.isdir(path):
    try:
      with open(path, mode, **open_kwargs) as f:
        yield f
    except OSError as e:
      raise OutputError(f"{path}: cannot write: {_reason(e)}") from e
    return
  directory, name = os.path.split(os.path.abspath(path))
  # Unique per process and thread; created with the usual permissions (0666 less the umask).
  tmp = os.path.join(
    directory, f".{name}.{os.getpid()}.{threading.get_ident()}.{secrets.token_hex(3)}.tmp"
  )
  try:
    fd = os.open(tmp, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o666)
    with open(fd, mode, **open_kwargs) as f:
      yield f
      f.flush()
      if fsync:
        os.fsync(f.fileno())
    os.replace(tmp, path)
  except BaseException as e:
    with contextlib.suppress(OSError):
      os.unlink(tmp)
    if isinstance(e, OSError) and not isinstance(e, OutputError):
      raise OutputError(f"{path}: cannot write: {_reason(e)}") from e
    raise


def write_text(path: str | os.PathLike, text: str) -> None:
  """`text` to `path` atomically (UTF-8)."""
  with atomic_write(path, "w") as f:
    f.write(text)


def write_bytes(path: str | os.PathLike, data: bytes) -> None:
  """`data` to `path` atomically."""
  with atomic_write(path, "wb") as f:
    f.write(data)


def user_cache_dir(*parts: str) -> str:
  """$XDG_CACHE_HOME/malloczero/PARTS (default ~/.cache/malloczero/PARTS): what malloczero keeps
  between commands (compiled programs, baseline results); deleting it costs only time."""
  base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
  return os.path.join(base, "malloczero", *parts)
