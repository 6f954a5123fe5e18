"""The `malloczero` command line: one module per command in launch/commands/.

Every user error (bad files, impossible hardware, wrong flags) ends in one line on stderr,
`malloczero: error: ...`, and a non-zero exit status; never a traceback.
"""

from __future__ import annotations

import argparse
import shlex
import signal
import sys
from typing import Sequence

from malloczero.common.errors import MalloczeroError
from malloczero.common.signals import Terminated, forget_pending, raise_pending, stop_on_signals
from malloczero.launch.commands import (
  bench,
  convert_checkpoint,
  evaluate,
  hardware,
  import_program,
  solve,
  suite,
  train,
  validate,
)
from malloczero.launch.compilation_cache import use_compilation_cache
from malloczero.launch.flags import FlagError, Parser, one_line

EXIT_INPUT_ERROR = 1
EXIT_FLAG_ERROR = 2
EXIT_INTERRUPTED = 130
EXIT_TERMINATED = 143  # 128 + SIGTERM, as a shell reports a process it killed.
EXIT_HUNG_UP = 129  # 128 + SIGHUP.
# In the order `malloczero --help` lists them.
COMMANDS = (
  validate,
  solve,
  import_program,
  suite,
  hardware,
  evaluate,
  bench,
  train,
  convert_checkpoint,
)


def build_parser() -> argparse.ArgumentParser:
  parser = Parser(
    prog="malloczero",
    description="Learned memory mapping for compiled ML "
    "programs: mallocGame, its cost model, baselines and a distributed MuZero "
    "agent.",
  )
  sub = parser.add_subparsers(dest="command", required=True, parser_class=Parser)
  for command in COMMANDS:
    command.add_parser(sub)
  return parser


def main(argv: Sequence[str] | None = None) -> int:
  argv = list(sys.argv[1:] if argv is None else argv)
  parser = build_parser()
  args = parser.parse_args(argv)
  args.command_line = shlex.join(["malloczero", *argv])  # What resumes an interrupted `train`.
  if getattr(args, "compilation_cache", True):
    use_compilation_cache()
  # `train` stops its nodes on SIGTERM itself (Launchpad's worker manager, system/guards.py).
  if args.command != "train":
    stop_on_signals()
  try:
    status = args.func(args)
    raise_pending()  # A signal whose exception was lost (common/signals.py) still stops it.
    return status
  except FlagError as e:
    print(
      f"malloczero: error: {one_line(str(e))} (see 'malloczero {args.command} --help')",
      file=sys.stderr,
    )
    return EXIT_FLAG_ERROR
  except MalloczeroError as e:
    print(f"malloczero: error: {one_line(str(e))}", file=sys.stderr)
    return EXIT_INPUT_ERROR
  except OSError as e:  # A file that vanished or a disk that filled up mid-run: still one line.
    where = f"{e.filename}: " if e.filename else ""
    print(f"malloczero: error: {one_line(f'{where}{e.strerror or e}')}", file=sys.stderr)
    return EXIT_INPUT_ERROR
  except KeyboardInterrupt:
    forget_pending()
    resume = f"; resume with: {args.command_line}" if args.command == "train" else ""
    print(f"malloczero: interrupted{resume}", file=sys.stderr)
    return EXIT_INTERRUPTED
  except Terminated as e:
    forget_pending()
    if e.signum == signal.SIGHUP:
      print("malloczero: hung up (the terminal closed)", file=sys.stderr)
      return EXIT_HUNG_UP
    resume = f"; resume with: {args.command_line}" if args.command == "train" else ""
    print(f"malloczero: terminated{resume}", file=sys.stderr)
    return EXIT_TERMINATED


if __name__ == "__main__":
  sys.exit(main())
