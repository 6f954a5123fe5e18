"""mallocGame: workloads, the hardware cost model, the dm_env game, and the validator.

`env` imports none of malloczero's other packages.
"""

from env.cost_model import Allocations, CostModel, Evaluation
from env.errors import (HardwareError, IllegalActionError, MalloczeroError, MappingError,
                        WorkloadError)
from env.game import GameConfig, MallocGame, observation_spec
from env.hardware import PRESETS, Hardware, MemoryLevel, load_hardware
from env.mapping import Mapping, load_mapping
from env.requests import Requests, build_requests
from env.validator import ValidationReport, validate_mapping
from env.workload import Buffer, Op, Workload, load_workload, save_workload

__all__ = [
    "Allocations", "Buffer", "CostModel", "Evaluation", "GameConfig", "Hardware", "HardwareError",
    "IllegalActionError", "MallocGame", "MalloczeroError", "Mapping", "MappingError",
    "MemoryLevel", "Op", "PRESETS", "Requests", "ValidationReport", "Workload", "WorkloadError",
    "build_requests", "load_hardware", "load_mapping", "load_workload", "observation_spec",
    "save_workload", "validate_mapping",
]
