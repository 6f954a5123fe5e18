"""Configuration presets: `tiny` (tests, CI), `small` (a 2-core machine), `large` (cloud); and the
layout of a training run's work directory."""

from malloczero.configs.config import (
  PRESETS,
  ActorConfig,
  Config,
  LearnerConfig,
  NetworkConfig,
  ProbeConfig,
  ReplayConfig,
  SearchConfig,
  get_config,
  large,
  small,
  tiny,
)
from malloczero.configs.workdir import WorkDir

__all__ = [
  "ActorConfig",
  "Config",
  "LearnerConfig",
  "NetworkConfig",
  "PRESETS",
  "ProbeConfig",
  "ReplayConfig",
  "SearchConfig",
  "WorkDir",
  "get_config",
  "large",
  "small",
  "tiny",
]
