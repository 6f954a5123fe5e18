"""XLA import: real programs compiled by XLA on CPU become valid workloads.

Checks flops against the analytic count and against XLA's own cost analysis, bytes and live
ranges against XLA's own memory analysis, one-line errors for malformed HLO, the JSON round
trip, and that the imported workloads can be played.
"""

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from malloczero.common.errors import WorkloadError
from malloczero.env.game import MallocGame
from malloczero.env.hardware import PRESETS
from malloczero.env.programs.hlo_import import (SMALL_CONSTANT_BYTES, import_hlo_text,
                                                workload_from_hlo_text, workload_from_jax)
from malloczero.env.programs.hlo_import.convert import convert_module
from malloczero.env.programs.hlo_import.from_text import parse_module
from malloczero.env.programs.hlo_import.notes import Notes
from malloczero.env.programs.synthetic import contended
from malloczero.env.workload import Workload, load_workload, save_workload

BATCH = 8
DIMS = (32, 64, 64, 10)  # Three dense layers.


def _mlp(params, x):
  for w, b in params[:-1]:
    x = jax.nn.relu(x @ w + b)
  w, b = params[-1]
  return x @ w + b


def _loss(params, x, y):
  return jnp.mean((_mlp(params, x) - y) ** 2)


def _train_step(params, x, y):
  grads = jax.grad(_loss)(params, x, y)
  return jax.tree_util.tree_map(lambda p, g: p - 0.1 * g, params, grads)


def _mlp_args(batch=BATCH, dims=DIMS):
  params = [(jnp.ones((a, b), jnp.float32), jnp.ones((b,), jnp.float32))
            for a, b in zip(dims[:-1], dims[1:])]
  return params, jnp.ones((batch, dims[0])), jnp.ones((batch, dims[-1]))


def _matmul_flops(batch=BATCH, dims=DIMS, training=False):
  """Forward: 2*B*in*out per layer. Backward: the weight gradient of every layer, and the
  input gradient of every layer but the first (x needs no gradient)."""
  layers = [2 * batch * a * b for a, b in zip(dims[:-1], dims[1:])]
  return sum(layers) + (sum(layers) + sum(layers[1:]) if training else 0)


@pytest.fixture(scope="module")
def mlp_forward():
  params, x, _ = _mlp_args()
  return workload_from_jax(_mlp, params, x, name="mlp-forward")


@pytest.fixture(scope="module")
def mlp_step():
  params, x, y = _mlp_args()
  return workload_from_jax(_train_step, params, x, y, name="mlp-train-step")


def _conv(x, k, stride=1, groups=1):
  return jax.lax.conv_general_dilated(x, k, (stride, stride), "SAME",
                                      dimension_numbers=("NHWC", "HWIO", "NHWC"),
                                      feature_group_count=groups)


def _cnn(params, x):
  h = jax.nn.relu(_conv(x, params[0]))
  h = jax.nn.relu(_conv(h, params[1], stride=2))
  return _conv(h, params[2], groups=4).mean()


CNN_PARAMS = [jax.ShapeDtypeStruct(s, jnp.float32) for s in
              [(3, 3, 3, 16), (3, 3, 16, 32), (3, 3, 8, 32)]]
CNN_INPUT = jax.ShapeDtypeStruct((4, 32, 32, 3), jnp.float32)
# 2 * N * Ho * Wo * Cout * KH * KW * (Cin per group), per convolution.
CNN_CONV_FLOPS = [2 * 4 * 32 * 32 * 16 * 9 * 3, 2 * 4 * 16 * 16 * 32 * 9 * 16,
                  2 * 4 * 16 * 16 * 32 * 9 * 8]


@pytest.fixture(scope="module")
def cnn_forward():
  return workload_from_jax(_cnn, CNN_PARAMS, CNN_INPUT, name="cnn-forward")


# ----------------------------------------------------------------------------- 1. flops, sizes


@pytest.mark.parametrize("case, training", [("mlp_forward", False), ("mlp_step", True)])
def test_mlp_imports_with_matmul_flops(request, case, training):
  w, stats = request.getfixturevalue(case)
  assert w.num_ops > 0 and w.source.startswith("xla-hlo")
  assert all(b.size > 0 for b in w.buffers)
  analytic = _matmul_flops(training=training)
  total = w.arrays.flops.sum()
  # The matmuls dominate; bias adds, ReLUs and the SGD update are the few % on top.
  assert analytic <= total <= 1.25 * analytic, (total, analytic)
  # The dot ops alone are exactly the analytic count.
  assert sum(o.flops for o in w.ops if o.name.startswith("dot")) == analytic
  # And the whole program agrees with XLA's own cost analysis.
  assert total == pytest.approx(stats["xla_flops"], rel=0.01)
  kinds = {b.kind for b in w.buffers}
  assert {"parameter", "output"} <= kinds
  if training:  # The ROOT is a tuple: one output per parameter array.
    assert sum(b.kind == "output" for b in w.buffers) == 2 * (len(DIMS) - 1)


# ----------------------------------------------------------------------------- 2. peak bytes


def _activation_peak(w: Workload) -> int:
  """Peak bytes of the buffers the program itself creates (activations and outputs)."""
  a = w.arrays
  made = ~a.is_prefetched
  delta = np.zeros(w.num_ops + 1, np.int64)
  np.add.at(delta, a.live_start[made], a.sizes[made])
  np.add.at(delta, a.live_end[made], -a.sizes[made])
  return int(np.cumsum(delta)[:-1].max())


def _memory_disagreements(w: Workload, stats: dict) -> list[str]:
  """How the workload disagrees with XLA's memory analysis (empty = agrees).

  What was found empirically (MLPs and CNNs, forward and training steps, on CPU):
  * XLA's argument bytes are exactly the parameter buffers, and its output bytes exactly the
    output buffers plus an 8-byte pointer per element of a tuple-shaped result.
  * XLA's total (argument + output + temp) differs from `peak_live_bytes` for three known
    reasons: XLA keeps every entry parameter allocated for the whole program while the
    workload frees a parameter after its last use (workload lower); outputs and temporaries
    are separate XLA allocations, so XLA pays max(outputs) + max(temps) rather than
    max(outputs + temps) (workload lower); XLA writes an elementwise op's result in place into
    a dead operand of the same size, e.g. the updated weight into its gradient's buffer, and
    the workload keeps logical tensors apart (workload higher). For this 3-layer MLP at batch
    8 the net effect is -7% (forward) and +0.5% (training step); we allow 10%. (For training
    steps whose weight matrices are large, in-place updates make the workload up to ~45% higher.)
  * The bytes the program creates (activations + outputs, the part that depends on live
    ranges) against XLA's output + temp: 0.93 (forward) and 1.10 (step, the in-place
    gradient buffers); we allow 15%. Buffers kept live to the end of the program double it and
    buffers freed at their definition lose 20-55%, so wrong live ranges fail this check (the
    test below builds both mutants and asserts that they are rejected).
  """
  problems = []
  a = w.arrays
  params = int(a.sizes[a.is_prefetched].sum())
  outputs = int(a.sizes[a.is_output].sum())
  num_outputs = int(a.is_output.sum())
  if params != stats["argument_size_in_bytes"]:
    problems.append(f"parameter bytes {params} != XLA argument bytes "
                    f"{stats['argument_size_in_bytes']}")
  pointer_table = stats["output_size_in_bytes"] - outputs
  if pointer_table not in (0, 8 * num_outputs):
    problems.append(f"output bytes {outputs} vs XLA {stats['output_size_in_bytes']}")
  if not a.sizes.max() <= w.peak_live_bytes <= a.sizes.sum():
    problems.append(f"peak {w.peak_live_bytes} outside [largest buffer, sum of buffers]")
  if abs(w.peak_live_bytes / stats["total_bytes"] - 1) > 0.10:
    problems.append(f"peak {w.peak_live_bytes} vs XLA total {stats['total_bytes']}: more "
                    "than 10% apart")
  made = stats["output_size_in_bytes"] - pointer_table + stats["temp_size_in_bytes"]
  if abs(_activation_peak(w) / made - 1) > 0.15:
    problems.append(f"activation peak {_activation_peak(w)} vs XLA output + temp {made}: more "
                    "than 15% apart")
  return problems


def _with_uses(w: Workload, uses_of) -> Workload:
  buffers = tuple(b if b.kind in ("parameter", "input") else dataclasses.replace(
      b, uses=uses_of(b, w.num_ops)) for b in w.buffers)
  return dataclasses.replace(w, buffers=buffers)


@pytest.mark.parametrize("case", ["mlp_forward", "mlp_step"])
def test_peak_live_bytes_agrees_with_xla_memory_analysis(request, case):
  w, stats = request.getfixturevalue(case)
  assert _memory_disagreements(w, stats) == []
  # The check is real: the same program with wrong live ranges is rejected.
  forever = _with_uses(w, lambda b, t: tuple(range(b.def_op + 1, t)))
  at_definition = _with_uses(w, lambda b, t: ())
  assert _memory_disagreements(forever, stats)
  assert _memory_disagreements(at_definition, stats)


# ----------------------------------------------------------------------------- 3. loops, convs


def test_scan_imports_with_trip_count():
  def scanned(w, x):
    return jax.lax.scan(lambda c, _: (jnp.tanh(c @ w), None), x, None, length=5)[0]

  w, _ = workload_from_jax(scanned, jnp.ones((16, 16)), jnp.ones((8, 16)), name="scan")
  loops = [o for o in w.ops if o.name.startswith("while")]
  assert len(loops) == 1
  body_matmul = 2 * 8 * 16 * 16
  # XLA printed known_trip_count=5: the body counts five times.
  assert 5 * body_matmul <= loops[0].flops <= 1.25 * 5 * body_matmul


def test_data_dependent_while_loop_counts_its_body_once():
  def loop(x):
    return jax.lax.while_loop(lambda c: c.sum() < 100.0, lambda c: jnp.tanh(c @ c) + 1.0, x)

  w, _ = workload_from_jax(loop, jnp.ones((8, 8)), name="while")
  assert w.arrays.flops.sum() > 0
  loops = [o for o in w.ops if o.name.startswith("while")]
  assert len(loops) == 1 and 2 * 8 * 8 * 8 <= loops[0].flops <= 1.25 * 2 * 8 * 8 * 8


def test_conv_flops_match_analytic(cnn_forward):
  w, stats = cnn_forward
  convs = [o for o in w.ops if o.name.startswith("convolution")]  # A chain: schedule order.
  assert len(convs) == 3
  # The analytic count includes the kernel taps that fall on SAME padding; XLA's (and ours)
  # does not, which is 4-8% less here.
  for op, analytic in zip(convs, CNN_CONV_FLOPS):
    assert 0.75 * analytic <= op.flops <= analytic, (op, analytic)
  total = w.arrays.flops.sum()
  assert 0.75 * sum(CNN_CONV_FLOPS) <= total <= 1.25 * sum(CNN_CONV_FLOPS)
  assert total == pytest.approx(stats["xla_flops"], rel=0.01)


def test_conv_gradient_flops_match_xla_cost_analysis():
  # Input gradients of strided convolutions are lhs-dilated convolutions: counting the holes
  # would give 4x the real work.
  w, stats = workload_from_jax(jax.grad(_cnn), CNN_PARAMS, CNN_INPUT, name="cnn-grad")
  f1, f2, f3 = CNN_CONV_FLOPS
  analytic = 2 * (f1 + f2 + f3) + f2 + f3  # Forward + weight gradients + input gradients 2, 3.
  assert 0.75 * analytic <= w.arrays.flops.sum() <= 1.25 * analytic
  assert w.arrays.flops.sum() == pytest.approx(stats["xla_flops"], rel=0.01)


# ----------------------------------------------------------------------------- rules, by hand

_BIG = ", ".join("{" + ",".join(str(r * 16 + c) for c in range(16)) + "}" for r in range(8))
HANDMADE = f"""HloModule handmade, is_scheduled=true

%fused_add (p0: f32[4,4], p1: f32[4,4]) -> f32[4,4] {{
  %p0 = f32[4,4]{{1,0}} parameter(0)
  %p1 = f32[4,4]{{1,0}} parameter(1)
  ROOT %add = f32[4,4]{{1,0}} add(%p0, %p1), metadata={{op_name="calls=%nowhere"}}
}}

ENTRY %main (a: f32[4,4], b: (f32[4,8], s32[])) -> (f32[4,4], f32[4,16], /*index=2*/f32[4,4]) {{
  %a = f32[4,4]{{1,0}} parameter(0)
  %b = (f32[4,8]{{1,0}}, s32[]) parameter(1)
  %b0 = f32[4,8]{{1,0}} get-tuple-element(%b), index=0
  %small = f32[] constant(2)
  %weights = f32[8,16]{{1,0}} constant({{ {_BIG} }})
  %empty = f32[0,4]{{1,0}} broadcast(%small), dimensions={{}}
  %mm = f32[4,16]{{1,0}} custom-call(%b0, %weights), custom_call_target="__onednn$matmul"
  %cs = (f32[4,4]{{1,0}}, f32[4,4]{{1,0}}, u32[]) copy-start(%a)
  %cd = f32[4,4]{{1,0}} copy-done(%cs)
  %bc = f32[16]{{0}} bitcast(%cd)
  %fus = f32[4,4]{{1,0}} fusion(%cd, %a), kind=kLoop, calls=%fused_add
  %tok = token[] after-all()
  %mystery = f32[4,4]{{1,0}} custom-call(%fus, %bc), custom_call_target="my_thing"
  ROOT %t = (f32[4,4]{{1,0}}, f32[4,16]{{1,0}}, f32[4,4]{{1,0}}) tuple(%mystery, %mm, /*index=2*/%a)
}}
"""


def test_handmade_module_follows_the_documented_rules():
  w = workload_from_hlo_text(HANDMADE, "handmade")
  ops = {o.name: o.flops for o in w.ops}
  # Aliases (GTE, bitcast, tuple, copy-start/done, after-all) and constants are not ops.
  assert list(ops) == ["empty", "mm", "fus", "mystery"]
  assert ops == {"empty": 0.0, "mm": 2 * 4 * 8 * 16, "fus": 16.0, "mystery": 0.0}
  bufs = {b.name: b for b in w.buffers}
  # One buffer per leaf of a tuple parameter; the zero-size result and the small constant
  # have none; the large constant is a parameter.
  assert set(bufs) == {"a", "b{0}", "b{1}", "weights", "mm", "fus", "mystery"}
  assert 4 * 8 * 16 > SMALL_CONSTANT_BYTES >= 4
  assert bufs["weights"].kind == "parameter" and bufs["weights"].size == 8 * 16 * 4
  assert bufs["b{1}"].size == 4 and bufs["b{1}"].uses == ()
  # ROOT leaves are outputs, except the one that is a parameter.
  assert bufs["a"].kind == "parameter"
  assert bufs["mm"].kind == bufs["mystery"].kind == "output"
  assert bufs["fus"].kind == "activation"
  # A use through copy-done or bitcast is a use of the aliased buffer.
  t = {name: i for i, name in enumerate(ops)}
  assert bufs["a"].uses == (t["fus"], t["mystery"])
  assert bufs["b{0}"].uses == bufs["weights"].uses == (t["mm"],)
  assert bufs["fus"].uses == (t["mystery"],)


# ----------------------------------------------------------------------------- 4. errors


@pytest.fixture(scope="module")
def forward_text():
  params, x, _ = _mlp_args()
  return jax.jit(_mlp).lower(params, x).compile().as_text()


def _one_line_error(text):
  with pytest.raises(WorkloadError) as info:
    workload_from_hlo_text(text, "bad")
  message = str(info.value)
  assert message and "\n" not in message and message.startswith("bad")
  return message


def test_malformed_hlo_is_a_one_line_error(forward_text):
  assert "empty" in _one_line_error("")
  assert "empty" in _one_line_error("  \n\n")
  # XLA's parser takes the last computation as the entry when none is marked ENTRY.
  assert workload_from_hlo_text(forward_text.replace("ENTRY ", ""), "bad") == (
      workload_from_hlo_text(forward_text, "bad"))
  assert "ENTRY" in _one_line_error("HloModule nothing_here\n")
  assert "unknown operand 'dot.99'" in _one_line_error(
      forward_text.replace("(%dot.20, %Arg_3.4)", "(%dot.99, %Arg_3.4)"))
  assert "unparseable" in _one_line_error(
      forward_text.replace("%dot.20 = f32[8,64]{1,0} dot(", "%dot.20 = f32[8,64 dot("))
  assert "truncated" in _one_line_error(forward_text[:forward_text.rindex("ROOT")])
  assert "unknown computation" in _one_line_error(
      forward_text.replace("calls=%fused_computation.1,", "calls=%fused_computation.77,"))


def test_every_truncation_is_a_one_line_error_or_says_what_was_taken(forward_text):
  end = forward_text.rindex("}")  # Cut anywhere before the ENTRY computation closes.
  for cut in range(0, end, 23):
    try:
      result = import_hlo_text(forward_text[:cut], "bad", compile=False)
    except WorkloadError as e:
      assert "\n" not in str(e) and str(e).startswith("bad")
    else:  # A cut just after a whole computation is a module XLA accepts: it says so.
      assert any("no computation is marked ENTRY" in n for n in result.notes)


@settings(max_examples=60, deadline=None)
@given(data=st.data())
def test_corrupted_hlo_never_crashes(forward_text, data):
  text = forward_text
  for _ in range(data.draw(st.integers(1, 3))):
    i = data.draw(st.integers(0, len(text) - 1))
    junk = data.draw(st.sampled_from(["", "(", ")", "{", "}", ",", "%", "=", "x", "9", "\n",
                                      "[", "]", "f32[]", "tuple(", " ROOT "]))
    text = text[:i] + junk + text[i + 1:]
  try:
    w = workload_from_hlo_text(text, "fuzz")
  except WorkloadError as e:
    assert "\n" not in str(e)
  else:
    assert w.num_ops > 0


def test_uncompilable_function_is_a_one_line_error():
  with pytest.raises(WorkloadError) as info:
    workload_from_jax(lambda a, b: a @ b, jnp.ones((2, 3)), jnp.ones((2, 3)), name="bad-shapes")
  assert "\n" not in str(info.value) and str(info.value).startswith("bad-shapes")


# ----------------------------------------------------------------------------- 5. files, game


@pytest.mark.parametrize("case", ["mlp_forward", "mlp_step", "cnn_forward"])
def test_json_round_trip(request, tmp_path, case):
  w, _ = request.getfixturevalue(case)
  for path in (tmp_path / "w.json", tmp_path / "w.json.gz"):
    save_workload(w, path)
    assert load_workload(path) == w


@pytest.mark.parametrize("case", ["mlp_forward", "mlp_step", "cnn_forward"])
def test_imported_workloads_play_in_the_game(request, case):
  w, _ = request.getfixturevalue(case)
  game = MallocGame(w, contended(PRESETS["tpu-v4i-like"], w, 0.25))
  step = game.reset()
  moves = 0
  while not step.last():
    step = game.step(int(np.flatnonzero(game.legal_actions)[-1]))
    moves += 1
  assert moves == len(game.requests) > 0


# ----------------------------------------------------------------------------- 6. parsers


def _both_parsers(text, name="m"):
  """The workload from XLA's parser (with its notes) and from the hand-written fallback."""
  notes = Notes()
  primary = parse_module(text, name, notes)
  fallback = parse_module(text, name, Notes(), use_xla=False)
  assert primary.parser == "xla" and fallback.parser == "text"
  return (convert_module(primary, name, "xla-hlo", notes),
          convert_module(fallback, name, "xla-hlo", notes), notes.all())


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


def test_hlo_pb2_is_read_without_importing_tensorflow():
  """Importing the importer loads no XLA library; reading TensorFlow's hlo_pb2 descriptors
  (about 0.03 s) does not run `tensorflow/__init__.py` (about 1.8 s)."""
  import subprocess
  import sys
  code = ("import sys, time; from malloczero.env.programs.hlo_import import xla_proto as h; "
          "heavy = lambda: sorted(m for m in ('tensorflow', 'jax', 'jaxlib') if m in sys.modules); "
          "print(heavy()); t = time.perf_counter(); h.hlo_module_proto(); "
          "print(time.perf_counter() - t); print(heavy())")
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
  assert len(result.notes) == 1 and "not scheduled: compiled it with XLA on the CPU" in (
      result.notes[0])
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
  assert list(t) == ["ags", "agd", "ars", "ard", "cps", "cpd", "as", "ad", "send", "send-done",
                     "recv", "recv-done", "neg"]
  # Collectives move data: 0 flops (the all-reduce's reducer is not counted either).
  assert [o.flops for o in w.ops] == [0.0] * 12 + [8 * 64]
  # Each start defines its result ({1} of its tuple); the done defines nothing.
  b = {x.name: x for x in w.buffers}
  assert {k: v.size for k, v in b.items()} == {
      "w": 1024, "ags{1}": 2048, "ars": 2048, "cps{1}": 2048, "as{1}": 2048, "recv{0}": 1024,
      "neg": 2048}
  # A done keeps the start's operands and results live, moving nothing (0-byte uses).
  assert b["w"].uses == (t["ags"], t["agd"], t["send"], t["send-done"])
  assert b["w"].use_bytes == (1024, 0, 1024, 0)
  assert b["ags{1}"].uses == (t["agd"], t["ars"], t["ard"])
  assert b["as{1}"].uses == (t["ad"], t["neg"])
  assert b["recv{0}"].kind == b["neg"].kind == "output"
  # Live: w [0, 10), ags{1} [0, 4), ars [2, 6), cps{1} [4, 8), as{1} [6, 13), recv{0}
  # [10, 13), neg [12, 13): at most three of them at any op, e.g. w + ags{1} + ars at op 2.
  assert w.peak_live_bytes == 1024 + 2048 + 2048
  assert w.arrays.incidence_bytes.sum() == 2 * 1024 + 4 * (2 * 2048) + 1024 + 2048


def test_variadic_all_reduce_start_defines_all_its_results():
  """Unlike the other starts, an all-reduce-start's tuple is its results, not (operands,
  results); the done keeps every leaf live without moving it."""
  text = ASYNC_COLLECTIVES.split("ENTRY")[0] + """ENTRY %main (a: f32[8], b: f32[16]) -> (f32[8], f32[16]) {
  %a = f32[8]{0} parameter(0)
  %b = f32[16]{0} parameter(1)
  %s = (f32[8]{0}, f32[16]{0}) all-reduce-start(%a, %b), replica_groups={{0,1}}, to_apply=%add
  ROOT %d = (f32[8]{0}, f32[16]{0}) all-reduce-done(%s)
}
"""
  w, fallback, _ = _both_parsers(text)
  assert w == fallback
  b = {x.name: x for x in w.buffers}
  assert {k: (v.size, v.kind, v.uses, v.use_bytes) for k, v in b.items()} == {
      "a": (32, "parameter", (0, 1), (32, 0)), "b": (64, "parameter", (0, 1), (64, 0)),
      "s{0}": (32, "output", (1,), (0,)), "s{1}": (64, "output", (1,), (0,))}


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
  w, _ = workload_from_jax(lookup, jax.ShapeDtypeStruct((4096, 64), jnp.float32),
                           jax.ShapeDtypeStruct((32,), jnp.int32),
                           jax.ShapeDtypeStruct((32, 64), jnp.float32), name="lookup")
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
    game = MallocGame(w, hw)
    step, total = game.reset(), 0.0
    while not step.last():
      step = game.step(int(np.flatnonzero(game.legal_actions)[-1]))
      total += step.reward
    mapping = game.mapping("last-candidate")
    validate_mapping(w, hw, mapping)  # Its times equal a fresh cost-model evaluation.
    assert total == pytest.approx(1 - 1 / mapping.speedup, abs=1e-9)
