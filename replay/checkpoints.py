"""The Reverb table's checkpoints, checked before a resumed run starts its replay node.

Reverb's default checkpointer (reverb/cc/platform/tfrecord_checkpointer.cc) writes each
checkpoint to a directory of its own, named by its time, holding `tables.tfrecord`,
`chunks.tfrecord` and `items.tfrecord` (ZLIB-compressed TFRecords) and, last, an empty `DONE`
file; on start it loads the newest directory that has `DONE`. A truncated or damaged file there
kills the replay node seconds into the launch, so the launcher reads every record first.
"""

from __future__ import annotations

import os
from typing import Optional

from malloczero.common.errors import MalloczeroError

CHECKPOINT_FILES = ("tables.tfrecord", "chunks.tfrecord", "items.tfrecord")


def latest_replay_checkpoint(directory: str) -> Optional[str]:
  """The checkpoint Reverb would load from `directory`: the newest with `DONE`, or None."""
  if not os.path.isdir(directory):
    return None
  done = [
    os.path.join(directory, name)
    for name in os.listdir(directory)
    if os.path.isfile(os.path.join(directory, name, "DONE"))
  ]
  return max(done, default=None)


def check_replay_checkpoint(directory: str) -> Optional[str]:
  """Reads every record of the checkpoint Reverb would load (CRCs and decompression checked);
  returns its path (None when there is none). A damaged one is a one-line MalloczeroError."""
  latest = latest_replay_checkpoint(directory)
  if latest is None:
    return None
  import tensorflow as tf

  # No autotuning: its optimisation thread, cancelled at exit, can log a line to stderr in a
  # command whose refusal must be one line.
  quiet = tf.data.Options()
  quiet.autotune.enabled = False
  quiet.experimental_optimization.apply_default_optimizations = False
  for name in CHECKPOINT_FILES:
    path = os.path.join(latest, name)
    try:
      for _ in tf.data.TFRecordDataset(path, compression_type="ZLIB").with_options(quiet):
        pass
    except (tf.errors.OpError, OSError) as e:
      why = str(getattr(e, "message", e)).splitlines()[0] if str(e) else type(e).__name__
      raise MalloczeroError(
        f"the replay checkpoint {latest} is damaged ({name}: {why}); move it away to resume "
        "with an empty table (the learner's checkpoint is kept)"
      ) from None
  return latest
