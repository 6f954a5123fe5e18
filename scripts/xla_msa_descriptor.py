#!/usr/bin/env python
"""Extracts XLA's compiled descriptor of memory_space_assignment.proto from the installed jaxlib
into env/msa/data/memory_space_assignment.pb (env/msa/xla_proto.py builds the override messages
from it).

  .venv/bin/python scripts/xla_msa_descriptor.py           # write it
  .venv/bin/python scripts/xla_msa_descriptor.py --check   # exit 1 unless it is jaxlib's

protoc embeds each compiled .proto file in the library as its serialized `FileDescriptorProto`,
which starts with field 1, the file's name. From there the top-level fields are walked (protoc
writes them in increasing field number) until one that cannot belong to it, and the bytes are
kept only if they parse back to exactly themselves.
"""

from __future__ import annotations

import argparse
import glob
import os
import sys
from typing import Optional

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from malloczero.env.msa.xla_proto import DESCRIPTOR, PROTO_FILE  # noqa: E402

# FileDescriptorProto's field numbers (name 1 ... edition 14) and the wire types they use.
_FIELDS = range(1, 15)


def _varint(data: bytes, i: int) -> tuple[int, int]:
  value, shift = 0, 0
  while True:
    byte = data[i]
    i += 1
    value |= (byte & 0x7F) << shift
    shift += 7
    if not byte & 0x80:
      return value, i


def _descriptor_at(data: bytes, start: int) -> Optional[bytes]:
  from google.protobuf import descriptor_pb2

  i, last = start, 0
  try:
    while i < len(data):
      key, j = _varint(data, i)
      field, wire = key >> 3, key & 7
      if field not in _FIELDS or field < last or wire not in (0, 2):
        break
      value, j = _varint(data, j)
      i, last = (j + value if wire == 2 else j), field
  except IndexError:
    return None
  blob = data[start:i]
  try:
    parsed = descriptor_pb2.FileDescriptorProto.FromString(blob)
  except Exception:  # noqa: BLE001 - any bytes that do not parse are simply not it.
    return None
  return blob if parsed.name == PROTO_FILE and parsed.SerializeToString() == blob else None


def jaxlib_descriptor() -> bytes:
  """The serialized descriptor of `PROTO_FILE` in the installed jaxlib's libraries."""
  import jaxlib

  name = PROTO_FILE.encode()
  marker = b"\x0a" + bytes([len(name)]) + name
  for library in sorted(glob.glob(os.path.join(os.path.dirname(jaxlib.__file__), "*.so"))):
    with open(library, "rb") as f:
      data = f.read()
    at = data.find(marker)
    while at >= 0:
      blob = _descriptor_at(data, at)
      if blob is not None:
        return blob
      at = data.find(marker, at + 1)
  raise SystemExit(f"no compiled descriptor of {PROTO_FILE} in jaxlib's libraries")


def main() -> int:
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("--check", action="store_true", help="compare with the committed file")
  args = parser.parse_args()
  blob = jaxlib_descriptor()
  if args.check:
    with open(DESCRIPTOR, "rb") as f:
      same = f.read() == blob
    print(f"{DESCRIPTOR}: {'the same as' if same else 'differs from'} jaxlib's ({len(blob)} bytes)")
    return 0 if same else 1
  with open(DESCRIPTOR, "wb") as f:
    f.write(blob)
  print(f"wrote {DESCRIPTOR} ({len(blob)} bytes)")
  return 0


if __name__ == "__main__":
  sys.exit(main())
