"""malloczero: replay (see docs/design.md).

Actors write fixed-length `Step` sequences with `SequenceWriter`; the learner reads `Batch`es with
`Sampler`; `make_table` / `start_server` build the Reverb table both sides agree on.
"""

from malloczero.replay.sampler import Sampler
from malloczero.replay.tables import (
  TABLE_NAME,
  error_buffer,
  make_rate_limiter,
  make_table,
  sequence_signature,
  start_server,
)
from malloczero.replay.targets import PRIORITY_EPSILON, priority, value_targets
from malloczero.replay.types import Batch, Step, step_spec, zero_step
from malloczero.replay.writer import SequenceWriter, WriterStopped

__all__ = [
  "Batch",
  "PRIORITY_EPSILON",
  "Sampler",
  "SequenceWriter",
  "Step",
  "TABLE_NAME",
  "error_buffer",
  "make_rate_limiter",
  "make_table",
  "sequence_signature",
  "start_server",
  "WriterStopped",
  "priority",
  "step_spec",
  "value_targets",
  "zero_step",
]
