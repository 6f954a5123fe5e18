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
from typing import NamedTuple

import dm_env
import numpy as np

from malloczero.common.errors import MalloczeroError
from malloczero.common.lazy import lazy_module
from malloczero.env.cost_model import Allocations
from malloczero.env.game.base import GameBase
from malloczero.env.game.config import GameConfig
from malloczero.env.hardware import Hardware
from malloczero.env.msa.algorithm import MsaDecisions
from malloczero.env.msa.decision import MsaDecision, option_slots, worth_deciding
from malloczero.env.msa.settings import MsaOptions
from malloczero.env.workload import PROGRAM_START, Workload

OPTION0_KINDS = ("default", "evict", "uncommit")

_observation_kernels = lazy_module("malloczero.env.game.observation_kernels")
_stall_kernels = lazy_module("malloczero.env.simulator_kernels")


class CandidatePlacements(NamedTuple):
  """Where the options after option 0 put the buffer, as `observation_kernels.candidate_rows`
  reads them, `[n]` each: level, start, reserved end, offset."""

  level: np.ndarray
  start: np.ndarray
  end: np.ndarray
  offset: np.ndarray


class CandidateValues(NamedTuple):
  """What the options after option 0 save and do, `[n]` each: saving, whether a prefetch,
  whether it evicts."""

  saving: np.ndarray
  prefetch: np.ndarray
  evicts: np.ndarray


class CandidateFrame(NamedTuple):
  """What the candidate rows are measured against, the same all episode: the ops' positions on
  the time axis, the last op, the fast levels' capacities, the saving scale, the slow time's
  prefix sums, the prefetch starts per level, the feature columns."""

  positions: np.ndarray
  last_op: int
  capacity: np.ndarray
  saving_scale: float
  slow_op_prefix: np.ndarray
  num_starts: int
  columns: np.ndarray


class _Columns:
  """Where each written feature sits (env/game/observation.py's msa layout), looked up once: the
  observation is built every step."""

  def __init__(self, config: GameConfig, num_fast: int):
    layout = config.layout
    q, c, look = layout.request, layout.candidate, layout.lookahead
    for name in (
      "segment_start",
      "use",
      "segment_length",
      "use_index",
      "msa_takes_option0",
      "program_time",
      "stall_share",
      "progress",
      "options_found",
    ):
      setattr(self, name, q.index(name))
    self.use_saving = q.slice("use_saving", num_fast)
    self.option0 = q.slice("option0").start
    for name in (
      "valid",
      "keep",
      "prefetch",
      "rank",
      "start",
      "lead",
      "hold",
      "offset",
      "saving",
      "hide_ratio",
      "evicts",
      "msa_choice",
    ):
      setattr(self, name, c.index(name))
    self.level = c.slice("level").start
    # The order `observation_kernels.candidate_rows` reads them in.
    self.candidate_order = np.array(
      [
        self.valid,
        self.keep,
        self.prefetch,
        self.rank,
        self.start,
        self.lead,
        self.hold,
        self.offset,
        self.saving,
        self.hide_ratio,
        self.evicts,
        self.msa_choice,
        self.level,
      ],
      np.int64,
    )
    static = look.slice("static").start
    self.look_valid = look.index("valid")
    self.look_position = static + layout.static.index("position")
    self.look_distance = static + layout.static.index("distance")
    saving = layout.static.slice("saving", num_fast)
    self.look_saving = slice(static + saving.start, static + saving.stop)


class MsaGame(GameBase):
  """mallocGame over msa's decision points for one (workload, hardware) pair; deterministic."""

  def __init__(
    self,
    workload: Workload,
    hardware: Hardware,
    config: GameConfig = GameConfig(),
    msa_options: MsaOptions = MsaOptions(),
    reference: tuple[float, int] | None = None,
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
    self._incidence_op = a.incidence_op
    # Python lists for the per-step scalar updates (`_move`): numpy scalars cost more there.
    self._key_list = self._incidence_key.tolist()
    self._bytes_prefix = (
      np.concatenate([[0], np.cumsum(a.incidence_bytes)]).astype(np.float64).tolist()
    )
    self._inverse_list = model.inverse_bandwidth.tolist()
    self._compute_list = model.compute_time.tolist()
    self._slow_level = hardware.slow_level
    self._def_op = a.def_op.tolist()
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
    self._kernels = _observation_kernels()
    self._stall = _stall_kernels()
    self._reset_state()
    self._msa_time, self._msa_moves = reference or self._msa_reference()
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
    self._columns = _Columns(config, self._num_fast)

  # -------------------------------------------------------------------------- dm_env API

  def _step_label(self) -> str:
    return f"at decision {self._decisions.num_steps}"

  def _play(self, action: int) -> float:
    self._apply(self._option_index[action])
    self._moves += 1
    self._actions.append(action)
    self._play_skipped_decisions()
    if self._segment_end is not None and self._moves >= self._segment_end:
      self._complete_with_msa()
    if self.config.reward == "advantage":
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

  def _msa_reference(self) -> tuple[float, int]:
    """(msa's program time, the moves of msa's own game): one msa pass, then a fresh state."""
    self._complete_with_msa()
    reference = self.total_time, self._moves
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
  def reference(self) -> tuple[float, int]:
    """(`msa_time`, `msa_moves`), for another game of the same program (`__init__`)."""
    return self._msa_time, self._msa_moves

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
    self._memory_time = model.slow_memory_time.copy()  # [T]
    self._default_time = model.slow_memory_time.copy()  # [T]
    self._op_time = np.maximum(model.compute_time, self._memory_time)  # [T]
    self._op_time_sum = float(self._op_time.sum())
    self._stall_time = 0.0
    self.total_time = self._op_time_sum
    self._level = [self._slow_level] * len(self._key_list)  # [E] each incidence's level
    # Copies so far (prefetches and evictions; the total stall does not depend on their order
    # among equal (start, done)), the first `_next_copy` rows, `_copy_alive` False once taken
    # back by an uncommit.
    capacity = 2 * len(self._incidence_key) + 2
    self._copy_start = np.zeros(capacity, np.int64)
    self._copy_done = np.zeros(capacity, np.int64)
    self._copy_work = np.zeros(capacity)
    self._copy_alive = np.zeros(capacity, bool)
    self._next_copy = 0
    self._num_copies = 0
    self._copies_changed = False
    # What the current buffer has changed, to take back on an uncommit.
    self._buffer = -1
    self._buffer_moves: list[int] = []  # Ops whose bytes of the buffer went to fast memory.
    self._buffer_copies: list[int] = []
    self._buffers_done = 0
    self._moves = 0
    self._actions: list[int] = []
    self._segment_end: int | None = None
    self._defer_stall, self._stall_stale = False, False
    # The time the rewards so far account for: what decisions played before the first move
    # save is in the first move's reward, so an episode's rewards still sum to the time saved.
    self._rewarded_time = self.total_time
    self._play_skipped_decisions()

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

  def _add_copy(self, start: int, done: int) -> None:
    k = self._next_copy
    self._copy_start[k], self._copy_done[k] = start, done
    self._copy_work[k] = self.cost_model.copy_time[self._buffer]
    self._copy_alive[k] = True
    self._buffer_copies.append(k)
    self._next_copy, self._num_copies, self._copies_changed = k + 1, self._num_copies + 1, True

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
      self._copy_alive[self._buffer_copies] = False
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
    """The copies' total stall, re-simulated (simulator.total_stall_loop)."""
    if not self._num_copies:
      self._stall_time = 0.0
    else:
      k = self._next_copy
      alive = self._copy_alive[:k]
      idle = np.maximum(self._op_time - self._default_time, 0.0)  # CostModel.idle_time
      self._stall_time = float(
        self._stall.stall_loop(
          idle, self._copy_start[:k][alive], self._copy_done[:k][alive], self._copy_work[:k][alive]
        )
      )
    self._stall_stale = False
    self.total_time = self._op_time_sum + self._stall_time

  # -------------------------------------------------------------------------- observation

  def _buffer_static(self, buffer: int) -> tuple[np.ndarray, np.ndarray]:
    """(the buffer's use ops `[U]`, sorted, the definition excluded; its request features that
    do not change during an episode), computed once per buffer."""
    cached = self._static_cache.get(buffer)
    if cached is not None:
      return cached
    a, q, num_fast = self.workload.arrays, self._layout.request, self._num_fast
    lo = int(np.searchsorted(self._incidence_key, buffer * self._stride, "left"))
    hi = int(np.searchsorted(self._incidence_key, (buffer + 1) * self._stride, "left"))
    ops = np.unique(self._incidence_op[lo:hi])
    uses = ops[ops != a.def_op[buffer]]
    size = float(a.sizes[buffer])
    row = np.zeros(q.size, np.float32)
    row[q.index("is_activation")] = a.def_op[buffer] != PROGRAM_START
    row[q.slice("size_vs_capacity", num_fast)] = np.minimum(size / self._capacity, 2.0)
    row[q.index("log_size")] = np.log2(max(size, 1.0)) / 32.0
    row[q.index("definition")] = self._position(int(a.def_op[buffer]))
    row[q.index("last_use")] = self._position(int(uses[-1])) if len(uses) else 0.0
    row[q.index("num_uses")] = np.log2(1 + len(uses)) / 10.0
    row[q.index("copy_time")] = min(
      float(self.cost_model.copy_time[buffer]) / self._saving_scale, 10.0
    )
    row[q.slice("level_present", num_fast)] = 1.0
    self._static_cache[buffer] = (uses, row)
    return uses, row

  def _position(self, op: int) -> float:
    """An op's position on the program's time axis / its length (0 for the program start)."""
    return self._position_list[min(op, self._last_op) + 1]

  def _observe(self) -> dict[str, np.ndarray]:
    cfg, col, num_fast = self.config, self._columns, self._num_fast
    decision = self._decisions.decision
    options = decision.options
    buffer, use, segment_start = decision.buffer, decision.use, decision.segment_start
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

    uses, static = self._buffer_static(buffer)
    k = int(np.searchsorted(uses, use))
    use_position, start_position = self._position(use), self._position(segment_start)
    request = static.copy()
    request[col.segment_start] = start_position
    request[col.use] = use_position
    request[col.segment_length] = use_position - start_position
    request[col.use_index] = k / max(len(uses), 1)
    request[col.use_saving] = self._use_reduction[:, incidence] / scale
    request[col.option0 + OPTION0_KINDS.index(options[0].kind)] = 1.0
    request[col.msa_takes_option0] = self._msa_action == 0
    request[col.program_time] = self.total_time / self.normaliser
    request[col.stall_share] = self._stall_time / max(self.total_time, 1e-30)
    request[col.progress] = self._buffers_done / max(self._num_buffers, 1)
    request[col.options_found] = len(options) / cfg.num_actions

    candidates = np.zeros(self._candidates_shape, np.float32)
    n = len(options) - 1
    if n:
      rest = options[1:]
      placements = (  # A `CandidatePlacements`' fields.
        np.fromiter([o.level for o in rest], np.int64, n),
        np.fromiter([o.start for o in rest], np.int64, n),
        np.fromiter([o.end for o in rest], np.int64, n),
        np.fromiter([o.offset for o in rest], np.float64, n),
      )
      values = (  # A `CandidateValues`' fields.
        np.fromiter([o.saving for o in rest], np.float64, n),
        np.fromiter([o.kind == "prefetch" for o in rest], np.bool_, n),
        np.fromiter([o.evicts for o in rest], np.bool_, n),
      )
      frame = (  # A `CandidateFrame`'s fields.
        self._positions,
        self._last_op,
        self._capacity,
        scale,
        self._slow_op_prefix,
        cfg.max_prefetch_starts,
        col.candidate_order,
      )
      self._kernels.candidate_rows(
        candidates,
        slots[1:] - 1,
        placements,
        values,
        frame,
        int(slots[decision.msa_choice]) - 1 if decision.msa_choice else -1,
        use,
        segment_start,
        copy_time,
      )

    occupancy = np.zeros((cfg.max_fast_levels, cfg.occupancy_bins), np.float64)
    heaps = self._decisions.algorithm.heaps
    first_op = max(segment_start, 0)
    for level in range(num_fast):
      self._kernels.occupancy(
        occupancy[level], heaps[level].kernel_state(), first_op, use, self._capacity[level]
      )

    lookahead = np.zeros(self._lookahead_shape, np.float32)
    following = uses[k + 1 : k + 1 + cfg.lookahead]
    n = len(following)
    if n:
      first = np.searchsorted(self._incidence_key, buffer * self._stride + following, "left")
      positions = self._positions[np.minimum(following, self._last_op) + 1]
      lookahead[:n, col.look_valid] = 1.0
      lookahead[:n, col.look_position] = positions
      lookahead[:n, col.look_distance] = positions - use_position
      lookahead[:n, col.look_saving] = (self._use_reduction[:, first] / scale).T
    return {
      "request": request,
      "occupancy": occupancy.astype(np.float32),
      "candidates": candidates,
      "lookahead": lookahead,
      "legal_actions": legal,
    }

  def _terminal_observation(self) -> dict[str, np.ndarray]:
    obs = super()._terminal_observation()
    self._option_index = np.zeros(self.config.num_actions, np.int64)
    self._msa_action = 0
    return obs
