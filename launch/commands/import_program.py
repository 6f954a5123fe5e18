"""`malloczero import-jax MODEL` and `malloczero import-hlo FILE`: programs compiled by XLA, as
workload files."""

from __future__ import annotations

import argparse
import os
import sys

from malloczero.common.errors import MalloczeroError
from malloczero.common.files import check_distinct_files, check_output_file
from malloczero.common.inputs import read_input_text
from malloczero.common.units import human_bytes
from malloczero.env.workload import Workload
from malloczero.launch.flags import OnceBooleanOptionalAction, bounded, console, positive_int
from malloczero.launch.hlo_input import hlo_name, hlo_source, print_notes

# The zoo's models are built with real parameters and inputs of this batch: past it a model's
# arrays alone outgrow a workstation's memory (ResNet-50's inputs at 1,024 are 0.6 GB).
MAX_IMPORT_BATCH = 1024


def add_parser(sub: argparse._SubParsersAction) -> None:
  p = sub.add_parser("import-jax", help="compile a zoo model with XLA (CPU) into a workload")
  p.add_argument("model", help="zoo model name, e.g. resnet50, bert, gpt, lstm, mlp")
  p.add_argument(
    "--batch",
    type=bounded(positive_int, MAX_IMPORT_BATCH),
    help=f"batch size (default: the model's first), at most {MAX_IMPORT_BATCH:,}",
  )
  p.add_argument("--train", action="store_true", help="a full training step instead of inference")
  p.add_argument("--tiny", action="store_true", help="the model's tiny test version")
  p.add_argument("--out", required=True, help="workload file (.json or .json.gz)")
  p.set_defaults(func=run_import_jax)

  p = sub.add_parser(
    "import-hlo",
    help="import an HLO text module (from any backend; an "
    "unscheduled one is compiled with XLA on the CPU first)",
  )
  p.add_argument(
    "hlo",
    help="HLO text, as printed by compiled.as_text() or XLA's dump "
    "(--xla_dump_to=DIR --xla_dump_hlo_as_text: the *after_optimizations.txt file)",
  )
  p.add_argument("--name", help="workload name (default: the file's name)")
  p.add_argument(
    "--compile",
    action=OnceBooleanOptionalAction,
    default=None,
    help="compile the module with XLA on the CPU before importing it (default: "
    "only when it is not scheduled); --no-compile keeps the print order of an "
    "unscheduled module as its schedule",
  )
  p.add_argument(
    "--xla-report",
    metavar="FILE",
    help="XLA's buffer assignment of the same dump (its *-buffer-assignment.txt, or the "
    "*-memory-usage-report.txt beside it): compare the imported peak and the largest live "
    "values with XLA's, and say where they differ and why (default: a one-line comparison "
    "with the buffer assignment beside FILE, when XLA wrote one)",
  )
  p.add_argument("--out", required=True, help="workload file (.json or .json.gz)")
  p.set_defaults(func=run_import_hlo)


def _describe_import(workload: Workload, out: str, stats: dict | None = None) -> None:
  line = (
    f"wrote {out}: '{workload.name}', {workload.num_ops} ops, {workload.num_buffers} "
    f"buffers, {workload.arrays.flops.sum():.4g} flops, peak live "
    f"{human_bytes(workload.peak_live_bytes)}"
  )
  if stats and "total_bytes" in stats:
    line += f" (XLA's memory analysis: {human_bytes(stats['total_bytes'])})"
  print(line)


def run_import_jax(args: argparse.Namespace) -> int:
  from malloczero.env.programs import import_model
  from malloczero.env.programs.zoo import MODELS
  from malloczero.env.workload_json import save_workload

  if args.model not in MODELS:
    raise MalloczeroError(f"unknown model '{args.model}' (choose from {', '.join(MODELS)})")
  check_output_file(args.out)
  batch = args.batch or MODELS[args.model].default_batches[0]
  with console(stderr=True).status(
    f"compiling {args.model} (batch {batch}{', training step' if args.train else ''}) with XLA..."
  ):
    workload, stats = import_model(args.model, batch, args.train, tiny=args.tiny)
  save_workload(workload, args.out)
  _describe_import(workload, args.out, stats)
  return 0


def run_import_hlo(args: argparse.Namespace) -> int:
  from malloczero.env.programs.hlo_import import import_hlo_text
  from malloczero.env.programs.hlo_import.xla_report import read_xla_report, report_beside
  from malloczero.env.workload_json import save_workload

  check_distinct_files([("--out", args.out)], [args.hlo, args.xla_report])
  check_output_file(args.out)
  text = read_input_text(args.hlo, MalloczeroError)
  # XLA's report is read first, so that a bad one is refused before anything is written.
  report = read_xla_report(args.xla_report) if args.xla_report else None
  beside = report_beside(args.hlo) if not args.xla_report else None
  if beside:
    try:
      report = read_xla_report(beside)
    except MalloczeroError as e:  # Not asked for: a damaged report beside the dump is a note.
      print(f"import-hlo: not compared with XLA's report: {e}", file=sys.stderr)
  result = import_hlo_text(
    text, args.name or hlo_name(args.hlo), source=hlo_source(args.hlo), compile=args.compile
  )
  print_notes(result.notes)
  save_workload(result.workload, args.out)
  _describe_import(result.workload, args.out)
  if report is not None:
    _compare_with_xla_report(result, report, full=bool(args.xla_report))
  return 0


def _compare_with_xla_report(result, report, full: bool) -> None:
  """XLA's own numbers beside the import's: in full for `--xla-report`, else one line when XLA
  left its buffer assignment beside the module."""
  from malloczero.env.programs.hlo_import.xla_report import compare_with_xla

  path = report.path
  if result.compiled:
    print(
      f"import-hlo: not compared with {path}: the module was compiled again here, so XLA's "
      "report describes another program",
      file=sys.stderr,
    )
    return
  comparison = compare_with_xla(result.workload, report)
  if full:
    print("\n".join(comparison.lines))
  elif comparison.ratio is not None:
    print(
      f"XLA's buffer assignment beside it ({os.path.basename(path)}): peak "
      f"{human_bytes(comparison.xla_peak_bytes)}; the import by XLA's rules "
      f"{(comparison.ratio - 1) * 100:+.1f}% (--xla-report FILE says where they differ)"
    )
