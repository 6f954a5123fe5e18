"""`train`'s flags that set fields of the preset's config: `--set PATH=VALUE` for every settable
field, a few everyday aliases named after their fields, and the older spellings, kept for one
release with a note.

A field's path is its name for the top level of `Config` (`seed`) and `SECTION.FIELD` for a
section's (`learner.demonstration_fraction`). What a field accepts, its help and its default come
from the field itself (common/settings.py `setting`), so that no flag restates them. Every such
flag appends to one list, `args.overrides`, in command-line order; `apply_overrides` applies
them over the preset, the last given for a field winning.
"""

from __future__ import annotations

import argparse
import dataclasses
import functools
import sys
from typing import Any, Callable, Optional, Sequence

from malloczero.common.settings import accepts, is_setting, parse_setting, shown
from malloczero.configs.config import Config
from malloczero.launch.flags import FlagError

# Fields of Config no --set reaches, and the flag that decides each.
NOT_SETTABLE = {"name": "--config", "programs": "--workload"}
# Everyday aliases: the flags, then the path they set.
ALIASES: tuple[tuple[tuple[str, ...], str, str], ...] = (
  (("--seed",), "seed", "the run's seed"),
  (
    ("--suite",),
    "suite",
    "suite to train on, a built-in name or a manifest made by `suite make` (with --workload, "
    "its training programs are trained on too)",
  ),
  (("--num-actors",), "distributed.num_actors", "actor nodes (local_mp and vertex_ai)"),
  (
    ("--max-learner-steps", "--max-steps"),
    "max_learner_steps",
    "stop when the learner reaches this step",
  ),
)
# Spellings of earlier releases -> the path each sets, as it did then.
DEPRECATED = {
  "--eval-every": "eval_every_steps",
  "--select-checkpoints": "select_checkpoints",
  "--capacity-variants": "capacity_variants",
  "--reward": "game.reward",
  "--skip-below": "game.skip_below",
  "--segment-moves": "actor.segment_moves",
  "--imitate-gains-only": "actor.imitate_gains_only",
  "--demonstrations": "learner.demonstration_fraction",
  "--demonstration-departures": "learner.demonstration_departures",
  "--reanalyse": "learner.reanalyse_fraction",
  "--policy-loss-weight": "learner.policy_loss_weight",
  "--lr-decay-steps": "learner.decay_steps",
  "--probes": "probes.share",
  "--probes-on-policy": "probes.on_policy",
  "--probe-batch": "probes.batch",
  "--probe-msa-margin": "probes.msa_margin",
  "--q-spread-floor": "search.q_spread_floor",
  "--eval-q-spread-floor": "search.eval_q_spread_floor",
  "--eval-msa-prior": "search.eval_msa_prior_logit",
}


def sections() -> tuple[str, ...]:
  """The fields of Config that are sections (dataclasses of their own), in Config's order."""
  return tuple(f.name for f in dataclasses.fields(Config) if dataclasses.is_dataclass(f.default))


@functools.lru_cache(maxsize=None)
def settable_fields() -> dict[str, dataclasses.Field]:
  """{path: field} for every field --set reaches, top-level fields first, in Config's order."""
  found = {f.name: f for f in dataclasses.fields(Config) if is_setting(f)}
  for section in sections():
    for field in dataclasses.fields(getattr(Config(), section)):
      if is_setting(field):
        found[f"{section}.{field.name}"] = field
  return found


def _valid(names: Sequence[str]) -> str:
  return ", ".join(names)


def resolve(path: str) -> dataclasses.Field:
  """The field at `path`; a ValueError in one line naming the valid paths when there is none."""
  fields = settable_fields()
  if path in fields:
    return fields[path]
  section, dot, name = path.partition(".")
  if not dot:
    if path in NOT_SETTABLE:
      raise ValueError(f"'{path}' is set by {NOT_SETTABLE[path]}, not --set")
    if path in sections():
      first = next(p for p in fields if p.startswith(f"{path}."))
      raise ValueError(f"'{path}' is a section: name one of its fields, e.g. {first}")
    top = [p for p in fields if "." not in p]
    raise ValueError(
      f"no field '{path}' in the config; valid: {_valid(top)}, or SECTION.FIELD with SECTION "
      f"one of {_valid(sections())}"
    )
  if section not in sections():
    raise ValueError(f"no section '{section}' in the config; valid: {_valid(sections())}")
  names = [p.partition(".")[2] for p in fields if p.startswith(f"{section}.")]
  raise ValueError(f"no field '{name}' in {section}; valid: {_valid(names)}")


def _flag_type(path: str) -> Callable[[str], Any]:
  """An argparse type for the field at `path`: its value, or argparse's one-line error."""
  field = resolve(path)

  def parse(text: str) -> Any:
    try:
      return parse_setting(field, text)
    except ValueError as e:
      raise argparse.ArgumentTypeError(str(e)) from None

  return parse


def _append(namespace: argparse.Namespace, path: str, value: Any) -> None:
  namespace.overrides = [*(getattr(namespace, "overrides", None) or ()), (path, value)]


class SetAction(argparse.Action):
  """`--set PATH=VALUE`: a wrong path or value is the parser's one-line error (exit 2)."""

  def __call__(self, parser, namespace, values, option_string=None):
    path, sep, text = values.partition("=")
    try:
      if not sep or not path:
        raise ValueError("expected PATH=VALUE, e.g. learner.batch_size=32")
      field = resolve(path)
      try:
        value = parse_setting(field, text)
      except ValueError as e:
        raise ValueError(f"{path}: {e}") from None
    except ValueError as e:
      parser.error(f"--set {values}: {e}")
    _append(namespace, path, value)


class OverrideAction(argparse.Action):
  """A flag that sets the field at `path`; with `deprecated`, it says which --set to use."""

  def __init__(self, option_strings, dest, path: str, deprecated: bool = False, **kwargs):
    super().__init__(option_strings, dest, **kwargs)
    self.path, self.deprecated = path, deprecated

  def __call__(self, parser, namespace, values, option_string=None):
    if self.deprecated:
      print(
        f"malloczero: note: {option_string} is deprecated; use --set {self.path}={shown(values)}",
        file=sys.stderr,
      )
    _append(namespace, self.path, values)


def add_config_flags(parser: argparse.ArgumentParser, defaults: Config) -> None:
  """--set, --list-config, the aliases and the deprecated spellings; the help gives the values
  of the `defaults` preset."""
  parser.add_argument(
    "--set",
    action=SetAction,
    dest="overrides",
    metavar="PATH=VALUE",
    help="set one field of the preset's config: a top-level field by its name (seed=3), a "
    "section's as SECTION.FIELD (learner.demonstration_fraction=0.25); numbers, on/off (or "
    "true/false), names, and lists as F,F,...; repeatable. --set and the flags that set fields "
    "apply over the preset in command-line order, the last for a field winning. --list-config "
    "shows every PATH",
  )
  parser.add_argument(
    "--list-config",
    action="store_true",
    help="print every PATH that --set takes with its value in the chosen --config (after the "
    "--set and flags given), what it accepts and what it does; then exit",
  )
  for flags, path, help in ALIASES:
    parser.add_argument(
      *flags,
      action=OverrideAction,
      path=path,
      dest="overrides",
      type=_flag_type(path),
      metavar=path.rpartition(".")[2].upper(),
      help=f"{help} (--set {path}; default: the config's, {_default(defaults, path)})",
    )
  for flag, path in DEPRECATED.items():
    parser.add_argument(
      flag,
      action=OverrideAction,
      path=path,
      deprecated=True,
      dest="overrides",
      type=_flag_type(path),
      help=argparse.SUPPRESS,
    )
  # One line per older spelling: argparse would otherwise rewrap them, breaking flags at hyphens.
  parser.formatter_class = argparse.RawDescriptionHelpFormatter
  width = max(map(len, DEPRECATED))
  parser.epilog = (
    "older spellings, still accepted this release with a note on stderr:\n"
    + "\n".join(f"  {flag:<{width}}  --set {path}=..." for flag, path in DEPRECATED.items())
  )


def _value(config: Config, path: str) -> Any:
  section, _, name = path.rpartition(".")
  return getattr(getattr(config, section) if section else config, name)


def _default(config: Config, path: str) -> str:
  return shown(_value(config, path)) or "''"


def apply_overrides(config: Config, overrides: Optional[Sequence[tuple[str, Any]]]) -> Config:
  """`config` with the `(path, value)` overrides, the last for a path winning; fields that
  contradict each other are a `FlagError` (exit 2)."""
  latest = dict(overrides or ())
  top: dict[str, Any] = {}
  by_section: dict[str, dict[str, Any]] = {}
  for path, value in latest.items():
    section, _, name = path.rpartition(".")
    (by_section.setdefault(section, {}) if section else top)[name] = value
  try:
    replaced = {s: dataclasses.replace(getattr(config, s), **v) for s, v in by_section.items()}
    return dataclasses.replace(config, **top, **replaced)
  except ValueError as e:
    raise FlagError(str(e)) from None


def describe_config(config: Config) -> str:
  """One line per settable path: its value in `config`, what it does and what it accepts."""
  fields = settable_fields()
  width = max(map(len, fields))
  values = {path: _default(config, path) for path in fields}
  value_width = min(12, max(map(len, values.values())))
  lines = [f"config '{config.name}': malloczero train --set PATH=VALUE"]
  for path, field in fields.items():
    lines.append(
      f"  {path:<{width}}  {values[path]:<{value_width}}  {field.metadata['help']} "
      f"({accepts(field)})"
    )
  return "\n".join(lines)
