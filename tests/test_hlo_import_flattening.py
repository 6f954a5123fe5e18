"""The importer's flattening: called computations on the time axis, as XLA's HloLiveRange puts
them, one test per rule on modules written by hand (read by both parsers), then JAX programs
compiled by XLA with its dump on, against XLA's own buffer assignment and live ranges."""

import dataclasses
import os
import subprocess
import sys

import pytest

from malloczero.common.errors import WorkloadError
from malloczero.env.programs.hlo_import import import_hlo_text
from malloczero.env.programs.hlo_import.convert import convert_module, count_ops
from malloczero.env.programs.hlo_import.from_text import parse_module
from malloczero.env.programs.hlo_import.notes import Notes
from malloczero.env.programs.hlo_import.xla_report import (
  compare_with_xla,
  read_xla_report,
  report_beside,
)
from malloczero.env.workload_json import load_workload
from tests.xla_dump_programs import BATCH, LAYERS, WIDTH, dump_programs, dump_tf_loop


def _both_parsers(text, name="m"):
  """The workload and notes from XLA's parser, checked equal to the hand-written fallback's."""
  results = []
  for use_xla in (True, False):
    notes = Notes()
    module = parse_module(text, name, notes, use_xla=use_xla)
    assert module.parser == ("xla" if use_xla else "text")
    results.append((convert_module(module, name, "xla-hlo", notes), notes.all()))
  (w, notes), (fallback, _) = results
  assert w == fallback
  return w, notes


def _ops(w):
  return [(o.name, o.weight) for o in w.ops]


def _buffer(w, name):
  (b,) = [b for b in w.buffers if b.name == name]
  return b


# A scan-like loop whose body calls a computation, in a scheduled module: each rule below reads it.
LOOP = """HloModule loop, is_scheduled=true

%inner (a: f32[64], b: f32[64]) -> f32[64] {
  %a = f32[64]{0} parameter(0)
  %b = f32[64]{0} parameter(1)
  %m = f32[64]{0} multiply(%a, %b)
  ROOT %s = f32[64]{0} add(%m, %a)
}

%cond (p: (s32[], f32[64], f32[16,64])) -> pred[] {
  %p = (s32[], f32[64]{0}, f32[16,64]{1,0}) parameter(0)
  %i = s32[] get-tuple-element(%p), index=0
  %n = s32[] constant(16)
  ROOT %lt = pred[] compare(%i, %n), direction=LT
}

%body (q: (s32[], f32[64], f32[16,64])) -> (s32[], f32[64], f32[16,64]) {
  %q = (s32[], f32[64]{0}, f32[16,64]{1,0}) parameter(0)
  %j = s32[] get-tuple-element(%q), index=0
  %h = f32[64]{0} get-tuple-element(%q), index=1
  %ws = f32[16,64]{1,0} get-tuple-element(%q), index=2
  %one = s32[] constant(1)
  %next = s32[] add(%j, %one)
  %row = f32[1,64]{1,0} dynamic-slice(%ws, %j, %j), dynamic_slice_sizes={1,64}
  %w = f32[64]{0} bitcast(%row)
  %t = f32[64]{0} tanh(%h)
  %h2 = f32[64]{0} call(%t, %w), to_apply=%inner
  ROOT %r = (s32[], f32[64]{0}, f32[16,64]{1,0}) tuple(%next, %h2, %ws)
}

ENTRY %main (x: f32[64], weights: f32[16,64]) -> f32[64] {
  %x = f32[64]{0} parameter(0)
  %weights = f32[16,64]{1,0} parameter(1)
  %zero = s32[] constant(0)
  %x0 = f32[64]{0} negate(%x)
  %init = (s32[], f32[64]{0}, f32[16,64]{1,0}) tuple(%zero, %x0, %weights)
  %loop = (s32[], f32[64]{0}, f32[16,64]{1,0}) while(%init), condition=%cond, body=%body, backend_config={"known_trip_count":{"n":"16"}}
  %last = f32[64]{0} get-tuple-element(%loop), index=1
  ROOT %out = f32[64]{0} exponential(%last)
}
"""


def test_a_while_loop_flattens_its_condition_then_its_body_each_op_weighted_by_the_trip_count():
  w, notes = _both_parsers(LOOP)
  assert notes == []
  # XLA's order: the condition, the body (the call's instructions in place of the call), then
  # nothing for the while; the condition runs 17 times, the body 16.
  assert _ops(w) == [
    ("x0", 1),
    ("lt", 17),
    ("next", 16),
    ("row", 16),
    ("t", 16),
    ("m", 16),
    ("s", 16),
    ("out", 1),
  ]
  assert count_ops(parse_module(LOOP, "m", Notes())) == len(w.ops)
  # Flops per step, times the weight: negate 64, compare 1 x 17, per iteration add 1 + tanh 64
  # + multiply 64 + add 64, then exp 64.
  assert w.arrays.flops.sum() == 64 + 17 + 16 * (1 + 64 + 64 + 64) + 64
  # Weights stretch the time axis: the loop covers 17 + 5 * 16 steps of the program.
  assert list(w.time_axis) == [0, 1, 18, 34, 50, 66, 82, 98, 99]


def test_a_loops_state_is_one_buffer_written_by_the_body_and_live_across_the_loop():
  w, _ = _both_parsers(LOOP)
  t = {o.name: i for i, o in enumerate(w.ops)}
  # The body's new h (`s`, via the call) is written into the state's buffer, the init value
  # x0's: no buffer of its own; the state is read by the next iteration and after the loop.
  assert "s" not in {b.name for b in w.buffers}
  state = _buffer(w, "x0")
  assert state.def_op == t["x0"]
  assert state.uses == (t["t"], t["s"], t["out"])
  # Buffers defined in the body live within it, once.
  assert _buffer(w, "t").uses == (t["m"], t["s"])
  assert _buffer(w, "m").uses == (t["s"],)
  # The stacked weights pass through: the parameter's own buffer, read a row per iteration.
  weights = _buffer(w, "weights")
  # It stays live to the loop's last op without moving more (a 0-byte use there).
  assert weights.kind == "parameter" and weights.uses == (t["row"], t["s"])
  assert weights.use_bytes == (64 * 4, 0)
  # The counter's init is a small constant (no buffer): its new value is a buffer of its own,
  # carried to the loop's last op.
  counter = _buffer(w, "next")
  assert counter.uses == (t["s"],) and counter.use_bytes == (0,)


def test_a_state_element_is_live_to_the_loops_last_op_even_when_the_body_reads_it_earlier():
  """The next iteration reads every element, so none dies inside the loop."""
  text = LOOP.replace(
    "ROOT %out = f32[64]{0} exponential(%last)", "ROOT %out = f32[64]{0} exponential(%x0)"
  )
  w, _ = _both_parsers(text)
  t = {o.name: i for i, o in enumerate(w.ops)}
  state = _buffer(w, "x0")
  assert state.uses[-1] == t["out"]
  assert state.uses[:2] == (t["t"], t["s"])
  # A loop whose state nobody reads afterwards: the state still lives to the loop's last op.
  free = LOOP.replace(
    "%last = f32[64]{0} get-tuple-element(%loop), index=1", "%last = f32[64]{0} negate(%x)"
  )
  w, _ = _both_parsers(free)
  t = {o.name: i for i, o in enumerate(w.ops)}
  assert _buffer(w, "x0").uses[-1] == t["s"]


def test_a_while_loop_without_a_known_trip_count_counts_once_with_a_warning():
  text = LOOP.replace(', backend_config={"known_trip_count":{"n":"16"}}', "")
  w, notes = _both_parsers(text)
  assert {o.weight for o in w.ops} == {1}
  (warning,) = notes
  assert "while loop without a known trip count" in warning and "'loop'" in warning
  assert "count once" in warning


def test_a_trip_count_of_zero_counts_the_loop_once_with_a_warning():
  text = LOOP.replace('"known_trip_count":{"n":"16"}', '"known_trip_count":{"n":"0"}')
  w, notes = _both_parsers(text)
  assert {o.weight for o in w.ops} == {1}
  (warning,) = notes
  assert "known_trip_count is 0" in warning and "count once" in warning


def test_a_module_that_would_flatten_past_the_limit_is_refused_in_one_line(monkeypatch):
  from malloczero.env.programs.hlo_import import convert

  monkeypatch.setattr(convert, "MAX_FLATTENED_INSTRUCTIONS", 10)
  with pytest.raises(WorkloadError) as info:
    _both_parsers(CALLED_TWICE)
  assert "more than 10 instructions" in str(info.value) and "\n" not in str(info.value)


def test_nested_loops_multiply_their_trip_counts():
  outer = LOOP.replace("%body (q:", "%inner_body (q:").replace("%cond (p:", "%inner_cond (p:")
  outer = outer.replace(
    "condition=%cond, body=%body", "condition=%inner_cond, body=%inner_body"
  ).split("ENTRY")[0]
  outer += """%outer_cond (oc: (s32[], f32[64], f32[16,64])) -> pred[] {
  %oc = (s32[], f32[64]{0}, f32[16,64]{1,0}) parameter(0)
  %oi = s32[] get-tuple-element(%oc), index=0
  %three = s32[] constant(3)
  ROOT %olt = pred[] compare(%oi, %three), direction=LT
}

%outer_body (ob: (s32[], f32[64], f32[16,64])) -> (s32[], f32[64], f32[16,64]) {
  %ob = (s32[], f32[64]{0}, f32[16,64]{1,0}) parameter(0)
  %oj = s32[] get-tuple-element(%ob), index=0
  %oh = f32[64]{0} get-tuple-element(%ob), index=1
  %ows = f32[16,64]{1,0} get-tuple-element(%ob), index=2
  %ozero = s32[] constant(0)
  %oone = s32[] constant(1)
  %onext = s32[] add(%oj, %oone)
  %ostart = (s32[], f32[64]{0}, f32[16,64]{1,0}) tuple(%ozero, %oh, %ows)
  %iloop = (s32[], f32[64]{0}, f32[16,64]{1,0}) while(%ostart), condition=%inner_cond, body=%inner_body, backend_config={"known_trip_count":{"n":"16"}}
  %ih = f32[64]{0} get-tuple-element(%iloop), index=1
  ROOT %or = (s32[], f32[64]{0}, f32[16,64]{1,0}) tuple(%onext, %ih, %ows)
}

ENTRY %main (x: f32[64], weights: f32[16,64]) -> f32[64] {
  %x = f32[64]{0} parameter(0)
  %weights = f32[16,64]{1,0} parameter(1)
  %zero = s32[] constant(0)
  %x0 = f32[64]{0} negate(%x)
  %init = (s32[], f32[64]{0}, f32[16,64]{1,0}) tuple(%zero, %x0, %weights)
  %loop = (s32[], f32[64]{0}, f32[16,64]{1,0}) while(%init), condition=%outer_cond, body=%outer_body, backend_config={"known_trip_count":{"n":"3"}}
  %last = f32[64]{0} get-tuple-element(%loop), index=1
  ROOT %out = f32[64]{0} exponential(%last)
}
"""
  w, notes = _both_parsers(outer)
  assert notes == []
  # Each op also says how many while loops enclose it (XLA's while nest level).
  assert [o.loop_depth for o in w.ops] == [0, 1, 1, 2, 2, 2, 2, 2, 2, 0]
  assert _ops(w) == [
    ("x0", 1),
    ("olt", 4),
    ("onext", 3),
    ("lt", 3 * 17),
    ("next", 3 * 16),
    ("row", 3 * 16),
    ("t", 3 * 16),
    ("m", 3 * 16),
    ("s", 3 * 16),
    ("out", 1),
  ]
  # Both loops carry h in the init value's buffer, x0's.
  assert [b.name for b in w.buffers if b.size == 256] == ["x", "x0", "row", "t", "m", "out"]


CALLED_TWICE = """HloModule twice, is_scheduled=true

%fused (f: f32[32]) -> f32[32] {
  %f = f32[32]{0} parameter(0)
  %e = f32[32]{0} exponential(%f)
  ROOT %n = f32[32]{0} negate(%e)
}

%layer (a: f32[32]) -> (f32[32], f32[32]) {
  %a = f32[32]{0} parameter(0)
  %big = f32[32]{0} constant({0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16, 17, 18, 19, 20, 21, 22, 23, 24, 25, 26, 27, 28, 29, 30, 31})
  %fu = f32[32]{0} fusion(%a), kind=kLoop, calls=%fused
  %y = f32[32]{0} add(%fu, %big)
  ROOT %pair = (f32[32]{0}, f32[32]{0}) tuple(%y, %a)
}

ENTRY %main (x: f32[32]) -> f32[32] {
  %x = f32[32]{0} parameter(0)
  %c1 = (f32[32]{0}, f32[32]{0}) call(%x), to_apply=%layer
  %y1 = f32[32]{0} get-tuple-element(%c1), index=0
  %c2 = (f32[32]{0}, f32[32]{0}) call(%y1), to_apply=%layer
  %y2 = f32[32]{0} get-tuple-element(%c2), index=0
  %x1 = f32[32]{0} get-tuple-element(%c2), index=1
  ROOT %sum = f32[32]{0} add(%y2, %x1)
}
"""


def test_calls_bind_parameters_and_roots_and_a_computation_called_twice_flattens_at_each_call():
  w, _ = _both_parsers(CALLED_TWICE)
  # The fusion stays one op; the call makes none; the layer's ops appear once per call site.
  assert _ops(w) == [("fu", 1), ("y", 1), ("fu", 1), ("y", 1), ("sum", 1)]
  assert w.arrays.flops.sum() == 2 * (2 * 32 + 32) + 32
  names = [b.name for b in w.buffers]
  # The layer's large constant is read-only data (a parameter), once per copy of the layer.
  assert names == ["x", "big", "fu", "y", "big", "fu", "y", "sum"]
  x, _, _, y1, *_ = w.buffers
  # The second call's parameter is the first call's root value; its root passes it through.
  assert x.uses == (0,)
  assert y1.uses == (2, 4)


def test_a_conditional_flattens_every_branch_and_merges_their_results():
  text = """HloModule branches, is_scheduled=true

%left (l: f32[128]) -> f32[128] {
  %l = f32[128]{0} parameter(0)
  ROOT %lt = f32[128]{0} tanh(%l)
}

%right (r: f32[128]) -> f32[128] {
  %r = f32[128]{0} parameter(0)
  %r2 = f32[128]{0} multiply(%r, %r)
  ROOT %rn = f32[128]{0} negate(%r2)
}

ENTRY %main (p: pred[], x: f32[128]) -> f32[128] {
  %p = pred[] parameter(0)
  %x = f32[128]{0} parameter(1)
  %c = f32[128]{0} conditional(%p, %x, %x), true_computation=%left, false_computation=%right
  ROOT %o = f32[128]{0} exponential(%c)
}
"""
  w, notes = _both_parsers(text)
  assert _ops(w) == [("lt", 1), ("r2", 1), ("rn", 1), ("o", 1)]
  (warning,) = notes
  assert "conditional" in warning and "every branch" in warning and "upper bound" in warning
  # One buffer for the result: the first branch's, written by the second.
  assert [b.name for b in w.buffers] == ["p", "x", "lt", "r2", "o"]
  assert _buffer(w, "lt").uses == (2, 3)


def test_a_computation_outside_the_modules_schedule_leaves_its_caller_one_op():
  """XLA's HloLiveRange does not flatten a computation the schedule has no sequence for."""
  module = parse_module(CALLED_TWICE, "m", Notes())
  module.comps["layer"] = dataclasses.replace(module.comps["layer"], sequenced=False)
  w = convert_module(module, "m", "xla-hlo", Notes())
  assert _ops(w) == [("c1", 1), ("c2", 1), ("sum", 1)]
  assert w.arrays.flops.sum() == 2 * (2 * 32 + 32) + 32


def test_a_computation_that_calls_itself_or_a_parameter_out_of_range_is_a_one_line_error():
  recursive = CALLED_TWICE.replace(
    "%fu = f32[32]{0} fusion(%a), kind=kLoop, calls=%fused",
    "%fu = (f32[32]{0}, f32[32]{0}) call(%a), to_apply=%layer\n"
    "  %fu0 = f32[32]{0} get-tuple-element(%fu), index=0",
  ).replace("add(%fu, %big)", "add(%fu0, %big)")
  module = parse_module(recursive, "m", Notes(), use_xla=False)
  with pytest.raises(WorkloadError, match="computation 'layer' calls itself"):
    convert_module(module, "m", "xla-hlo", Notes())
  extra = CALLED_TWICE.replace(
    "%fu = f32[32]{0} fusion(%a)", "%a9 = f32[32]{0} parameter(9)\n  %fu = f32[32]{0} fusion(%a9)"
  )
  module = parse_module(extra, "m", Notes(), use_xla=False)
  with pytest.raises(WorkloadError) as info:
    convert_module(module, "m", "xla-hlo", Notes())
  assert "parameter 9 of computation 'layer', which is called with 1 operands" in str(info.value)
  assert "\n" not in str(info.value)


# ----------------------------------------------------------------------------- XLA's own dumps


@pytest.fixture(scope="module")
def dumps(tmp_path_factory):
  """The JAX programs of tests/xla_dump_programs.py, compiled by XLA with its dump on."""
  return dump_programs(str(tmp_path_factory.mktemp("xla-dump")))


def _import(path):
  with open(path, encoding="utf-8") as f:
    return import_hlo_text(f.read(), os.path.basename(path))


@pytest.mark.parametrize("program", ["called_step", "scanned_step", "nested_step", "branchy_step"])
def test_the_import_peak_matches_xla_buffer_assignment(dumps, program):
  """XLA's HloLiveRange over the same flattened sequence: by XLA's rules (entry parameters live
  to the end, in-place results in their operand's memory) the import's peak is XLA's; the
  workload's own peak is within 5%."""
  result = _import(dumps[program])
  report = read_xla_report(report_beside(dumps[program]))
  comparison = compare_with_xla(result.workload, report)
  assert abs(comparison.ratio - 1) <= 0.001, comparison.lines
  assert abs(result.workload.peak_live_bytes / comparison.xla_peak_bytes - 1) <= 0.05
  # The report's own sequence holds every op of the import, in the same order.
  steps = {name: i for i, name in enumerate(report.sequence)}
  positions = [steps[o.name] for o in result.workload.ops]
  assert positions == sorted(positions)


def test_a_step_inside_one_call_imports_its_called_instructions(dumps):
  """As a GPU command buffer holds a whole step: the ENTRY computation is one call."""
  text = open(dumps["called_step"], encoding="utf-8").read()
  entry = text[text.index("ENTRY") :]
  assert entry.count(" call(") == 1 and " dot(" not in entry
  w = _import(dumps["called_step"]).workload
  assert w.num_ops >= 8 and not any(o.name.startswith("call") for o in w.ops)
  # Forward 2 matmuls, backward 3 (no input gradient), 2 * B * W * 2W each.
  assert w.arrays.flops.sum() >= 5 * 2 * BATCH * WIDTH * 2 * WIDTH


def test_a_scan_imports_its_body_weighted_by_the_trip_count(dumps):
  w = _import(dumps["scanned_step"]).workload
  weights = {o.weight for o in w.ops}
  assert weights == {1, LAYERS, LAYERS + 1}
  # Forward and backward over every layer: 3 matmuls per layer.
  matmuls = 3 * LAYERS * 2 * BATCH * WIDTH * WIDTH
  assert matmuls <= w.arrays.flops.sum() <= 1.25 * matmuls
  nested = _import(dumps["nested_step"]).workload
  assert max(o.weight for o in nested.ops) == 3 * (LAYERS + 1)


def test_import_hlo_compares_with_xla_report_beside_the_dump(dumps, tmp_path):
  out = tmp_path / "w.json"
  cmd = [sys.executable, "-m", "malloczero", "import-hlo", dumps["scanned_step"], "--out", str(out)]
  done = subprocess.run(cmd, capture_output=True, text=True, check=True)
  assert "buffer assignment beside it" in done.stdout and "+0.0%" in done.stdout
  assert load_workload(str(out)).num_ops == _import(dumps["scanned_step"]).workload.num_ops
  report = report_beside(dumps["scanned_step"]).replace(
    "-buffer-assignment.txt", "-memory-usage-report.txt"
  )
  done = subprocess.run(cmd + ["--xla-report", report], capture_output=True, text=True, check=True)
  assert "where the two differ" in done.stdout and "entry parameters" in done.stdout
  assert "as 'broadcast" in done.stdout  # A loop's state, named after its init value.
  # A file that is not XLA's report is refused in one line, before anything is written.
  os.remove(out)
  done = subprocess.run(
    cmd + ["--xla-report", dumps["scanned_step"]], capture_output=True, text=True, check=False
  )
  assert done.returncode != 0 and not out.exists()
  assert done.stderr.count("\n") == 1 and "not an XLA buffer assignment" in done.stderr


@pytest.mark.slow
def test_a_scanned_transformer_step_imports_its_layers_as_loop_ops_and_msa_maps_it(tmp_path):
  """The bench's scanned transformer at a small size: its layers are two loops of one trip per
  layer; it is too big for tpu-v4i-like's HBM, which names presets that hold it; msa maps it
  on tpu-v4 through `solve PROGRAM.hlo`."""
  from malloczero.env.programs.scanned_transformer import TransformerShape, scanned_transformer_hlo

  shape = TransformerShape(layers=6, width=1024, heads=8, mlp=4096, sequence=2048, batch=8)
  path = tmp_path / "transformer.hlo"
  path.write_text(scanned_transformer_hlo(shape))
  w = _import(str(path)).workload
  assert {o.weight for o in w.ops} == {1, 6, 7}
  matmuls = [o for o in w.ops if o.weight == 6 and o.flops >= 2 * 8 * 2048 * 1024 * 1024]
  assert len(matmuls) >= 6 * 3  # Forward and backward of each projection, at least.
  env = dict(os.environ, MALLOCZERO_IMPORT_CACHE_DIR=str(tmp_path / "cache"))
  cmd = [sys.executable, "-m", "malloczero", "solve", str(path), "--solver", "msa", "--hardware"]
  refused = subprocess.run(cmd + ["tpu-v4i-like"], capture_output=True, text=True, env=env)
  assert refused.returncode != 0 and "presets that hold it: " in refused.stderr
  assert "tpu-v4 (" in refused.stderr and refused.stderr.count("\n") == 2  # An import note.
  mapped = subprocess.run(cmd + ["tpu-v4"], capture_output=True, text=True, env=env, check=True)
  assert "validated" in mapped.stdout and "using the import" in mapped.stderr


@pytest.mark.slow
def test_a_tensorflow_while_loop_matches_the_older_report_of_tensorflows_xla(tmp_path):
  """TensorFlow 2.8's XLA prints its module in schedule order without `is_scheduled=true`, no trip
  count, and an older buffer assignment (allocation addresses, no cumulative sizes)."""
  path = dump_tf_loop(str(tmp_path))
  with open(path, encoding="utf-8") as f:
    result = import_hlo_text(f.read(), "tf-loop", compile=False)
  assert any("while loop without a known trip count" in n for n in result.notes)
  assert result.workload.num_ops >= 3 and {o.weight for o in result.workload.ops} == {1}
  report = read_xla_report(report_beside(path))
  assert report.allocated and report.reported_peak_bytes
  comparison = compare_with_xla(result.workload, report)
  assert abs(comparison.ratio - 1) <= 0.001, comparison.lines


def test_a_memory_usage_report_alone_gives_xla_total_and_says_what_is_missing(dumps, tmp_path):
  report = report_beside(dumps["called_step"]).replace(
    "-buffer-assignment.txt", "-memory-usage-report.txt"
  )
  alone = tmp_path / os.path.basename(report)
  alone.write_text(open(report, encoding="utf-8").read())
  parsed = read_xla_report(str(alone))
  assert parsed.total_bytes > 0 and parsed.values == ()
  comparison = compare_with_xla(_import(dumps["called_step"]).workload, parsed)
  assert comparison.ratio is None
  assert any("no HloLiveRange section" in line for line in comparison.lines)


def test_the_generated_layered_step_flattens_to_the_size_asked_for():
  """The bench's 100,000-buffer program at a small size: layers in calls, scans as loops."""
  from malloczero.env.programs.synthetic_hlo import SCAN_EVERY, layered_step_hlo

  text = layered_step_hlo(2000, seed=1)
  assert text == layered_step_hlo(2000, seed=1)
  result = import_hlo_text(text, "layered")
  w = result.workload
  assert result.notes == () and 1800 <= w.num_buffers <= 2000
  assert not any(o.name.startswith(("call", "fwd_", "bwd_", "scan_")) for o in w.ops)
  # Each scan: the condition's compare and the body's counter, step and in-place save.
  scans = (2000 // 14) // SCAN_EVERY
  assert len([o for o in w.ops if o.weight > 1]) == 4 * scans


COMMAND_BUFFER = """HloModule gpu_step, is_scheduled=true

%add (p0: f32[], p1: f32[]) -> f32[] {
  %p0 = f32[] parameter(0)
  %p1 = f32[] parameter(1)
  ROOT %sum = f32[] add(%p0, %p1)
}

%fused_scale (f0: f32[1024]) -> f32[1024] {
  %f0 = f32[1024]{0} parameter(0)
  ROOT %twice = f32[1024]{0} add(%f0, %f0)
}

%command_buffer (c0: f32[1024], c1: (f32[1024], f32[1024])) -> (f32[1024], f32[1024]) {
  %c0 = f32[1024]{0} parameter(0)
  %c1 = (f32[1024]{0}, f32[1024]{0}) parameter(1)
  %w = f32[1024]{0} get-tuple-element(%c1), index=0
  %fusion = f32[1024]{0} fusion(%c0), kind=kLoop, calls=%fused_scale
  %start = f32[1024]{0} all-reduce-start(%fusion), replica_groups={{0,1}}, to_apply=%add
  %done = f32[1024]{0} all-reduce-done(%start)
  %fusion.1 = f32[1024]{0} fusion(%done), kind=kLoop, calls=%fused_scale
  ROOT %tuple = (f32[1024]{0}, f32[1024]{0}) tuple(%fusion.1, %w)
}

ENTRY %main (a: f32[1024], b: (f32[1024], f32[1024])) -> f32[1024] {
  %a = f32[1024]{0} parameter(0)
  %b = (f32[1024]{0}, f32[1024]{0}) parameter(1)
  %call = (f32[1024]{0}, f32[1024]{0}) call(%a, %b), to_apply=%command_buffer
  %get-tuple-element = f32[1024]{0} get-tuple-element(%call), index=0
  %get-tuple-element.1 = f32[1024]{0} get-tuple-element(%call), index=1
  ROOT %custom-call = f32[1024]{0} custom-call(%get-tuple-element, %get-tuple-element.1), custom_call_target="some target"
}
"""


def test_a_gpu_command_buffer_is_a_call_whose_instructions_are_the_ops():
  """XLA:GPU outlines a stretch of a step into `call(...), to_apply=%command_buffer`
  (xla/service/gpu/transforms/command_buffer_scheduling.cc); its instructions, async collectives
  included, are the program's ops."""
  w, notes = _both_parsers(COMMAND_BUFFER)
  assert _ops(w) == [("fusion", 1), ("start", 1), ("done", 1), ("fusion.1", 1), ("custom-call", 1)]
  t = {o.name: i for i, o in enumerate(w.ops)}
  # The call's operands reach the ops inside: `a` read by the first fusion, `b{0}` passed
  # through the command buffer to the custom call; the all-reduce keeps its operand to the done.
  assert _buffer(w, "a").uses == (t["fusion"],)
  assert _buffer(w, "b{0}").uses == (t["custom-call"],) and _buffer(w, "b{1}").uses == ()
  assert _buffer(w, "fusion").uses == (t["start"], t["done"])
  assert _buffer(w, "fusion.1").uses == (t["custom-call"],)
  assert any("custom-call 'some target'" in n for n in notes)
