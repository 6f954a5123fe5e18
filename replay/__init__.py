"""malloczero: replay (see docs/design.md).

Actors write fixed-length `Step` sequences with `SequenceWriter`; the learner reads `Batch`es with
`Sampler`; `make_table` / `start_server` build the Reverb table both sides agree on.

The names are imported on first use (PEP 562): the targets and step types (numpy only) must not
cost Reverb and TensorFlow (about 4 s), so that the learner's losses, the agent as a solver and
`evaluate` start without them.
"""

from __future__ import annotations

import importlib

_SOURCES = {
  "Batch": "types",
  "PRIORITY_EPSILON": "targets",
  "Sampler": "sampler",
  "SequenceWriter": "writer",
  "Step": "types",
  "TABLE_NAME": "tables",
  "error_buffer": "tables",
  "make_rate_limiter": "tables",
  "make_table": "tables",
  "sequence_signature": "tables",
  "start_server": "tables",
  "WriterStopped": "writer",
  "priority": "targets",
  "step_spec": "types",
  "value_targets": "targets",
  "zero_step": "types",
}

__all__ = list(_SOURCES)


def __getattr__(name: str):
  if name not in _SOURCES:
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
  value = getattr(importlib.import_module(f"{__name__}.{_SOURCES[name]}"), name)
  globals()[name] = value
  return value


def __dir__() -> list[str]:
  return sorted(set(globals()) | set(_SOURCES))
