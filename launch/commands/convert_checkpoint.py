"""`malloczero convert-checkpoint PATH --trust`: an older, pickled learner checkpoint rewritten in
the current format (arrays and JSON metadata, which loading cannot run)."""

from __future__ import annotations

import argparse
import os
import sys

from malloczero.common.errors import MalloczeroError


def add_parser(sub: argparse._SubParsersAction) -> None:
  p = sub.add_parser(
    "convert-checkpoint",
    help="rewrite an older, pickled learner checkpoint "
    "(learner_state.pkl) in the current format; reading a pickle runs code its "
    "author put in it, so this needs --trust",
  )
  p.add_argument(
    "checkpoint",
    help="the learner_state.pkl file, or the checkpoints/ folder or "
    "training work directory holding it",
  )
  p.add_argument(
    "--trust",
    action="store_true",
    help="I know where this file comes from: unpickling it may run any code in it",
  )
  p.add_argument(
    "--out",
    help="where to write the converted checkpoint (default: learner_state.npz beside the pickle)",
  )
  p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
  from malloczero.configs.workdir import LEGACY_CHECKPOINT_FILENAME, WorkDir

  path = args.checkpoint
  if os.path.isfile(os.path.join(WorkDir(path).checkpoints, LEGACY_CHECKPOINT_FILENAME)):
    path = WorkDir(path).checkpoints
  if not args.trust:
    raise MalloczeroError(
      f"reading '{args.checkpoint}' would unpickle it, which runs any code "
      "its author put in it: pass --trust only if you trust where it came "
      "from"
    )
  if args.out:
    from malloczero.common.files import check_output_file

    check_output_file(args.out)
  from malloczero.learner.checkpoint import checkpoint_steps, convert_legacy_checkpoint

  print(
    "malloczero: notice: unpickling a checkpoint runs its author's code (--trust)", file=sys.stderr
  )
  written = convert_legacy_checkpoint(path, args.out)
  print(f"wrote {written} (learner step {checkpoint_steps(written)})")
  return 0
