"""mallocGame on XLA's own decisions: one step per decision point of msa's allocation loop.

A step is one `AllocateSegment` call of the faithful msa (env/msa/algorithm.py,
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
is the agent's. Why these decision points rather than the requests game's
(env/game/requests_game.py): XLA's msa evicts, chooses prefetch start times and keeps a value
across uses, which a game over whole requests cannot express (docs/msa.md).

Rewards (`GameConfig.reward`) are exact. "advantage", the default, is potential-based shaping
(Ng, Harada & Russell 1999) with msa's completion as the potential: C(s) is the program time when
msa decides every remaining step from state s, a move's reward (C(s_t) - C(s_t+1)) / T_msa. A
move that is msa's own leaves C unchanged (reward exactly 0) and the episode's return is
(T_msa - T) / T_msa, the fraction of msa's own time the mapping saves: 0 for msa's play, above 0
only where the agent beats it, in units the value and reward heads can resolve (a move's
advantage is typically 1e-5 to 1e-2 of msa's time; the all-slow time's absolute savings are
100-1000x larger and hid them). C is measured where it is known without extra work: at the
start (T_msa, one msa pass when the game is built) and at the end, so the whole advantage is
the last move's reward (msa's decision loop is a generator, so a state cannot be copied to
complete it from the middle; a completion would cost a replay of the whole prefix).
"time" rewards each step with the decrease of the cost model's program time (copies
contending, env/simulator.py) that the step's segment causes, over the all-slow time, the
undecided buffers being in default memory, so an episode's return is the fractional time saved
by the final mapping, as in the requests game.

Short games (`reset_segment`, Backplay: Salimans & Chen 2018): msa plays the first `start` moves,
the agent the next `moves`, and msa finishes the program; the return is still exact (msa's
trajectory has potential T_msa everywhere), and one actor completes many more of these than of
whole programs, whose longest have 16,855 decisions. Op times update locally (the incidences the
option moves into fast memory, or back on an uncommit); the copy queue is re-simulated when the
copies change, and when a stall may shrink (`Placement` explains why moving bytes into fast
memory can never add one).
"""

from __future__ import annotations

import bisect

import dm_env
import numpy as np

from malloczero.common.errors import MalloczeroError
from malloczero.common.lazy import lazy_module
from malloczero.env.cost_model import Allocations
from malloczero.env.game.base import GameBase
from malloczero.env.game.config import GameConfig
from malloczero.env.game.msa_observation import OPTION_FIELDS, observed_columns
from malloczero.env.game.pressure import MsaReference, fill_prefix, program_fill, segment_fill
from malloczero.env.hardware import Hardware
from malloczero.env.msa.algorithm import MsaDecisions
from malloczero.env.msa.decision import MsaDecision, option_slots, worth_deciding
from malloczero.env.msa.settings import MsaOptions
from malloczero.env.simulator import StallTracker
from malloczero.env.workload import PROGRAM_START, Workload

OPTION0_KINDS = ("default", "evict", "uncommit")

_observation_kernels = lazy_module("malloczero.env.game.observation_kernels")


class MsaGame(GameBase):
  """mallocGame over msa's decision points for one (workload, hardware) pair; deterministic."""

  def __init__(
    self,
    workload: Workload,
    hardware: Hardware,
    config: GameConfig = GameConfig(),
    msa_options: MsaOptions = MsaOptions(),
    reference: MsaReference | None = None,
  ):
    """`reference`: another game's `reference` for the same program and settings, which spares
    the msa pass that measures it."""
    if config.decisions != "msa":
      raise ValueError(
        f"MsaGame plays msa's decisions; the config asks for "
        f"'{config.decisions}' (env/game/requests_game.py's RequestsGame)"
      )
    self._set_up(workload, hardware, config)
    self.msa_options = msa_options
    model = self.cost_model
    self._capacity = hardware.capacities[:-1].astype(np.float64)  # [F]
    a = workload.arrays
    self._stride = workload.num_ops + 1
    self._incidence_key = model._incidence_key  # [E] sorted
    # Python lists for the per-step scalar updates (`_move`): numpy scalars cost more there.
    self._key_list = self._incidence_key.tolist()
    self._bytes_prefix = (
      np.concatenate([[0], np.cumsum(a.incidence_bytes)]).astype(np.float64).tolist()
    )
    self._inverse_list = model.inverse_bandwidth.tolist()
    self._compute_list = model.compute_time.tolist()
    self._slow_level = hardware.slow_level
    self._def_op = a.def_op.tolist()
    self._copy_time_list = model.copy_time.tolist()
    self._size_list = a.sizes.astype(np.float64).tolist()
    self._incidence_start = a.buffer_incidence_start.tolist()
    self._incidence_op_list = a.incidence_op.tolist()
    self._axis = workload.time_axis.astype(np.float64)
    self._length = max(float(self._axis[-1]), 1e-30)
    # [T + 1] positions of ops -1 (the program start: 0), 0, ..., T - 1.
    self._last_op = len(self._axis) - 1
    self._positions = np.concatenate([[0.0], self._axis / self._length])
    self._position_list = self._positions.tolist()
    self._candidates_shape = (config.candidate_slots, config.candidate_features)
    self._lookahead_shape = (config.lookahead, config.lookahead_features)
    self._slow_op_prefix = np.concatenate(
      [[0.0], np.cumsum(np.maximum(model.compute_time, model.slow_memory_time))]
    )
    self._layout = config.layout
    self._skip_threshold = config.skip_below * self.normaliser
    self._advantage = config.reward == "advantage"
    self._kernels = _observation_kernels()
    self._reset_state()
    if reference is None or (config.pressure_bins and reference.fill_prefix is None):
      reference = self._msa_reference()
    self._reference = reference
    self._msa_time, self._msa_moves = reference.time, reference.moves
    if config.pressure_bins:  # The program's half of every pressure observation.
      self._pressure = np.zeros((config.max_fast_levels, 2 * config.pressure_bins), np.float32)
      self._pressure[: self._num_fast, config.pressure_bins :] = program_fill(
        reference.fill_prefix, config.pressure_bins
      )
    if self._decisions.done:
      why = (
        "msa has no decision to make (no buffer to allocate)"
        if not config.skip_below
        else f"no decision of msa's is worth {config.skip_below:g} of the all-slow time "
        "(skip_below)"
      )
      raise MalloczeroError(f"{workload.name}: nothing to play on '{hardware.name}': {why}")
    analyses = self._decisions.algorithm.analyses
    self._use_reduction = np.stack([ca.use_elapsed_reduction for ca in analyses])  # [F, E]
    self._saving_scale = max(float(self._use_reduction.max(initial=0.0)), 1e-30)
    self._num_buffers = int(np.sum(~a.is_output & (a.sizes > 0)))
    self._static_cache: dict[int, tuple[np.ndarray, np.ndarray]] = {}
    slow_start = len(self._positions)
    capacity_start = slow_start + len(self._slow_op_prefix)
    scale_at = capacity_start + len(self._capacity)
    self._frame = (  # An `ObservationFrame`'s fields.
      np.concatenate([self._positions, self._slow_op_prefix, self._capacity, [self._saving_scale]]),
      np.concatenate(
        [
          [self._last_op, config.max_prefetch_starts, slow_start, capacity_start, scale_at],
          observed_columns(config),
        ]
      ).astype(np.int64),
    )
    self._option_width = len(OPTION_FIELDS)
    q = config.layout.request
    self._static_columns = (
      q.index("is_activation"),
      q.slice("size_vs_capacity").start,
      q.index("log_size"),
      q.index("definition"),
      q.index("last_use"),
      q.index("num_uses"),
      q.index("copy_time"),
      q.slice("level_present").start,
    )
    self._capacity_list = self._capacity.tolist()
    # When occupancy reads a heap through its index and lists (tests set smaller ones).
    self._occupancy_limits = (self._kernels.SCAN_LIMIT, self._kernels.COLLECT_LIMIT)
    # The observation's shapes (the config derives them from its layouts on every call).
    self._shapes = (
      config.request_features,
      (config.max_fast_levels, config.occupancy_bins),
      self._candidates_shape,
      self._lookahead_shape,
      config.num_actions,
    )

  # -------------------------------------------------------------------------- dm_env API

  def _step_label(self) -> str:
    return f"at decision {self._decisions.num_steps}"

  def _play(self, action: int) -> float:
    self._apply(self._option_index[action])
    self._moves += 1
    self._actions.append(action)
    if self._skip_threshold > 0:
      self._play_skipped_decisions()
    if self._segment_end is not None and self._moves >= self._segment_end:
      self._complete_with_msa()
    if self._advantage:
      if not self._decisions.done:
        return 0.0
      # The cost model's own evaluation, as for msa's time: msa's play returns exactly 0.
      self.total_time = self.cost_model.evaluate(self._decisions.allocations()).total_time_s
      return self._msa_time - self.total_time
    saved = self._rewarded_time - self.total_time
    self._rewarded_time = self.total_time
    return saved

  def reset_segment(self, start: int, moves: int) -> dm_env.TimeStep:
    """A short game: msa plays the first `start` moves, the agent the next `moves` (or fewer,
    where the program ends first), msa all the rest. The return is the mapping's advantage over
    msa's, as for a whole game; `played_actions` holds every move of the whole trajectory."""
    if self.config.reward != "advantage":
      raise ValueError(
        "short games need the 'advantage' reward (their return is exact only "
        "relative to msa's completion)"
      )
    if not 0 <= start < self._msa_moves or moves < 1:
      raise ValueError(
        f"a short game needs 0 <= start < {self._msa_moves} and moves >= 1, got "
        f"start {start}, moves {moves}"
      )
    self._reset_state()
    self._defer_stall = True  # msa's prefix: the stall is simulated once, at its end.
    try:
      while self._moves < start:
        self._play_msa_move(fast_forward=self._moves + 1 < start)
    finally:
      self._defer_stall = False
    self._update_stall()
    self._segment_end = start + moves
    return dm_env.restart(self._observe())

  def _play_msa_move(self, fast_forward: bool = False) -> None:
    """msa's own move at the current decision (recorded as its slot), as `_play` would.

    fast_forward: the next decision will be answered with msa's move too, so only its options up
    to msa's own are planned (`MsaAlgorithm.fast_forward`: 3-6x cheaper, the same slot for
    msa's move). Not with `skip_below`, whose skipped decisions depend on every option."""
    decision = self._decisions.decision
    slots = option_slots(decision.options, self.config.max_prefetch_starts)
    self._actions.append(int(slots[decision.msa_choice]))
    self._decisions.algorithm.fast_forward = fast_forward and self._skip_threshold <= 0
    try:
      self._apply(decision.msa_choice)
    finally:
      self._decisions.algorithm.fast_forward = False
    self._moves += 1
    self._play_skipped_decisions()

  def _complete_with_msa(self) -> None:
    """msa decides every remaining step (recorded as slots); the program time is then the cost
    model's, evaluated once: the incremental timing state is not needed after the last move
    (1.5-3x cheaper than playing the moves; the observation is not built either)."""
    if self._skip_threshold > 0:  # Skipped decisions depend on every option: play them out.
      while not self._decisions.done:
        self._play_msa_move()
      return
    decisions, starts = self._decisions, self.config.max_prefetch_starts
    decisions.algorithm.fast_forward = True
    while not decisions.done:
      decision = decisions.decision
      self._actions.append(int(option_slots(decision.options, starts)[decision.msa_choice]))
      decisions.choose(decision.msa_choice)
      self._moves += 1
    self.total_time = self.cost_model.evaluate(decisions.allocations()).total_time_s

  def _msa_reference(self) -> MsaReference:
    """msa's program time, the moves of msa's own game and, when the observation shows the
    pressure, its mapping's fill: one msa pass, then a fresh state."""
    self._complete_with_msa()
    fill = None
    if self.config.pressure_bins:
      fill = fill_prefix(
        self._decisions.allocations(),
        self.workload.arrays.sizes,
        self._capacity,
        self.workload.num_ops,
      )
    reference = MsaReference(self.total_time, self._moves, fill)
    self._reset_state()
    return reference

  def _finished(self) -> bool:
    return self._decisions.done

  # -------------------------------------------------------------------------- queries

  @property
  def decision(self) -> MsaDecision | None:
    """The current decision point (None once the episode is over)."""
    return self._decisions.decision

  @property
  def reward_scale(self) -> float:
    return self._msa_time if self.config.reward == "advantage" else self.normaliser

  @property
  def msa_time(self) -> float:
    """msa's own program time on this pair (seconds, copies contending)."""
    return self._msa_time

  @property
  def reference(self) -> MsaReference:
    """What the msa pass measured, for another game of the same program and config
    (`__init__`)."""
    return self._reference

  @property
  def msa_moves(self) -> int:
    """Moves in msa's own game: the starts `reset_segment` accepts are below it."""
    return self._msa_moves

  @property
  def played_actions(self) -> tuple[int, ...]:
    """Every move of the episode so far as action slots, msa's own in a short game's prefix
    and completion included: replayed from `reset()` they give the same mapping."""
    return tuple(self._actions)

  @property
  def msa_action(self) -> int:
    """The slot msa itself takes at the current step."""
    return self._msa_action

  @property
  def num_steps(self) -> int:
    """Moves made so far in this episode (decisions msa played itself, `skip_below`, not
    counted)."""
    return self._moves

  def allocations(self) -> Allocations:
    """The segments so far (the whole mapping once the episode is over), in msa's order."""
    return self._decisions.allocations_so_far()

  def _request_rows(self, num_allocations: int) -> np.ndarray:
    return np.full(num_allocations, -1, np.int64)

  # -------------------------------------------------------------------------- state

  def _reset_state(self) -> None:
    model = self.cost_model
    self._decisions = MsaDecisions(
      self.workload, self.hardware, self.msa_options, self.config.max_prefetch_starts
    )
    self._done = False
    op_time = np.maximum(model.compute_time, model.slow_memory_time)
    self._op_time_sum = float(op_time.sum())
    # Per op [T], as Python lists: a step updates one or two ops with scalar arithmetic.
    self._memory_time = model.slow_memory_time.tolist()
    self._default_time = model.slow_memory_time.tolist()
    self._op_time = op_time.tolist()
    self._stall_time = 0.0
    self.total_time = self._op_time_sum
    self._level = [self._slow_level] * len(self._key_list)  # [E] each incidence's level
    # The copies so far (prefetches and evictions), their total stall kept up to date as they
    # and the ops' idle times change (env/simulator.py's `StallTracker`).
    self._tracker = StallTracker(np.maximum(op_time - model.slow_memory_time, 0.0), capacity=1024)
    self._num_copies = 0
    self._copies_changed = False
    # What the current buffer has changed, to take back on an uncommit.
    self._buffer = -1
    self._buffer_moves: list[int] = []  # Ops whose bytes of the buffer went to fast memory.
    self._buffer_copies: list[tuple[int, int, int]] = []  # (copy id, start, done)
    self._buffers_done = 0
    self._moves = 0
    # The heaps' chunks by bin, filed once a heap outgrows a plain scan (`_heap_state`).
    self._bin_lists = [self._new_bin_lists() for _ in range(self._num_fast)]
    self._actions: list[int] = []
    self._segment_end: int | None = None
    self._defer_stall, self._stall_stale = False, False
    # The time the rewards so far account for: what decisions played before the first move
    # save is in the first move's reward, so an episode's rewards still sum to the time saved.
    self._rewarded_time = self.total_time
    self._play_skipped_decisions()

  def _new_bin_lists(self, room: int = 256) -> tuple:
    """Empty lists of the bins (a `BinLists`' fields), room for `room` chunks per bin."""
    bins = self.config.occupancy_bins
    return (
      np.zeros((bins, room, 3), np.int64),
      np.zeros((bins, room)),
      np.zeros(bins, np.int64),
      np.zeros(1, np.int64),
    )

  def _play_skipped_decisions(self) -> None:
    """Plays msa's own choice at the decisions not offered (`GameConfig.skip_below`)."""
    if self._skip_threshold <= 0:
      return
    while not self._decisions.done:
      if worth_deciding(self._decisions.decision.options, self._skip_threshold):
        return
      self._apply(self._decisions.decision.msa_choice)

  def _move(self, buffer: int, op: int, level: int) -> None:
    """Moves the buffer's bytes at `op` (its incidences there, one key range) to `level` and
    updates the op's times. Scalar arithmetic: a step moves one or two ops."""
    key = buffer * self._stride + op
    lo, hi = bisect.bisect_left(self._key_list, key), bisect.bisect_right(self._key_list, key)
    if lo == hi or self._level[lo] == level:
      return
    old, inv, slow = self._level[lo], self._inverse_list, self._slow_level
    nbytes = self._bytes_prefix[hi] - self._bytes_prefix[lo]
    memory = self._memory_time[op] + nbytes * (inv[level] - inv[old])
    self._memory_time[op] = memory
    self._default_time[op] += nbytes * inv[slow] * ((level == slow) - (old == slow))
    self._level[lo:hi] = [level] * (hi - lo)
    new_time = max(self._compute_list[op], memory)
    self._op_time_sum += new_time - self._op_time[op]
    self._op_time[op] = new_time
    self._tracker.set_idle(op, max(new_time - self._default_time[op], 0.0))

  def _add_copy(self, start: int, done: int) -> None:
    copy_id = self._tracker.add(start, done, self.cost_model.copy_time[self._buffer])
    self._buffer_copies.append((copy_id, start, done))
    self._num_copies, self._copies_changed = self._num_copies + 1, True

  def _apply(self, index: int) -> None:
    """Applies option `index` of the current decision to the timing state, then to msa's loop."""
    decision = self._decisions.decision
    option = decision.options[index]
    buffer, use = decision.buffer, decision.use
    if buffer != self._buffer:
      self._buffer, self._buffer_moves, self._buffer_copies = buffer, [], []
    first = decision.options[0]
    moved_to_slow = False
    if option.kind == "uncommit":
      for op in self._buffer_moves:
        self._move(buffer, op, self._slow_level)
      for copy in self._buffer_copies:
        self._tracker.remove(*copy)
      self._num_copies -= len(self._buffer_copies)
      self._copies_changed |= bool(self._buffer_copies)
      moved_to_slow = bool(self._buffer_moves)
      self._buffer_moves, self._buffer_copies = [], []
    else:
      if first.kind == "evict" and (index == 0 or option.evicts):
        self._add_copy(first.start, first.end)
      if option.kind in ("keep", "prefetch"):
        moved = [use]
        def_op = self._def_op[buffer]
        if option.kind == "keep" and def_op != PROGRAM_START and decision.segment_start == def_op:
          # The first segment of an activation: produced in place, its definition writes fast
          # memory too (a later segment starts at the previous use, never at the definition).
          moved.append(def_op)
        for op in moved:
          self._move(buffer, op, option.level)
        self._buffer_moves += moved
        if option.kind == "prefetch":
          self._add_copy(option.start, use)
    self._decisions.choose(index)
    if self._decisions.done or self._decisions.decision.buffer != buffer:
      self._buffers_done += 1
    if self._defer_stall:  # The stall is a function of the state alone: computed once later.
      self._stall_stale |= self._copies_changed or self._stall_time > 0 or moved_to_slow
    elif self._num_copies and (self._copies_changed or self._stall_time > 0 or moved_to_slow):
      self._update_stall()
    elif not self._num_copies:
      self._stall_time = 0.0
    self._copies_changed = False
    self.total_time = self._op_time_sum + self._stall_time

  def _update_stall(self) -> None:
    """The copies' total stall (simulator.total_stall_loop's, kept up to date by the tracker)."""
    self._stall_time = self._tracker.stall() if self._num_copies else 0.0
    self._stall_stale = False
    self.total_time = self._op_time_sum + self._stall_time

  # -------------------------------------------------------------------------- observation

  def _buffer_static(self, buffer: int) -> tuple[np.ndarray, np.ndarray]:
    """(the buffer's use ops `[U]`, sorted, the definition excluded; its request features that
    do not change during an episode), computed once per buffer (scalar arithmetic: a large
    program has a hundred thousand buffers)."""
    cached = self._static_cache.get(buffer)
    if cached is not None:
      return cached
    def_op, start = self._def_op[buffer], self._incidence_start
    use_list: list[int] = []
    for op in self._incidence_op_list[start[buffer] : start[buffer + 1]]:  # Sorted.
      if op != def_op and (not use_list or use_list[-1] != op):
        use_list.append(op)
    uses = np.array(use_list, np.int64)
    (
      is_activation,
      size_vs_capacity,
      log_size,
      definition,
      last_use,
      num_uses,
      copy_time,
      level_present,
    ) = self._static_columns
    size = self._size_list[buffer]
    row = np.zeros(self._shapes[0], np.float32)
    row[is_activation] = def_op != PROGRAM_START
    for level, capacity in enumerate(self._capacity_list):
      row[size_vs_capacity + level] = min(size / capacity, 2.0)
    row[log_size] = np.log2(max(size, 1.0)) / 32.0
    row[definition] = self._position(def_op)
    row[last_use] = self._position(use_list[-1]) if use_list else 0.0
    row[num_uses] = np.log2(1 + len(use_list)) / 10.0
    row[copy_time] = min(self._copy_time_list[buffer] / self._saving_scale, 10.0)
    row[level_present : level_present + self._num_fast] = 1.0
    self._static_cache[buffer] = (uses, row)
    return uses, row

  def _position(self, op: int) -> float:
    """An op's position on the program's time axis / its length (0 for the program start)."""
    return self._position_list[min(op, self._last_op) + 1]

  def _observe(self) -> dict[str, np.ndarray]:
    decision = self._decisions.decision
    options = decision.options
    buffer, use = decision.buffer, decision.use
    uses, static = self._buffer_static(buffer)
    table = np.array(
      [
        value
        for o in options[1:]
        for value in (o.kind == "prefetch", o.level, o.start, o.end, o.offset, o.evicts, o.saving)
      ],
      np.float64,
    ).reshape(len(options) - 1, self._option_width)
    request, occupancy, candidates, lookahead, actions = self._shapes
    observation = {
      "request": np.zeros(request, np.float32),
      "occupancy": np.zeros(occupancy, np.float32),
      "candidates": np.zeros(candidates, np.float32),
      "lookahead": np.zeros(lookahead, np.float32),
      "legal_actions": np.zeros(actions, bool),
    }
    self._legal = observation["legal_actions"]
    self._option_index = np.zeros(actions, np.int64)
    heaps = self._decisions.algorithm.heaps
    first = heaps[0].kernel_state()[:3]
    second = heaps[1].kernel_state()[:3] if self._num_fast > 1 else first
    large = first[2] > self._occupancy_limits[0] or second[2] > self._occupancy_limits[0]
    if large:  # A large heap's occupancy is `_occupancy`'s; the kernel skips it (count -1).
      first = first if first[2] <= self._occupancy_limits[0] else (first[0], first[1], -1)
      second = second if second[2] <= self._occupancy_limits[0] else (second[0], second[1], -1)
    total = self.total_time
    self._msa_action = self._kernels.observe(
      (  # An `ObservationArrays`' fields.
        observation["request"],
        observation["candidates"],
        observation["occupancy"],
        observation["lookahead"],
      ),
      (table, self._legal, self._option_index),  # A `DecisionArrays`' fields.
      self._frame,
      (self._incidence_key, self._use_reduction, uses, static),  # A `BufferArrays`' fields.
      first,
      second,
      self._num_fast,
      buffer * self._stride,
      use,
      decision.segment_start,
      OPTION0_KINDS.index(options[0].kind),
      decision.msa_choice,
      self._copy_time_list[buffer],
      total / self.normaliser,
      self._stall_time / max(total, 1e-30),
      self._buffers_done / max(self._num_buffers, 1),
    )
    if large:
      for level in range(self._num_fast):
        if heaps[level].kernel_state()[2] > self._occupancy_limits[0]:
          self._occupancy(observation["occupancy"][level], level, decision)
    if self.config.pressure_bins:
      bins, pressure = self.config.pressure_bins, self._pressure.copy()
      pressure[: self._num_fast, :bins] = segment_fill(
        self._reference.fill_prefix, decision.segment_start, use, bins
      )
      observation["pressure"] = pressure
    return observation

  def _occupancy(self, out: np.ndarray, level: int, decision: MsaDecision) -> None:
    """Writes a large heap's occupancy over the decision's segment into `out` (float32),
    through `observation_kernels.occupancy`."""
    row = np.zeros(len(out))
    index, chunks, hits, lists = self._heap_state(level)
    self._kernels.occupancy(
      row,
      index,
      chunks,
      hits,
      lists,
      max(decision.segment_start, 0),
      decision.use,
      float(self._capacity[level]),
      self._occupancy_limits,
    )
    out[:] = row

  def _heap_state(self, level: int) -> tuple[tuple, tuple, np.ndarray, tuple]:
    """What `observation_kernels.occupancy` reads of a large fast level's heap: its time index,
    its chunks, its search scratch and the bins' lists (mirrored up to date here)."""
    heap = self._decisions.algorithm.heaps[level]
    chunks = heap.kernel_state()
    lists = self._bin_lists[level]
    width = float(self._capacity[level]) / self.config.occupancy_bins
    while not self._kernels.mirror(lists, chunks, width):
      rows, covered, counts, synced = lists
      room = 2 * rows.shape[1]
      grown = np.zeros((rows.shape[0], room, 3), np.int64)
      grown[:, : rows.shape[1]] = rows
      more = np.zeros((rows.shape[0], room))
      more[:, : rows.shape[1]] = covered
      lists = self._bin_lists[level] = (grown, more, counts, synced)
    index, _, _, scratch = heap.search_state()
    return index, chunks, scratch[0], lists

  def _terminal_observation(self) -> dict[str, np.ndarray]:
    obs = super()._terminal_observation()
    self._option_index = np.zeros(self.config.num_actions, np.int64)
    self._msa_action = 0
    return obs
