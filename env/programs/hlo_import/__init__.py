"""Import a program compiled by XLA: HLO text -> `Workload`.

The input is an HLO module as text: the post-optimisation module printed by
`jax.jit(f).lower(*args).compile().as_text()` or dumped by XLA on any backend
(`--xla_dump_to=DIR --xla_dump_hlo_as_text`, the `*after_optimizations.txt` file), or an
unoptimised module (TensorFlow, torch-xla, a `before_optimizations` dump), which is compiled
here first. Only the ENTRY computation becomes the schedule; called computations only
contribute flops and tell which bytes a fusion reads.

The package, one module per concern:

  hlo          the parsed module both parsers produce: shapes, instructions, computations
  text_parser  the hand-written parser, the fallback for text XLA's parser refuses
  xla_proto    XLA's own parser, read through its `HloModuleProto`
  cost_rules   flops per op, and the bytes an op reads and writes (XLA's HloCostAnalysis)
  convert      the ENTRY computation -> `Workload`, one step per instruction
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
  A module is scheduled when it says `is_scheduled=true` (the proto then holds a schedule for
  the ENTRY computation): its ops are taken in that order. An unscheduled module's print order
  is not a schedule and it has no fusion, so `import_hlo_text` (and `import-hlo`) compiles it
  with the installed XLA for the CPU first (HLO -> StableHLO -> the CPU client's compiler ->
  the optimised, scheduled module) and imports that, with a one-line note; `compile=False`
  (`--no-compile`) keeps the print order, with a note. A module XLA cannot compile on one CPU
  (collectives over several devices, another backend's custom calls) keeps its print order with
  a note, unless compiling was asked for explicitly (then it is an error).

Ops
  The ENTRY instructions in schedule order, except the ones that create no data of their own:
  `parameter`, `constant`, `get-tuple-element`, `bitcast`, `tuple`, `copy-start`,
  `copy-done`, `async-update`, `add-dependency`, `opt-barrier`, `domain` and `after-all`.
  Every other instruction (fusion, dot, convolution, custom-call, reduce, copy, while, call,
  conditional, the start and the done of each asynchronous operation, ...) is one op, named
  after the instruction.

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
  * `fusion`, `call`, async `*-start` with `calls=`: the sum over the called computation.
  * `while`: (body + condition) x the trip count when XLA printed one in `backend_config`
    (`"known_trip_count":{"n":"5"}`), otherwise once (the trip count is data dependent).
  * `conditional`: the most expensive branch (an upper bound; which branch runs is data
    dependent).
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
    buffer per leaf.
  * Constants: an ENTRY constant of more than `SMALL_CONSTANT_BYTES` bytes is read-only data
    that exists before the program, so it becomes a `parameter` buffer too; smaller constants
    (scalars, tiny tables) are ignored, as they are immediates rather than memory traffic.
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
  * In-place ops (dynamic-update-slice fusions with `output_to_operand_aliasing`, a `while`'s
    loop state, donated arguments named in `input_output_alias`, and XLA's reuse of a dead
    operand's buffer for an elementwise result) are treated as new buffers: the workload
    models logical tensors, not XLA's buffer assignment.

Against `compiled.memory_analysis()` (measured on CPU MLPs and CNNs): the parameter bytes
equal XLA's argument bytes and the output bytes its output bytes (less 8 bytes per element of
a tuple-shaped result, XLA's pointer table). `peak_live_bytes` is not XLA's
argument + output + temp: XLA keeps every argument allocated for the whole program and gives
outputs their own allocations (both make XLA higher), and it updates in place, e.g. a new
weight into its dead gradient's buffer (which makes XLA lower: by up to ~30% of the workload's
peak for training steps with large weight matrices).

Uses
  An op uses every buffer reachable through its operands after alias resolution. Operands are
  defined earlier in the schedule, so every use is strictly after the definition.

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
