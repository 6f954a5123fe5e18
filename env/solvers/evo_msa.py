"""Evolution in the game's own decision space: msa's trajectory with a few decisions changed.

A genome is a set of deviations from msa: {(buffer, use): action slot} (env/game/game.py's
slots: 0 leaves the use in default memory, or evicts, or uncommits; 1 keeps; 2 + f K + k the
k-th prefetch start into fast level f). Decoding plays msa's decision process
(`MsaDecisions`), taking msa's own option wherever the genome says nothing or names a slot that
is not offered there, and times the mapping with the cost model (copies contending). The first
genome is msa itself, and the elite is kept, so the result is never slower than msa. Children
are tournament winners with one to four decisions of their trajectory changed to another
offered slot (or a deviation dropped).

Why in this space, beside `evo` over request priorities: the agent plays this game, so what
`evo-msa` finds is a trajectory the agent can play (and learn from as a demonstration), and its
gain over msa is a measure of what deviating from the heuristic, decision by decision, is
worth. It cannot reorder buffers (msa's order is the game's), which `evo` can.

The time limit bounds the whole call as in `evo` (time_limit.py's `DecodeBudget`; msa's own
decode always runs, so there is a mapping). Unlike `evo`, the search has no budget of decodes by
default: it runs until the time limit, because a fixed count (evo's 120) ended it on small
programs long before its time was spent, leaving gains over msa unfound (`evaluations` caps it
where a test or a caller wants a fixed amount of work).

`defer` (off by default) adds one move the game does not have: a genome also carries a set of
deferred buffers, which msa's loop allocates after all the others (`MsaDecisions(deferred=)`),
and `DEFER_SHARE` of the mutation picks toggle one buffer's deferral. Why: `evo`'s lead over
evo-msa may come from reordering buffers, which the game cannot express; evo-msa with and
without it, at the same number of decodes, is a measurement of what a defer action would be
worth before the game gets one (docs/results/defer-measurement.md). msa stays the first genome
(nothing deferred), so the result is still never slower than msa.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from malloczero.env.cost_model import Allocations, CostModel
from malloczero.env.mapping import Mapping
from malloczero.env.msa.algorithm import MsaDecisions, allocations_mapping, msa_mapping
from malloczero.env.msa.decision import DEFAULT_PREFETCH_STARTS, option_slots, worth_deciding
from malloczero.env.msa.settings import MsaOptions
from malloczero.env.solvers.time_limit import DecodeBudget, now

# Full mappings decoded when neither `evaluations` nor a time limit bounds the search (as evo).
DEFAULT_EVALUATIONS = 120
Genome = dict[tuple[int, int], int]
# A decision point that offers more than one slot: (buffer, use, slots offered, msa's slot).
Choice = tuple[int, int, np.ndarray, int]


def decode(
  model: CostModel,
  genome: Genome,
  options: MsaOptions = MsaOptions(),
  max_prefetch_starts: int = DEFAULT_PREFETCH_STARTS,
  skip_below: float = 0.0,
  deferred: frozenset[int] = frozenset(),
) -> tuple[float, Allocations, list[Choice], Genome]:
  """Plays msa's decisions with the genome's deviations; (program time, segments, the decision
  points that offered a choice, the deviations actually taken: a deviation whose decision no
  longer comes up, or no longer offers its slot, is dropped). With `skip_below`, only the
  decisions the msa game offers with that setting (`GameConfig.skip_below`) offer a choice.
  `deferred`: buffers msa's loop allocates after the others (`MsaDecisions`)."""
  decisions = MsaDecisions(
    model.workload, model.hardware, options, max_prefetch_starts, deferred=deferred
  )
  threshold = skip_below * model.slow_only_time
  choices: list[Choice] = []
  taken: Genome = {}
  while not decisions.done:
    decision = decisions.decision
    choice = decision.msa_choice
    if worth_deciding(decision.options, threshold):
      slots = option_slots(decision.options, max_prefetch_starts)
      key = (decision.buffer, decision.use)
      wanted = genome.get(key)
      if wanted is not None and wanted != slots[choice]:
        found = np.flatnonzero(slots == wanted)
        if len(found):
          choice = int(found[0])
          taken[key] = wanted
      choices.append((decision.buffer, decision.use, slots, int(slots[decision.msa_choice])))
    decisions.choose(choice)
  allocations = decisions.allocations()
  return model.evaluate(allocations).total_time_s, allocations, choices, taken


# How a guide's proposals (`Proposals`) are mixed with uniform ones: the share of mutations that
# ignore the guide, so that decisions the policy is sure of are still tried now and then.
UNIFORM_SHARE = 0.25
# {(buffer, use): [A] probabilities over action slots}, e.g. the agent's search policy at each of
# its moves (actors/agent.py): where the policy leaves msa's slot, and for which slot.
Proposals = dict[tuple[int, int], np.ndarray]
# With `defer`, the share of mutation picks that toggle a buffer's deferral rather than change a
# decision: one in four, so that most of the search stays in the game's own moves.
DEFER_SHARE = 0.25


def mutate(
  parent: Genome,
  choices: list[Choice],
  rng: np.random.Generator,
  proposals: Proposals | None = None,
  picks: int | None = None,
) -> Genome:
  """One to four of the parent trajectory's decisions set to another offered slot (msa's slot
  drops the deviation). With `proposals`, most picks follow them: a decision with the chance
  that the guide leaves msa's slot there, a slot with the guide's probability among the others
  offered (`UNIFORM_SHARE` of the picks stay uniform). `picks`: how many decisions to change
  (None: one to four, drawn)."""
  child = dict(parent)
  weights = _decision_weights(choices, proposals) if proposals else None
  changed: set[int] = set()  # A decision changes once per child: twice could undo the first.
  for _ in range(int(rng.integers(1, 5)) if picks is None else picks):
    guided = weights is not None and rng.random() >= UNIFORM_SHARE
    index = int(rng.choice(len(choices), p=weights)) if guided else int(rng.integers(len(choices)))
    if index in changed:
      continue
    changed.add(index)
    buffer, use, slots, msa_slot = choices[index]
    current = child.get((buffer, use), msa_slot)
    others = slots[slots != current]
    proposal = proposals.get((buffer, use)) if guided else None
    if proposal is not None and proposal[others].sum() > 0:
      slot = int(rng.choice(others, p=proposal[others] / proposal[others].sum()))
    else:
      slot = int(others[rng.integers(len(others))])
    if slot == msa_slot:
      child.pop((buffer, use), None)
    else:
      child[(buffer, use)] = slot
  return child


def mutate_with_deferral(
  parent: Genome,
  deferred: frozenset[int],
  choices: list[Choice],
  rng: np.random.Generator,
  proposals: Proposals | None = None,
) -> tuple[Genome, frozenset[int]]:
  """One to four picks, each with chance `DEFER_SHARE` a toggle of one buffer's deferral (a
  buffer with a decision offering a choice in the parent's trajectory, or one deferred now, so
  that a deferral can always be undone), else a decision changed as `mutate` changes it (none
  when the trajectory offers no choice)."""
  picks = int(rng.integers(1, 5))
  toggles = int((rng.random(picks) < DEFER_SHARE).sum())
  child_deferred = set(deferred)
  if toggles:
    candidates = sorted({buffer for buffer, _, _, _ in choices} | set(deferred))
    for buffer in rng.choice(candidates, size=min(toggles, len(candidates)), replace=False):
      child_deferred ^= {int(buffer)}
  # A trajectory without a choice (every offering buffer deferred away) changes deferrals only.
  changes = picks - toggles if choices else 0
  child = mutate(parent, choices, rng, proposals, changes) if changes else parent
  return dict(child), frozenset(child_deferred)


def _decision_weights(choices: list[Choice], proposals: Proposals) -> np.ndarray | None:
  """`[len(choices)]` probabilities of mutating each decision: the guide's chance of leaving
  msa's slot there (None when the guide never leaves it: then picks are uniform)."""
  leave = np.zeros(len(choices))
  for i, (buffer, use, _, msa_slot) in enumerate(choices):
    proposal = proposals.get((buffer, use))
    if proposal is not None:
      leave[i] = max(0.0, 1.0 - float(proposal[msa_slot]))
  total = leave.sum()
  return leave / total if total > 0 else None


# A decode through msa's decision process takes about this many times msa's jitted loop (6x on
# the 100,000-buffer program, 13 s against 2 s; taken at 8).
DECISION_PROCESS_RATIO = 8.0


def _msa_when_no_decode_fits(
  model: CostModel, options: MsaOptions, deadline: float, solver: str, defer: bool
) -> tuple[Mapping, dict[str, Any]] | None:
  """msa's own mapping from its jitted loop (the same decisions as the decision process,
  env/msa/solver_loop.py) with evo-msa's info, when what is left before `deadline` could not hold
  one decode through the decision process; None (time spent: milliseconds on most programs)
  when it could. Why: the first decode always runs whole, and on a program of 100,000 buffers
  it alone outlasts a 10 s limit."""
  started = now()
  mapping, _ = msa_mapping(model, options, solver)
  took = now() - started
  if deadline - now() >= DECISION_PROCESS_RATIO * took:
    return None
  msa_time = mapping.estimated_time_s
  return mapping, {
    "evaluations": 1,  # msa's own mapping, as the first decode would have given it.
    "deviations_from_msa": 0,
    "deviations": [],
    "msa_time_s": msa_time,
    "best_time_per_generation_s": [msa_time],
    **({"deferred_buffers": 0, "deferred": []} if defer else {}),
    "stopped_by_time_limit": True,
    "cut_short": "time limit: no decode of msa's decision process fits; msa's own mapping",
  }


def evo_msa(
  model: CostModel,
  evaluations: int | None = None,
  population: int = 8,
  elite: int = 2,
  time_limit_s: float | None = None,
  seed: int = 0,
  skip_below: float = 0.0,
  initial: list[Genome] | None = None,
  proposals: Proposals | None = None,
  solver: str = "evo-msa",
  defer: bool = False,
  **msa_options: Any,
) -> tuple[Mapping, dict[str, Any]]:
  """The best mapping found and an info dict (evaluations; the best genome's deviations from
  msa as [buffer position, use op, slot] rows, which replayed in the msa game give the mapping;
  the best time per generation; msa's own time).

  `evaluations` None: decode until `time_limit_s` (`DEFAULT_EVALUATIONS` when that is None too,
  so that the call always ends). `initial`: genomes decoded after msa's own and before any
  child, joining the first population (the agent's trajectories, actors/agent.py); `proposals`:
  where and how mutations deviate (`mutate`). `defer`: genomes also defer buffers (the module's
  docstring); the info then counts the best genome's `deferred_buffers`."""
  if evaluations is None:
    evaluations = DEFAULT_EVALUATIONS if time_limit_s is None else float("inf")
  options = MsaOptions(**msa_options)
  rng = np.random.default_rng(seed)
  budget = DecodeBudget(time_limit_s)
  if budget.deadline is not None:
    quick = _msa_when_no_decode_fits(model, options, budget.deadline, solver, defer)
    if quick is not None:
      return quick
  msa_time, best_allocations, msa_choices, _ = budget.decode(
    decode, model, {}, options, skip_below=skip_below
  )
  best = {"time": msa_time, "genome": {}, "deferred": frozenset(), "allocations": best_allocations}
  # The population, one entry per column: deviations, deferred buffers, times, trajectories.
  population_columns: tuple[list, ...] = ([{}], [frozenset()], [msa_time], [msa_choices])
  used, stopped, history = 1, False, [msa_time]
  if not msa_choices:  # msa is offered no choice anywhere: nothing to search.
    evaluations = 1

  def evaluate(genome: Genome, deferred: frozenset[int], into: tuple[list, ...]) -> None:
    """Decodes a genome into the population (`population_columns`' columns), keeping the best."""
    nonlocal used
    child_time, allocations, child_choices, child = budget.decode(
      decode, model, genome, options, skip_below=skip_below, deferred=deferred
    )
    used += 1
    if child_time < best["time"]:
      best.update(time=child_time, genome=child, deferred=deferred, allocations=allocations)
    for column, value in zip(into, (child, deferred, child_time, child_choices)):
      column.append(value)

  for genome in initial or []:
    if used >= evaluations or not budget.time_for_another():
      break
    evaluate(genome, frozenset(), population_columns)
  while used < evaluations and not stopped:
    genomes, deferrals, fitness, trajectories = population_columns
    order = np.argsort(fitness, kind="stable")
    kept = tuple([column[i] for i in order[:elite]] for column in population_columns)
    while len(kept[0]) < population and used < evaluations:
      if not budget.time_for_another():
        stopped = True
        break
      a, b = rng.integers(len(genomes), size=2)
      parent = a if fitness[a] <= fitness[b] else b
      if defer:
        child, child_deferred = mutate_with_deferral(
          genomes[parent], deferrals[parent], trajectories[parent], rng, proposals
        )
      else:
        child = mutate(genomes[parent], trajectories[parent], rng, proposals)
        child_deferred = deferrals[parent]
      evaluate(child, child_deferred, kept)
    population_columns = kept
    history.append(min(population_columns[2]))
  best_allocations, best_genome = best["allocations"], best["genome"]
  mapping = allocations_mapping(model, best_allocations, solver)
  info = {
    "evaluations": used,
    "deviations_from_msa": len(best_genome),
    "deviations": [[b, u, slot] for (b, u), slot in sorted(best_genome.items())],
    "msa_time_s": msa_time,
    "best_time_per_generation_s": history,
    **(
      {"deferred_buffers": len(best["deferred"]), "deferred": sorted(best["deferred"])}
      if defer
      else {}
    ),
    **({"stopped_by_time_limit": True} if stopped else {}),
  }
  return mapping, info
