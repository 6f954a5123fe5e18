"""The trained agent and the portfolio as solvers, registered beside the baselines.

They live at the top layer because they load a checkpoint (JAX, the networks); the baselines'
registry (env/solvers/registry.py) imports nothing of the agent. `ALL_SOLVERS` is what `solve
--solver` offers; both records share the baselines' `Solver` record and flag metadata.
"""

from __future__ import annotations

import dataclasses
import sys
from typing import Any, Optional

from malloczero.common.errors import MalloczeroError
from malloczero.configs.config import DEFAULT_ATTEMPTS, DEFAULT_SEARCH_SECONDS, MAX_SIMULATIONS
from malloczero.env.hardware import Hardware
from malloczero.env.solvers.registry import (
  BASELINES,
  MAX_TIME_LIMIT_S,
  Solver,
  option,
  seed_option,
)
from malloczero.env.workload import Workload

# Attempts are games played in one batch: past this a solve fills memory before its time limit
# can act. Simulations are bounded as the configs' are (configs/config.py MAX_SIMULATIONS).
MAX_ATTEMPTS = 64


@dataclasses.dataclass(frozen=True)
class AgentOptions:
  checkpoint: Optional[str] = option(
    None, "--checkpoint", "a training work directory or its checkpoint", "path", default_help=""
  )
  simulations: Optional[int] = option(
    None,
    "--simulations",
    "search simulations per move (0: the network's policy alone, no search)",
    "non_negative_int",
    default_help="twice the run's evaluation search",
    maximum=MAX_SIMULATIONS,
  )
  attempts: int = option(
    DEFAULT_ATTEMPTS,
    "--attempts",
    "trajectories played, the first greedy; the best is kept",
    "positive_int",
    maximum=MAX_ATTEMPTS,
  )
  search_seconds: float = option(
    DEFAULT_SEARCH_SECONDS,
    "--search-seconds",
    "after the attempts, a search guided by the network for this long (0: none)",
    "non_negative",
    maximum=MAX_TIME_LIMIT_S,
  )
  agent_time_limit: Optional[float] = option(
    None,
    "--agent-time-limit",
    "per program, a limit on the whole solve (the attempts, msa and the guided search, which "
    "gets what is left of it), in place of --search-seconds: the agent at a baseline's "
    "--time-limit",
    "positive",
    metavar="SECONDS",
    default_help="none: --search-seconds decides",
    maximum=MAX_TIME_LIMIT_S,
  )
  guide_decisions: bool = option(
    False,
    "--guide-decisions",
    "the guided search is evo-msa over msa's decisions, steered by the network's moves, in "
    "place of evo over request priorities seeded with the network's mapping beside msa's and "
    "the greedy's orders",
    "switch",
  )
  seed: int = seed_option()


def search_notice(agent: Any) -> None:
  """A checkpoint without its run's config.json is played with the default search settings:
  `solve` and `evaluate` both say so, in one line on stderr, rather than silently."""
  notice = agent.search_notice()
  if notice:
    print(f"malloczero: notice: {notice}", file=sys.stderr)


def _agent(
  workload: Workload,
  hardware: Hardware,
  checkpoint: Optional[str] = None,
  simulations: Optional[int] = None,
  attempts: int = DEFAULT_ATTEMPTS,
  search_seconds: float = DEFAULT_SEARCH_SECONDS,
  agent_time_limit: Optional[float] = None,
  guide_decisions: bool = False,
  seed: int = 0,
) -> Any:
  """The checkpoint's networks with test-time search (actors/agent.py `solve_with_agent`)."""
  if not checkpoint:  # Before JAX loads: a forgotten flag is refused at once.
    raise MalloczeroError(
      "this solver needs --checkpoint DIR (a training work directory or its checkpoint)"
    )
  from malloczero.actors.agent import load_agent, solve_with_agent

  agent = load_agent(checkpoint)
  search_notice(agent)
  return solve_with_agent(
    agent,
    workload,
    hardware,
    simulations=simulations,
    attempts=attempts,
    seed=seed,
    search_seconds=search_seconds,
    time_limit=agent_time_limit,
    guide="decisions" if guide_decisions else "priorities",
  )


def _portfolio(workload: Workload, hardware: Hardware, **options: Any) -> Any:
  """The agent, which already counts msa's mapping among its attempts, with msa's result named
  in its info (`msa`) and which won (`winner`: "agent" when the network's play is at least as
  fast, else "msa"); kept so that `--solver portfolio` prints msa's line beside the agent's."""
  result = _agent(workload, hardware, **options)
  winner = "msa" if result.info["best_attempt"] == "msa" else "agent"
  return dataclasses.replace(result, info=dict(result.info, winner=winner))


AGENT = Solver(
  "agent",
  "agent",
  _agent,
  "the trained agent with test-time search; msa's mapping "
  "is one more attempt, so never slower than msa",
  AgentOptions,
  segments=True,
)
PORTFOLIO = Solver(
  "portfolio",
  "agent",
  _portfolio,
  "the agent (msa among its attempts), with msa's line and which won",
  AgentOptions,
  segments=True,
)
ALL_SOLVERS: dict[str, Solver] = {**BASELINES, AGENT.name: AGENT, PORTFOLIO.name: PORTFOLIO}
