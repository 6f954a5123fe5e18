"""malloczero: learner (see docs/design.md): Haiku networks, the MuZero loss, the optax learner and
its checkpoints. Made-up batches for benchmarks and tests are in learner/fakes.py, outside this API.
Two features that reach beyond the learner are each one sub-package, whose docstring says where
the actors and the learner hook in: learner/probes/ and learner/demonstrations/."""

from malloczero.learner.checkpoint import (
  CHECKPOINT_FILENAME,
  check_params_fit,
  checkpoint_configs,
  checkpoint_steps,
  load_params,
  params_digest,
)
from malloczero.learner.learner import (
  MuZeroLearner,
  TrainingState,
  importance_weights,
  learning_rate_schedule,
  make_initial_state,
  make_optimizer,
  make_sgd_step,
)
from malloczero.learner.losses import muzero_loss, scale_gradient
from malloczero.learner.networks import (
  ILLEGAL_LOGIT,
  MuZeroNetworks,
  Prediction,
  logits_to_scalar,
  make_networks,
  masked_policy_logits,
  scalar_to_probs,
)
from malloczero.replay.targets import PRIORITY_EPSILON, value_targets

__all__ = [
  "CHECKPOINT_FILENAME",
  "ILLEGAL_LOGIT",
  "MuZeroLearner",
  "MuZeroNetworks",
  "PRIORITY_EPSILON",
  "Prediction",
  "TrainingState",
  "check_params_fit",
  "checkpoint_configs",
  "checkpoint_steps",
  "importance_weights",
  "learning_rate_schedule",
  "load_params",
  "logits_to_scalar",
  "make_initial_state",
  "make_networks",
  "make_optimizer",
  "make_sgd_step",
  "masked_policy_logits",
  "muzero_loss",
  "params_digest",
  "scalar_to_probs",
  "scale_gradient",
  "value_targets",
]
