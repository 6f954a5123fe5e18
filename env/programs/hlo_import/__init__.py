"""Import a program compiled by XLA: HLO text -> `Workload`.

The input is an HLO module as text: the post-optimisation module printed by
`jax.jit(f).lower(*args).compile().as_text()` or dumped by XLA on any backend
(`--xla_dump_to=DIR --xla_dump_hlo_as_text`, the `*after_optimizations.txt` file), or an
unoptimised module (TensorFlow, torch-xla, a `before_optimizations` dump), which is compiled
here first. The schedule is the module's flattened sequence, as XLA's `HloLiveRange` makes it
(xla/hlo/utils/hlo_live_range.cc): the ENTRY computation, with the instructions of every `call`,
`while` and `conditional` and of every async-wrapped computation in place. Fusions stay one op;
their computations, and other called ones (reducers, comparators), only contribute flops and
tell which bytes a fusion reads.

The package, one module per concern:

  hlo          the parsed module both parsers produce: shapes, instructions, computations
  text_parser  the hand-written parser, the fallback for text XLA's parser refuses
  xla_proto    XLA's own parser, read through its `HloModuleProto`
  cost_rules   flops per op, and the bytes an op reads and writes (XLA's HloCostAnalysis)
  convert      the flattened schedule -> `Workload`, one step per instruction
  xla_report   XLA's buffer assignment beside a dump, compared with the import
  from_text    the entry points for HLO text, and compiling on the CPU
  from_jax     the entry point for a JAX function
  notes        the one-line notes and warnings returned with the workload

Conversion rules
----------------
Parsing
  XLA's own parser reads the text (`hlo_module_from_text` of the installed jaxlib, in a child
  process: a module that fails one of its CHECKs aborts that process only), and its
  `HloModuleProto` gives exact shapes, operands, attributes and the schedule; the proto classes
  are built from the descriptors in TensorFlow's generated `hlo_pb2.py` / `xla_data_pb2.py`
  without importing TensorFlow. Where XLA's parser refuses the text (an old module with an
  attribute it no longer knows, ...) or crashes on it, a hand-written parser reads it instead
  and a one-line note says so and why. XLA's parser gives duplicate instruction names a suffix
  (`.1`), which the fallback does not. XLA's parser takes the last computation as the entry
  when none is marked ENTRY (a note says so: the text may be truncated).

Schedule and compiling
  A module is scheduled when it says `is_scheduled=true` (the proto then holds a sequence for
  each computation that is not fused): its ops are taken in that order. An unscheduled module's
  print order is not a schedule and it has no fusion, so `import_hlo_text` (and `import-hlo`)
  compiles it
  with the installed XLA for the CPU first (HLO -> StableHLO -> the CPU client's compiler ->
  the optimised, scheduled module) and imports that, with a one-line note; `compile=False`
  (`--no-compile`) keeps the print order, with a note. A module XLA cannot compile on one CPU
  (collectives over several devices, another backend's custom calls) keeps its print order with
  a note, unless compiling was asked for explicitly (then it is an error).

Flattening (called computations on the time axis), after `HloLiveRange::FlattenSchedule`
  * Each computation is taken in its own schedule order (the module's schedule holds a sequence
    for every computation that is not fused; an unscheduled module, kept in print order, is
    taken in print order throughout).
  * `call`: the called computation's instructions come in place of the call, its parameters
    bound to the call's operands (the same buffers, no copy) and the call's result is the
    called root's value. The call itself makes no op. A GPU command buffer is such a call.
  * `while`: the condition's instructions, then the body's, then nothing for the while itself
    (XLA's order). The condition runs once more than the body: with XLA's trip count `n` (its
    `"known_trip_count":{"n":"..."}` in `backend_config`), each body op has weight `n` and each
    condition op `n + 1` (env/workload.py: an op's weight multiplies its time, its flops and
    every byte it moves, and stretches the time axis by as much); weights of nested loops
    multiply. Without a printed trip count (a data-dependent loop) or with a count of 0, they
    count once, with a warning.
  * A loop's state is one buffer per element, as XLA's alias analysis puts the init value, the
    condition's and body's parameters, the body's root and the while's result in one buffer:
    the element's buffer is the init value's; an element the body computes anew is written into
    it (its defining op becomes a write of the state's buffer, its uses uses of it); an element
    passed through stays the init value's buffer (stacked weights read by a scan). Every
    element is live from before the loop to the loop's last op (the next iteration reads it),
    and after it for as long as the while's result is used. Buffers defined in the body and not
    part of its root live within the body's span, once: every iteration puts them at the same
    place. (XLA's copy insertion has already added a copy wherever an element must not be
    updated in place, so merging is what XLA's buffers do; an init element with no buffer, a
    small constant, leaves the body's new value a buffer of its own.)
  * `conditional`: every branch in turn, each bound to its operand, each op counted once (an
    upper bound on its time: which branch runs is data dependent; a warning says so); the
    branches' new root buffers are merged into one per element (XLA aliases them).
  * `async-start` with a wrapped computation (`calls=`): the computation's instructions come
    before the start, which makes no op; the done is an op that keeps the operands and results
    live to it (see Buffers). Starts without a computation (all-gather-start, ...) are ops as
    before.
  * Fusions are one op (their computations are not in the schedule), as are reductions, maps,
    sorts, scatters and every other instruction that applies a computation element by element.
  * Where it departs from XLA: XLA flattens a computation at its first caller only, once; a
    computation called from several places is flattened at each call site here, with its ops
    named after its instructions each time (after XLA's call-graph flattening every computation
    of a compiled module has one caller, so the two agree there). A called computation that
    is not in a scheduled module's schedule (XLA skips those too, and then has no total order)
    leaves its caller one op whose flops are the computation's. Modules that would flatten to
    more than 20 million instructions are refused.

Ops
  The flattened instructions in schedule order, except the ones that create no data of their
  own: `parameter`, `constant`, `get-tuple-element`, `bitcast`, `tuple`, `copy-start`,
  `copy-done`, `async-update`, `add-dependency`, `opt-barrier`, `domain`, `after-all` and the
  flattened `call`, `while`, `conditional` and `async-start`. Every other instruction (fusion,
  dot, convolution, custom-call, reduce, copy, the start and the done of each asynchronous
  operation, ...) is one op, named after the instruction, with the weight of the loops around
  it.

Flops per op
  * `dot`: 2 * prod(output dims) * prod(lhs contracting dims).
  * `convolution`: 2 * prod(output dims) * prod(kernel spatial dims) * input features per
    group, read from `dim_labels` and `window`, except that kernel taps which fall on padding
    or on the holes of `lhs_dilate` (transposed convolutions, input gradients of strided
    convolutions) are not counted, exactly as XLA's own cost analysis does. (Without that, a
    stride-2 input gradient would count 4x its real work.)
  * `reduce`: prod(input dims), summed over the reduced inputs of a variadic reduce.
  * `reduce-window`: prod(output dims) * prod(window size).
  * Data movement (broadcast, reshape, transpose, copy, slice, concatenate, pad, gather, iota,
    dynamic-(update-)slice, ...) and every collective (all-gather, all-reduce, reduce-scatter,
    all-to-all, collective-permute, send, recv, their -start/-done forms): 0. (XLA's cost
    analysis counts an all-reduce's additions; they are negligible next to the transfer.)
  * Any other instruction (elementwise, compare, select, convert, scatter, sort, ...):
    prod(output dims) (summed over the leaves of a tuple-shaped result).
  * `fusion`, and a `call` or async `*-start` whose computation is not flattened: the sum over
    the called computation.
  * A `while` or `conditional` that is not flattened: (body + condition) x the trip count
    (once without one), and the most expensive branch.
  * Flops and bytes are per step: an op's weight (its loops' trip counts) multiplies both.
  * `custom-call`: a target whose name mentions matmul/gemm/dot is estimated from shapes as
    2 * prod(lhs dims) * (last output dim) (exact for `[..., M, K] x [..., K, N]`); a target
    mentioning conv that carries `window`/`dim_labels` uses the convolution rule; any other
    target counts 0 (its cost is unknown).

Buffers
  * Every array leaf of an op's result (a tuple-shaped result gives one buffer per leaf) is an
    `activation` of `bytes(shape)` (pred/s8/u8/f8 = 1, bf16/f16/s16/u16 = 2, f32/s32/u32 = 4,
    f64/s64/u64/c64 = 8, c128 = 16; sub-byte types round up). Leaves with a zero dimension and
    token/opaque leaves are skipped.
  * ENTRY `parameter`s are all `parameter` buffers (def = null): HLO does not say which
    arguments are weights and which are program inputs. A tuple-shaped parameter gives one
    buffer per leaf. A called computation's parameters are its operands' buffers.
  * Constants: a constant of more than `SMALL_CONSTANT_BYTES` bytes (in any flattened
    computation) is read-only data that exists before the program, so it becomes a `parameter`
    buffer too; smaller constants (scalars, tiny tables) are ignored, as they are immediates
    rather than memory traffic.
  * The buffers the ROOT resolves to (each leaf if the ROOT is a tuple) become `output`s; a
    leaf that resolves to a parameter stays a parameter.
  * Aliasing: `get-tuple-element`, `bitcast`, `tuple` (and the other non-op instructions
    above) create no buffer; they resolve to the buffer(s) they alias, so a use of them is a
    use of those buffers. `copy-start`/`copy-done` (a memory-space move) resolve to their
    operand.
  * Asynchronous pairs alias as XLA aliases them. A start whose result is a tuple
    (`async-start` `((operands), results, context)`, `all-gather-start`,
    `collective-permute-start`, `all-to-all-start`, ...) aliases element {0} to its operands,
    defines element {1} (the results: new buffers, defined at the start) and ignores the
    context elements; `all-reduce-start` defines its whole result (a tuple of results when it
    reduces several operands). `send`
    aliases its data operand; `recv` defines element {0}. `async-update` passes the start
    through. The done (`*-done`, `send-done`, `recv-done`) defines nothing: its result is the
    start's results (`recv-done`: (data, token)). The done is a 0-flop op that uses the start's
    operands and results with 0 bytes (see Bytes), so that they stay live until the transfer
    ends, as in XLA, without being charged twice.
  * A loop's state and a conditional's result are one buffer per element (see Flattening).
    Other in-place ops (dynamic-update-slice fusions with `output_to_operand_aliasing` outside
    loops, donated arguments named in `input_output_alias`, and XLA's reuse of a dead
    operand's buffer for an elementwise result) are new buffers: the workload models the
    values XLA's memory-space assignment sees, before buffer assignment shares their memory.

Against XLA's own report (`import-hlo --xla-report`, `xla_report.py`): XLA's buffer assignment
beside a dump holds its `HloLiveRange` of the same flattened sequence. Measured by XLA's rules
(read-only entry parameters live for the whole program; a result written into its dying
operand's memory counted once), the import's peak equals the most memory XLA's live values
occupy, to within 0.1% on the JAX programs of tests/xla_dump_programs.py (a step inside one
call, scans, nested loops, a switch). The workload's own `peak_live_bytes` frees a parameter
after its last use and counts an in-place result apart from its operand, so it is lower where
parameters die early and higher where XLA updates in place (within 3% on those programs).
Against `compiled.memory_analysis()`: the parameter bytes equal XLA's argument bytes and the
output bytes its output bytes (less 8 bytes per element of a tuple-shaped result, XLA's pointer
table).

Uses
  An op uses every buffer reachable through its operands after alias resolution (through a
  called computation's parameters too). Operands are defined earlier in the schedule, so every
  use is strictly after the definition.

Bytes (what an op moves of each buffer: the workload's `use_bytes` / `def_bytes`)
  An op reads all of each operand and writes all of each result, except where XLA's
  HloCostAnalysis charges less:
  * `slice`, `dynamic-slice` and `gather` read their output's size of operand 0 (the rows
    fetched, not the table); their index operands are read whole.
  * `dynamic-update-slice` updates operand 0 in place: it reads 0 bytes of it and writes the
    update's size of its result; the update is read whole.
  * A fusion reads of an operand what its fused computation reads of that parameter: when
    every use of the parameter inside (following bitcasts) is operand 0 of a slice, dynamic
    slice or gather, the sum of their output sizes (an embedding lookup reads its rows); when
    they are all in-place updates of it, 0; as soon as any other use reads it, all of it
    (HloCostAnalysis::FusionParameterReadBytes, with gathers counted as XLA counts them
    unfused). A fusion whose root (or a root tuple's element) is a dynamic-update-slice
    writes the update's size of that result.
  * `pad` is charged whole, as XLA charges it (operand and result).
  * The done of an asynchronous pair moves 0 bytes (it only marks the end of the transfer).
  Reads of one buffer through several operands of one op add up, capped at its size. Live
  ranges do not depend on the bytes moved.

Warnings
  A module with custom calls of unknown cost or shapes that cannot be sized still imports,
  with one warning line per kind (a custom-call target; an unknown element type; an unbounded
  dynamic dimension), not per instruction: an unknown custom call counts 0 flops and is
  charged its operands and results whole; an unsizable shape gets no buffer.

Malformed text (empty, no ENTRY computation, an unparseable instruction line, an operand that
names no earlier instruction, a truncated module) raises `WorkloadError` with one line.
"""

from __future__ import annotations

from malloczero.env.programs.hlo_import.convert import SMALL_CONSTANT_BYTES
from malloczero.env.programs.hlo_import.from_jax import workload_from_jax
from malloczero.env.programs.hlo_import.from_text import (
  HloImport,
  compile_hlo_on_cpu,
  import_hlo_text,
  workload_from_hlo_text,
)

__all__ = [
  "SMALL_CONSTANT_BYTES",
  "HloImport",
  "compile_hlo_on_cpu",
  "import_hlo_text",
  "workload_from_hlo_text",
  "workload_from_jax",
]
