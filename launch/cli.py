"""The `malloczero` command line: one module per command in launch/commands/.

Every user error (bad files, impossible hardware, wrong flags) ends in one line on stderr,
`malloczero: error: ...`, and a non-zero exit status; never a traceback.
"""

from __future__ import annotations

import argparse
import sys
from typing import Sequence

from malloczero.common.errors import MalloczeroError
from malloczero.launch.commands import (bench, convert_checkpoint, evaluate, imports, solve, suite,
                                        train, validate)
from malloczero.launch.compilation_cache import use_compilation_cache
from malloczero.launch.flags import Parser

EXIT_INPUT_ERROR = 1
# In the order `malloczero --help` lists them.
COMMANDS = (validate, solve, imports, suite, evaluate, bench, train, convert_checkpoint)


def build_parser() -> argparse.ArgumentParser:
  parser = Parser(prog="malloczero", description="Learned memory mapping for compiled ML "
                  "programs: mallocGame, its cost model, baselines and a distributed MuZero "
                  "agent.")
  sub = parser.add_subparsers(dest="command", required=True, parser_class=Parser)
  for command in COMMANDS:
    command.add_parser(sub)
  return parser


def main(argv: Sequence[str] | None = None) -> int:
  args = build_parser().parse_args(argv)
  if getattr(args, "compilation_cache", True):
    use_compilation_cache()
  try:
    return args.func(args)
  except MalloczeroError as e:
    print(f"malloczero: error: {e}", file=sys.stderr)
    return EXIT_INPUT_ERROR
  except OSError as e:  # A file that vanished or a disk that filled up mid-run: still one line.
    where = f"{e.filename}: " if e.filename else ""
    print(f"malloczero: error: {where}{e.strerror or e}", file=sys.stderr)
    return EXIT_INPUT_ERROR
  except KeyboardInterrupt:
    print("malloczero: interrupted", file=sys.stderr)
    return 130


if __name__ == "__main__":
  sys.exit(main())
