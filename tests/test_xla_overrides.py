"""XLA's msa overrides (env/msa/xla_proto.py, overrides.py, export_overrides.py): the committed
descriptor is the installed jaxlib's; the sort-order and preferred-prefetch overrides are matched
as XLA's utils.cc matches them; `solve --xla-overrides` writes files XLA's own text-format parser
for those messages reads, and msa reading them back reproduces a mapping whose deviations from
msa are prefetch starts."""

import json
import os
import re

import numpy as np
import pytest

from tests.command_line import REPO, run_main

WORKLOADS = os.path.join(REPO, "env", "programs", "data", "workloads")


def _workload(name="tiny-vgg-b1-infer"):
  from malloczero.env import load_workload

  return load_workload(os.path.join(WORKLOADS, f"{name}.json.gz"))


def _jaxlib_messages():
  """The override message classes built from the descriptor jaxlib carries (not the committed
  copy), as the protobuf module XLA's Python bindings would generate."""
  import importlib.util

  from google.protobuf import descriptor_pb2, descriptor_pool, message_factory

  spec = importlib.util.spec_from_file_location(
    "xla_msa_descriptor", os.path.join(REPO, "scripts", "xla_msa_descriptor.py")
  )
  script = importlib.util.module_from_spec(spec)
  spec.loader.exec_module(script)
  blob = script.jaxlib_descriptor()
  pool = descriptor_pool.DescriptorPool()
  pool.Add(descriptor_pb2.FileDescriptorProto.FromString(blob))
  factory = message_factory.MessageFactory(pool)
  package = "xla.memory_space_assignment"
  return blob, {
    name: factory.GetPrototype(pool.FindMessageTypeByName(f"{package}.{name}"))
    for name in ("MsaSortOrderOverrides", "PreferredPrefetchOverrides")
  }


def test_the_committed_descriptor_is_the_one_the_installed_jaxlib_carries():
  from malloczero.env.msa.xla_proto import DESCRIPTOR

  blob, _ = _jaxlib_messages()
  with open(DESCRIPTOR, "rb") as f:
    assert f.read() == blob


def _regex(name):
  """`name` as a regex in a text proto's string (its backslashes escaped)."""
  return re.escape(name).replace("\\", "\\\\")


def _sort_order(text):
  from malloczero.env.msa.xla_proto import SORT_ORDER, parse_text

  return parse_text(text, SORT_ORDER, "test")


def _prefetch(text):
  from malloczero.env.msa.xla_proto import PREFERRED_PREFETCH, parse_text

  return parse_text(text, PREFERRED_PREFETCH, "test")


def test_sort_order_priorities_follow_xlas_first_match_rules():
  from malloczero.env.msa.overrides import INT64_MAX, INT64_MIN, sort_order_priorities

  w = _workload("tiny-mlp-b2-train")
  names = [b.name for b in w.buffers]
  overrides = _sort_order(
    # Arg_1.2 first; every Arg_ of 128 bytes last (Arg_0.1 is matched first by the next one:
    # the first match decides); a partial name matches nothing (FullMatch); no option: skipped.
    'overrides { hlo_position_matcher { instruction_name_regex: "Arg_1\\\\.2" } '
    "override_options { assign_first: true } }"
    'overrides { hlo_position_matcher { instruction_name_regex: "Arg_0\\\\.1" } }'
    'overrides { hlo_position_matcher { instruction_name_regex: "Arg_.*" size_lte: 128 '
    "size_gte: 128 } override_options { assign_last: true } }"
    'overrides { hlo_position_matcher { instruction_name_regex: "Arg_3" } '
    "override_options { assign_first: true } }"
  )
  priority = sort_order_priorities(overrides, w)
  assert priority[names.index("Arg_1.2")] == INT64_MIN
  last = [i for i, b in enumerate(w.buffers) if b.name.startswith("Arg_") and b.size == 128]
  assert last and all(priority[i] == INT64_MAX - 2 for i in last)
  assert names.index("Arg_0.1") in last
  assert priority[names.index("Arg_3.4")] == 0
  assert np.count_nonzero(priority) == 1 + len(last)

  from malloczero.env.msa.overrides import buffer_position

  assert buffer_position("while.1{2,0}") == ("while.1", (2, 0))
  assert buffer_position("dot.49") == ("dot.49", ())


def test_msa_allocates_assign_first_buffers_first_and_assign_last_ones_last(tmp_path):
  from malloczero.env.msa.algorithm import MsaAlgorithm, MsaOptions
  from malloczero.env.programs.suites import get_suite

  entry = next(e for e in get_suite("tiny").entries if e.program == "tiny-mlp-b2-train")
  w, hw = entry.load()
  plain = MsaAlgorithm(w, hw).allocation_order()
  first, last = plain[-1], plain[0]
  file = tmp_path / "order.textproto"
  file.write_text(
    "".join(
      f'overrides {{ hlo_position_matcher {{ instruction_name_regex: "{_regex(w.buffers[b].name)}" '
      f"}} override_options {{ {kind}: true }} }}\n"
      for b, kind in ((first, "assign_first"), (last, "assign_last"))
    )
  )
  algorithm = MsaAlgorithm(w, hw, MsaOptions(sort_order_overrides=str(file)))
  order = algorithm.allocation_order()
  assert order[0] == first and order[-1] == last and order[1:-1] == plain[1:-1]
  jitted = algorithm.run()
  assert algorithm.jitted
  # The Python decision process, answered with msa's own choices, takes the same order.
  python = MsaAlgorithm(w, hw, MsaOptions(sort_order_overrides=str(file))).run(jitted=False)
  assert np.array_equal(python.buffer, jitted.buffer) and np.array_equal(python.start, jitted.start)
  assert not np.array_equal(jitted.buffer, MsaAlgorithm(w, hw).run().buffer)


def test_preferred_prefetch_times_follow_xlas_rules():
  from malloczero.env.msa.overrides import preferred_prefetch_times

  w = _workload("tiny-vgg-b1-infer")
  ops = [op.name for op in w.ops]
  b = next(b for b in w.buffers if b.uses and b.uses[-1] >= 6)
  use = b.uses[-1]
  user, first, fourth = _regex(ops[use]), _regex(ops[0]), _regex(ops[3])
  times = preferred_prefetch_times(
    _prefetch(
      # Out of the window for an earliest start of 2 (before_instruction op 0: time -1), so the
      # next matching override decides: eagerness 0.5, truncated toward the earliest start.
      f'overrides {{ hlo_operand_filter {{ instruction_name_regex: "{user}" size_gte: {b.size} }} '
      f'override_options {{ before_instruction {{ instruction_name_regex: "{first}" }} }} }}'
      f'overrides {{ hlo_operand_filter {{ instruction_name_regex: "{user}" }} '
      "override_options { prefetch_eagerness: 0.5 } }"
    ),
    w,
  )
  assert times.time(b.id, use, 2) == 2 + (use - 2) // 2
  assert times.time(b.id, use, -1) == -1  # The first override is in the window from -1.
  after = preferred_prefetch_times(
    _prefetch(
      f'overrides {{ hlo_operand_filter {{ instruction_name_regex: "{user}" '
      f"size_lte: {b.size - 1} }} override_options {{ prefetch_eagerness: 1 }} }}"
      f'overrides {{ hlo_operand_filter {{ instruction_name_regex: "{user}" }} '
      f'override_options {{ after_instruction {{ instruction_name_regex: "{fourth}" }} }} }}'
    ),
    w,
  )
  assert after.time(b.id, use, 0) == 3  # The size bound leaves the first override out.
  assert after.time(b.id, use, 4) is None  # Op 3 is before the earliest start: dropped.


def _case(filter_text, options_text, said):
  return (
    f"overrides {{ hlo_operand_filter {{ {filter_text} }} override_options {{ {options_text} }} }}",
    said,
  )


EAGER = "prefetch_eagerness: 0.5"
REFUSED = [
  _case("operand_number: 1", EAGER, "operand_number matches operand slots"),
  _case(
    'instruction_regex: ".*"', EAGER, "instruction_regex matches the instruction's printed HLO"
  ),
  _case(
    'instruction_name_regex: ".*"',
    'after_instruction { instruction_name_regex: "nosuch" }',
    "no op of the program is named to match 'nosuch'",
  ),
  _case('instruction_name_regex: "("', EAGER, "bad regex '('"),
  _case("", "prefetch_eagerness: 1.5", "prefetch_eagerness must be in [0, 1]"),
  ("overrides { bogus: 1 }", 'has no field named "bogus"'),
]


@pytest.mark.parametrize("text, said", REFUSED)
def test_overrides_the_workload_cannot_evaluate_are_refused_in_one_line(
  tmp_path, capsys, text, said
):
  file = tmp_path / "p.textproto"
  file.write_text(text)
  workload = os.path.join(WORKLOADS, "tiny-vgg-b1-infer.json.gz")
  code, _, err = run_main(
    capsys, "solve", workload, "--hardware", "tpu-v4i-like", "--capacity", "16384",
    "--msa-option", f"preferred_prefetch_overrides={file}",
  )  # fmt: skip
  assert code == 1 and err.count("\n") == 1 and said in err, err


def test_solve_exports_overrides_xla_parses_and_msa_reproduces_the_mapping(tmp_path, capsys):
  """evo-msa's deviations on this entry are all prefetch starts, which the overrides express."""
  from google.protobuf import text_format

  workload = os.path.join(WORKLOADS, "tiny-vgg-b1-infer.json.gz")
  machine = ("--hardware", "tpu-v4i-like", "--capacity", "14336")  # Its tiny suite entry's.
  stem = tmp_path / "found"
  code, out, err = run_main(
    capsys, "solve", workload, *machine, "--solver", "evo-msa", "--decodes", "40",
    "--seed", "1", "--out", tmp_path / "found.json", "--xla-overrides", f"{stem}.textproto",
  )  # fmt: skip
  assert code == 0, err
  prefetch = tmp_path / "found.preferred_prefetch.textproto"
  order = tmp_path / "found.sort_order.textproto"
  assert f"wrote {prefetch} (" in out and f"{order} (0 buffers allocated last)" in out
  _, messages = _jaxlib_messages()
  parsed = text_format.Parse(prefetch.read_text(), messages["PreferredPrefetchOverrides"]())
  text_format.Parse(order.read_text(), messages["MsaSortOrderOverrides"]())
  assert len(parsed.overrides) >= 1
  for override in parsed.overrides:
    assert override.hlo_operand_filter.instruction_name_regex
    assert override.override_options.WhichOneof("options") in (
      "after_instruction",
      "before_instruction",
    )

  code, out, err = run_main(
    capsys, "solve", workload, *machine, "--out", tmp_path / "back.json",
    "--msa-option", f"preferred_prefetch_overrides={prefetch}",
    "--msa-option", f"sort_order_overrides={order}",
  )  # fmt: skip
  assert code == 0, err
  code, _, err = run_main(capsys, "solve", workload, *machine, "--out", tmp_path / "msa.json")
  assert code == 0, err
  times = {
    name: json.loads((tmp_path / f"{name}.json").read_text())["estimated_time_s"]
    for name in ("found", "back", "msa")
  }
  assert times["found"] < times["msa"] * 0.99  # The search found a gain worth exporting.
  assert times["back"] == pytest.approx(times["found"], rel=0.01)
