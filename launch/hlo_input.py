"""Programs as the commands take them: a workload file, a MiniMalloc CSV or an HLO text module.

`import-hlo` writes an HLO module's workload where it is told; `solve`, `validate` and `train
--workload` import a module on first use through the import cache
(env/programs/import_cache.py) and say on stderr, as `import-hlo` does, what the importer did or
which cached import they used. Both print the importer's notes the same way (`print_notes`).
"""

from __future__ import annotations

import sys
from typing import Iterable, Optional

from malloczero.common.errors import MalloczeroError
from malloczero.env.programs.import_cache import hlo_name, hlo_source
from malloczero.env.workload import Workload
from malloczero.env.workload_json import load_workload, workload_format

REIMPORT_HELP = (
  "an HLO module (.hlo/.txt): import it again, not using the import cached from an earlier "
  "run (the new import replaces it)"
)


def print_notes(notes: Iterable[str]) -> None:
  """The importer's notes on stderr: what was done (parser, compiling) and one warning per kind."""
  for note in notes:
    print(f"import-hlo: {note}", file=sys.stderr)


def load_program(
  path: str, reimport: bool = False, need_file: bool = False
) -> tuple[Workload, Optional[str]]:
  """The workload of `path` and a workload file that holds it: the file itself, or for an HLO
  module the import cache's entry, None where it could not be written. `need_file` (`train`,
  whose nodes load the program from a file) refuses that case."""
  if workload_format(path) != "hlo":
    if reimport:
      raise MalloczeroError(f"--reimport is for HLO modules (.hlo, .txt), not {path}")
    return load_workload(path), path
  workload, stored = import_program(path, reimport=reimport)
  if stored is None and need_file:
    raise MalloczeroError(
      f"{path}: the imported workload could not be kept in the import cache (see above), and "
      "`train --workload` loads it from there: set MALLOCZERO_IMPORT_CACHE_DIR to a writable "
      "directory, or write it with `malloczero import-hlo` and pass that file"
    )
  return workload, stored


def import_program(path: str, reimport: bool = False) -> tuple[Workload, Optional[str]]:
  """An HLO module's workload, through the import cache, saying on stderr what happened: the
  import cached in PATH was used (and when it was imported), or the importer's notes and where the
  new import is kept."""
  from malloczero.env.programs.import_cache import default_cache_dir, import_hlo_file

  result = import_hlo_file(path, hlo_name(path), hlo_source(path), reimport=reimport)
  if result.cached:
    print(
      f"import-hlo: using the import of {path} cached in {result.path} (imported "
      f"{result.imported} in {result.seconds:.1f} s; --reimport imports it again)",
      file=sys.stderr,
    )
    return result.workload, result.path
  if result.dropped:
    print(
      f"import-hlo: the cached import could not be used ({result.dropped}); imported it again",
      file=sys.stderr,
    )
  print_notes(result.notes)
  kept = (
    f"kept in {result.path}"
    if result.path
    else f"not kept: the cache {default_cache_dir()} cannot be written ({result.unsaved})"
  )
  print(f"import-hlo: imported {path} in {result.seconds:.1f} s; {kept}", file=sys.stderr)
  return result.workload, result.path
