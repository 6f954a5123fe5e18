"""The baseline solvers, one record each: what a solver needs, its options and their flags.

`solve` dispatches on a record's `kind`; the command line derives its `--solver` choices, its
solver flags, their defaults and help from the records' options dataclasses; an evaluation's
cache keys a result by the record's `version` and options. Adding a solver is one record here
(the agent and the portfolio are registered the same way at the top layer, launch/solvers.py,
which may import the agent).

An options field carries its flag in its metadata (`option`): the flag's name, what values it
takes (`check`, one of `CHECKS`) and its help. A flag shared by several solvers (`--time-limit`,
`--seed`) has one default: tests/test_solvers.py checks that every record agrees on it.
"""

from __future__ import annotations

import dataclasses
import os
from typing import Any, Callable, Optional

from malloczero.env.cost_model import CostModel
from malloczero.env.game import REQUESTS_GAME, GameConfig
from malloczero.env.msa.algorithm import MsaOptions, msa_mapping
from malloczero.env.requests import Requests, build_requests
from malloczero.env.solvers.cpsat import DEFAULT_TIME_LIMIT_S, DEFAULT_WORKERS, cpsat
from malloczero.env.solvers.evo import DEFAULT_EVALUATIONS, evo
from malloczero.env.solvers.evo_msa import evo_msa
from malloczero.env.solvers.heuristics import bestfit_play, greedy, msa_simple, random_play
from malloczero.env.solvers.time_limit import now

# What a flag accepts: checked by the command line's flag types (launch/flags.py).
CHECKS = (
  "positive",
  "non_negative",
  "positive_int",
  "non_negative_int",
  "fraction",
  "seed",
  "path",
  "switch",
)
# What a solver is handed: the cost model (it builds its own segments), a game to play its policy
# in, or a `Placement` of the requests game's requests; "agent" is the top layer's.
KINDS = ("model", "game", "placement", "agent")


# Every count and time a user can give is bounded: a budget beyond these is a mistake (or an
# attack) that would run for days, allocate without end or overflow a solver's integer clock.
MAX_TIME_LIMIT_S = 86_400.0  # A day.
MAX_COUNT = 1_000_000_000  # Evaluations, decodes.
MAX_WORKERS = 4 * max(1, os.cpu_count() or 1)


def option(
  default: Any,
  flag: str,
  help: str,
  check: str,
  metavar: Optional[str] = None,
  default_help: Optional[str] = None,
  maximum: Optional[float] = None,
) -> Any:
  """A field of a solver's options dataclass, with the command-line flag that sets it;
  `default_help` says what a default of None means; `maximum`, the largest value it takes (a
  numeric flag's bound, said in its help)."""
  if check not in CHECKS:
    raise ValueError(f"unknown check '{check}' (choose from {', '.join(CHECKS)})")
  return dataclasses.field(
    default=default,
    metadata={
      "flag": flag,
      "help": help,
      "check": check,
      "metavar": metavar,
      "maximum": maximum,
      "default_help": (
        default_help if default is None or isinstance(default, bool) else f"{default:g}"
      ),
    },
  )


def _time_limit() -> Any:
  return option(
    DEFAULT_TIME_LIMIT_S,
    "--time-limit",
    "seconds per program, building the solver's model included",
    "positive",
    maximum=MAX_TIME_LIMIT_S,
  )


def seed_option() -> Any:
  return option(0, "--seed", "seed (0 to 2**31-1)", "seed")


def _evaluations() -> Any:
  return option(
    DEFAULT_EVALUATIONS,
    "--evaluations",
    "evo's budget: full mappings decoded (evo-msa runs until --time-limit)",
    "positive_int",
    maximum=MAX_COUNT,
  )


@dataclasses.dataclass(frozen=True)
class NoOptions:
  """A solver without options."""


@dataclasses.dataclass(frozen=True)
class CpsatOptions:
  time_limit_s: float = _time_limit()
  workers: int = option(
    DEFAULT_WORKERS,
    "--workers",
    "CP-SAT worker threads",
    "positive_int",
    maximum=MAX_WORKERS,
  )


@dataclasses.dataclass(frozen=True)
class EvoOptions:
  evaluations: int = _evaluations()
  time_limit_s: float = _time_limit()
  seed: int = seed_option()


@dataclasses.dataclass(frozen=True)
class EvoMsaOptions:
  """Not evo's `--evaluations` (120): evo-msa decodes until `--time-limit` unless `--decodes`
  caps it (env/solvers/evo_msa.py); a fixed count makes a measurement independent of the
  machine's load. `defer` is a field, so the baseline cache keys results with it on apart."""

  time_limit_s: float = _time_limit()
  seed: int = seed_option()
  skip_below: float = option(
    0.0,
    "--skip-below",
    "change only decisions whose best option saves "
    "at least this fraction of the all-slow time (0: any)",
    "fraction",
    metavar="FRACTION",
  )
  decodes: Optional[int] = option(
    None,
    "--decodes",
    "full mappings decoded, msa's own included",
    "positive_int",
    default_help="until --time-limit",
    maximum=MAX_COUNT,
  )
  defer: bool = option(
    False,
    "--defer",
    "genomes also defer buffers after the others (a measurement of a defer action)",
    "switch",
    default_help="off",
  )


@dataclasses.dataclass(frozen=True)
class PackOptions:
  time_limit_s: float = _time_limit()


@dataclasses.dataclass(frozen=True)
class TimeLimitOptions:
  """A one-pass heuristic's only option: it stops where its time limit finds it (a program of
  100,000 buffers takes minutes), the requests not reached left in slow memory."""

  time_limit_s: float = _time_limit()


@dataclasses.dataclass(frozen=True)
class RandomOptions:
  seed: int = seed_option()
  time_limit_s: float = _time_limit()


def _msa(model: Any, time_limit_s: Optional[float] = None, **options: Any) -> tuple[Any, dict]:
  # A time limit is accepted and not needed: msa is one greedy pass.
  return msa_mapping(model, MsaOptions(**options))


def _msa_simple(placement: Any, time_limit_s: Optional[float] = None) -> dict:
  return msa_simple(placement, None if time_limit_s is None else now() + float(time_limit_s))


def _evo_msa(model: Any, decodes: Optional[int] = None, **options: Any) -> tuple[Any, dict]:
  # `decodes` is evo_msa's `evaluations`, named apart so that it is not evo's flag and default.
  return evo_msa(model, evaluations=decodes, **options)


def _pack(placement: Any, **options: Any) -> dict:
  # Imported on first use: its jitted search loads numba, which importing the solvers must not.
  from malloczero.env.solvers.packing import pack

  return pack(placement, **options)


@dataclasses.dataclass(frozen=True)
class Solver:
  """One solver.

  kind: what `run` is handed (`KINDS`): "model" -> `run(cost_model, **options)` returns
    `(mapping, info)`; "game" -> `run(game, **options)` plays `game_config`'s game and returns
    `info`; "placement" -> `run(placement, **options)` places requests and returns `info`.
  options: a frozen dataclass whose fields are `run`'s keyword options (made with `option`).
  takes_msa_options: `--msa-option NAME=VALUE` pairs (`MsaOptions` fields) are passed on too.
  version: raised whenever the solver's results change, so cached results are not reused.
  segments: the mapping is msa's segments (a buffer may have several), not placed requests.
  split_activations: its requests offer an activation's groups (evicted after its definition,
    prefetched again before later uses) beside its whole live range (env/requests.py).
  late_prefetches: its requests also time copies as msa's prefetch-interval picker does: a
    prefetched group's late variant, and the uses grouped with those windows (env/requests.py).
  reshaped_groups: its requests also keep a weight across all its uses, or cut a group's later
    uses off, as msa's allocations do (env/requests.py).
  """

  name: str
  kind: str
  run: Callable[..., Any]
  summary: str
  options: type = NoOptions
  takes_msa_options: bool = False
  version: int = 1
  game_config: Optional[GameConfig] = None
  segments: bool = False
  split_activations: bool = False
  late_prefetches: bool = False
  reshaped_groups: bool = False

  def __post_init__(self):
    if self.kind not in KINDS:
      raise ValueError(f"solver {self.name}: unknown kind '{self.kind}'")

  def requests(self, model: CostModel) -> Requests:
    """The requests this solver places, of `model`'s program."""
    return build_requests(model, self.split_activations, self.late_prefetches, self.reshaped_groups)

  def make_options(self, values: dict[str, Any], msa_options: Optional[dict] = None) -> dict:
    """`run`'s keyword options: this solver's fields taken from `values` (others ignored), and
    `msa_options` where the solver takes them."""
    names = {f.name for f in dataclasses.fields(self.options)}
    chosen = self.options(**{k: v for k, v in values.items() if k in names})
    options = dataclasses.asdict(chosen)
    if self.takes_msa_options:
      options.update(msa_options or {})
    return options


BASELINES: dict[str, Solver] = {
  s.name: s
  for s in (
    Solver(
      "msa",
      "model",
      _msa,
      "XLA's memory-space assignment (its allocation loop)",
      takes_msa_options=True,
      version=2,
      segments=True,
    ),
    Solver(
      "greedy",
      "placement",
      greedy,
      "requests by saving per byte, each where it saves most",
      TimeLimitOptions,
      version=2,
    ),
    Solver(
      "bestfit",
      "game",
      bestfit_play,
      "the requests game's first candidate every step",
      TimeLimitOptions,
      game_config=REQUESTS_GAME,
    ),
    Solver(
      "random",
      "game",
      random_play,
      "uniformly random legal moves in the msa game",
      RandomOptions,
      game_config=GameConfig(),
      segments=True,
    ),
    Solver(
      "evo",
      "placement",
      evo,
      "evolution over request priorities",
      EvoOptions,
      version=8,
      split_activations=True,
      late_prefetches=True,
      reshaped_groups=True,
    ),
    Solver(
      "evo-msa",
      "model",
      _evo_msa,
      "evolution over deviations from msa's decisions",
      EvoMsaOptions,
      takes_msa_options=True,
      version=3,
      segments=True,
    ),
    Solver("cpsat", "placement", cpsat, "OR-Tools CP-SAT over the requests", CpsatOptions),
    Solver(
      "pack", "placement", _pack, "MiniMalloc-style exact packing search", PackOptions, version=2
    ),
    Solver(
      "msa-simple",
      "placement",
      _msa_simple,
      "the ten-line msa in request space",
      TimeLimitOptions,
    ),
  )
}

SOLVERS = tuple(BASELINES)


def option_fields(solvers: Any) -> dict[str, list[tuple[Solver, dataclasses.Field]]]:
  """{field name: [(solver, field), ...]} over the options of `solvers`, in first-seen order."""
  found: dict[str, list[tuple[Solver, dataclasses.Field]]] = {}
  for solver in solvers:
    for field in dataclasses.fields(solver.options):
      found.setdefault(field.name, []).append((solver, field))
  return found
