"""mallocGame: workloads, the hardware cost model, the dm_env game, and the validator.

`env` imports none of malloczero's other packages but `common`.
"""

from malloczero.common.errors import (
  HardwareError,
  IllegalActionError,
  MalloczeroError,
  MappingError,
  WorkloadError,
)
from malloczero.env.cost_model import Allocations, CostModel, Evaluation
from malloczero.env.game import (
  REQUESTS_GAME,
  FeatureLayout,
  GameConfig,
  MsaGame,
  ObservationLayout,
  RequestsGame,
  make_game,
  observation_layout,
  observation_spec,
)
from malloczero.env.hardware import PRESETS, Hardware, MemoryLevel, load_hardware
from malloczero.env.mapping import Mapping, load_mapping
from malloczero.env.requests import Requests, build_requests
from malloczero.env.validator import ValidationReport, validate_mapping
from malloczero.env.workload import Buffer, Op, Workload
from malloczero.env.workload_json import load_workload, save_workload

__all__ = [
  "Allocations",
  "Buffer",
  "CostModel",
  "Evaluation",
  "FeatureLayout",
  "GameConfig",
  "Hardware",
  "HardwareError",
  "IllegalActionError",
  "RequestsGame",
  "MalloczeroError",
  "Mapping",
  "MappingError",
  "MemoryLevel",
  "MsaGame",
  "ObservationLayout",
  "Op",
  "PRESETS",
  "REQUESTS_GAME",
  "Requests",
  "ValidationReport",
  "Workload",
  "WorkloadError",
  "build_requests",
  "load_hardware",
  "load_mapping",
  "load_workload",
  "make_game",
  "observation_layout",
  "observation_spec",
  "save_workload",
  "validate_mapping",
]
