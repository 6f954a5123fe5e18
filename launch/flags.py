"""What the commands share: the parser that errs in one line, flag types, the console, and the
flags derived from the solver registry (env/solvers/registry.py).

A flag type raises `argparse.ArgumentTypeError`, which the parser turns into one line and exit 2.
"""

from __future__ import annotations

import argparse
import dataclasses
import sys
from typing import Any, Callable, Collection, Iterable, Optional, Sequence

from rich.console import Console

from malloczero.common.errors import MalloczeroError
from malloczero.common.settings import MAX_SEED
from malloczero.env.hardware import PRESETS, Capacity, Hardware, describe_fast_levels
from malloczero.env.solvers.registry import Solver, option_fields


def console(stderr: bool = False) -> Console:
  """Wide tables when output goes to a file or a pipe (rich would assume 80 columns)."""
  stream = sys.stderr if stderr else sys.stdout
  return Console(stderr=stderr, width=None if stream.isatty() else 240)


def flushing_print(out: Console) -> Callable[[str], None]:
  """Log lines reach a redirected log file as they happen, not when the buffer fills, and each
  stays one line however long (rich would break it at the console's width: a long path made a
  run's closing line two)."""

  def print_fn(text: str) -> None:
    out.print(text, soft_wrap=True)
    out.file.flush()

  return print_fn


class FlagError(MalloczeroError):
  """A flag's value that only the command can judge (a wrong --msa-option, a flag the chosen
  solver ignores): exit 2, as argparse's own flag errors."""


# Control characters (a newline in a file or model name, a terminal's escape sequences) are shown
# escaped: an error stays one line and cannot repaint the user's terminal.
_CONTROL = {c: f"\\x{c:02x}" for c in (*range(0x20), 0x7F)}
_CONTROL.update({ord("\n"): "\\n", ord("\r"): "\\r", ord("\t"): "\\t"})


def one_line(message: str) -> str:
  """`message` with its control characters escaped."""
  return message.translate(_CONTROL)


class Parser(argparse.ArgumentParser):
  def error(
    self, message: str
  ) -> None:  # One line, exit 2, as argparse does, minus the usage dump.
    message = one_line(message)
    sys.stderr.write(
      f"malloczero: error: {message} (see 'malloczero {self.prog.split()[-1]} --help')\n"
      if " " in self.prog
      else f"malloczero: error: {message}\n"
    )
    sys.exit(2)


def positive_int(text: str) -> int:
  try:
    value = int(text)
  except ValueError:
    raise argparse.ArgumentTypeError(f"expected a positive integer, got '{text}'") from None
  if value <= 0:
    raise argparse.ArgumentTypeError(f"expected a positive integer, got {value}")
  return value


def non_negative_int(text: str) -> int:
  try:
    value = int(text)
  except ValueError:
    raise argparse.ArgumentTypeError(f"expected an integer >= 0, got '{text}'") from None
  if value < 0:
    raise argparse.ArgumentTypeError(f"expected an integer >= 0, got {value}")
  return value


def name_value(text: str) -> tuple[str, str]:
  name, sep, value = text.partition("=")
  if not sep or not name or not value:
    raise argparse.ArgumentTypeError(f"expected NAME=VALUE, got '{text}'")
  return name, value


def capacity(text: str) -> Capacity:
  """`BYTES` (the fast levels together) or `LEVEL=BYTES` (one fast level)."""
  level, sep, value = text.rpartition("=")
  if sep and not level:
    raise argparse.ArgumentTypeError(f"expected BYTES or LEVEL=BYTES, got '{text}'")
  return (level if sep else None), positive_int(value)


def seed(text: str) -> int:
  try:
    value = int(text)
  except ValueError:
    raise argparse.ArgumentTypeError(f"expected an integer seed, got '{text}'") from None
  if not 0 <= value <= MAX_SEED:
    raise argparse.ArgumentTypeError(
      f"the seed must be between 0 and 2**31-1 ({MAX_SEED}), got {value}"
    )
  return value


def _float_flag(text: str, expected: str, accept: Callable[[float], bool]) -> float:
  try:
    value = float(text)
  except ValueError:
    raise argparse.ArgumentTypeError(f"expected {expected}, got '{text}'") from None
  if not accept(value):
    raise argparse.ArgumentTypeError(f"expected {expected}, got {value}")
  return value


def positive_float(text: str) -> float:
  return _float_flag(text, "a finite positive number", lambda value: 0 < value < float("inf"))


def non_negative_float(text: str) -> float:
  return _float_flag(text, "a finite number >= 0", lambda value: 0.0 <= value < float("inf"))


def fraction(text: str) -> float:
  return _float_flag(text, "a fraction in [0, 1)", lambda value: 0.0 <= value < 1.0)


def share(text: str) -> float:
  return _float_flag(text, "a share in [0, 1]", lambda value: 0.0 <= value <= 1.0)


def positive_fractions(text: str) -> list[float]:
  """Comma-separated fractions in (0, 1], e.g. 0.1,0.25."""
  return [
    _float_flag(part, "fractions in (0, 1] like 0.1,0.25", lambda value: 0.0 < value <= 1.0)
    for part in text.split(",")
  ]


def show_number(value: float) -> str:
  """`1,000,000` for a whole number, `0.25` or `1e+308` otherwise."""
  if isinstance(value, int) or (abs(value) < 1e15 and float(value).is_integer()):
    return f"{int(value):,}"
  return f"{value:g}"


def bounded(parse: Callable[[str], Any], maximum: Optional[float]) -> Callable[[str], Any]:
  """`parse`, refusing values above `maximum` (None: no bound) as a flag error."""
  if maximum is None:
    return parse

  def parse_bounded(text: str) -> Any:
    value = parse(text)
    if value > maximum:
      raise argparse.ArgumentTypeError(f"at most {show_number(maximum)}, got {show_number(value)}")
    return value

  parse_bounded.__name__ = getattr(parse, "__name__", "value")
  return parse_bounded


# The registry's `check` names (env/solvers/registry.py CHECKS) as flag types.
FLAG_TYPES: dict[str, Callable[[str], Any]] = {
  "positive": positive_float,
  "non_negative": non_negative_float,
  "positive_int": positive_int,
  "non_negative_int": non_negative_int,
  "fraction": fraction,
  "seed": seed,
  "path": str,
  "switch": bool,  # Not a type: a "switch" field is a store_true flag (`add_solver_flags`).
}

CAPACITY_HELP = (
  "fast memory in bytes, overriding the hardware's: BYTES for the fast levels "
  "together, shared in the hardware's ratio (nnpi-like: 1/7 SRAM, 6/7 LLC), or "
  "LEVEL=BYTES for one level (repeatable)"
)
HARDWARE_CHOICES = f"preset ({', '.join(PRESETS)}) or hardware JSON file"


def add_capacity_flag(
  p: argparse.ArgumentParser, help_prefix: str = "", help_suffix: str = ""
) -> None:
  p.add_argument(
    "--capacity",
    type=capacity,
    action="append",
    metavar="[LEVEL=]BYTES",
    help=help_prefix + CAPACITY_HELP + help_suffix,
  )


def say_capacities(capacities: Optional[Sequence[Capacity]], hw: Hardware) -> None:
  if capacities and hw.num_fast_levels > 1:
    print(f"fast memory (--capacity): {describe_fast_levels(hw)}")


def add_solver_flags(
  p: argparse.ArgumentParser, solvers: Iterable[Solver], skip: Collection[str] = ()
) -> None:
  """One flag per options field of `solvers` (a field several solvers share is one flag, with
  one default), but for the fields named in `skip` (a command that defines them otherwise), and
  `--msa-option` for those that take msa's options."""
  solvers = list(solvers)
  for name, users in option_fields(solvers).items():
    if name in skip:
      continue
    field = users[0][1]
    meta = field.metadata
    who = ", ".join(solver.name for solver, _ in users)
    if meta["check"] == "switch":
      p.add_argument(meta["flag"], dest=name, action="store_true", help=f"{who}: {meta['help']}")
      continue
    maximum = meta.get("maximum")
    p.add_argument(
      meta["flag"],
      dest=name,
      type=bounded(FLAG_TYPES[meta["check"]], maximum),
      default=field.default,
      metavar=meta["metavar"] or meta["flag"].lstrip("-").replace("-", "_").upper(),
      help=f"{who}: {meta['help']}"
      + (f" (default {meta['default_help']})" if meta["default_help"] else "")
      + (f", at most {show_number(maximum)}" if maximum is not None else ""),
    )
  takers = [s.name for s in solvers if s.takes_msa_options]
  if takers:
    p.add_argument(
      "--msa-option",
      type=name_value,
      action="append",
      metavar="NAME=VALUE",
      help=f"{', '.join(takers)}: one of msa's options (env/msa/settings.py "
      "MsaOptions, defaults XLA's), e.g. min_overlap_to_async_copy_ratio=0.8, "
      "max_outstanding_prefetches=2, picker=instruction_count, copy_budget=idle, "
      "while_execution_count=10; "
      "repeatable",
    )


def solver_options(args: argparse.Namespace, solver: Solver) -> dict:
  """The keyword options `solve` passes to `solver`, from the flags `add_solver_flags` made."""
  check_msa_options_used(args, [solver])
  return solver.make_options(
    vars(args), msa_options(getattr(args, "msa_option", None)) if solver.takes_msa_options else None
  )


def check_msa_options_used(args: argparse.Namespace, solvers: Sequence[Solver]) -> None:
  """`--msa-option` is refused unless one of `solvers` reads it."""
  if getattr(args, "msa_option", None) and not any(s.takes_msa_options for s in solvers):
    raise FlagError(
      f"--msa-option is for {', '.join(takers_of_msa_options())}, not "
      f"{', '.join(s.name for s in solvers)}"
    )


def takers_of_msa_options() -> list[str]:
  from malloczero.env.solvers.registry import BASELINES

  return [name for name, s in BASELINES.items() if s.takes_msa_options]


class OnceBooleanOptionalAction(argparse.BooleanOptionalAction):
  """`--flag` / `--no-flag`, refused when both (or either twice) are given."""

  def __call__(self, parser, namespace, values, option_string=None):
    if getattr(namespace, f"_{self.dest}_given", False):
      raise argparse.ArgumentError(
        self, f"given twice (choose one of {' or '.join(self.option_strings)})"
      )
    setattr(namespace, f"_{self.dest}_given", True)
    super().__call__(parser, namespace, values, option_string)


def msa_options(pairs: Optional[Sequence[tuple[str, str]]]) -> dict:
  """`--msa-option NAME=VALUE` pairs as `MsaOptions` fields, each value read as its field's type."""
  from malloczero.env.msa.algorithm import MsaOptions

  defaults = MsaOptions()
  names = [f.name for f in dataclasses.fields(MsaOptions)]
  options: dict = {}
  for name, text in pairs or ():
    if name not in names:
      raise FlagError(f"unknown --msa-option '{name}' (choose from {', '.join(names)})")
    kind = type(getattr(defaults, name))
    try:
      if kind is bool:
        if text.lower() not in ("true", "false"):
          raise ValueError
        value = text.lower() == "true"
      else:
        value = kind(text)
    except ValueError:
      wanted = {bool: "true or false", int: "an integer", float: "a number"}.get(kind, "a string")
      raise FlagError(f"--msa-option {name} needs {wanted}, got '{text}'") from None
    options[name] = value
  try:
    MsaOptions(**options)
  except ValueError as e:
    raise FlagError(f"--msa-option: {e}") from None
  return options
