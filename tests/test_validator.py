"""The validator accepts what the game emits and rejects every kind of broken mapping."""

import dataclasses
import functools
import json
import subprocess
import sys

import numpy as np
import pytest
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st

from malloczero.env import PRESETS, MappingError, RequestsGame, save_workload, validate_mapping
from malloczero.env.mapping import Mapping, load_mapping
from malloczero.env.programs.synthetic import contended, random_workload
from malloczero.env.workload_json import workload_from_dict

WORKLOAD = random_workload(21, num_ops=40)
HARDWARE = contended(PRESETS["tpu-v4i-like"], WORKLOAD, 0.3)


@pytest.fixture(scope="module")
def mapping() -> Mapping:
  game = RequestsGame(WORKLOAD, HARDWARE)
  ts = game.reset()
  while not ts.last():
    ts = game.step(1 if ts.observation["legal_actions"][1] else 0)  # greedy best fit
  m = game.mapping("best-fit")
  assert len(m.allocations) >= 5
  return m


def with_allocations(m: Mapping, allocations) -> Mapping:
  return dataclasses.replace(m, allocations=tuple(allocations))


def edited(m: Mapping, index: int, **changes) -> Mapping:
  rows = [dict(a) for a in m.allocations]
  rows[index].update(changes)
  return with_allocations(m, rows)


def test_game_mapping_is_valid(mapping):
  report = validate_mapping(WORKLOAD, HARDWARE, mapping)
  assert report.num_allocations == len(mapping.allocations)
  assert report.speedup > 1.0


def _overlapping(mapping: Mapping) -> Mapping:
  """Moves one allocation onto the address of another that is live at the same time."""
  rows = [dict(a) for a in mapping.allocations]
  size = lambda a: HARDWARE.align(WORKLOAD.buffers[WORKLOAD.buffer_index[a["buffer"]]].size)
  cap = HARDWARE.levels[0].capacity_bytes
  for i, a in enumerate(rows):
    for j, b in enumerate(rows):
      if (
        i != j
        and a["level"] == b["level"]
        and a["start"] < b["end"]
        and b["start"] < a["end"]
        and b["offset"] + size(a) <= cap
      ):
        rows[i]["offset"] = b["offset"]
        return with_allocations(mapping, rows)
  raise AssertionError("fixture has no two allocations live at the same time")


def test_rejects_overlap_in_time_and_address(mapping):
  with pytest.raises(MappingError, match=r"overlap in level 'CMEM': ops \[\d+, \d+\) x bytes"):
    validate_mapping(WORKLOAD, HARDWARE, _overlapping(mapping))


def test_rejects_each_broken_constraint(mapping):
  cap = HARDWARE.levels[0].capacity_bytes
  a0 = mapping.allocations[0]
  cases = [
    (edited(mapping, 0, offset=cap), "exceed the capacity"),
    (
      edited(mapping, 0, offset=a0["offset"] + 1),
      "not a non-negative multiple of the alignment 512",
    ),
    (edited(mapping, 0, level=1), "level 1 is not a fast level"),
    (edited(mapping, 0, buffer=10**6), "unknown buffer id 1000000"),
    (edited(mapping, 0, end=WORKLOAD.num_ops + 5), "not a non-empty part of its live range"),
    (
      dataclasses.replace(mapping, estimated_time_s=mapping.estimated_time_s * 0.9),
      "reported estimated_time_s",
    ),
    (dataclasses.replace(mapping, slow_only_time_s=1.0), "reported slow_only_time_s"),
    (dataclasses.replace(mapping, workload="other"), "mapping is for workload 'other'"),
    (
      with_allocations(mapping, list(mapping.allocations) + [dict(a0)]),
      "two allocations overlapping in time",
    ),
  ]
  output = next(b for b in WORKLOAD.buffers if b.kind == "output")
  cases.append(
    (edited(mapping, 0, buffer=output.id), "program outputs must stay in default memory")
  )
  act = next(
    i
    for i, a in enumerate(mapping.allocations)
    if WORKLOAD.buffers[WORKLOAD.buffer_index[a["buffer"]]].kind == "activation"
  )
  a = mapping.allocations[act]
  if a["end"] - a["start"] > 1:
    # Ending early is a valid segment only with an eviction: the last use reads default memory.
    cases.append(
      (
        edited(mapping, act, end=a["end"] - 1),
        r"read from default memory at op \d+ after it was produced in fast memory, "
        "but it is never evicted",
      )
    )
    cases.append(
      (
        edited(mapping, act, start=a["start"] + 1),
        "without a prefetch it is produced in place, so it must start at its defining",
      )
    )
  cases.append(
    (
      edited(mapping, act, eviction={"start": a["start"], "done": a["start"]}),
      "its eviction .* must start after the producing op",
    )
  )
  param = next(i for i, a in enumerate(mapping.allocations) if "prefetch" in a)
  p = mapping.allocations[param]
  rows = [dict(r) for r in mapping.allocations]
  del rows[param]["prefetch"]
  cases += [
    (
      with_allocations(mapping, rows),
      "starts in default memory, so a fast allocation of it must be filled by a prefetch",
    ),
    (
      edited(mapping, param, prefetch={"start": p["start"] + 1, "done": p["prefetch"]["done"]}),
      "its prefetch starts at op .*, not at the allocation's start",
    ),
    (
      edited(mapping, param, prefetch={"start": p["start"], "done": p["end"]}),
      "its prefetch is due at op .*, outside the allocation's ops",
    ),
    (
      edited(mapping, param, eviction={"start": p["end"] - 1, "done": p["end"]}),
      "only a value produced in fast memory can be evicted",
    ),
  ]
  for broken, message in cases:
    with pytest.raises(MappingError, match=message) as info:
      validate_mapping(WORKLOAD, HARDWARE, broken)
    assert "\n" not in str(info.value)


def test_other_hardware_is_rejected(mapping):
  other = HARDWARE.with_fast_capacity(HARDWARE.levels[0].capacity_bytes * 2)
  with pytest.raises(MappingError, match="was made for hardware"):
    validate_mapping(WORKLOAD, other, mapping)


def _cli(*args):
  return subprocess.run(
    [sys.executable, "-m", "malloczero", *args], capture_output=True, text=True, timeout=120
  )


@pytest.mark.slow  # Integration-sized: subprocesses, compiles or every solver.
def test_cli_validate_accepts_and_rejects(tmp_path, mapping):
  wpath, good, bad = tmp_path / "w.json", tmp_path / "good.json", tmp_path / "bad.json"
  save_workload(WORKLOAD, wpath)
  mapping.save(good)
  assert load_mapping(good) == mapping
  _overlapping(mapping).save(bad)
  ok = _cli("validate", str(wpath), str(good))
  assert ok.returncode == 0, ok.stderr
  assert ok.stdout.startswith("valid: ") and "speed-up" in ok.stdout
  assert _cli("validate", str(wpath), str(good), "--hardware", "tpu-v4i-like").returncode == 1
  rejected = _cli("validate", str(wpath), str(bad))
  assert rejected.returncode == 1
  assert rejected.stderr.count("\n") == 1 and rejected.stderr.startswith("malloczero: error: ")
  assert "overlap in level 'CMEM'" in rejected.stderr
  truncated = tmp_path / "trunc.json"
  truncated.write_text(good.read_text()[:100])
  out = _cli("validate", str(wpath), str(truncated))
  assert out.returncode == 1 and "not valid JSON" in out.stderr and out.stderr.count("\n") == 1
  out = _cli("validate", str(tmp_path / "nope.json"), str(good))
  assert out.returncode == 1 and "no such workload file" in out.stderr
  out = _cli("validate", str(wpath), str(good), "--capacity", "-3")
  assert out.returncode == 2 and "expected a positive integer" in out.stderr
  assert "Traceback" not in out.stderr


@pytest.mark.slow  # Integration-sized: subprocesses, compiles or every solver.
def test_cli_validate_minimalloc_csv(tmp_path):
  csv = tmp_path / "p.csv"
  csv.write_text("id,lower,upper,size\n0,0,4,300\n1,1,3,500\n2,3,6,400\n")
  from malloczero.env import load_workload
  from malloczero.env.cost_model import CostModel

  workload = load_workload(csv)
  hw = PRESETS["minimalloc"].with_fast_capacity(800)
  game = RequestsGame(workload, hw)
  ts = game.reset()
  while not ts.last():
    ts = game.step(1 if ts.observation["legal_actions"][1] else 0)
  path = tmp_path / "map.json"
  game.mapping("best-fit").save(path)
  assert _cli("validate", str(csv), str(path), "--capacity", "800").returncode == 0
  out = _cli("validate", str(csv), str(path))  # hardware recorded in the mapping
  assert out.returncode == 0, out.stderr
  data = json.loads(path.read_text())
  data["allocations"] = [dict(a, offset=0) for a in data["allocations"]]
  data["estimated_time_s"] = (
    CostModel(workload, hw).evaluate(load_mapping(path).to_arrays(workload)).total_time_s
  )
  path.write_text(json.dumps(data))
  out = _cli("validate", str(csv), str(path))
  assert out.returncode == 1 and "overlap" in out.stderr, out.stderr
  assert np.isfinite(data["estimated_time_s"])


@pytest.mark.parametrize("key", ["request", "buffer", "level", "offset", "start", "end"])
@pytest.mark.parametrize("value", [10**30, 2**63, -(2**63) - 1])
def test_mapping_integers_beyond_int64_are_one_line_errors(tmp_path, mapping, key, value):
  """They used to end in an OverflowError traceback when the allocation arrays were built."""
  data = mapping.to_dict()
  data["allocations"][0][key] = value
  path = tmp_path / "m.json"
  path.write_text(json.dumps(data))
  with pytest.raises(
    MappingError,
    match=rf"allocation 0: '{key}' = .* beyond the limit of "
    r"2\*\*60",
  ) as info:
    load_mapping(path)
  assert "\n" not in str(info.value)


@pytest.mark.parametrize(
  "field,value,message",
  [
    (
      "capacity_bytes",
      10**30,
      r"'capacity_bytes' = a 31-digit number is beyond the limit of 2\*\*62",
    ),
    ("alignment_bytes", 2**63, r"'alignment_bytes' = 9223372036854775808 is beyond the limit"),
    ("peak_flops_per_s", 10**400, r"'peak_flops_per_s' is too large a number"),
  ],
)
def test_hardware_numbers_beyond_the_limits_are_one_line_errors(tmp_path, field, value, message):
  from malloczero.env.hardware import HardwareError, load_hardware

  data = HARDWARE.to_dict()
  if field == "capacity_bytes":
    data["levels"][0][field] = value
  else:
    data[field] = value
  path = tmp_path / "hw.json"
  path.write_text(json.dumps(data))
  with pytest.raises(HardwareError, match=message):
    load_hardware(str(path))


def test_cli_refuses_huge_integers_in_one_line(tmp_path, mapping):
  wpath, mpath = tmp_path / "w.json", tmp_path / "m.json"
  save_workload(WORKLOAD, wpath)
  data = mapping.to_dict()
  data["allocations"][0]["offset"] = 10**30
  mpath.write_text(json.dumps(data))
  for args in (
    ("validate", str(wpath), str(mpath)),
    ("solve", str(wpath), "--hardware", "tpu-v4i-like", "--capacity", str(10**30)),
  ):
    out = _cli(*args)
    assert out.returncode == 1, out.stderr
    assert out.stderr.startswith("malloczero: error: ") and out.stderr.count("\n") == 1, out.stderr
    assert "beyond the limit" in out.stderr


# ------------------------------------------------------------------ segments: eviction, prefetch


def _evict_and_prefetch_program():
  """XLA's EvictAndPrefetch in small: activation a (24 B) produced at op0, used at op1 and op5,
  with three 1 s ops between; XLA's test hardware (see tests/test_cost_model.py)."""
  from tests.test_cost_model import XLA_HW, xla_program

  program = xla_program(
    [0.0, 0.0, 1000.0, 1000.0, 1000.0, 0.0],
    [{"id": 7, "name": "a", "size": 24, "def": 0, "uses": [1, 5], "kind": "activation"}],
  )
  return program, XLA_HW


def _segments(program, hw, rows):
  from malloczero.env.cost_model import Allocations, CostModel

  col = lambda k: np.array([r[k] for r in rows], np.int64)
  alloc = Allocations(
    col("buffer"),
    col("level"),
    col("offset"),
    col("start"),
    col("end"),
    prefetch_done=col("done"),
    evict_start=col("evict_start"),
    evict_done=col("evict_done"),
  )
  model = CostModel(program, hw)
  return Mapping.from_arrays(
    program,
    hw,
    "hand",
    np.full(len(rows), -1),
    alloc,
    model.evaluate(alloc).total_time_s,
    model.slow_only_time,
  )


def test_evict_and_prefetch_back_validates_and_times_by_hand():
  program, hw = _evict_and_prefetch_program()
  # Produced in fast memory over [0, 3), evicted from op1 to op3; prefetched back over [4, 6),
  # due at op5. op0 and op1 touch a in fast memory (0.024 s each, 0.024 s idle each): the
  # eviction (0.24 s) gets 0.024 s in op1 and the rest in op2's 1 s; the prefetch hides in op4.
  rows = [
    dict(buffer=0, level=0, offset=0, start=0, end=3, done=-1, evict_start=1, evict_done=3),
    dict(buffer=0, level=0, offset=8, start=4, end=6, done=5, evict_start=-1, evict_done=-1),
  ]
  mapping = _segments(program, hw, rows)
  assert mapping.allocations[0]["eviction"] == {"start": 1, "done": 3}
  assert "prefetch" not in mapping.allocations[0]
  assert mapping.allocations[1]["prefetch"] == {"start": 4, "done": 5}
  report = validate_mapping(program, hw, mapping)
  assert report.estimated_time_s == pytest.approx(3 * 0.024 + 3.0)
  assert report.slow_only_time_s == pytest.approx(3 * 0.24 + 3.0)
  # The same without the eviction: the prefetch copies a value default memory never got.
  rows[0].update(evict_start=-1, evict_done=-1)
  with pytest.raises(
    MappingError,
    match=r"allocation 1 \(buffer 7 'a'\) prefetches at op 4 a "
    "value produced in fast memory, but it is never evicted",
  ) as info:
    validate_mapping(program, hw, _segments(program, hw, rows))
  assert "\n" not in str(info.value)
  # Without the prefetch back, op5 reads default memory: that needs the eviction too.
  with pytest.raises(
    MappingError,
    match="read from default memory at op 5 after it was "
    "produced in fast memory, but it is never evicted",
  ):
    validate_mapping(program, hw, _segments(program, hw, rows[:1]))
  # An eviction must be done by the end of the allocation it copies from.
  rows[0].update(evict_start=1, evict_done=4)
  with pytest.raises(
    MappingError,
    match=r"its eviction \[1, 4\] must start after the producing "
    "op 0 and be done by the allocation's end 3",
  ):
    validate_mapping(program, hw, _segments(program, hw, rows))


def test_an_eviction_that_cannot_finish_stalls_the_program():
  program, hw = _evict_and_prefetch_program()
  # Evicted from op1, due before op2: only op1's 0.024 s of idle time, so a 0.216 s stall.
  rows = [dict(buffer=0, level=0, offset=0, start=0, end=2, done=-1, evict_start=1, evict_done=2)]
  report = validate_mapping(program, hw, _segments(program, hw, rows))
  assert report.estimated_time_s == pytest.approx(0.024 + 0.024 + 0.216 + 3.0 + 0.24)


def test_a_version_1_mapping_file_is_refused_in_one_line(tmp_path, mapping):
  data = mapping.to_dict()
  assert data["format_version"] == 2
  del data["format_version"]
  path = tmp_path / "old.json"
  path.write_text(json.dumps(data))
  with pytest.raises(
    MappingError,
    match=r"mapping format version 1 \(no 'format_version'\); "
    "this malloczero reads version 2",
  ) as info:
    load_mapping(path)
  assert "\n" not in str(info.value)
  wpath = tmp_path / "w.json"
  save_workload(WORKLOAD, wpath)
  out = _cli("validate", str(wpath), str(path))
  assert out.returncode == 1 and out.stderr.count("\n") == 1, out.stderr
  assert "mapping format version 1 (no 'format_version')" in out.stderr
  data["format_version"] = 3
  path.write_text(json.dumps(data))
  with pytest.raises(
    MappingError, match="mapping format version 3; this malloczero reads version 2"
  ):
    load_mapping(path)


def test_copy_times_are_on_the_workload_time_axis(tmp_path):
  """A weighted op stands for several steps: a segment's copies are written in program time,
  like its window, and a copy time inside a weighted op names no op boundary."""
  from tests.test_cost_model import XLA_HW

  program = workload_from_dict(
    {
      "name": "weighted",
      "source": "hand",
      "ops": [{"name": "wait", "flops": 100.0, "weight": 10}, {"name": "use", "flops": 0.0}],
      "buffers": [
        {"id": 3, "name": "p", "size": 24, "def": None, "uses": [1], "kind": "parameter"}
      ],
    }
  )
  rows = [dict(buffer=0, level=0, offset=0, start=0, end=2, done=1, evict_start=-1, evict_done=-1)]
  mapping = _segments(program, XLA_HW, rows)
  # op 0 is 10 steps of 0.1 s: its 1 s of idle time hides the 0.24 s copy.
  assert mapping.allocations[0]["prefetch"] == {"start": 0, "done": 10}
  assert mapping.allocations[0]["end"] == 11
  assert validate_mapping(program, XLA_HW, mapping).estimated_time_s == pytest.approx(1.024)
  path = tmp_path / "m.json"
  mapping.save(path)
  np.testing.assert_array_equal(load_mapping(path).to_arrays(program).prefetch_done, [1])
  inside = edited(mapping, 0, prefetch={"start": 0, "done": 4})
  with pytest.raises(MappingError, match="'prefetch.done' = 4 is not an op boundary"):
    validate_mapping(program, XLA_HW, inside)


def test_a_prefetch_waits_behind_an_eviction_issued_before_it():
  """One FIFO copy engine for both directions: an eviction issued first is served first."""
  from tests.test_cost_model import XLA_HW, xla_program

  program = xla_program(
    [0.0, 0.0, 100.0, 0.0, 0.0, 0.0],
    [
      {"id": 0, "name": "a", "size": 24, "def": 0, "uses": [1, 5], "kind": "activation"},
      {"id": 1, "name": "p", "size": 24, "def": None, "uses": [3], "kind": "parameter"},
    ],
  )
  # a is produced in fast memory at op0 and evicted from op1 (due at op4); p is prefetched from
  # op2, due at op3. op0 and op1 touch only fast memory (0.024 s each, all idle): the eviction
  # gets 0.024 s of op1; op2 computes 0.1 s: 0.1 s more of the eviction, 0.116 s left. At op3
  # the program waits for the rest of the eviction and the whole prefetch: 0.356 s. op5 reads
  # a from default memory (0.24 s).
  rows = [
    dict(buffer=0, level=0, offset=0, start=0, end=4, done=-1, evict_start=1, evict_done=4),
    dict(buffer=1, level=0, offset=24, start=2, end=4, done=3, evict_start=-1, evict_done=-1),
  ]
  mapping = _segments(program, XLA_HW, rows)
  report = validate_mapping(program, XLA_HW, mapping)
  assert report.estimated_time_s == pytest.approx(0.024 + 0.024 + 0.1 + 0.356 + 0.024 + 0.24)


def _outcome(workload, hw, m: Mapping) -> str:
  try:
    validate_mapping(workload, hw, m)
  except MappingError as e:
    return str(e)
  return "valid"


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
  st.lists(
    st.tuples(
      st.integers(0, 200),
      st.sampled_from(["buffer", "level", "offset", "start", "end", "prefetch", "eviction"]),
      st.integers(-2, 45),
      st.integers(-2, 45),
    ),
    min_size=1,
    max_size=3,
  )
)
def test_the_test_of_all_allocations_at_once_reports_what_one_by_one_does(edits):
  """`_suspects` picks the allocations checked one by one: with it, the outcome (valid, or the
  first problem's message) is the one of checking every allocation one by one."""
  from malloczero.env import validator

  m = _msa_mapping()
  rows = [dict(a) for a in m.allocations]
  for index, key, x, y in edits:
    row = rows[index % len(rows)]
    if key in ("prefetch", "eviction"):
      row[key] = {"start": min(x % 41, y % 41), "done": max(x % 41, y % 41)}
    elif key == "offset":
      row[key] = x * HARDWARE.alignment_bytes + (y % 3 == 0)
    else:
      row[key] = x
  broken = with_allocations(m, rows)
  try:
    broken = Mapping.from_dict(broken.to_dict())  # As a file would give it.
  except MappingError:
    assume(False)  # Not a mapping file: refused before any validation.
  at_once = _outcome(WORKLOAD, HARDWARE, broken)
  suspects = validator._suspects
  try:
    validator._suspects = lambda *args: np.ones(len(broken.allocations), bool)
    one_by_one = _outcome(WORKLOAD, HARDWARE, broken)
  finally:
    validator._suspects = suspects
  assert at_once == one_by_one


@functools.lru_cache(maxsize=1)
def _msa_mapping() -> Mapping:
  """msa's mapping of WORKLOAD: prefetches and evictions among its allocations."""
  from malloczero.env.solvers import solve

  return solve(WORKLOAD, HARDWARE, "msa").mapping


_VALUES = st.one_of(
  st.integers(-3, 3), st.sampled_from([2**60, 2**60 + 1, -(2**60) - 1, True, 1.0, "1", None])
)
_COPIES = st.one_of(
  st.none(),
  st.dictionaries(st.sampled_from(["start", "done", "at"]), _VALUES, max_size=3),
  st.integers(0, 2),
)


@settings(max_examples=300, deadline=None)
@given(
  st.dictionaries(
    st.sampled_from(["request", "buffer", "level", "offset", "start", "end", "x"]),
    _VALUES,
    min_size=5,
    max_size=7,
  ),
  st.dictionaries(st.sampled_from(["prefetch", "eviction"]), _COPIES, max_size=2),
)
def test_a_plain_allocation_is_read_as_the_checks_key_by_key_read_it(row, copies):
  """`_plain_allocation`, the quick reading of a mapping row, returns nothing or what the
  checks key by key return (and where they refuse the row, nothing)."""
  from malloczero.env.mapping import _allocation, _plain_allocation

  a = {**row, **copies}

  def fail(message):
    raise MappingError(message)

  try:
    checked = _allocation(a, "allocation 0", fail)
  except MappingError:
    checked = None
  quick = _plain_allocation(a)
  assert quick is None or quick == checked
  if all(type(row.get(k)) is int for k in ("request", "buffer", "level", "offset")) and not copies:
    assert quick == checked  # The common row is read quickly.
