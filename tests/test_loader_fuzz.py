"""Fuzzing the file loaders: a valid workload, mapping, MiniMalloc CSV or hardware file, mutated
(bytes flipped, cut short, keys deleted or given twice, values of other types, huge numbers, deep
nesting, a byte order mark, bytes that are not UTF-8), loads as a valid object or fails with one
MalloczeroError of one line, never another exception.

A loaded mapping is also validated against its workload, and a loaded workload summarised, so
that what a loader accepts is something the rest of the program can use."""

from __future__ import annotations

import copy
import gzip
import json
import os
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from malloczero.common.errors import MalloczeroError
from malloczero.env import load_hardware, load_mapping, load_workload, validate_mapping
from malloczero.env.hardware import PRESETS
from malloczero.env.programs.synthetic import contended, random_workload
from malloczero.env.solvers import solve
from malloczero.env.workload_json import workload_to_dict

WORKLOAD = random_workload(5, num_ops=12)
HARDWARE = contended(PRESETS["nnpi-like"], WORKLOAD, 0.4)
CSV = "id,lower,upper,size\n0,0,3,100\n1,1,2,50\n2,2,5,10\n3,4,9,70\n"
# Building and loading a mutated file is slower than hypothesis expects of a strategy.
FUZZ = settings(suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])


class Raw(str):
  """Text put into a JSON document as it is: what `json.dumps` would never write."""


class Pairs(list):
  """A JSON object as its (key, value) pairs, so that a key may be written twice."""


def _dump(node: Any) -> str:
  if isinstance(node, Raw):
    return str(node)
  if isinstance(node, Pairs):
    return "{" + ",".join(f"{json.dumps(k)}:{_dump(v)}" for k, v in node) + "}"
  if isinstance(node, dict):
    return _dump(Pairs(node.items()))
  if isinstance(node, list):
    return "[" + ",".join(_dump(v) for v in node) + "]"
  return json.dumps(node)


def _paths(node: Any, path: tuple = ()) -> list[tuple]:
  found = [path]
  if isinstance(node, Pairs):
    return found  # Already given a repeated key: left as it is.
  if isinstance(node, dict):
    for key, value in node.items():
      found += _paths(value, path + (key,))
  elif isinstance(node, list):
    for i, value in enumerate(node):
      found += _paths(value, path + (i,))
  return found


VALUES = st.one_of(
  st.sampled_from(
    [
      None,
      True,
      False,
      0,
      -1,
      1,
      2.0,
      2.5,
      -0.0,
      "",
      "x",
      "a\nb",
      [],
      {},
      [[1]],
      {"k": 1},
      10**30,
      -(2**63),
      2**63,
      1e308,
    ]
  ),
  st.integers(),
  st.floats(),
  st.text(max_size=6),
  st.sampled_from(
    [
      Raw("1" * 5000),
      Raw("1" + "0" * 400),
      Raw("NaN"),
      Raw("-Infinity"),
      Raw("1e999"),
      Raw("[" * 50000 + "]" * 50000),
      Raw('{"a":' * 2000 + "1" + "}" * 2000),
      Raw("[" * 900 + "]" * 900),
    ]
  ),
)


@st.composite
def mutated_json(draw, document: Any) -> bytes:
  """`document` changed in a few places, as JSON text, then maybe changed as bytes."""
  doc = copy.deepcopy(document)
  for _ in range(draw(st.integers(0, 3))):
    paths = _paths(doc)
    path = draw(st.sampled_from(paths))
    if not path:
      doc = draw(VALUES) if draw(st.integers(0, 9)) == 0 else doc
      continue
    parent = doc
    for step in path[:-1]:
      parent = parent[step]
    last = path[-1]
    action = draw(st.sampled_from(["delete", "replace", "replace", "repeat", "add"]))
    if action == "delete":
      del parent[last]
    elif action == "replace":
      parent[last] = draw(VALUES)
    elif action == "repeat" and isinstance(parent, dict):
      pairs = Pairs(parent.items())
      pairs.insert(draw(st.integers(0, len(pairs))), (last, draw(VALUES)))
      _replace(doc, path[:-1], pairs)
      if not path[:-1]:
        doc = pairs
    elif action == "repeat":
      parent.insert(last, copy.deepcopy(parent[last]))
    elif isinstance(parent[last], dict):
      parent[last][draw(st.sampled_from(["extra", "id", "Name", "prefetch", "levels"]))] = draw(
        VALUES
      )
  return draw(mutated_bytes(_dump(doc).encode("utf-8")))


def _replace(doc: Any, path: tuple, value: Any) -> None:
  if path:
    parent = doc
    for step in path[:-1]:
      parent = parent[step]
    parent[path[-1]] = value


@st.composite
def mutated_bytes(draw, data: bytes) -> bytes:
  """`data` with a few byte-level changes: flips, a cut, a BOM, bytes that are not UTF-8."""
  for _ in range(draw(st.integers(0, 2))):
    at = draw(st.integers(0, len(data)))
    action = draw(st.sampled_from(["flip", "cut", "bom", "latin-1", "insert"]))
    if action == "flip" and at < len(data):
      data = data[:at] + bytes([data[at] ^ draw(st.integers(1, 255))]) + data[at + 1 :]
    elif action == "cut":
      data = data[:at]
    elif action == "bom":
      data = b"\xef\xbb\xbf" + data
    elif action == "latin-1":
      data = data[:at] + b"\xe9\xff" + data[at:]
    else:
      data = (
        data[:at]
        + draw(st.sampled_from([b",", b'"', b"{", b"]", b"\n", b"\x00", b"-"]))
        + data[at:]
      )
  return data


@st.composite
def mutated_csv(draw) -> bytes:
  """The CSV with lines dropped or repeated and cells replaced, then changed as bytes."""
  rows = [line.split(",") for line in CSV.splitlines()]
  for _ in range(draw(st.integers(0, 3))):
    i = draw(st.integers(0, len(rows) - 1))
    action = draw(st.sampled_from(["drop", "repeat", "cell"]))
    if action == "drop":
      del rows[i]
    elif action == "repeat":
      rows.insert(i, list(rows[i]))
    elif rows[i]:
      rows[i][draw(st.integers(0, len(rows[i]) - 1))] = draw(
        st.sampled_from(
          ["", "-1", "x", "1" * 5000, "9" * 25, "1e3", "+3", '"a\nb"', "0", '"', "\u0663"]
        )
      )
    if not rows:
      break
  text = "\n".join(",".join(row) for row in rows) + "\n"
  return draw(mutated_bytes(text.encode("utf-8")))


def _one_line_or_result(load, path: str) -> Any:
  """What `load(path)` returns, or None when it fails as it should: one MalloczeroError whose
  message is one line. Any other exception fails the test."""
  try:
    return load(path)
  except MalloczeroError as e:
    message = str(e)
    assert message and len(message.splitlines()) == 1 and message == message.strip(), message
    assert len(message) < 1000, message
    return None


def _write(folder: str, name: str, data: bytes, compressed: bool) -> str:
  path = os.path.join(folder, name + (".gz" if compressed else ""))
  with open(path, "wb") as f:
    f.write(gzip.compress(data) if compressed else data)
  return path


@pytest.fixture(scope="module")
def folder(tmp_path_factory) -> str:
  return str(tmp_path_factory.mktemp("fuzz"))


@pytest.fixture(scope="module")
def mapping_dict() -> dict:
  mapping = solve(WORKLOAD, HARDWARE, "bestfit").mapping
  assert mapping.allocations
  return mapping.to_dict()


@FUZZ
@given(data=st.data(), compressed=st.booleans())
def test_workload_loader_survives_mutations(folder, data, compressed):
  raw = data.draw(mutated_json(workload_to_dict(WORKLOAD)))
  workload = _one_line_or_result(load_workload, _write(folder, "w.json", raw, compressed))
  if workload is not None:
    workload.summary()


@FUZZ
@given(data=st.data(), compressed=st.booleans())
def test_mapping_loader_survives_mutations(folder, mapping_dict, data, compressed):
  raw = data.draw(mutated_json(mapping_dict))
  mapping = _one_line_or_result(load_mapping, _write(folder, "m.json", raw, compressed))
  if mapping is not None:
    _one_line_or_result(lambda m: validate_mapping(WORKLOAD, HARDWARE, m), mapping)


@FUZZ
@given(raw=mutated_csv())
def test_csv_loader_survives_mutations(folder, raw):
  workload = _one_line_or_result(load_workload, _write(folder, "p.csv", raw, False))
  if workload is not None:
    workload.summary()


@FUZZ
@given(data=st.data())
def test_hardware_loader_survives_mutations(folder, data):
  raw = data.draw(mutated_json(HARDWARE.to_dict()))
  hardware = _one_line_or_result(load_hardware, _write(folder, "hw.json", raw, False))
  if hardware is not None:
    _one_line_or_result(hardware.with_fast_capacity, hardware.fast_capacity_bytes // 2)


@given(
  capacity=st.one_of(st.integers(), st.integers(-8, 4096), st.just(2**62 + 1)),
  level=st.sampled_from([None, "SRAM", "LLC", "DRAM", "L2"]),
)
def test_capacities_are_set_or_refused_in_one_line(capacity, level):
  hw = PRESETS["nnpi-like"]
  hardware = _one_line_or_result(
    lambda c: hw.with_fast_capacity(c) if level is None else hw.with_level_capacities({level: c}),
    capacity,
  )
  if hardware is not None:
    assert hw.alignment_bytes <= capacity <= hw.levels[-1].capacity_bytes
    assert all(
      hw.alignment_bytes <= lv.capacity_bytes <= hw.levels[-1].capacity_bytes
      for lv in hardware.levels
    )
