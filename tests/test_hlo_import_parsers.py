"""XLA import, continued: XLA's parser against the hand-written fallback, compiling unscheduled
modules, async collectives and the bytes accessed by gathers, slices and in-place updates."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from malloczero.common.errors import WorkloadError
from malloczero.env.game import RequestsGame
from malloczero.env.hardware import PRESETS
from malloczero.env.programs.hlo_import import (
  import_hlo_text,
  workload_from_hlo_text,
  workload_from_jax,
)
from malloczero.env.programs.hlo_import.convert import convert_module
from malloczero.env.programs.hlo_import.from_text import parse_module
from malloczero.env.programs.hlo_import.notes import Notes
from malloczero.env.programs.synthetic import contended
from malloczero.env.workload_json import load_workload, save_workload
from tests.hlo_programs import (
  CNN_INPUT,
  CNN_PARAMS,
  _cnn,
  _mlp_args,
  _train_step,
)

# ----------------------------------------------------------------------------- 6. parsers


def _both_parsers(text, name="m"):
  """The workload from XLA's parser (with its notes) and from the hand-written fallback."""
  notes = Notes()
  primary = parse_module(text, name, notes)
  fallback = parse_module(text, name, Notes(), use_xla=False)
  assert primary.parser == "xla" and fallback.parser == "text"
  return (
    convert_module(primary, name, "xla-hlo", notes),
    convert_module(fallback, name, "xla-hlo", notes),
    notes.all(),
  )


@pytest.mark.parametrize("case", ["mlp_step", "cnn_forward"])
def test_xla_parser_and_fallback_agree_on_compiled_programs(case):
  if case == "mlp_step":
    params, x, y = _mlp_args()
    text = jax.jit(_train_step).lower(params, x, y).compile().as_text()
  else:
    text = jax.jit(_cnn).lower(CNN_PARAMS, CNN_INPUT).compile().as_text()
  primary, fallback, notes = _both_parsers(text)
  assert primary == fallback and notes == []
  assert import_hlo_text(text, "m").notes == ()  # Scheduled: nothing compiled, nothing to say.


def test_xla_parser_follows_the_schedule_not_the_print_order():
  """The proto lists a computation's instructions in its own order; the schedule decides."""
  text = SCHEDULED_BY_HAND
  primary, fallback, _ = _both_parsers(text)
  assert [o.name for o in primary.ops] == ["second", "first"] == [o.name for o in fallback.ops]


SCHEDULED_BY_HAND = """HloModule order, is_scheduled=true

ENTRY %main (a: f32[8], b: f32[8]) -> (f32[8], f32[8]) {
  %a = f32[8]{0} parameter(0)
  %b = f32[8]{0} parameter(1)
  %second = f32[8]{0} negate(%b)
  %first = f32[8]{0} exponential(%a)
  ROOT %t = (f32[8]{0}, f32[8]{0}) tuple(%first, %second)
}
"""

OLD_MODULE = """HloModule old, is_scheduled=true

ENTRY %main (a: f32[4,4], b: f32[4,4]) -> f32[4,4] {
  %a = f32[4,4]{1,0} parameter(0)
  %b = f32[4,4]{1,0} parameter(1)
  %add = f32[4,4]{1,0} add(%a, %b), some_old_attribute=3
  ROOT %mul = f32[4,4]{1,0} multiply(%add, %a)
}
"""


def test_text_xla_refuses_is_read_by_the_fallback_which_says_so():
  result = import_hlo_text(OLD_MODULE, "old")
  assert len(result.notes) == 1
  note = result.notes[0]
  assert "\n" not in note and "XLA's parser refused" in note and "hand-written" in note
  assert "line 6" in note and "some_old_attribute" in note
  w = result.workload
  assert [o.name for o in w.ops] == ["add", "mul"] and w.peak_live_bytes == 3 * 64
  assert result.scheduled and not result.compiled


# XLA's parser fails a CHECK on a `tuple` instruction given an array shape, which aborts the
# process it runs in.
ABORTS_XLAS_PARSER = """HloModule aborts

ENTRY %main (p: f32[4]) -> f32[4] {
  %p = f32[4]{0} parameter(0)
  %t = f32[4]{0} tuple(%p)
  ROOT %n = f32[4]{0} negate(%p)
}
"""


def test_a_module_that_aborts_xlas_parser_is_read_by_the_fallback_and_the_importer_lives_on():
  result = import_hlo_text(ABORTS_XLAS_PARSER, "aborts")
  assert [o.name for o in result.workload.ops] == ["n"]
  parsed, compiling = result.notes
  assert "\n" not in parsed and "XLA's parser refused" in parsed and "hand-written" in parsed
  assert "crashed (signal SIGABRT): Check failed" in parsed and "Expected a tuple shape" in parsed
  # Compiling would parse it again: not here, and the print order is kept with a note.
  assert not result.compiled and "could not compile" in compiling and "crashed" in compiling
  with pytest.raises(WorkloadError) as info:
    import_hlo_text(ABORTS_XLAS_PARSER, "aborts", compile=True)
  assert "\n" not in str(info.value) and "XLA's parser crashed" in str(info.value)
  # The parser's process is started again for the next module.
  assert parse_module(UNSCHEDULED, "next", Notes()).parser == "xla"


def test_a_text_that_is_not_valid_unicode_is_read_by_the_fallback():
  """A lone surrogate (a str from a bytes decoded with `surrogateescape`) cannot reach XLA's
  parser: the fallback reads the module, and the note says why."""
  result = import_hlo_text(
    ABORTS_XLAS_PARSER.replace("HloModule aborts", "HloModule ab\udc80"), "s"
  )
  assert [o.name for o in result.workload.ops] == ["n"]
  assert "XLA's parser refused the module (the text is not valid Unicode" in result.notes[0]


def test_hlo_pb2_is_read_without_importing_tensorflow():
  """Importing the importer loads no XLA library; reading TensorFlow's hlo_pb2 descriptors
  (about 0.03 s) does not run `tensorflow/__init__.py` (about 1.8 s)."""
  import subprocess
  import sys

  code = (
    "import sys, time; from malloczero.env.programs.hlo_import import xla_proto as h; "
    "heavy = lambda: sorted(m for m in ('tensorflow', 'jax', 'jaxlib') if m in sys.modules); "
    "print(heavy()); t = time.perf_counter(); h.hlo_module_proto(); "
    "print(time.perf_counter() - t); print(heavy())"
  )
  out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
  before, seconds, after = out.stdout.splitlines()
  assert before == after == "[]" and float(seconds) < 1.0


# ----------------------------------------------------------------------------- 7. compiling


UNSCHEDULED = """HloModule eager, entry_computation_layout={(f32[64,32]{1,0}, f32[64,32]{1,0})->f32[64,32]{1,0}}

ENTRY %main (a: f32[64,32], b: f32[64,32]) -> f32[64,32] {
  %a = f32[64,32]{1,0} parameter(0)
  %b = f32[64,32]{1,0} parameter(1)
  %add = f32[64,32]{1,0} add(%a, %b)
  %mul = f32[64,32]{1,0} multiply(%add, %a)
  %neg = f32[64,32]{1,0} negate(%mul)
  ROOT %exp = f32[64,32]{1,0} exponential(%neg)
}
"""


def test_unscheduled_module_is_compiled_and_fused_first():
  result = import_hlo_text(UNSCHEDULED, "eager")
  assert result.compiled and not result.scheduled
  assert (
    len(result.notes) == 1 and "not scheduled: compiled it with XLA on the CPU" in (result.notes[0])
  )
  assert "4 ops before, 1 after" in result.notes[0]
  w = result.workload
  assert w.source == "xla-hlo, compiled with XLA on the CPU"
  assert w.num_ops == 1  # XLA fused the four elementwise ops into one loop fusion.
  assert w.arrays.flops.sum() == 4 * 64 * 32
  assert w.peak_live_bytes == 3 * 64 * 32 * 4  # a, b and the result; no temporaries.


def test_unscheduled_module_kept_in_print_order_says_so():
  result = import_hlo_text(UNSCHEDULED, "eager", compile=False)
  assert not result.compiled and not result.scheduled
  assert [o.name for o in result.workload.ops] == ["add", "mul", "neg", "exp"]
  assert len(result.notes) == 1 and "print order" in result.notes[0]


def test_module_xla_cannot_compile():
  """A collective over two replicas does not compile on one CPU device: with the default the
  print order is kept and a note says why; asking for compiling makes it an error."""
  text = ASYNC_COLLECTIVES.replace(", is_scheduled=true", "")
  result = import_hlo_text(text, "multi")
  assert not result.compiled and "could not compile" in result.notes[0]
  assert result.workload.num_ops == 13
  with pytest.raises(WorkloadError) as info:
    import_hlo_text(text, "multi", compile=True)
  assert "\n" not in str(info.value) and "XLA could not compile the module" in str(info.value)


# ----------------------------------------------------------------------------- 8. async


ASYNC_COLLECTIVES = """HloModule collectives, is_scheduled=true

%add (x: f32[], y: f32[]) -> f32[] {
  %x = f32[] parameter(0)
  %y = f32[] parameter(1)
  ROOT %sum = f32[] add(%x, %y)
}

%a2a (p: f32[8,64]) -> f32[8,64] {
  %p = f32[8,64]{1,0} parameter(0)
  ROOT %r = f32[8,64]{1,0} all-to-all(%p), replica_groups={{0,1}}, dimensions={0}
}

ENTRY %main (w: f32[256]) -> (f32[8,64], f32[256]) {
  %w = f32[256]{0} parameter(0)
  %ags = (f32[256]{0}, f32[512]{0}) all-gather-start(%w), replica_groups={{0,1}}, dimensions={0}
  %agd = f32[512]{0} all-gather-done(%ags)
  %ars = f32[512]{0} all-reduce-start(%agd), replica_groups={{0,1}}, to_apply=%add
  %ard = f32[512]{0} all-reduce-done(%ars)
  %cps = (f32[512]{0}, f32[512]{0}, u32[], u32[]) collective-permute-start(%ard), source_target_pairs={{0,1},{1,0}}
  %cpd = f32[512]{0} collective-permute-done(%cps)
  %b = f32[8,64]{1,0} bitcast(%cpd)
  %as = ((f32[8,64]{1,0}), f32[8,64]{1,0}, s32[]) async-start(%b), calls=%a2a
  %au = ((f32[8,64]{1,0}), f32[8,64]{1,0}, s32[]) async-update(%as)
  %ad = f32[8,64]{1,0} async-done(%au)
  %tok = token[] after-all()
  %send = (f32[256]{0}, u32[], token[]) send(%w, %tok), channel_id=1
  %send-done = token[] send-done(%send), channel_id=1
  %recv = (f32[256]{0}, u32[], token[]) recv(%tok), channel_id=2
  %recv-done = (f32[256]{0}, token[]) recv-done(%recv), channel_id=2
  %rd = f32[256]{0} get-tuple-element(%recv-done), index=0
  %neg = f32[8,64]{1,0} negate(%ad)
  ROOT %out = (f32[8,64]{1,0}, f32[256]{0}) tuple(%neg, %rd)
}
"""


def test_async_collectives_alias_what_xla_aliases():
  w, fallback, notes = _both_parsers(ASYNC_COLLECTIVES)
  assert w == fallback and notes == []
  t = {o.name: i for i, o in enumerate(w.ops)}
  assert list(t) == [
    "ags",
    "agd",
    "ars",
    "ard",
    "cps",
    "cpd",
    "r",
    "ad",
    "send",
    "send-done",
    "recv",
    "recv-done",
    "neg",
  ]
  # Collectives move data: 0 flops (the all-reduce's reducer is not counted either).
  assert [o.flops for o in w.ops] == [0.0] * 12 + [8 * 64]
  # Each start defines its result ({1} of its tuple); the done defines nothing. The generic
  # async-start's wrapped computation is flattened: its all-to-all `r` is the op and its
  # result the start's {1}; the start makes no op.
  b = {x.name: x for x in w.buffers}
  assert {k: v.size for k, v in b.items()} == {
    "w": 1024,
    "ags{1}": 2048,
    "ars": 2048,
    "cps{1}": 2048,
    "r": 2048,
    "recv{0}": 1024,
    "neg": 2048,
  }
  # A done keeps the start's operands and results live, moving nothing (0-byte uses).
  assert b["w"].uses == (t["ags"], t["agd"], t["send"], t["send-done"])
  assert b["w"].use_bytes == (1024, 0, 1024, 0)
  assert b["ags{1}"].uses == (t["agd"], t["ars"], t["ard"])
  assert b["r"].uses == (t["ad"], t["neg"])
  assert b["cps{1}"].uses[-1] == t["ad"]  # The wrapped computation's operand, to the done.
  assert b["recv{0}"].kind == b["neg"].kind == "output"
  # Live: w [0, 10), ags{1} [0, 4), ars [2, 6), cps{1} [4, 8), r [6, 13), recv{0}
  # [10, 13), neg [12, 13): at most three of them at any op, e.g. w + ags{1} + ars at op 2.
  assert w.peak_live_bytes == 1024 + 2048 + 2048
  assert w.arrays.incidence_bytes.sum() == 2 * 1024 + 4 * (2 * 2048) + 1024 + 2048


def test_variadic_all_reduce_start_defines_all_its_results():
  """Unlike the other starts, an all-reduce-start's tuple is its results, not (operands,
  results); the done keeps every leaf live without moving it."""
  text = (
    ASYNC_COLLECTIVES.split("ENTRY")[0]
    + """ENTRY %main (a: f32[8], b: f32[16]) -> (f32[8], f32[16]) {
  %a = f32[8]{0} parameter(0)
  %b = f32[16]{0} parameter(1)
  %s = (f32[8]{0}, f32[16]{0}) all-reduce-start(%a, %b), replica_groups={{0,1}}, to_apply=%add
  ROOT %d = (f32[8]{0}, f32[16]{0}) all-reduce-done(%s)
}
"""
  )
  w, fallback, _ = _both_parsers(text)
  assert w == fallback
  b = {x.name: x for x in w.buffers}
  assert {k: (v.size, v.kind, v.uses, v.use_bytes) for k, v in b.items()} == {
    "a": (32, "parameter", (0, 1), (32, 0)),
    "b": (64, "parameter", (0, 1), (64, 0)),
    "s{0}": (32, "output", (1,), (0,)),
    "s{1}": (64, "output", (1,), (0,)),
  }


# ----------------------------------------------------------------------------- 9. accessed bytes


ACCESS = """HloModule access, is_scheduled=true

%embed (e_table: f32[1000,16], e_ids: s32[10]) -> f32[10,16] {
  %e_table = f32[1000,16]{1,0} parameter(0)
  %e_ids = s32[10]{0} parameter(1)
  %e_ids2 = s32[10,1]{1,0} bitcast(%e_ids)
  ROOT %e_g = f32[10,16]{1,0} gather(%e_table, %e_ids2), offset_dims={1}, collapsed_slice_dims={0}, start_index_map={0}, index_vector_dim=1, slice_sizes={1,16}
}

%update (u_buf: f32[64,16], u_row: f32[1,16], u_i: s32[]) -> f32[64,16] {
  %u_buf = f32[64,16]{1,0} parameter(0)
  %u_row = f32[1,16]{1,0} parameter(1)
  %u_i = s32[] parameter(2)
  %u_z = s32[] constant(0)
  ROOT %u_dus = f32[64,16]{1,0} dynamic-update-slice(%u_buf, %u_row, %u_i, %u_z)
}

ENTRY %main (table: f32[1000,16], ids: s32[10], i: s32[], buf: f32[64,16], idx3: s32[3,1]) -> (f32[64,16], f32[4,16], f32[3,16]) {
  %table = f32[1000,16]{1,0} parameter(0)
  %ids = s32[10]{0} parameter(1)
  %i = s32[] parameter(2)
  %buf = f32[64,16]{1,0} parameter(3)
  %idx3 = s32[3,1]{1,0} parameter(4)
  %emb = f32[10,16]{1,0} fusion(%table, %ids), kind=kLoop, calls=%embed
  %sl = f32[2,16]{1,0} slice(%emb), slice={[0:2], [0:16]}
  %z = s32[] constant(0)
  %ds = f32[1,16]{1,0} dynamic-slice(%buf, %i, %z), dynamic_slice_sizes={1,16}
  %row = f32[1,16]{1,0} add(%ds, %ds)
  %upd = f32[64,16]{1,0} fusion(%buf, %row, %i), kind=kLoop, calls=%update
  %dus2 = f32[64,16]{1,0} dynamic-update-slice(%upd, %row, %i, %z)
  %zero = f32[] constant(0)
  %p = f32[4,16]{1,0} pad(%sl, %zero), padding=1_1x0_0
  %g2 = f32[3,16]{1,0} gather(%table, %idx3), offset_dims={1}, collapsed_slice_dims={0}, start_index_map={0}, index_vector_dim=1, slice_sizes={1,16}
  ROOT %out = (f32[64,16]{1,0}, f32[4,16]{1,0}, f32[3,16]{1,0}) tuple(%dus2, %p, %g2)
}
"""


def test_gathers_slices_and_in_place_updates_are_charged_the_bytes_they_access(tmp_path):
  w, fallback, notes = _both_parsers(ACCESS)
  assert w == fallback and notes == []
  t = {o.name: i for i, o in enumerate(w.ops)}
  b = {x.name: x for x in w.buffers}
  row = 16 * 4
  # The embedding fusion gathers 10 rows of the 64,000-byte table; the unfused gather 3 rows.
  assert b["table"].uses == (t["emb"], t["g2"]) and b["table"].use_bytes == (10 * row, 3 * row)
  assert b["ids"].use_bytes is None  # Indices are read whole (through the fused bitcast too).
  # A slice reads its output's size; a dynamic slice too; its index is read whole.
  assert b["emb"].use_bytes == (2 * row,)
  assert b["i"].use_bytes is None
  # The in-place update (fused or not) reads nothing of the buffer it updates and writes the
  # update's bytes; the update itself is read whole.
  assert b["buf"].uses == (t["ds"], t["upd"]) and b["buf"].use_bytes == (row, 0)
  assert b["upd"].def_bytes == b["dus2"].def_bytes == row and b["upd"].use_bytes == (0,)
  assert b["row"].use_bytes is None
  # Pad is charged whole, as XLA's cost analysis does (its operand is the smaller side).
  assert b["sl"].use_bytes is None and b["p"].def_bytes is None
  moved = np.bincount(w.arrays.incidence_op, w.arrays.incidence_bytes, minlength=w.num_ops)
  assert moved[t["emb"]] == 10 * row + 40 + 10 * row
  assert moved[t["upd"]] == 0 + row + 4 + row
  # The partial accesses survive a file round trip.
  save_workload(w, tmp_path / "w.json")
  assert load_workload(tmp_path / "w.json") == w


# ----------------------------------------------------------------------------- 10. warnings


UNKNOWN = """HloModule vendor, is_scheduled=true

ENTRY %main (a: f32[16], d: f32[?,4]) -> (f32[16], f32[16], f32[16]) {
  %a = f32[16]{0} parameter(0)
  %d = f32[?,4]{1,0} parameter(1)
  %x = f32[16]{0} custom-call(%a), custom_call_target="vendor_op"
  %y = f32[16]{0} custom-call(%x), custom_call_target="vendor_op"
  %z = f32[16]{0} custom-call(%y, %d), custom_call_target="other_op"
  %e = f32[?,4]{1,0} negate(%d)
  ROOT %t = (f32[16]{0}, f32[16]{0}, f32[16]{0}) tuple(%x, %y, %z)
}
"""


def test_custom_calls_and_unsizable_shapes_import_with_one_warning_per_kind():
  result = import_hlo_text(UNKNOWN, "unknown")
  w = result.workload
  assert [o.name for o in w.ops] == ["x", "y", "z", "e"]
  assert {x.name for x in w.buffers} == {"a", "x", "y", "z"}  # No buffer of unknown size.
  warnings = [n for n in result.notes if n.startswith("warning:")]
  assert len(warnings) == 3 and all("\n" not in n for n in warnings)
  assert any("'vendor_op' (2 instructions" in n for n in warnings)
  assert any("'other_op' (1 instruction," in n for n in warnings)
  assert any("unbounded dynamic dimension (2 instructions" in n for n in warnings)
  assert not any("XLA's parser refused" in n for n in result.notes)
  # An element type the importer does not know (only the fallback reads one) is one more kind.
  odd = UNKNOWN.replace("f32[?,4]", "q7[2,4]")
  result = import_hlo_text(odd, "odd")
  assert any("unknown element type 'q7' (2 instructions" in n for n in result.notes)
  assert {x.name for x in result.workload.buffers} == {"a", "x", "y", "z"}


def test_embedding_lookup_compiled_by_xla_reads_only_its_rows():
  """XLA's CPU backend wraps the gather fusion in a `call`; both are followed."""

  def lookup(table, ids, x):
    return table[ids] + x

  w, _ = workload_from_jax(
    lookup,
    jax.ShapeDtypeStruct((4096, 64), jnp.float32),
    jax.ShapeDtypeStruct((32,), jnp.int32),
    jax.ShapeDtypeStruct((32, 64), jnp.float32),
    name="lookup",
  )
  table = next(b for b in w.buffers if b.size == 4096 * 64 * 4)
  assert table.use_bytes == (32 * 64 * 4,)


@pytest.mark.parametrize("text", [ASYNC_COLLECTIVES, ACCESS], ids=["async", "access"])
def test_partial_and_zero_byte_uses_play_and_validate_with_every_baseline(text):
  """The game, the requests, every baseline and the validator charge the same bytes per use,
  including the 0-byte uses of async dones and in-place updates."""
  from malloczero.env.solvers import SOLVERS, solve
  from malloczero.env.validator import validate_mapping

  w = workload_from_hlo_text(text, "m")
  for preset in ("tpu-v4i-like", "nnpi-like"):
    hw = contended(PRESETS[preset], w, 0.3)
    for solver in sorted(SOLVERS):
      result = solve(w, hw, solver)  # Validated: its times equal a fresh cost-model evaluation.
      # greedy and evo keep a placement only if the simulation says it saves time; the others
      # choose with estimates that ignore copy contention, so a prefetch can cost a little.
      assert result.mapping.speedup >= (1.0 if solver in ("greedy", "evo") else 0.9)
    # The game's rewards add up to the speed-up of the mapping it builds, which validates.
    game = RequestsGame(w, hw)
    step, total = game.reset(), 0.0
    while not step.last():
      step = game.step(int(np.flatnonzero(game.legal_actions)[-1]))
      total += step.reward
    mapping = game.mapping("last-candidate")
    validate_mapping(w, hw, mapping)  # Its times equal a fresh cost-model evaluation.
    assert total == pytest.approx(1 - 1 / mapping.speedup, abs=1e-9)
