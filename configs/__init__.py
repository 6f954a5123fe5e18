"""Configuration presets: `tiny` (tests, CI), `small` (a 2-core machine), `large` (cloud)."""

from malloczero.configs.config import (ActorConfig, Config, LearnerConfig, NetworkConfig, PRESETS,
                            ReplayConfig, SearchConfig, get_config, large, small, tiny)

__all__ = ["ActorConfig", "Config", "LearnerConfig", "NetworkConfig", "PRESETS", "ReplayConfig",
           "SearchConfig", "get_config", "large", "small", "tiny"]
