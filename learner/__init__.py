"""malloczero: learner (see docs/design.md): Haiku networks, the MuZero loss, the optax learner."""

from malloczero.learner.learner import (CHECKPOINT_FILENAME, MuZeroLearner, TrainingState, checkpoint_steps,
                             importance_weights, learner_updates_per_s, learning_rate_schedule,
                             load_params, make_initial_state, params_digest, make_optimizer, make_sgd_step,
                             random_batch)
from malloczero.learner.losses import PRIORITY_EPSILON, muzero_loss, scale_gradient, value_targets
from malloczero.learner.networks import (ILLEGAL_LOGIT, MuZeroNetworks, Prediction, logits_to_scalar,
                              make_networks, masked_policy_logits, scalar_to_probs)

__all__ = [
    "CHECKPOINT_FILENAME", "ILLEGAL_LOGIT", "MuZeroLearner", "MuZeroNetworks", "PRIORITY_EPSILON",
    "Prediction", "TrainingState", "checkpoint_steps", "importance_weights", "learner_updates_per_s",
    "learning_rate_schedule", "load_params", "logits_to_scalar", "make_initial_state",
    "make_networks", "make_optimizer", "make_sgd_step", "masked_policy_logits", "muzero_loss", "params_digest",
    "random_batch", "scalar_to_probs", "scale_gradient", "value_targets",
]
