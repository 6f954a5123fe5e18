"""The trained agent as a solver: a checkpoint's networks with MCTS at test time.

`solve_with_agent` plays `attempts` copies of one program in a single batch (the evaluation loop
of actors/greedy_play.py): the first with the greedy search (no noise), the others sampling root
actions with Gumbel noise, all with `simulations` simulations per move, and one more played by
the network's policy alone (no search). msa's own mapping is one more attempt, so the agent as a
solver is never slower than the heuristic it starts from; the fastest is kept (ties go to the
network's play) and msa's solve time is part of the agent's. The result's info says which
attempt won (`best_attempt`: a trajectory's index or "msa") and keeps the network's own play
apart, so that reports can show what was learned separately from what search and the heuristic
add: `greedy_speedup`, one greedy attempt with the search, and `policy_speedup`, the policy
alone; neither has msa's mapping among its candidates, nor msa's move in its prior unless the
run's search config puts it there. With `search_seconds`, a search guided by the network goes on
after the attempts (`guided_search`: evo over request priorities seeded with the network's
mapping and msa's, or evo-msa over msa's decisions steered by its moves; `best_attempt` "guided"
when it wins, `guided_speedup` apart). A run that fitted a proposer (learner/proposer/, saved
beside the checkpoint) has it played after the attempts: one decode of its proposal, one more
candidate (`best_attempt` "proposal", `proposal_speedup` apart, its time in the solve's), and the
first genome of the guided search over priorities, its neighbours next (`neighbour_genomes`).
Every mapping it returns has passed the independent validator.
"""

from __future__ import annotations

import dataclasses
import json
import os
import time
from typing import Any, Optional, Sequence, Union

import numpy as np

from malloczero.actors.games import GameSpec
from malloczero.actors.greedy_play import (
  EvaluationResult,
  compile_searches,
  play_programs,
  with_simulations,
)
from malloczero.common.errors import MalloczeroError
from malloczero.common.inputs import read_input_text
from malloczero.configs.config import DEFAULT_ATTEMPTS, SearchConfig
from malloczero.configs.workdir import WorkDir
from malloczero.env.cost_model import CostModel
from malloczero.env.game import GameConfig
from malloczero.env.hardware import Hardware
from malloczero.env.mapping import Mapping
from malloczero.env.placement import Placement
from malloczero.env.solvers import SolveResult, solve
from malloczero.env.solvers.evo import evo, mapping_genomes
from malloczero.env.solvers.evo_msa import evo_msa
from malloczero.env.solvers.time_limit import now
from malloczero.env.validator import validate_mapping
from malloczero.env.workload import Workload
from malloczero.learner.checkpoint import (
  CHECKPOINT_FILENAME,
  check_params_fit,
  checkpoint_configs,
  checkpoint_steps,
  load_params,
  refuse_legacy,
)
from malloczero.learner.networks import MuZeroNetworks, Params, make_networks
from malloczero.learner.proposer import Proposer, neighbour_genomes, play_proposal, requests_of


@dataclasses.dataclass(frozen=True)
class Agent:
  networks: MuZeroNetworks
  params: Params
  search: SearchConfig
  game: GameConfig
  learner_steps: int
  checkpoint: str
  # The run's config.json the search settings came from; None when the checkpoint has none beside
  # it and the defaults are used (the command line says so: `search_notice`).
  config_file: Optional[str] = None
  # The run's proposer (learner/proposer/), None when the run fitted none.
  proposer: Optional[Proposer] = None

  def search_notice(self) -> Optional[str]:
    """One line naming the search settings used when the run's own are unknown, else None."""
    if self.config_file is not None:
      return None
    s = self.search
    return (
      f"no config.json beside the checkpoint {self.checkpoint} (expected "
      f"{WorkDir.of_checkpoint(self.checkpoint).config}): using the default search settings "
      f"(evaluation search {s.eval_num_simulations} simulations, "
      f"{s.max_num_considered_actions} considered actions, Gumbel scale {s.gumbel_scale:g}, "
      f"Q spread floor {s.eval_q_spread_floor:g} ({s.q_spread_floor:g} in the sampled attempts), "
      f"msa prior logit {s.eval_msa_prior_logit:g})"
    )

  @property
  def default_simulations(self) -> int:
    """Test-time search is wider than training's: twice the evaluation search."""
    return 2 * self.search.eval_num_simulations

  def test_time_simulations(self, simulations: Optional[int]) -> int:
    """`simulations` as asked (0, the policy alone, included), or the default when None."""
    return self.default_simulations if simulations is None else simulations


def find_checkpoint(path: str) -> str:
  """A training work directory, its checkpoints/ folder, or the checkpoint file -> the file."""
  for candidate in (WorkDir(path).learner_state, os.path.join(path, CHECKPOINT_FILENAME), path):
    if os.path.isfile(candidate):
      return candidate
  for place in (WorkDir(path).checkpoints, path):  # An older, pickled checkpoint: never read.
    refuse_legacy(place)
  raise MalloczeroError(
    f"no learner checkpoint at '{path}' (give a training work directory, "
    f"its checkpoints/ folder or a {CHECKPOINT_FILENAME} file)"
  )


def load_agent(path: str) -> Agent:
  """Loads a checkpoint; the search settings come from the run's config.json when present."""
  file = find_checkpoint(path)
  network_config, game_config = checkpoint_configs(file)
  networks = make_networks(network_config, game_config)
  params = load_params(file)
  check_params_fit(networks, params, file)
  config_file: Optional[str] = WorkDir.of_checkpoint(file).config
  if os.path.isfile(config_file):
    search = read_search_config(config_file)
  else:
    search, config_file = SearchConfig(), None
  proposer_file = WorkDir.of_checkpoint(file).proposer
  proposer = Proposer.load(proposer_file) if os.path.isfile(proposer_file) else None
  return Agent(
    networks, params, search, game_config, checkpoint_steps(file), file, config_file, proposer
  )


def read_search_config(config_file: str) -> SearchConfig:
  """The search settings of a run's config.json; a corrupt file is a one-line MalloczeroError."""

  def fail(why: str) -> MalloczeroError:
    return MalloczeroError(f"run config '{config_file}' is unusable ({why})".replace("\n", " "))

  try:
    data = json.loads(read_input_text(config_file, MalloczeroError))
  except MalloczeroError as e:
    raise fail(str(e)) from None
  except ValueError as e:  # Not JSON, or too many digits.
    raise fail(f"{type(e).__name__}: {e}") from None
  search = data.get("search") if isinstance(data, dict) else None
  if not isinstance(search, dict):
    raise fail("no 'search' object")
  fields = {f.name: f for f in dataclasses.fields(SearchConfig)}
  unknown = sorted(set(search) - set(fields))
  if unknown:
    raise fail(f"unknown search settings {', '.join(map(repr, unknown))}")
  for name, value in search.items():
    if fields[name].type == "int":
      if isinstance(value, bool) or not isinstance(value, int) or not 1 <= value <= 1 << 20:
        raise fail(f"search '{name}' must be an integer between 1 and 2**20, got {value!r}")
    elif (
      isinstance(value, bool)
      or not isinstance(value, (int, float))
      or not 0 <= value < float("inf")
    ):
      raise fail(f"search '{name}' must be a finite number >= 0, got {value!r}")
  try:
    return SearchConfig(**search)
  except ValueError as e:  # A setting beyond its bound (common/settings.py).
    raise fail(str(e)) from None


def solve_with_agent(
  agent: Agent,
  workload: Workload,
  hardware: Hardware,
  simulations: Optional[int] = None,
  attempts: int = DEFAULT_ATTEMPTS,
  seed: int = 0,
  search_seconds: float = 0.0,
  time_limit: Optional[float] = None,
  guide: str = "priorities",
) -> SolveResult:
  """Plays `attempts` trajectories (1 greedy, the rest sampled) and the policy's alone, adds msa's
  mapping as one more attempt, then searches `search_seconds` guided by the network (or what
  `time_limit` leaves, as in `play_with_agent`), and keeps the fastest: never slower than
  msa."""
  return play_with_agent(
    agent,
    [GameSpec(workload.name, workload, hardware)],
    simulations,
    attempts,
    seed,
    search_seconds=search_seconds,
    time_limit=time_limit,
    guide=guide,
  )[0]


def compile_agent(
  agent: Agent,
  spec: GameSpec,
  simulations: Optional[int] = None,
  attempts: int = DEFAULT_ATTEMPTS,
  num_programs: int = 1,
) -> float:
  """Compiles the agent's searches for `play_with_agent` on `num_programs` programs; returns the
  seconds it took (paid once per batch shape, so kept out of per-program solve times)."""
  return compile_searches(
    agent.networks,
    agent.params,
    _test_time_search(agent, simulations),
    agent.game,
    spec,
    num_programs,
    attempts,
    policy_alone=True,
  )


def _test_time_search(agent: Agent, simulations: Optional[int]) -> SearchConfig:
  return with_simulations(agent.search, agent.test_time_simulations(simulations))


# evo's decodes in the guided search over priorities: the time limit is the bound (as the
# `evo` baseline's `--evaluations 100000` at a time limit).
MAX_GUIDED_DECODES = 100_000
# The guided search's spaces (`guided_search`): msa's decisions (evo-msa) or request priorities
# (evo).
GUIDES = ("decisions", "priorities")
# Under a time limit, the share of what msa leaves that the attempts may play for: evo-msa goes on
# from whatever the play found, while evo over priorities needs decodes of its own (on programs
# of 3,000-4,000 buffers, a trajectory of search takes the whole limit).
PLAY_SHARE = {"decisions": 1.0, "priorities": 0.5}

# After the play's deadline: the search call in flight, and the kept mapping's build and
# validation (actors/greedy_play.py `play_programs`).
PLAY_RESERVE_S = 0.5
# Building a program's first msa game replays msa's decisions through the game, which no deadline
# interrupts: measured at 1.0-1.1x msa's solve time on 2k-10k buffers and 3.3x at 100k (10.3 s
# against 3.1 s, 2 cores). Play starts only when this many msa solve times fit in what is left.
GAME_BUILD_PER_MSA_S = 4.0


def play_with_agent(
  agent: Agent,
  specs: Sequence[GameSpec],
  simulations: Optional[int] = None,
  attempts: int = DEFAULT_ATTEMPTS,
  seed: int = 0,
  msa: Optional[Sequence[SolveResult]] = None,
  search_seconds: float = 0.0,
  time_limit: Optional[float] = None,
  guide: str = "priorities",
) -> list[SolveResult]:
  """`solve_with_agent` for several programs in one batch; each result's solve time is the
  batch's wall time divided evenly among its programs plus that program's msa solve (and its
  guided search).

  `msa`: msa's results for `specs`, when the caller has solved them already (`evaluate` does, as
  its reference); otherwise msa is solved here. `search_seconds`: per program, a search guided
  by the network (`guided_search`) after the attempts; 0 plays the attempts alone.
  `time_limit`: per program, a limit on the whole solve in place of `search_seconds`: msa comes
  first, the attempts stop at what it leaves (less `PLAY_RESERVE_S`; the trajectories unfinished
  then are dropped, info `cut_short`; none is played when building the games would not fit,
  `GAME_BUILD_PER_MSA_S`), and the guided search gets the rest (none when the
  attempts used it all), so that the agent can be compared with a baseline at the baseline's
  time limit. An attempt cut short has no speed-up (None), the network's own play included.
  `guide`: the guided search's space (`guided_search`); with a time limit, it sets the share of
  it the attempts get (`PLAY_SHARE`)."""
  _check_guide(guide)
  search = _test_time_search(agent, simulations)
  if msa is None:  # First: it is the answer when the time limit leaves no room for play.
    msa = [solve(spec.workload, spec.hardware, "msa") for spec in specs]
  start = now()  # The solvers' clock: the one their time limits read.
  deadline, room = None, True
  if time_limit is not None:
    left = len(specs) * (time_limit - max(b.solve_time_s for b in msa)) - PLAY_RESERVE_S
    left *= PLAY_SHARE[guide]
    deadline = start + max(0.0, left)
    room = left > GAME_BUILD_PER_MSA_S * sum(b.solve_time_s for b in msa)
  played: list[Optional[EvaluationResult]] = [None] * len(specs)
  if room:
    played = list(
      play_programs(
        agent.networks,
        agent.params,
        search,
        agent.game,
        specs,
        attempts=attempts,
        seed=seed,
        solver_name="agent",
        policy_alone=True,
        deadline=deadline,
      )
    )
  share = (now() - start) / max(1, len(specs))
  trajectories = attempts + (search.eval_num_simulations > 0)
  solved = []
  for spec, result, baseline in zip(specs, played, msa):
    best_attempt: Union[int, str] = "msa"
    mapping = dataclasses.replace(baseline.mapping, solver="agent")
    # Strictly faster only: on a tie the network's own mapping is kept.
    if result is not None and result.mapping is not None:
      if result.mapping.estimated_time_s <= mapping.estimated_time_s:
        best_attempt, mapping = result.best_attempt, result.mapping
    searched: dict[str, Any] = {}
    seconds = search_seconds
    if time_limit is not None:
      seconds = time_limit - share - baseline.solve_time_s
    proposal = None
    if agent.proposer is not None and (time_limit is None or seconds > 0):
      proposal = _play_proposal(agent.proposer, spec)
      searched = {"proposal_speedup": proposal.mapping.speedup, "proposal_s": proposal.seconds}
      seconds -= proposal.seconds if time_limit is not None else 0.0
      if proposal.mapping.estimated_time_s < mapping.estimated_time_s:
        best_attempt, mapping = "proposal", proposal.mapping
    # Over priorities the search has msa's mapping to start from when the play found nothing.
    played_any = result is not None and result.proposals is not None
    if seconds > 0 and (played_any or guide == "priorities"):
      started = time.perf_counter()
      found, found_info = guided_search(
        spec,
        result if played_any else None,
        seconds,
        seed,
        guide,
        msa=baseline.mapping,
        proposal=proposal,
      )
      searched |= {
        "guided_budget_s": seconds,
        "guide": guide,
        "guided_speedup": found.speedup,
        "guided_evaluations": found_info["evaluations"],
        "guided_s": time.perf_counter() - started,
      }
      if found.estimated_time_s < mapping.estimated_time_s:
        best_attempt, mapping = "guided", found
    unfinished = trajectories if result is None else result.unfinished
    if unfinished:
      searched["cut_short"] = (
        f"{unfinished} of {trajectories} trajectories unfinished at the time limit"
      )
    info: dict[str, Any] = {
      "requests": baseline.info["requests"] if result is None else result.requests,
      "attempts": attempts,
      "best_attempt": best_attempt,
      "greedy_speedup": None if result is None else result.greedy_speedup,
      "policy_speedup": None if result is None else result.policy_speedup,
      "proposal_speedup": None,
      "search_speedup": None if result is None or result.mapping is None else result.speedup,
      "attempt_speedups": (
        [None] * trajectories if result is None else list(result.attempt_speedups)
      ),
      "msa_speedup": baseline.mapping.speedup,
      "msa_solve_s": baseline.solve_time_s,
      "msa": baseline,
      "simulations": search.eval_num_simulations,
      "learner_steps": agent.learner_steps,
      "checkpoint": agent.checkpoint,
      **searched,
    }
    solve_time = share + baseline.solve_time_s + searched.get("guided_s", 0.0)
    solve_time += searched.get("proposal_s", 0.0)
    solved.append(SolveResult(mapping, solve_time, info))
  return solved


@dataclasses.dataclass(frozen=True)
class Proposal:
  """The proposer's play on one program: its genome `[R]` over `placement`'s requests (evo's),
  the validated mapping of its one decode, the genomes beside it that the guided search also
  starts from (`neighbour_genomes`, not decoded here), and the seconds all took."""

  genome: np.ndarray
  mapping: Mapping
  placement: Placement
  seconds: float
  neighbours: tuple[np.ndarray, ...] = ()


def _play_proposal(proposer: Proposer, spec: GameSpec) -> Proposal:
  started = time.perf_counter()
  placement = Placement(*requests_of(spec.workload, spec.hardware))
  genome, chance = play_proposal(proposer, placement)
  mapping = placement.mapping("agent")
  validate_mapping(spec.workload, spec.hardware, mapping)
  neighbours = tuple(neighbour_genomes(chance))
  return Proposal(genome, mapping, placement, time.perf_counter() - started, neighbours)


def _check_guide(guide: str) -> None:
  if guide not in GUIDES:
    raise MalloczeroError(f"unknown guided search '{guide}' (choose from {', '.join(GUIDES)})")


def guided_search(
  spec: GameSpec,
  played: Optional[EvaluationResult],
  seconds: float,
  seed: int = 0,
  guide: str = "priorities",
  msa: Optional[Mapping] = None,
  proposal: Optional[Proposal] = None,
) -> tuple[Mapping, dict[str, Any]]:
  """A search guided by the network's play, in one of two spaces (`guide`):

  * "decisions": evo-msa (env/solvers/evo_msa.py), its first population the agent's attempts
    (their departures from msa, fastest first), its mutations drawn mostly where the search's
    policy left msa's move and toward the moves it preferred. Why: the network's play is one
    trajectory; the decisions it doubts are where a few more full decodes pay.
  * "priorities": evo over request priorities (env/solvers/evo.py), the strongest baseline on
    large programs because it can reorder buffers, which msa's decisions cannot; its first
    population holds the proposer's genome and its neighbours (`proposal`, learner/proposer/;
    the proposal at other thresholds, and ordered by its chances), the kept mapping of
    the agent's play (`played`, None when the play found none) and then `msa`'s mapping as
    priority genomes (`mapping_genomes`), as EGRL seeds its population with its policy's
    proposals, beside msa's and the greedy's orders. The same search without the networks is
    this one with `played` and `proposal` None, at the same limit
    (scripts/guided_search_without_network.py).

  `seconds` include building the cost model (and the requests), as a baseline's time limit
  includes building its model."""
  _check_guide(guide)
  started = time.perf_counter()
  if guide == "priorities":
    return _guided_priorities(spec, played, msa, proposal, seconds, seed, started)
  if played is None:
    raise ValueError("the guided search over msa's decisions starts from the network's play")
  finished = [i for i, s in enumerate(played.attempt_speedups) if s is not None]
  order = sorted(finished, key=lambda i: -played.attempt_speedups[i])
  initial = [played.genomes[i] for i in order if played.genomes[i]]
  model = CostModel(spec.workload, spec.hardware)
  mapping, info = evo_msa(
    model,
    time_limit_s=max(0.0, seconds - (time.perf_counter() - started)),
    seed=seed,
    initial=initial,
    proposals=played.proposals,
    solver="agent",
  )
  validate_mapping(spec.workload, spec.hardware, mapping)
  return mapping, info


def _guided_priorities(
  spec: GameSpec,
  played: Optional[EvaluationResult],
  msa: Optional[Mapping],
  proposal: Optional[Proposal],
  seconds: float,
  seed: int,
  started: float,
) -> tuple[Mapping, dict[str, Any]]:
  # The `evo` baseline's requests, so that the search is that baseline with a seeded start; the
  # proposal's are those already.
  placement = (
    Placement(*requests_of(spec.workload, spec.hardware))
    if proposal is None
    else proposal.placement
  )
  seeds = [] if proposal is None else [proposal.genome, *proposal.neighbours]
  for mapping in (None if played is None else played.mapping, msa):
    if mapping is not None:
      seeds.extend(mapping_genomes(placement.requests, mapping, spec.workload))
  initial: list[np.ndarray] = []
  for genome in seeds:
    if not any(np.array_equal(genome, known) for known in initial):
      initial.append(genome)
  info = evo(
    placement,
    evaluations=MAX_GUIDED_DECODES,
    time_limit_s=max(0.0, seconds - (time.perf_counter() - started)),
    seed=seed,
    initial=initial,
    # The networks' first: on a program where a decode takes a second, the limit may leave room
    # for one or two. A decode the limit cuts short is never kept over msa's mapping.
    initial_first=True,
    grace_s=0.0,
  )
  mapping = placement.mapping("agent")
  validate_mapping(spec.workload, spec.hardware, mapping)
  return mapping, info
