"""Workload files: round trips and one-line errors for every kind of malformed input."""

import csv
import gzip
import io
import json

import numpy as np
import pytest
from hypothesis import given

import malloczero.env.workload_json as workload_json
from malloczero.env import WorkloadError, load_workload, save_workload
from malloczero.env.minimalloc_csv import workload_from_minimalloc_csv, workload_to_minimalloc_csv
from malloczero.env.workload import Op, Workload
from malloczero.env.workload_json import workload_from_dict, workload_to_dict
from tests.strategies import workloads

GOOD = {
  "name": "tiny",
  "source": "hand",
  "ops": [{"name": "a", "flops": 10.0}, {"name": "b", "flops": 0}, {"name": "c", "flops": 5}],
  "buffers": [
    {"id": 7, "name": "w", "size": 64, "def": None, "uses": [0, 2], "kind": "parameter"},
    {"id": 8, "name": "x", "size": 32, "def": 0, "uses": [1], "kind": "activation"},
    {"id": 9, "name": "y", "size": 16, "def": 1, "uses": [], "kind": "output"},
  ],
}


def test_live_ranges_and_peak():
  w = workload_from_dict(GOOD)
  a = w.arrays
  assert a.live_start.tolist() == [0, 0, 1]
  assert a.live_end.tolist() == [3, 2, 3]  # parameter to last use; output to the end
  assert w.peak_live_bytes == 64 + 32 + 16  # all three live at op 1
  assert a.incidence_op.tolist() == [0, 2, 0, 1, 1]


@given(workloads())
def test_json_round_trip(tmp_path_factory, workload):
  path = tmp_path_factory.mktemp("w") / "w.json.gz"
  save_workload(workload, path)
  assert load_workload(path) == workload
  plain = path.with_suffix("").with_suffix(".json")
  save_workload(workload, plain)
  assert load_workload(plain) == workload


def test_a_loops_ops_keep_their_weight_and_depth_through_a_file(tmp_path):
  """An op of a loop's body: its weight the trip count, its depth the loops around it."""
  w = workload_from_dict(
    {
      "name": "loop",
      "ops": [
        {"name": "a", "flops": 1.0},
        {"name": "b", "flops": 2.0, "weight": 8, "loop_depth": 1},
      ],
      "buffers": [{"id": 0, "size": 64, "def": 0, "uses": [1], "kind": "activation"}],
    }
  )
  assert [(o.weight, o.loop_depth) for o in w.ops] == [(1, 0), (8, 1)]
  assert w.arrays.flops.tolist() == [1.0, 16.0] and w.time_axis.tolist() == [0, 1, 9]
  path = tmp_path / "loop.json"
  save_workload(w, path)
  assert load_workload(path) == w
  assert '"loop_depth":1' in path.read_text() and path.read_text().count("loop_depth") == 1


def test_csv_round_trip_and_objective_is_the_bytes_written_and_read(tmp_path):
  text = "id,lower,upper,size\n0,0,3,100\n1,1,2,50\n2,2,6,10\n"
  w = workload_from_minimalloc_csv(text, name="mm")
  # Points 0, 1, 2, 3, 5, 6 (0 and each lower, lower + 1, upper - 1, upper): five ops.
  assert w.num_ops == 5 and w.source == "minimalloc-csv"
  assert [o.weight for o in w.ops] == [1, 1, 1, 2, 1] and w.time_axis.tolist() == [0, 1, 2, 3, 5, 6]
  assert w.arrays.live_start.tolist() == [0, 1, 2] and w.arrays.live_end.tolist() == [3, 2, 5]
  # Written at `lower`, read at `upper - 1`; a buffer of one step is only written.
  assert [(b.def_op, b.uses) for b in w.buffers] == [(0, (2,)), (1, ()), (2, (4,))]
  assert workload_to_minimalloc_csv(w) == text
  path = tmp_path / "mm.csv"
  path.write_text(text)
  assert load_workload(path) == w
  from malloczero.env.cost_model import CostModel
  from malloczero.env.hardware import PRESETS
  from malloczero.env.requests import build_requests

  model = CostModel(w, PRESETS["minimalloc"])
  inv = model.inverse_bandwidth
  saving = build_requests(model).standalone_saving[:, 0]
  # Saving of each buffer = size x accesses x (1/bw_slow - 1/bw_fast), whatever its length.
  assert sorted(saving.tolist()) == pytest.approx(
    sorted([s * accesses * (inv[1] - inv[0]) for s, accesses in ((100, 2), (50, 1), (10, 2))])
  )


MALFORMED = [
  (
    "size -5",
    lambda d: d["buffers"][1].update(size=-5),
    r"buffer 8 \('x'\): size must be positive",
  ),
  ("size 0", lambda d: d["buffers"][1].update(size=0), r"size must be positive, got 0"),
  (
    "use before def",
    lambda d: d["buffers"][1].update(uses=[0]),
    r"used at op 0 before its definition at op 0",
  ),
  ("unknown op in uses", lambda d: d["buffers"][1].update(uses=[9]), r"use at unknown op 9"),
  (
    "unknown def op",
    lambda d: d["buffers"][1].update(**{"def": 5}),
    r"'def' refers to unknown op 5",
  ),
  ("duplicate id", lambda d: d["buffers"][2].update(id=7), r"duplicate buffer id 7"),
  ("empty schedule", lambda d: d.update(ops=[]), r"empty schedule"),
  ("string size", lambda d: d["buffers"][0].update(size="64"), r"'size' must be an integer"),
  ("float id", lambda d: d["buffers"][0].update(id=1.5), r"'id' must be an integer"),
  ("bool flops", lambda d: d["ops"][0].update(flops=True), r"'flops' must be a finite number"),
  ("negative flops", lambda d: d["ops"][0].update(flops=-1), r"'flops' must be a finite number"),
  (
    "flops beyond a float",
    lambda d: d["ops"][0].update(flops=10**400),
    r"'flops' must be a finite number >= 0, got 1000",
  ),
  ("uses not list", lambda d: d["buffers"][0].update(uses=3), r"'uses' must be a list"),
  ("unknown kind", lambda d: d["buffers"][0].update(kind="weights"), r"unknown kind 'weights'"),
  ("kind on two lines", lambda d: d["buffers"][0].update(kind="a\nb"), r"unknown kind 'a\\nb'"),
  ("parameter with def", lambda d: d["buffers"][0].update(**{"def": 0}), r"'def' must be null"),
  ("missing buffers", lambda d: d.pop("buffers"), r"missing required key 'buffers'"),
  ("ops not a list", lambda d: d.update(ops={"a": 1}), r"'ops' must be a list"),
  ("top-level list", lambda d: (d.clear(), None), r"missing required key"),
  # Integers beyond int64 used to end in an OverflowError traceback when arrays were built.
  (
    "size 10**30",
    lambda d: d["buffers"][1].update(size=10**30),
    r"buffer 8 \('x'\): 'size' = a 31-digit number is beyond the limit of 2\*\*60",
  ),
  (
    "id 2**63",
    lambda d: d["buffers"][1].update(id=2**63),
    r"'id' = 9223372036854775808 is beyond the limit of 2\*\*60",
  ),
  ("def 2**63", lambda d: d["buffers"][1].update(**{"def": 2**63}), r"'def' = .* beyond the limit"),
  ("use 10**30", lambda d: d["buffers"][1].update(uses=[10**30]), r"'uses' = .* beyond the limit"),
  (
    "use_bytes length",
    lambda d: d["buffers"][0].update(use_bytes=[8]),
    r"buffer 7 \('w'\): 'use_bytes' has 1 entries for 2 uses",
  ),
  (
    "use_bytes above size",
    lambda d: d["buffers"][0].update(use_bytes=[8, 65]),
    r"'use_bytes' entry 65 is outside 0..size \(64\)",
  ),
  (
    "use_bytes negative",
    lambda d: d["buffers"][0].update(use_bytes=[-1, 8]),
    r"'use_bytes' entry -1 is outside",
  ),
  (
    "use_bytes not ints",
    lambda d: d["buffers"][0].update(use_bytes=[8, "8"]),
    r"'use_bytes' must be a list of integers",
  ),
  (
    "unsorted uses",
    lambda d: d["buffers"][0].update(uses=[2, 0]),
    r"buffer 7 \('w'\): 'uses' must be sorted with each op once, got 0 after 2",
  ),
  (
    "repeated use",
    lambda d: d["buffers"][0].update(uses=[0, 0, 2]),
    r"buffer 7 \('w'\): 'uses' must be sorted with each op once, got 0 after 0",
  ),
  ("negative id", lambda d: d["buffers"][0].update(id=-1), r"buffer #0: 'id' must be >= 0, got -1"),
  ("bool id", lambda d: d["buffers"][0].update(id=True), r"buffer #0: 'id' must be an integer"),
  (
    "float weight",
    lambda d: d["ops"][0].update(weight=2.0),
    r"op 0 \('a'\): 'weight' must be an "
    "integer",
  ),
  (
    "negative loop depth",
    lambda d: d["ops"][0].update(loop_depth=-1),
    r"op 0 \('a'\): 'loop_depth' must be an integer from 0 to 64, got -1",
  ),
  (
    "string loop depth",
    lambda d: d["ops"][0].update(loop_depth="1"),
    r"op 0 \('a'\): 'loop_depth' must be an integer from 0 to 64, got '1'",
  ),
  (
    "unknown top-level key",
    lambda d: d.update(buffer=[]),
    r"unknown key 'buffer' \(known keys: "
    r"name, source, ops, buffers\): remove it or fix its spelling",
  ),
  ("unknown op key", lambda d: d["ops"][1].update(flop=3), r"op 1: unknown key 'flop'"),
  (
    "unknown buffer key",
    lambda d: d["buffers"][0].update(use_byte=[8, 8]),
    r"buffer #0: unknown key 'use_byte'",
  ),
  (
    "line break in a name",
    lambda d: d["buffers"][0].update(name="a\nb"),
    r"buffer 7: 'name' must be a string of printable text, got 'a\\nb'",
  ),
  (
    "def_bytes on a parameter",
    lambda d: d["buffers"][0].update(def_bytes=8),
    r"'def_bytes' is given but the buffer has no defining op",
  ),
  (
    "def_bytes above size",
    lambda d: d["buffers"][1].update(def_bytes=33),
    r"'def_bytes' 33 is outside 0..size \(32\)",
  ),
  (
    "sizes adding past 2**62",
    lambda d: (
      [b.update(size=2**60) for b in d["buffers"]]
      and d["buffers"].extend(dict(b, id=b["id"] + 10) for b in list(d["buffers"]))
    ),
    r"sizes add up to .* above the limit of 2\*\*62",
  ),
]


@pytest.mark.parametrize("label,mutate,message", MALFORMED, ids=[m[0] for m in MALFORMED])
def test_malformed_workloads_give_one_line_errors(tmp_path, label, mutate, message):
  data = json.loads(json.dumps(GOOD))
  mutate(data)
  path = tmp_path / "bad.json"
  path.write_text(json.dumps(data))
  with pytest.raises(WorkloadError, match=message) as info:
    load_workload(path)
  assert "\n" not in str(info.value) and str(path) in str(info.value)


def test_partial_accesses_are_charged_and_round_trip(tmp_path):
  """`use_bytes` / `def_bytes` reach the incidences the cost model and the requests charge;
  full-size values are dropped, so a file without partial accesses saves unchanged."""
  from malloczero.env.cost_model import CostModel
  from malloczero.env.hardware import PRESETS
  from malloczero.env.requests import build_requests

  data = json.loads(json.dumps(GOOD))
  data["buffers"][0]["use_bytes"] = [8, 64]  # op 0 reads 8 of w's 64 bytes (a gather), op 2 all
  data["buffers"][1]["def_bytes"] = 4  # op 0 writes 4 of x's 32 bytes
  data["buffers"][2]["use_bytes"] = []
  w = workload_from_dict(data)
  a = w.arrays
  assert a.incidence_op.tolist() == [0, 2, 0, 1, 1]
  assert a.incidence_bytes.tolist() == [8, 64, 4, 32, 16]
  assert w.peak_live_bytes == 64 + 32 + 16  # Live ranges do not depend on what is accessed.
  plain = workload_from_dict(GOOD)
  hw = PRESETS["tpu-v4i-like"]
  slow = CostModel(w, hw).slow_memory_time
  assert slow[0] == pytest.approx(CostModel(plain, hw).slow_memory_time[0] * (8 + 4) / (64 + 32))
  requests = build_requests(CostModel(w, hw))
  for r in range(len(requests.buffer)):
    ops, moved = requests.ops(r)
    b = int(requests.buffer[r])
    lo, hi = a.buffer_incidence_start[b], a.buffer_incidence_start[b + 1]
    wanted = dict(zip(a.incidence_op[lo:hi].tolist(), a.incidence_bytes[lo:hi].tolist()))
    assert moved.tolist() == [wanted[t] for t in ops.tolist()]
  path = tmp_path / "w.json"
  save_workload(w, path)
  saved = json.loads(path.read_text())["buffers"]
  assert saved[0]["use_bytes"] == [8, 64] and saved[1]["def_bytes"] == 4
  assert "use_bytes" not in saved[2] and "def_bytes" not in saved[2]
  assert load_workload(path) == w
  # Spelling out full sizes is the same workload as omitting them, and saves without the keys.
  full = json.loads(json.dumps(GOOD))
  full["buffers"][0]["use_bytes"] = [64, 64]
  full["buffers"][1]["def_bytes"] = 32
  assert workload_from_dict(full) == plain
  save_workload(workload_from_dict(full), path)
  assert json.loads(path.read_text()) == json.loads(json.dumps(workload_to_dict(plain)))


def test_truncated_and_non_json_files(tmp_path):
  text = json.dumps(GOOD)
  truncated = tmp_path / "t.json"
  truncated.write_text(text[: len(text) // 2])
  with pytest.raises(WorkloadError, match=r"not valid JSON \(truncated or corrupt\?\)"):
    load_workload(truncated)
  broken_gz = tmp_path / "t.json.gz"
  broken_gz.write_bytes(gzip.compress(text.encode())[:30])
  with pytest.raises(WorkloadError, match=r"t.json.gz: (cannot read|not valid JSON)"):
    load_workload(broken_gz)
  array = tmp_path / "a.json"
  array.write_text("[1, 2]")
  with pytest.raises(WorkloadError, match="expected a JSON object at the top level, got list"):
    load_workload(array)
  with pytest.raises(WorkloadError, match="no such workload file"):
    load_workload(tmp_path / "missing.json")


@pytest.mark.parametrize(
  "text,message",
  [
    ("", "empty CSV"),
    ("a,b,c\n1,2,3\n", "header must contain id,lower,upper,size"),
    ("id,lower,upper,size\n", "no buffers"),
    ("id,lower,upper,size\n0,5,5,10\n", r"needs 0 <= lower < upper, got \[5, 5\)"),
    ("id,lower,upper,size\n0,0,2,ten\n", "line 2: expected integers"),
    ("id,lower,upper,size\n0,0,2,-1\n", "size must be positive"),
    ("id,lower,upper,size\n0,0,2,4\n0,1,3,4\n", "duplicate buffer id 0"),
    (
      "id,lower,upper,size\n0,0,2,1000000000000000000000000000000\n",
      r"line 2: 'size' = a 31-digit number is beyond the limit of 2\*\*60",
    ),
    ("id,lower,upper,size\n9223372036854775808,0,2,4\n", r"line 2: 'id' = .* beyond the limit"),
    # Times are compressed to their distinct values, so only the int64 bound applies.
    (
      "id,lower,upper,size\n0,0,100000000000000000000,4\n",
      r"line 2: 'upper' = 100000000000000000000 is beyond the limit of 2\*\*60",
    ),
    (
      "buffer,start,end\n0,0,2\n",
      r"header must contain id,lower,upper,size \(or MiniMalloc's "
      r"buffer,start,end,size\); got buffer,start,end",
    ),
  ],
)
def test_malformed_csv(text, message):
  with pytest.raises(WorkloadError, match=message):
    workload_from_minimalloc_csv(text, name="bad")


def test_integers_with_more_digits_than_python_reads_are_one_line_errors(tmp_path):
  path = tmp_path / "huge.json"
  path.write_text(json.dumps(GOOD).replace('"size": 64', '"size": 1' + "0" * 5000))
  with pytest.raises(
    WorkloadError,
    match="huge.json: an integer of 5001 digits is too long: no "
    "value in this file needs more than 19 digits",
  ) as info:
    load_workload(path)
  assert "\n" not in str(info.value) and "set_int_max_str_digits" not in str(info.value)


@pytest.mark.parametrize(
  "rows, quick",
  [
    (["0,0,3,100", "1,1,2,50"], True),
    ([" +7 , 007 ,9, 64 ", "8,0,1,1"], True),  # Signs, leading zeros and spaces.
    (["5,0,1152921504606846976,1"], False),  # 19 digits (2**60): past the quick reading's 18.
    (['"3",0,"4",8', "4,2,3,8"], True),  # Quoted cells.
  ],
)
def test_the_quick_csv_reading_reads_what_the_line_by_line_one_does(rows, quick):
  from malloczero.env.minimalloc_csv import CSV_COLUMNS, _csv_columns, _csv_columns_line_by_line

  parsed = list(csv.reader(io.StringIO("\n".join(rows))))
  col = {k: i for i, k in enumerate(CSV_COLUMNS)}
  slow = _csv_columns_line_by_line(parsed, col, "t")
  table = _csv_columns(parsed, col)
  assert (table is not None) == quick
  if table is not None:
    assert all(np.array_equal(table[k], slow[k]) for k in CSV_COLUMNS)
  text = "id,lower,upper,size\n" + "\n".join(rows) + "\n"
  w = workload_from_minimalloc_csv(text, name="q")
  assert [b.id for b in w.buffers] == slow["id"].tolist()


@given(workloads())
def test_the_one_pass_checks_load_what_the_one_key_checks_load(workload):
  """Ops and buffers that pass the one-pass checks (`_plain_op`, `_plain_buffer`) load equal to
  what the checks one key at a time make of them."""
  data = json.loads(json.dumps(workload_to_dict(workload)))
  for t, op in enumerate(data["ops"]):
    plain = workload_json._plain_op(op, frozenset(workload_json.OP_KEYS), t)
    assert plain is None or plain == workload.ops[t]
  for i, buffer in enumerate(data["buffers"]):
    plain = workload_json._plain_buffer(buffer, frozenset(workload_json.BUFFER_KEYS))
    assert plain is None or plain == workload.buffers[i]
  assert workload_from_dict(data) == workload


@pytest.mark.parametrize(
  "change",
  [
    {"id": True},
    {"id": -1},
    {"id": 1.0},
    {"id": 1 << 61},
    {"size": 64.0},
    {"size": -(1 << 61)},
    {"def": 1.5},
    {"name": None},
    {"name": "two\nlines"},
    {"kind": 3},
    {"uses": [3, 2]},
    {"uses": [2, 2]},
    {"uses": [1, True]},
    {"uses": [1 << 61]},
    {"uses": (1, 2)},
    {"use_bytes": [8]},
    {"def_bytes": 8},
    {"extra": 1},
  ],
)
def test_the_one_pass_checks_leave_anything_unusual_to_the_one_key_checks(change):
  plain = {"id": 1, "size": 64, "def": 0, "uses": [1], "kind": "activation"}
  keys = frozenset(workload_json.BUFFER_KEYS)
  assert workload_json._plain_buffer(plain, keys) is not None
  assert workload_json._plain_buffer({**plain, **change}, keys) is None


@pytest.mark.parametrize(
  "op",
  [
    {"flops": float("nan")},
    {"flops": float("inf")},
    {"flops": -1.0},
    {"flops": True},
    {"flops": 1 << 61},
    {"weight": 0},
    {"weight": 2.0},
    {"loop_depth": -1},
    {"loop_depth": 65},
    {"loop_depth": 1.0},
    {"name": None},
    {"name": "tab\there"},
    {"other": 1},
  ],
)
def test_the_one_pass_op_check_leaves_anything_unusual_to_the_one_key_checks(op):
  keys = frozenset(workload_json.OP_KEYS)
  assert workload_json._plain_op({"name": "a", "flops": 1.0, "weight": 2}, keys, 0) is not None
  assert workload_json._plain_op({"name": "a", "flops": 1.0, "weight": 2, **op}, keys, 0) is None


def _one_at_a_time(document):
  """The workload of `document` read and checked one op and buffer at a time (the reader's
  column checks off)."""
  import malloczero.env.workload as workload_module

  with pytest.MonkeyPatch.context() as patch:
    patch.setattr(workload_json, "_plain_ops", lambda *args: None)
    patch.setattr(workload_json, "_plain_buffers", lambda *args: None)
    patch.setattr(workload_module, "_plainly_valid", lambda *args: None)
    return workload_from_dict(document)


@given(workloads())
def test_the_column_checks_read_what_the_checks_one_at_a_time_read(workload):
  """Reading a file's ops and buffers column by column gives the workload, and the arrays, that
  reading them one at a time gives (the same values, of the same types)."""
  document = workload_to_dict(workload)
  fast, slow = workload_from_dict(document), _one_at_a_time(document)
  assert fast == slow
  for a, b in zip(fast.ops + fast.buffers, slow.ops + slow.buffers):
    assert vars(a) == vars(b) and [type(v) for v in vars(a).values()] == [
      type(v) for v in vars(b).values()
    ]
  for name, value in vars(fast.arrays).items():
    other = getattr(slow.arrays, name)
    assert value.dtype == other.dtype and np.array_equal(value, other), name


def test_the_column_checks_keep_and_check_the_ops_loop_depths():
  """Loop depths read column by column are those read one op at a time; a depth out of range,
  in a file or in ops built in Python, is refused with the one-op message."""
  document = json.loads(json.dumps(GOOD))
  for t, op in enumerate(document["ops"]):
    op.update(weight=1 + 3 * t, loop_depth=t)
  fast, slow = workload_from_dict(document), _one_at_a_time(document)
  assert fast == slow and [o.loop_depth for o in fast.ops] == list(range(len(document["ops"])))
  document["ops"][1]["loop_depth"] = 65
  with pytest.raises(WorkloadError, match="op 1 \\('b'\\): 'loop_depth' must be an integer"):
    workload_from_dict(document)
  ops = (Op("a", 1.0), Op("b", 1.0, 2, 65))
  with pytest.raises(WorkloadError, match="op 1 \\('b'\\): 'loop_depth' must be an integer"):
    Workload("w", "test", ops, fast.buffers)


def test_a_file_not_plain_somewhere_is_read_one_at_a_time_with_its_message():
  """One buffer whose uses go back, one op of NaN flops: the checks one at a time name them."""
  backwards = json.loads(json.dumps(GOOD))
  backwards["buffers"][0]["uses"] = [2, 0]
  with pytest.raises(WorkloadError, match="buffer 7 \\('w'\\): 'uses' must be sorted"):
    workload_from_dict(backwards)
  nan = json.loads(json.dumps(GOOD))
  nan["ops"][1]["flops"] = float("nan")
  with pytest.raises(WorkloadError, match="op 1 \\('b'\\): 'flops' must be a finite number"):
    workload_from_dict(nan)
