"""XLA's memory-space-assignment override protos, as XLA itself defines them.

`MsaSortOrderOverrides` and `PreferredPrefetchOverrides` (package `xla.memory_space_assignment`,
openxla/xla `xla/service/memory_space_assignment/memory_space_assignment.proto`) are the two
messages through which a user steers XLA's msa: which buffers it allocates first or last, and
when it prefers to start a use's prefetch. No installed Python package ships their generated
module, so the message classes are built with the installed protobuf from XLA's own compiled
descriptor of that file: `data/memory_space_assignment.pb` is the serialized
`FileDescriptorProto` that the installed jaxlib (0.6.2) carries in `libjax_common.so`, extracted
by `scripts/xla_msa_descriptor.py` (tests/test_xla_overrides.py checks that it is still the one
jaxlib carries). Text files are read and written with protobuf's own text format, so a file
written here is one XLA's `ParseTextProto` reads, field names and all.
"""

from __future__ import annotations

import functools
import os
from typing import Any, Type

from malloczero.common.errors import MalloczeroError
from malloczero.common.inputs import read_input_text

PACKAGE = "xla.memory_space_assignment"
PROTO_FILE = "xla/service/memory_space_assignment/memory_space_assignment.proto"
DESCRIPTOR = os.path.join(
  os.path.dirname(os.path.abspath(__file__)), "data", "memory_space_assignment.pb"
)
SORT_ORDER = "MsaSortOrderOverrides"
PREFERRED_PREFETCH = "PreferredPrefetchOverrides"


class OverridesError(MalloczeroError, ValueError):
  """An override file that cannot be read as its XLA message."""


@functools.lru_cache(maxsize=None)
def message_class(name: str) -> Type[Any]:
  """The protobuf message class of `xla.memory_space_assignment.NAME`, from XLA's descriptor."""
  from google.protobuf import descriptor_pb2, descriptor_pool, message_factory

  with open(DESCRIPTOR, "rb") as f:
    file_proto = descriptor_pb2.FileDescriptorProto.FromString(f.read())
  pool = descriptor_pool.DescriptorPool()
  pool.Add(file_proto)
  return message_factory.MessageFactory(pool).GetPrototype(
    pool.FindMessageTypeByName(f"{PACKAGE}.{name}")
  )


def to_text(message: Any) -> str:
  """`message` in protobuf's text format (the proto's field names), as XLA's tools print it."""
  from google.protobuf import text_format

  return text_format.MessageToString(message)


def parse_text(text: str, name: str, where: str) -> Any:
  """The `name` message of a text-format string; a one-line OverridesError naming `where` and
  the line and column protobuf's parser stopped at."""
  from google.protobuf import text_format

  message = message_class(name)()
  try:
    text_format.Parse(text, message)
  except text_format.ParseError as e:
    raise OverridesError(f"{where}: not a {PACKAGE}.{name} text proto: {e}") from None
  return message


def read_text_proto(path: str, name: str) -> Any:
  """The `name` message in the text-format file `path` (read within the input limits)."""
  return parse_text(read_input_text(path, OverridesError), name, path)
