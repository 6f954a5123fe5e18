"""msa's allocation loop as a decision process (env/msa/algorithm.py: `MsaDecisions`,
`MsaAlgorithm.steps`), what the msa game is built on (docs/msa.md): the game's steps are msa's
decision points and its actions the options msa weighs there.

What must hold: msa's own choice at every step is the `msa` solver, exactly as it was before the
loop became a decision process (tests/data/msa_golden.json); "default" everywhere is all-slow;
any legal option at any step gives a mapping the validator accepts; the options describe what
choosing them commits.
"""

import json
import pathlib
import random

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from malloczero.env.cost_model import NO_COPY, Allocations, CostModel
from malloczero.env.msa.algorithm import (
  DEFAULT_PREFETCH_STARTS,
  OPTION_KINDS,
  MsaAlgorithm,
  MsaDecision,
  MsaDecisions,
  MsaOptions,
  allocations_mapping,
  msa_allocations,
  msa_mapping,
  msa_policy,
  play,
)
from malloczero.env.programs.suites import get_suite
from malloczero.env.validator import validate_mapping
from tests.msa_xla_cases import XLA_HW, tanh_negate_chains
from tests.strategies import hardware_for, workloads
from tests.test_msa import (
  COUNT_PICKER,
  evict_and_prefetch,
  evictions_shouldnt_be_delayed,
  negate_chain,
  segments_of,
  simple_program,
)

GOLDEN = json.loads((pathlib.Path(__file__).parent / "data" / "msa_golden.json").read_text())
ROWS = ("buffer", "level", "offset", "start", "end", "prefetch_done", "evict_start", "evict_done")
# Programs whose msa options are counted; small enough for the 2-core test machine.
DEFAULT_ENTRIES = ("unet-b8-infer@tpu-v4i-like:10%", "mlp-b8-train@tpu-v4i-like:25%")


def rows(allocations: Allocations) -> list[list[int]]:
  return [getattr(allocations, name).tolist() for name in ROWS]


def same_allocations(a: Allocations, b: Allocations) -> bool:
  return rows(a) == rows(b)


def entry(name: str):
  suite = "tiny" if name.startswith("tiny-") else "default"
  (found,) = [e for e in get_suite(suite).entries if e.name == name]
  return found


def hand_made() -> list[tuple[str, object, MsaOptions]]:
  """XLA's programs of tests/test_msa.py, each with the picker its test uses."""
  cases = [
    ("simple", simple_program(), MsaOptions()),
    ("simple-count", simple_program(), COUNT_PICKER),
    ("negate-chain", negate_chain(), MsaOptions()),
    ("negate-chain-count", negate_chain(), COUNT_PICKER),
    ("evict-and-prefetch", evict_and_prefetch(), COUNT_PICKER),
    ("evict-and-prefetch-and-prefetch", evict_and_prefetch(True), COUNT_PICKER),
    ("evictions-shouldnt-be-delayed", evictions_shouldnt_be_delayed(), COUNT_PICKER),
    ("tanh-negate-chains", tanh_negate_chains(), MsaOptions()),
  ]
  cases += [
    (
      f"evict-and-prefetch-limit-{n}",
      evict_and_prefetch(True),
      MsaOptions(
        picker="instruction_count", max_outstanding_prefetches=n, max_outstanding_evictions=n
      ),
    )
    for n in (0, 1, 2)
  ]
  return cases


def play_checked(
  workload,
  hardware,
  policy,
  options: MsaOptions = MsaOptions(),
  max_prefetch_starts: int = DEFAULT_PREFETCH_STARTS,
) -> Allocations:
  """Plays `policy` step by step through `MsaDecisions`, checking each decision's shape, and
  that every fast segment committed is one the chosen options described (level, offset,
  start; a prefetch's copy due at its use), unless its buffer was later uncommitted."""
  decisions = MsaDecisions(workload, hardware, options, max_prefetch_starts)
  described: dict[int, set] = {}
  uncommitted: set[int] = set()
  while not decisions.done:
    decision = decisions.decision
    check_decision(decision, hardware, max_prefetch_starts)
    choice = policy(decision)
    option = decision.options[choice]
    b = decision.buffer
    if option.kind == "uncommit":
      uncommitted.add(b)
    elif option.kind == "prefetch":
      described.setdefault(b, set()).add((option.level, option.offset, option.start, decision.use))
    elif (
      option.kind == "keep"
      and decision.segment_start == option.start
      and (decision.segment_start == int(workload.arrays.def_op[b]))
    ):
      described.setdefault(b, set()).add((option.level, option.offset, option.start, NO_COPY))
    decisions.choose(choice)
  allocations = decisions.allocations()
  committed: dict[int, set] = {}
  for i in range(len(allocations)):
    b = int(allocations.buffer[i])
    committed.setdefault(b, set()).add(
      (
        int(allocations.level[i]),
        int(allocations.offset[i]),
        int(allocations.start[i]),
        int(allocations.prefetch_done[i]),
      )
    )
  for b in uncommitted:
    described.pop(b, None)
  assert committed == described
  assert decisions.num_steps > 0 or len(allocations) == 0
  return allocations


def check_decision(decision: MsaDecision, hardware, max_starts: int) -> None:
  """The shape every decision point has: option 0 allocates nothing new, at most one keep
  (option 1), prefetches per level at most `max_starts`, in fast memory and in range."""
  options = decision.options
  assert options and 0 <= decision.msa_choice < len(options)
  assert options[0].kind in ("default", "evict", "uncommit")
  assert all(o.kind in OPTION_KINDS for o in options)
  assert all(o.kind in ("keep", "prefetch") for o in options[1:])
  assert [o.kind for o in options].count("keep") <= 1
  if any(o.kind == "keep" for o in options):
    assert options[1].kind == "keep"
  for level in range(hardware.num_fast_levels):
    assert sum(o.kind == "prefetch" and o.level == level for o in options) <= max_starts
  for o in options:
    if o.kind in ("keep", "prefetch"):
      assert 0 <= o.offset and o.offset + o.size <= hardware.levels[o.level].capacity_bytes
      assert o.start <= decision.use < o.end
      assert o.saving >= 0
    if o.kind == "prefetch":
      # A prefetch may start before earlier uses that read default memory (XLA: as soon as
      # default memory holds the value), never before the value exists.
      assert o.start <= decision.use
      assert o.evicts == (options[0].kind == "evict")
  # msa keeps when it can, else takes the first prefetch (the fastest level's first start).
  assert decision.msa_choice == (1 if len(options) > 1 else 0)


def msa_options(fifo: bool = False) -> st.SearchStrategy[MsaOptions]:
  """Options that change msa's decisions: the picker, the outstanding-copy limits and, with
  `fifo`, the prefetch FIFO order."""
  return st.builds(
    MsaOptions,
    picker=st.sampled_from(["cost", "instruction_count"]),
    max_outstanding_prefetches=st.sampled_from([-1, 0, 1, 2]),
    max_outstanding_evictions=st.sampled_from([-1, 0, 1]),
    enforce_prefetch_fifo_order=st.booleans() if fifo else st.just(False),
  )


def random_policy(seed: int):
  rng = random.Random(seed)
  return lambda decision: rng.randrange(len(decision.options))


def default_policy(decision: MsaDecision) -> int:
  (index,) = [i for i, o in enumerate(decision.options) if o.kind == "default"]
  return index


# ------------------------------------------------------------------ (a) msa's choice is msa


@pytest.mark.parametrize("name", sorted(GOLDEN["entries"]))
def test_msas_choice_at_every_step_gives_the_solvers_mapping_from_before_the_refactor(name):
  golden = GOLDEN["entries"][name]
  workload, hardware = entry(name).load()
  for max_starts in (1, DEFAULT_PREFETCH_STARTS):
    allocations = play_checked(workload, hardware, msa_policy, max_prefetch_starts=max_starts)
    assert rows(allocations) == golden["rows"]
  mapping, info = msa_mapping(CostModel(workload, hardware))
  assert info == golden["stats"]
  assert mapping.estimated_time_s == pytest.approx(golden["time_s"], rel=1e-12)


@pytest.mark.parametrize("name,workload,options", hand_made(), ids=[c[0] for c in hand_made()])
def test_msas_choice_reproduces_the_solver_on_xlas_programs(name, workload, options):
  expected, _ = msa_allocations(workload, XLA_HW, options)
  for max_starts in (1, 2, 8):
    got = play_checked(workload, XLA_HW, msa_policy, options, max_starts)
    assert same_allocations(got, expected)


def test_evict_and_prefetch_is_a_keep_then_an_evicting_prefetch_and_later_starts_are_offered():
  """XLA's `EvictAndPrefetch` step by step: tanh's first step keeps it (produced in fast
  memory for `a`); at its second use msa evicts and prefetches, and the other options there
  are evicting without a prefetch and later starts of the same copy."""
  w = evict_and_prefetch()
  decisions = MsaDecisions(w, XLA_HW, COUNT_PICKER)
  tanh = [x.name for x in w.buffers].index("tanh")
  seen = []
  while not decisions.done:
    if decisions.decision.buffer == tanh:
      seen.append(decisions.decision)
    decisions.choose(decisions.msa_choice)
  first, second = seen
  assert first.options[first.msa_choice].kind == "keep"
  assert first.options[first.msa_choice].start == 0
  chosen = second.options[second.msa_choice]
  assert (chosen.kind, chosen.evicts, chosen.start) == ("prefetch", True, 7)
  assert second.options[0].kind == "evict"
  assert (second.options[0].start, second.options[0].end) == (1, 2)
  starts = [o.start for o in second.options if o.kind == "prefetch"]
  assert starts[0] == 7 and len(set(starts)) == len(starts) == DEFAULT_PREFETCH_STARTS
  allocations = decisions.allocations()
  produced, fetched = segments_of(w, allocations, "tanh")
  assert (fetched["start"], fetched["prefetch_done"]) == (7, 16)


@pytest.mark.slow  # Integration-sized: subprocesses, compiles or every solver.
@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.data())
def test_msas_choice_equals_the_solver_on_random_workloads_for_any_number_of_starts(data):
  """The number of prefetch options offered never changes msa's own choice."""
  workload = data.draw(workloads())
  hardware = data.draw(hardware_for(workload))
  options = data.draw(msa_options())
  expected, _ = msa_allocations(workload, hardware, options)
  got = play_checked(workload, hardware, msa_policy, options, data.draw(st.sampled_from([1, 3])))
  assert same_allocations(got, expected)


# ------------------------------------------------------------------ (b) default everywhere


@pytest.mark.parametrize("name", sorted(n for n in GOLDEN["entries"] if n.startswith("tiny-")))
def test_default_memory_at_every_step_is_all_slow(name):
  workload, hardware = entry(name).load()
  allocations = play_checked(workload, hardware, default_policy)
  assert len(allocations) == 0
  played, stats = play(workload, hardware, default_policy)
  assert len(played) == 0 and stats.kept == stats.prefetches == stats.evictions == 0
  model = CostModel(workload, hardware)
  mapping = allocations_mapping(model, allocations, "default")
  assert validate_mapping(workload, hardware, mapping).estimated_time_s == pytest.approx(
    model.slow_only_time, rel=1e-12
  )


# ------------------------------------------------------------------ (c) every option is legal


@pytest.mark.slow  # Integration-sized: subprocesses, compiles or every solver.
@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.data())
def test_any_legal_option_at_every_step_gives_a_mapping_the_validator_accepts(data):
  workload = data.draw(workloads())
  hardware = data.draw(hardware_for(workload))
  options = data.draw(msa_options(fifo=True))
  policy = random_policy(data.draw(st.integers(0, 2**32 - 1)))
  allocations = play_checked(
    workload, hardware, policy, options, data.draw(st.sampled_from([1, 4]))
  )
  model = CostModel(workload, hardware)
  mapping = allocations_mapping(model, allocations, "random-steps")
  report = validate_mapping(workload, hardware, mapping)
  assert report.estimated_time_s == pytest.approx(mapping.estimated_time_s, rel=1e-9)


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_random_options_on_the_tiny_suite_and_xlas_programs_validate(seed):
  for e in get_suite("tiny").entries:
    workload, hardware = e.load()
    allocations = play_checked(workload, hardware, random_policy(seed))
    validate_mapping(
      workload, hardware, allocations_mapping(CostModel(workload, hardware), allocations, "random")
    )
  for _name, workload, options in hand_made():
    allocations = play_checked(workload, XLA_HW, random_policy(seed), options)
    validate_mapping(
      workload, XLA_HW, allocations_mapping(CostModel(workload, XLA_HW), allocations, "random")
    )


def test_a_choice_out_of_range_or_after_the_end_is_refused():
  decisions = MsaDecisions(simple_program(), XLA_HW)
  with pytest.raises(ValueError, match="out of range"):
    decisions.choose(len(decisions.options()))
  with pytest.raises(RuntimeError, match="not done"):
    decisions.allocations()
  while not decisions.done:
    decisions.choose(0)
  with pytest.raises(RuntimeError, match="no decision left"):
    decisions.options()
  with pytest.raises(ValueError, match="max_prefetch_starts"):
    MsaDecisions(simple_program(), XLA_HW, max_prefetch_starts=0)


# ------------------------------------------------------------------ (d) the size of the game


def step_counts(workload, hardware) -> tuple[int, list[int]]:
  """Steps of an episode played by msa, and the number of options at each step."""
  decisions = MsaDecisions(workload, hardware)
  counts = []
  while not decisions.done:
    counts.append(len(decisions.options()))
    decisions.choose(decisions.msa_choice)
  return decisions.num_steps, counts


@pytest.mark.parametrize("name", sorted(GOLDEN["entries"]))
def test_an_episode_has_one_step_per_segment_msa_allocates_and_a_bounded_action_space(name):
  """Played by msa (no uncommitted buffer on these programs), an episode has one step per use
  of each buffer msa allocates (outputs and empty buffers are not allocated), and one for an
  activation nothing reads; no step offers more than 2 + K x fast levels options."""
  workload, hardware = entry(name).load()
  a = workload.arrays
  num_steps, counts = step_counts(workload, hardware)
  expected = 0
  for b in range(workload.num_buffers):
    if a.is_output[b] or a.sizes[b] == 0:
      continue
    uses = {
      int(op)
      for op, buf in zip(a.incidence_op, a.incidence_buffer)
      if buf == b and op != a.def_op[b]
    }
    expected += len(uses) if uses else int(a.def_op[b] != -1)
  assert num_steps == expected == len(counts)
  assert max(counts) <= 2 + DEFAULT_PREFETCH_STARTS * hardware.num_fast_levels
  assert max(counts) > 2  # Some step offers more than one prefetch start.


def test_the_solvers_steps_plan_only_up_to_msas_own_option_and_agree_with_the_full_ones():
  """`MsaAlgorithm.run` (the `msa` solver) plans only what XLA's `AllocateSegment` tries before
  its first success; each of its decisions is option 0 and msa's own, the same options as the
  full decision point's option 0 and msa's choice."""
  for e in get_suite("tiny").entries:
    workload, hardware = e.load()
    lean = MsaAlgorithm(workload, hardware).steps(1, msa_only=True)
    full = MsaDecisions(workload, hardware)
    decision = next(lean)
    while True:
      assert len(decision.options) <= 2
      assert decision.buffer == full.decision.buffer and decision.use == full.decision.use
      assert decision.options[0] == full.options()[0]
      assert decision.options[decision.msa_choice] == full.options()[full.msa_choice]
      full.choose(full.msa_choice)
      try:
        decision = lean.send(decision.msa_choice)
      except StopIteration as stop:
        assert full.done and same_allocations(stop.value, full.allocations())
        break


def test_a_prefetch_option_made_fast_is_the_dataclasss_own():
  """`prefetch_option` skips the frozen dataclass's `__init__`: the option is the same (equal,
  hashed and shown alike, frozen still, its plan kept)."""
  import dataclasses

  from malloczero.env.msa.decision import MsaOption, prefetch_option

  made = prefetch_option(1, 10, 21, 4096, 100, 2.5e-6, True, (9, 21))
  own = MsaOption("prefetch", 1, 10, 21, 4096, 100, 2.5e-6, True, plan=(9, 21))
  assert made == own and hash(made) == hash(own) and repr(made) == repr(own)
  assert dataclasses.astuple(made) == dataclasses.astuple(own) and made.plan == own.plan
  with pytest.raises(dataclasses.FrozenInstanceError):
    made.start = 3
