"""Fields of the frozen config dataclasses that a user may set (`malloczero train --set
PATH=VALUE`).

A settable field declares, once and beside its default, what values it takes (`check`, one of
`CHECKS`, with `choices` for a "choice") and a line of help (`setting`). The dataclass enforces
the checks when it is built (`check_settings` in its `__post_init__`), and the command line
parses a value, checks it and describes what it accepts from the same record, so that a range is
never written twice.
"""

from __future__ import annotations

import dataclasses
import math
import numbers
from typing import Any, Callable, Optional

# The seeds' consumers: numpy's default_rng takes no negative seed, CP-SAT's random_seed is an int32
# and jax.random.PRNGKey an int64; derived seeds (seed + 7919 x actor) stay within the last two.
MAX_SEED = 2**31 - 1

_SWITCH = {"on": True, "true": True, "off": False, "false": False}


def _int(value: Any) -> bool:
  return isinstance(value, numbers.Integral) and not isinstance(value, bool)


def _finite(value: Any) -> bool:
  return isinstance(value, numbers.Real) and not isinstance(value, bool) and math.isfinite(value)


def _switch(text: str) -> bool:
  if text.lower() not in _SWITCH:
    raise ValueError(text)
  return _SWITCH[text.lower()]


def _fractions(text: str) -> tuple[float, ...]:
  return tuple(float(part) for part in text.split(",")) if text.strip() else ()


def _unit_fractions(value: Any) -> bool:
  return (
    isinstance(value, tuple)
    and all(_finite(f) and 0 < f <= 1 for f in value)
    and len(set(value)) == len(value)
  )


@dataclasses.dataclass(frozen=True)
class Check:
  """What a field accepts: `accepts` says it in words, `parse` reads a command-line text (a
  ValueError for text of the wrong kind), `ok` judges a value."""

  accepts: str
  parse: Callable[[str], Any]
  ok: Callable[[Any], bool]


CHECKS: dict[str, Check] = {
  "positive_int": Check("a positive integer", int, lambda v: _int(v) and v >= 1),
  "non_negative_int": Check("an integer >= 0", int, lambda v: _int(v) and v >= 0),
  "positive": Check("a finite positive number", float, lambda v: _finite(v) and v > 0),
  "non_negative": Check("a finite number >= 0", float, lambda v: _finite(v) and v >= 0),
  "fraction": Check("a fraction in [0, 1)", float, lambda v: _finite(v) and 0 <= v < 1),
  "probability": Check("a probability in [0, 1]", float, lambda v: _finite(v) and 0 <= v <= 1),
  "seed": Check(
    f"an integer seed between 0 and 2**31-1 ({MAX_SEED})",
    int,
    lambda v: _int(v) and 0 <= v <= MAX_SEED,
  ),
  "switch": Check("on, off, true or false", _switch, lambda v: isinstance(v, bool)),
  "text": Check("a name", str, lambda v: isinstance(v, str)),
  "choice": Check("one of the choices", str, lambda v: isinstance(v, str)),
  "unit_fractions": Check("fractions in (0, 1], each once (F,F,...)", _fractions, _unit_fractions),
}


# Every integer setting's bound unless it names a tighter one: a count beyond it is a typo, and
# the sizes it sets are allocated (`train --set actor.num_games=10**12` must not reach numpy).
MAX_SETTING_COUNT = 1_000_000_000


def setting(
  default: Any,
  check: str,
  help: str,
  choices: Optional[tuple[str, ...]] = None,
  maximum: Optional[float] = None,
) -> Any:
  """A settable field of a config dataclass: its default, what it accepts (`maximum`: an upper
  bound on a number; integers have MAX_SETTING_COUNT unless given one) and its help."""
  if check not in CHECKS:
    raise ValueError(f"unknown check '{check}' (choose from {', '.join(CHECKS)})")
  if (check == "choice") != (choices is not None):
    raise ValueError("a 'choice' field, and only one, names its choices")
  if maximum is None and check in ("positive_int", "non_negative_int"):
    maximum = MAX_SETTING_COUNT
  return dataclasses.field(
    default=default,
    metadata={"check": check, "help": help, "choices": choices, "maximum": maximum},
  )


def is_setting(field: dataclasses.Field) -> bool:
  return "check" in field.metadata


def accepts(field: dataclasses.Field) -> str:
  """What `field` accepts, in words."""
  choices = field.metadata["choices"]
  if choices:
    return f"one of {', '.join(choices)}"
  maximum = field.metadata.get("maximum")
  bound = "" if maximum is None else f" at most {maximum:,}"
  return CHECKS[field.metadata["check"]].accepts + bound


def acceptable(field: dataclasses.Field, value: Any) -> bool:
  choices = field.metadata["choices"]
  if choices:
    return value in choices
  maximum = field.metadata.get("maximum")
  return CHECKS[field.metadata["check"]].ok(value) and (maximum is None or value <= maximum)


def parse_setting(field: dataclasses.Field, text: str) -> Any:
  """`text` as a value of `field`; a ValueError saying what it accepts when it is not one."""
  try:
    value = CHECKS[field.metadata["check"]].parse(text)
  except ValueError:
    value = None
  if value is None or not acceptable(field, value):
    raise ValueError(f"expected {accepts(field)}, got '{text}'")
  return value


def check_settings(config: Any, section: str = "") -> None:
  """Raises ValueError naming the first settable field of the dataclass `config` (the config's
  `section`, "" for its top level) whose value its check refuses."""
  for field in dataclasses.fields(config):
    if is_setting(field):
      value = getattr(config, field.name)
      if not acceptable(field, value):
        path = f"{section}.{field.name}" if section else field.name
        raise ValueError(f"{path} must be {accepts(field)}, got {value!r}")


def shown(value: Any) -> str:
  """A field's value as `--set` would take it."""
  if isinstance(value, bool):
    return "on" if value else "off"
  if isinstance(value, float):
    return f"{value:g}"
  if isinstance(value, tuple):
    return ",".join(shown(v) for v in value)
  return str(value)
