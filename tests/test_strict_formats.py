"""The file formats read strictly: what Python's `json` would let through or end in a traceback
(deep nesting, keys given twice, NaN, numbers of thousands of digits, 2.0 for an integer, unknown
keys) is one line naming the file and where in it; a byte order mark is accepted."""

import dataclasses
import gzip
import json

import pytest

from malloczero.common.errors import HardwareError, MappingError, WorkloadError
from malloczero.env import load_hardware, load_mapping, load_workload, validate_mapping
from malloczero.env.hardware import PRESETS
from malloczero.env.mapping import Mapping
from malloczero.env.minimalloc_csv import workload_from_minimalloc_csv
from malloczero.env.programs.synthetic import contended, random_workload
from malloczero.env.solvers import solve
from tests.test_workload import GOOD

WORKLOAD = random_workload(5, num_ops=12)
HARDWARE = contended(PRESETS["nnpi-like"], WORKLOAD, 0.4)
CSV = "id,lower,upper,size\n0,0,3,100\n1,1,2,50\n"


@pytest.fixture(scope="module")
def mapping() -> Mapping:
  found = solve(WORKLOAD, HARDWARE, "bestfit").mapping
  assert any("prefetch" in a for a in found.allocations)
  return found


def _refused(load, path, text, error, message):
  """`load(path)` of a file holding `text` fails with `error`: one line naming the file."""
  path.write_text(text, encoding="utf-8")
  with pytest.raises(error, match=message) as info:
    load(path)
  assert str(info.value).startswith(str(path)) and len(str(info.value).splitlines()) == 1
  return str(info.value)


def _loaders(tmp_path, mapping):
  """(loader, a file it reads, its valid document, its error class) for each JSON format."""
  return [
    (load_workload, tmp_path / "w.json", json.loads(json.dumps(GOOD)), WorkloadError),
    (load_mapping, tmp_path / "m.json", mapping.to_dict(), MappingError),
    (load_hardware, tmp_path / "hw.json", HARDWARE.to_dict(), HardwareError),
  ]


@pytest.mark.parametrize("depth", [2000, 50_000, 100_000])
def test_deeply_nested_json_is_one_line(tmp_path, mapping, depth):
  for load, path, _, error in _loaders(tmp_path, mapping):
    for text in ("[" * depth + "]" * depth, '{"ops":' * depth + "1" + "}" * depth):
      _refused(load, path, text, error, "JSON nested too deeply to read")


def test_duplicate_keys_are_refused_with_their_place(tmp_path, mapping):
  workload, mapping_file, hardware = _loaders(tmp_path, mapping)
  text = json.dumps(workload[2]).replace('"size": 32', '"size": 32, "size": 64')
  _refused(
    load_workload,
    workload[1],
    text,
    WorkloadError,
    r"key 'size' appears twice in the object at buffers\[1\]: give each key once",
  )
  data = mapping_file[2]
  i = next(i for i, a in enumerate(data["allocations"]) if "prefetch" in a)
  done = data["allocations"][i]["prefetch"]["done"]
  text = json.dumps(data).replace(f'"done": {done}}}', f'"done": {done}, "done": {done + 1}}}', 1)
  _refused(
    load_mapping,
    mapping_file[1],
    text,
    MappingError,
    rf"key 'done' appears twice in the object at allocations\[{i}\].prefetch",
  )
  text = json.dumps(hardware[2]).replace(
    '"alignment_bytes": 64', '"alignment_bytes": 64, "alignment_bytes": 128'
  )
  _refused(
    load_hardware,
    hardware[1],
    text,
    HardwareError,
    "key 'alignment_bytes' appears twice in the top-level object",
  )


def test_integers_with_thousands_of_digits_say_the_number_is_too_long(tmp_path, mapping):
  for load, path, data, error in _loaders(tmp_path, mapping):
    text = json.dumps(data)
    key = {
      WorkloadError: '"size": 64',
      MappingError: '"offset": 0',
      HardwareError: '"alignment_bytes": 64',
    }[error]
    assert key in text
    message = _refused(
      load,
      path,
      text.replace(key, key.split(":")[0] + ": " + "7" * 5000, 1),
      error,
      "an integer of 5000 digits is too long",
    )
    assert "set_int_max_str_digits" not in message
  message = _refused(
    load_workload,
    tmp_path / "p.csv",
    CSV + "2,0,1," + "7" * 5000 + "\n",
    WorkloadError,
    r"CSV line 4: 'size' is an integer of 5000 digits, too long",
  )
  assert "set_int_max_str_digits" not in message


def test_not_a_number_is_refused(tmp_path, mapping):
  for load, path, data, error in _loaders(tmp_path, mapping):
    key = {
      WorkloadError: "flops",
      MappingError: "estimated_time_s",
      HardwareError: "peak_flops_per_s",
    }[error]
    text = json.dumps(data, allow_nan=True)
    node = data["ops"][0] if error is WorkloadError else data
    node[key] = float("nan")
    _refused(load, path, json.dumps(data), error, "'NaN' is not a JSON number")
    assert "NaN" not in text


def test_a_byte_order_mark_is_accepted(tmp_path, mapping):
  plain = workload_from_minimalloc_csv(CSV, name="p")
  assert workload_from_minimalloc_csv("\ufeff" + CSV, name="p") == plain
  path = tmp_path / "p.csv"
  path.write_text("\ufeff" + CSV, encoding="utf-8")
  assert path.read_bytes().startswith(b"\xef\xbb\xbf")
  assert load_workload(path) == plain
  for load, path, data, _ in _loaders(tmp_path, mapping):
    path.write_text("\ufeff" + json.dumps(data), encoding="utf-8")
    load(path)


def test_integers_only_where_integers_are_meant(tmp_path, mapping):
  data = mapping.to_dict()
  for version in (2.0, True, "2"):
    data["format_version"] = version
    _refused(
      load_mapping,
      tmp_path / "m.json",
      json.dumps(data),
      MappingError,
      rf"'format_version' must be the integer 2, got {version!r}",
    )
  data["format_version"] = 2
  data["allocations"][0]["offset"] = 0.0
  _refused(
    load_mapping,
    tmp_path / "m.json",
    json.dumps(data),
    MappingError,
    r"allocation 0: 'offset' must be an integer, got 0.0",
  )
  hardware = HARDWARE.to_dict()
  hardware["levels"][0]["capacity_bytes"] = float(hardware["levels"][0]["capacity_bytes"])
  _refused(
    load_hardware,
    tmp_path / "hw.json",
    json.dumps(hardware),
    HardwareError,
    r"level 0: 'capacity_bytes' must be an integer, got \d+\.0",
  )
  hardware = HARDWARE.to_dict()
  hardware["alignment_bytes"] = True
  _refused(
    load_hardware,
    tmp_path / "hw.json",
    json.dumps(hardware),
    HardwareError,
    "'alignment_bytes' must be an integer, got True",
  )


def test_times_beyond_a_float_are_refused(tmp_path, mapping):
  data = mapping.to_dict()
  data["estimated_time_s"] = 10**400
  _refused(
    load_mapping,
    tmp_path / "m.json",
    json.dumps(data),
    MappingError,
    "'estimated_time_s' must be a finite number of seconds >= 0, got 1000",
  )


@pytest.mark.parametrize("where", ["top", "allocation", "prefetch", "hardware", "level"])
def test_unknown_keys_are_refused_at_every_level(tmp_path, mapping, where):
  data = mapping.to_dict()
  i = next(i for i, a in enumerate(data["allocations"]) if "prefetch" in a)
  node, message = {
    "top": (data, "unknown key 'extra'"),
    "allocation": (data["allocations"][i], rf"allocation {i}: unknown key 'extra'"),
    "prefetch": (
      data["allocations"][i]["prefetch"],
      rf"allocation {i}: 'prefetch': unknown key 'extra' \(known keys: start, done\)",
    ),
    "hardware": (data["hardware"], "hardware: unknown key 'extra'"),
    "level": (data["hardware"]["levels"][1], "hardware: level 1: unknown key 'extra'"),
  }[where]
  node["extra"] = 1
  _refused(
    load_mapping,
    tmp_path / "m.json",
    json.dumps(data),
    MappingError,
    message + ".*remove it or fix its spelling",
  )
  if where in ("hardware", "level"):
    _refused(
      load_hardware,
      tmp_path / "hw.json",
      json.dumps(data["hardware"]),
      HardwareError,
      message.replace("hardware: ", ""),
    )


def test_csv_buffer_ids_are_non_negative():
  with pytest.raises(WorkloadError, match=r"buffer -1 \('b-1'\): buffer ids must be >= 0"):
    workload_from_minimalloc_csv(CSV.replace("\n1,", "\n-1,"), name="p")


def test_a_copy_due_before_its_issue_is_refused_naming_the_window(tmp_path, mapping):
  data = mapping.to_dict()
  i = next(i for i, a in enumerate(data["allocations"]) if "prefetch" in a)
  start = data["allocations"][i]["prefetch"]["start"]
  data["allocations"][i]["prefetch"]["done"] = start - 1 if start else 0
  data["allocations"][i]["prefetch"]["start"] = max(start, 1)
  _refused(
    load_mapping,
    tmp_path / "m.json",
    json.dumps(data),
    MappingError,
    rf"allocation {i}: its prefetch window \[start {max(start, 1)}, done "
    rf"{start - 1 if start else 0}\] is due before it is issued: 'done' must be >= 'start'",
  )


def test_a_copy_due_at_its_issue_is_a_full_stall_not_a_bad_window():
  """A prefetch due at the op it is issued at is the simulator's full stall (env/simulator.py);
  the baselines write one when a program's first op reads a parameter, so it is a valid window
  and only a reported time that ignores the stall is refused."""
  from tests.test_cost_model import XLA_HW, param, xla_program
  from tests.test_validator import _segments

  program = xla_program([0.0, 100.0, 0.0], [param(0, 24, [0, 2])])
  rows = [dict(buffer=0, level=0, offset=0, start=0, end=3, done=0, evict_start=-1, evict_done=-1)]
  stalled = _segments(program, XLA_HW, rows)
  assert stalled.allocations[0]["prefetch"] == {"start": 0, "done": 0}
  validate_mapping(program, XLA_HW, stalled)
  later = _segments(program, XLA_HW, [dict(rows[0], done=2)])
  assert later.estimated_time_s != stalled.estimated_time_s
  with pytest.raises(MappingError, match="reported estimated_time_s"):
    validate_mapping(
      program, XLA_HW, dataclasses.replace(stalled, estimated_time_s=later.estimated_time_s)
    )


def test_mappings_may_be_gzipped(tmp_path, mapping):
  path = tmp_path / "m.json.gz"
  mapping.save(path)
  assert json.loads(gzip.decompress(path.read_bytes())) == mapping.to_dict()
  assert load_mapping(path) == mapping
  path.write_bytes(path.read_bytes()[:40])
  with pytest.raises(MappingError, match=r"m.json.gz: cannot read") as info:
    load_mapping(path)
  assert len(str(info.value).splitlines()) == 1


@pytest.mark.parametrize(
  "capacity,message",
  [
    (
      {"SRAM": 64 << 30},
      r"nnpi-like: capacity of 'SRAM' 64.00 GiB \(68719476736 bytes\) exceeds "
      r"the slow default memory 'DRAM' \(32.00 GiB\): give at most 34359738368 bytes",
    ),
    (
      {"LLC": 3},
      r"capacity of 'LLC' 3 bytes is below the alignment of 64 bytes, so no buffer "
      "fits: give at least 64 bytes",
    ),
    ({"SRAM": 0}, "capacity of 'SRAM' must be positive, got 0"),
    (3, r"nnpi-like: fast capacity 3 bytes is below the alignment of 64 bytes"),
    (33 << 30, r"nnpi-like: fast capacity 33.00 GiB .* exceeds the slow default memory 'DRAM'"),
    (10**30, r"fast capacity is beyond the limit of 2\*\*62 bytes, got a 31-digit number"),
  ],
)
def test_capacities_above_the_slow_memory_or_below_the_alignment_are_refused(capacity, message):
  hw = PRESETS["nnpi-like"]
  with pytest.raises(HardwareError, match=message) as info:
    if isinstance(capacity, dict):
      hw.with_level_capacities(capacity)
    else:
      hw.with_fast_capacity(capacity)
  assert len(str(info.value).splitlines()) == 1
  assert (
    hw.with_fast_capacity(hw.levels[-1].capacity_bytes).fast_capacity_bytes
    <= hw.levels[-1].capacity_bytes
  )
  assert hw.with_level_capacities({"LLC": 64}).levels[1].capacity_bytes == 64
