"""mallocGame on XLA's own decisions: one step per decision point of msa's allocation loop.

A step is one `AllocateSegment` call of the faithful msa (env/solvers/msa/algorithm.py,
`MsaDecisions`), in msa's order: buffers by memory-boundedness, each buffer's uses in time
order, each use one segment from the previous use (or the definition). The actions are the
options msa weighs there, in fixed slots (`A = 2 + K x F`, `K = max_prefetch_starts`, `F =
max_fast_levels`):

  0           allocate nothing new: the use reads default memory ("default"), after the
              eviction msa would make when the fast copy is the only one ("evict"), or, when
              that eviction is refused, the whole buffer back to default memory ("uncommit");
  1           keep in fast memory without a copy (the previous chunk extended to the use, or an
              activation produced in place at the best chunk);
  2 + f K + k the picker's k-th fitting prefetch start into fast level f, at its best chunk.

Slots with no option are illegal (the legal mask). The observation says which slot msa itself
takes (`msa_choice`), so playing that slot at every step is the `msa` solver, exactly
(tests/test_msa_game.py): the heuristic's answer is always reachable and every deviation from it
is the agent's. Why these decision points rather than the requests game's (env/game.py): XLA's
msa evicts, chooses prefetch start times and keeps a value across uses, which a game over whole
requests cannot express (issue 14).

Rewards are exact: each step's reward is the decrease of the cost model's program time (copies
contending, env/simulator.py) that the step's segment causes, over the all-slow time, the
undecided buffers being in default memory; so an episode's return is the fractional time saved
by the final mapping, as in the requests game. Op times update locally (the incidences the
option moves into fast memory, or back on an uncommit); the copy queue is re-simulated when the
copies change, and when a stall may shrink (`Placement` explains why moving bytes into fast
memory can never add one).
"""

from __future__ import annotations

from typing import Any

import dm_env
import numpy as np
from dm_env import specs

from malloczero.env.cost_model import Allocations, CostModel
from malloczero.env.errors import HardwareError, IllegalActionError, MalloczeroError
from malloczero.env.game import GameConfig
from malloczero.env.hardware import Hardware, check_fits
from malloczero.env.mapping import Mapping
from malloczero.env.observation import observation_spec
from malloczero.env.simulator import Copies, CopyQueue
from malloczero.env.solvers.msa.algorithm import MsaDecisions, MsaOption, MsaOptions
from malloczero.env.workload import PROGRAM_START, Workload

OPTION0_KINDS = ("default", "evict", "uncommit")


def option_slots(options: tuple[MsaOption, ...], max_prefetch_starts: int) -> np.ndarray:
  """`[n]` the action slot of each option of a decision (see the module docstring)."""
  slots = np.zeros(len(options), np.int64)
  rank = {}
  for i, option in enumerate(options):
    if i == 0:
      continue
    if option.kind == "keep":
      slots[i] = 1
      continue
    k = rank.get(option.level, 0)
    rank[option.level] = k + 1
    slots[i] = 2 + option.level * max_prefetch_starts + k
  return slots


class MsaGame(dm_env.Environment):
  """mallocGame over msa's decision points for one (workload, hardware) pair; deterministic."""

  def __init__(self, workload: Workload, hardware: Hardware, config: GameConfig = GameConfig(),
               msa_options: MsaOptions = MsaOptions()):
    if config.decisions != "msa":
      raise ValueError(f"MsaGame plays msa's decisions; the config asks for "
                       f"'{config.decisions}' (env/game.py's MallocGame)")
    if hardware.num_fast_levels > config.max_fast_levels:
      raise HardwareError(f"hardware '{hardware.name}' has {hardware.num_fast_levels} fast levels; "
                          f"this game config observes at most {config.max_fast_levels}")
    check_fits(hardware, workload.peak_live_bytes, workload.name)
    self.workload, self.hardware, self.config = workload, hardware, config
    self.msa_options = msa_options
    self.cost_model = model = CostModel(workload, hardware)
    self.normaliser = model.slow_only_time
    self._num_fast = hardware.num_fast_levels
    self._capacity = hardware.capacities[:-1].astype(np.float64)        # [F]
    self._inverse_bandwidth = model.inverse_bandwidth                    # [L]
    a = workload.arrays
    self._stride = workload.num_ops + 1
    self._incidence_key = model._incidence_key                           # [E] sorted
    self._incidence_bytes = a.incidence_bytes.astype(np.float64)
    self._incidence_op = a.incidence_op
    self._axis = workload.time_axis.astype(np.float64)
    self._length = max(float(self._axis[-1]), 1e-30)
    self._slow_op_prefix = np.concatenate(
        [[0.0], np.cumsum(np.maximum(model.compute_time, model.slow_memory_time))])
    self._obs_spec = observation_spec(config)
    self._layout = config.layout
    self._reset_state()
    if self._decisions.done:
      raise MalloczeroError(f"{workload.name}: nothing to play on '{hardware.name}': msa has no "
                            "decision to make (no buffer to allocate)")
    analyses = self._decisions.algorithm.analyses
    self._use_reduction = np.stack([ca.use_elapsed_reduction for ca in analyses])  # [F, E]
    self._saving_scale = max(float(self._use_reduction.max(initial=0.0)), 1e-30)
    self._num_buffers = int(np.sum(~a.is_output & (a.sizes > 0)))
    self._uses_cache: dict[int, np.ndarray] = {}

  # -------------------------------------------------------------------------- dm_env API

  def observation_spec(self) -> dict[str, specs.Array]:
    return self._obs_spec

  def action_spec(self) -> specs.DiscreteArray:
    return specs.DiscreteArray(self.config.num_actions, name="action")

  def reward_spec(self) -> specs.Array:
    return specs.Array((), np.float64, "reward")

  def discount_spec(self) -> specs.BoundedArray:
    return specs.BoundedArray((), np.float64, 0.0, 1.0, "discount")

  def reset(self) -> dm_env.TimeStep:
    self._reset_state()
    return dm_env.restart(self._observe())

  def step(self, action: Any) -> dm_env.TimeStep:
    if self._done:
      return self.reset()
    action = int(action)
    if not (0 <= action < self.config.num_actions) or not self._legal[action]:
      raise IllegalActionError(
          f"action {action} is illegal at decision {self._decisions.num_steps} of "
          f"'{self.workload.name}': legal actions are {np.flatnonzero(self._legal).tolist()}")
    before = self.total_time
    self._apply(self._option_index[action])
    reward = (before - self.total_time) / self.normaliser
    if self._decisions.done:
      self._done = True
      return dm_env.termination(reward, self._terminal_observation())
    return dm_env.transition(reward, self._observe())

  # -------------------------------------------------------------------------- queries

  @property
  def done(self) -> bool:
    return self._done

  @property
  def decision(self):
    """The current `MsaDecision` (None once the episode is over)."""
    return self._decisions.decision

  @property
  def legal_actions(self) -> np.ndarray:
    """[A] bool mask of the current step."""
    return self._legal.copy()

  @property
  def msa_action(self) -> int:
    """The slot msa itself takes at the current step."""
    return self._msa_action

  @property
  def num_steps(self) -> int:
    """Decisions taken so far in this episode."""
    return self._decisions.num_steps

  def allocations(self) -> Allocations:
    """The segments so far (the whole mapping once the episode is over), in msa's order."""
    return self._decisions.allocations_so_far()

  def mapping(self, solver: str) -> Mapping:
    """The mapping of the finished episode, reporting the game's exact program time."""
    allocations = self.allocations()
    return Mapping.from_arrays(self.workload, self.hardware, solver,
                               np.full(len(allocations), -1, np.int64), allocations,
                               self.total_time, self.normaliser)

  # -------------------------------------------------------------------------- state

  def _reset_state(self) -> None:
    model = self.cost_model
    self._decisions = MsaDecisions(self.workload, self.hardware, self.msa_options,
                                   self.config.max_prefetch_starts)
    self._done = False
    self._memory_time = model.slow_memory_time.copy()                        # [T]
    self._default_time = model.slow_memory_time.copy()                       # [T]
    self._op_time = np.maximum(model.compute_time, self._memory_time)        # [T]
    self._op_time_sum = float(self._op_time.sum())
    self._stall_time = 0.0
    self.total_time = self._op_time_sum
    self._level = np.full(len(self._incidence_key), self.hardware.slow_level, np.int64)  # [E]
    # Copies so far, prefetches before evictions as `CostModel.copies` lists them: {id: row}.
    self._prefetches: dict[int, tuple[int, int, float]] = {}
    self._evictions: dict[int, tuple[int, int, float]] = {}
    self._next_copy = 0
    self._queue: CopyQueue | None = None
    # What the current buffer has changed, to take back on an uncommit.
    self._buffer = -1
    self._buffer_incidences: list[np.ndarray] = []
    self._buffer_copies: list[int] = []
    self._buffers_done = 0

  def _incidences(self, buffer: int, op: int) -> np.ndarray:
    key = buffer * self._stride + op
    lo = int(np.searchsorted(self._incidence_key, key, "left"))
    hi = int(np.searchsorted(self._incidence_key, key, "right"))
    return np.arange(lo, hi)

  def _move(self, incidences: np.ndarray, level: int) -> None:
    """Moves incidences to `level` and updates their ops' times."""
    if not len(incidences):
      return
    inv, slow = self._inverse_bandwidth, self.hardware.slow_level
    old = self._level[incidences]
    nbytes = self._incidence_bytes[incidences]
    ops = self._incidence_op[incidences]
    memory = nbytes * (inv[level] - inv[old])
    default = nbytes * inv[slow] * (float(level == slow) - (old == slow))
    np.add.at(self._memory_time, ops, memory)
    np.add.at(self._default_time, ops, default)
    self._level[incidences] = level
    unique = np.unique(ops)
    new_time = np.maximum(self.cost_model.compute_time[unique], self._memory_time[unique])
    self._op_time_sum += float((new_time - self._op_time[unique]).sum())
    self._op_time[unique] = new_time

  def _add_copy(self, table: dict, start: int, done: int) -> None:
    table[self._next_copy] = (start, done, float(self.cost_model.copy_time[self._buffer]))
    self._buffer_copies.append(self._next_copy)
    self._next_copy += 1
    self._queue = None

  def _apply(self, index: int) -> None:
    """Applies option `index` of the current decision to the timing state, then to msa's loop."""
    decision = self._decisions.decision
    option = decision.options[index]
    buffer, use = decision.buffer, decision.use
    if buffer != self._buffer:
      self._buffer, self._buffer_incidences, self._buffer_copies = buffer, [], []
    first = decision.options[0]
    moved_to_slow = False
    if option.kind == "uncommit":
      for incidences in self._buffer_incidences:
        self._move(incidences, self.hardware.slow_level)
      for copy in self._buffer_copies:
        self._prefetches.pop(copy, None)
        self._evictions.pop(copy, None)
      moved_to_slow = bool(self._buffer_incidences)
      self._queue = None if self._buffer_copies else self._queue
      self._buffer_incidences, self._buffer_copies = [], []
    else:
      if first.kind == "evict" and (index == 0 or option.evicts):
        self._add_copy(self._evictions, first.start, first.end)
      if option.kind in ("keep", "prefetch"):
        incidences = self._incidences(buffer, use)
        def_op = int(self.workload.arrays.def_op[buffer])
        if option.kind == "keep" and def_op != PROGRAM_START and decision.segment_start == def_op:
          # The first segment of an activation: produced in place, its definition writes fast
          # memory too (a later segment starts at the previous use, never at the definition).
          incidences = np.unique(np.concatenate([self._incidences(buffer, def_op), incidences]))
        self._move(incidences, option.level)
        self._buffer_incidences.append(incidences)
        if option.kind == "prefetch":
          self._add_copy(self._prefetches, option.start, use)
    self._decisions.choose(index)
    if self._decisions.done or self._decisions.decision.buffer != buffer:
      self._buffers_done += 1
    copies = len(self._prefetches) + len(self._evictions)
    if copies and (self._queue is None or self._stall_time > 0 or moved_to_slow):
      if self._queue is None:
        rows = list(self._prefetches.values()) + list(self._evictions.values())
        start, done, work = (np.array(c) for c in zip(*rows))
        self._queue = CopyQueue(Copies(start.astype(np.int64), done.astype(np.int64),
                                       work.astype(np.float64)), self.cost_model.num_ops)
      idle = self.cost_model.idle_time(self._op_time, self._default_time)
      self._stall_time = self._queue.total_stall(idle)
    elif not copies:
      self._stall_time = 0.0
    self.total_time = self._op_time_sum + self._stall_time

  # -------------------------------------------------------------------------- observation

  def _uses(self, buffer: int) -> np.ndarray:
    """[U] the buffer's use ops, sorted, the definition excluded."""
    uses = self._uses_cache.get(buffer)
    if uses is None:
      a = self.workload.arrays
      lo = int(np.searchsorted(self._incidence_key, buffer * self._stride, "left"))
      hi = int(np.searchsorted(self._incidence_key, (buffer + 1) * self._stride, "left"))
      ops = np.unique(self._incidence_op[lo:hi])
      uses = ops[ops != a.def_op[buffer]]
      self._uses_cache[buffer] = uses
    return uses

  def _position(self, op: int) -> float:
    return 0.0 if op < 0 else float(self._axis[min(op, len(self._axis) - 1)]) / self._length

  def _observe(self) -> dict[str, np.ndarray]:
    cfg, layout, num_fast = self.config, self._layout, self._num_fast
    decision = self._decisions.decision
    options = decision.options
    buffer, use, segment_start = decision.buffer, decision.use, decision.segment_start
    a = self.workload.arrays
    size = float(a.sizes[buffer])
    slots = option_slots(options, cfg.max_prefetch_starts)
    legal = np.zeros(cfg.num_actions, bool)
    legal[slots] = True
    option_index = np.zeros(cfg.num_actions, np.int64)
    option_index[slots] = np.arange(len(options))
    self._legal, self._option_index = legal, option_index
    self._msa_action = int(slots[decision.msa_choice])
    incidence = int(np.searchsorted(self._incidence_key, buffer * self._stride + use, "left"))
    scale = self._saving_scale
    copy_time = float(self.cost_model.copy_time[buffer])

    uses = self._uses(buffer)
    k = int(np.searchsorted(uses, use))
    request = np.zeros(cfg.request_features, np.float32)
    q = layout.request
    request[q.index("is_activation")] = a.def_op[buffer] != PROGRAM_START
    request[q.slice("size_vs_capacity", num_fast)] = np.minimum(size / self._capacity, 2.0)
    request[q.index("log_size")] = np.log2(max(size, 1.0)) / 32.0
    request[q.index("definition")] = self._position(int(a.def_op[buffer]))
    request[q.index("last_use")] = self._position(int(uses[-1])) if len(uses) else 0.0
    request[q.index("segment_start")] = self._position(segment_start)
    request[q.index("use")] = self._position(use)
    request[q.index("segment_length")] = self._position(use) - self._position(segment_start)
    request[q.index("use_index")] = k / max(len(uses), 1)
    request[q.index("num_uses")] = np.log2(1 + len(uses)) / 10.0
    request[q.slice("use_saving", num_fast)] = self._use_reduction[:, incidence] / scale
    request[q.index("copy_time")] = min(copy_time / scale, 10.0)
    request[q.slice("option0").start + OPTION0_KINDS.index(options[0].kind)] = 1.0
    request[q.index("msa_takes_option0")] = self._msa_action == 0
    request[q.slice("level_present", num_fast)] = 1.0
    request[q.index("program_time")] = self.total_time / self.normaliser
    request[q.index("stall_share")] = self._stall_time / max(self.total_time, 1e-30)
    request[q.index("progress")] = self._buffers_done / max(self._num_buffers, 1)
    request[q.index("options_found")] = len(options) / cfg.num_actions

    candidates = np.zeros((cfg.candidate_slots, cfg.candidate_features), np.float32)
    c = layout.candidate
    window = max(use - segment_start + 1, 1)
    for i in range(1, len(options)):
      option, row = options[i], candidates[slots[i] - 1]
      row[c.index("valid")] = 1.0
      row[c.index(option.kind)] = 1.0
      row[c.slice("level").start + option.level] = 1.0
      if option.kind == "prefetch":
        row[c.index("rank")] = ((slots[i] - 2) % cfg.max_prefetch_starts) / cfg.max_prefetch_starts
        hidden = self._slow_op_prefix[use] - self._slow_op_prefix[max(option.start, 0)]
        row[c.index("hide_ratio")] = min(hidden / max(copy_time, 1e-30), 10.0)
        row[c.index("lead")] = (use - option.start) / window
      row[c.index("start")] = self._position(option.start)
      row[c.index("hold")] = (self._position(option.end) - self._position(option.start))
      row[c.index("offset")] = option.offset / self._capacity[option.level]
      row[c.index("saving")] = option.saving / scale
      row[c.index("evicts")] = option.evicts
      row[c.index("msa_choice")] = i == decision.msa_choice

    occupancy = np.zeros((cfg.max_fast_levels, cfg.occupancy_bins), np.float32)
    heaps = self._decisions.algorithm.heaps
    for level in range(num_fast):
      start, end, offset, chunk = heaps[level].chunks()
      live = (start < use + 1) & (end > max(segment_start, 0))
      if live.any():
        edges = np.linspace(0.0, self._capacity[level], cfg.occupancy_bins + 1)
        low, high = offset[live], offset[live] + chunk[live]
        covered = np.clip(edges[:, None] - low[None, :], 0, (high - low)[None, :]).sum(axis=1)
        occupancy[level] = np.minimum(np.diff(covered) / (edges[1] - edges[0]), 1.0)

    lookahead = np.zeros((cfg.lookahead, cfg.lookahead_features), np.float32)
    following = uses[k + 1:k + 1 + cfg.lookahead]
    if len(following):
      s = layout.static
      first = np.searchsorted(self._incidence_key, buffer * self._stride + following, "left")
      n = len(following)
      positions = self._axis[np.minimum(following, len(self._axis) - 1)] / self._length
      lookahead[:n, layout.lookahead.index("valid")] = 1.0
      rows = np.zeros((n, s.size), np.float32)
      rows[:, s.index("position")] = positions
      rows[:, s.index("distance")] = positions - self._position(use)
      rows[:, s.slice("saving", num_fast)] = (self._use_reduction[:, first] / scale).T
      lookahead[:n, layout.lookahead.slice("static")] = rows
    return {"request": request, "occupancy": occupancy, "candidates": candidates,
            "lookahead": lookahead, "legal_actions": legal}

  def _terminal_observation(self) -> dict[str, np.ndarray]:
    obs = {k: np.zeros(spec.shape, spec.dtype) for k, spec in self._obs_spec.items()}
    obs["legal_actions"][0] = True
    self._legal = obs["legal_actions"]
    self._option_index = np.zeros(self.config.num_actions, np.int64)
    self._msa_action = 0
    return obs
