"""Hardware descriptions: memory levels (fastest first), compute peak, copy bandwidth, alignment.

The last level is the slow default memory where every buffer lives unless placed elsewhere;
levels before it are the fast memories the game places requests into.

JSON format::

  {"name": str, "peak_flops_per_s": number, "copy_bandwidth_bytes_per_s": number,
   "alignment_bytes": int,
   "levels": [{"name": str, "capacity_bytes": int, "bandwidth_bytes_per_s": number}, ...]}
"""

from __future__ import annotations

import dataclasses
import os
from typing import Any, Mapping, Optional, Sequence

import numpy as np

from malloczero.common import strict_json
from malloczero.common.errors import HardwareError, MalloczeroError
from malloczero.common.strict_json import show_value, unknown_key
from malloczero.common.units import human_bytes, show_int
from malloczero.env.workload import Workload

KiB, MiB, GiB = 1 << 10, 1 << 20, 1 << 30
# Capacities and the alignment become int64 arrays and are added to offsets there; the bound keeps
# those sums from overflowing (the 'minimalloc' preset's slow memory is 2**62 bytes).
MAX_CAPACITY_BYTES = 1 << 62
MAX_ALIGNMENT_BYTES = 1 << 30
HARDWARE_KEYS = (
  "name",
  "peak_flops_per_s",
  "copy_bandwidth_bytes_per_s",
  "alignment_bytes",
  "levels",
)
LEVEL_KEYS = ("name", "capacity_bytes", "bandwidth_bytes_per_s")


@dataclasses.dataclass(frozen=True)
class MemoryLevel:
  name: str
  capacity_bytes: int
  bandwidth_bytes_per_s: float


@dataclasses.dataclass(frozen=True)
class Hardware:
  name: str
  levels: tuple[MemoryLevel, ...]
  peak_flops_per_s: float
  copy_bandwidth_bytes_per_s: float
  alignment_bytes: int = 1

  def __post_init__(self):
    _check_hardware(self)

  @property
  def num_levels(self) -> int:
    return len(self.levels)

  @property
  def num_fast_levels(self) -> int:
    return len(self.levels) - 1

  @property
  def slow_level(self) -> int:
    return len(self.levels) - 1

  @property
  def inverse_bandwidths(self) -> np.ndarray:
    """[L] seconds per byte of each level."""
    return 1.0 / np.array([lv.bandwidth_bytes_per_s for lv in self.levels], np.float64)

  @property
  def capacities(self) -> np.ndarray:
    """[L] int64 bytes."""
    return np.array([lv.capacity_bytes for lv in self.levels], np.int64)

  def align(self, size: np.ndarray | int) -> np.ndarray | int:
    a = self.alignment_bytes
    return (size + a - 1) // a * a

  def with_fast_capacities(self, capacities: list[int] | tuple[int, ...]) -> "Hardware":
    """The same machine with each fast level's capacity replaced (in level order)."""
    if len(capacities) != self.num_fast_levels:
      raise HardwareError(
        f"{self.name}: expected {self.num_fast_levels} fast capacities, got {len(capacities)}"
      )
    for lv, capacity in zip(self.levels, capacities):
      if problem := self._capacity_problem(int(capacity)):
        raise HardwareError(f"{self.name}: capacity of '{lv.name}' {problem}")
    levels = tuple(
      dataclasses.replace(lv, capacity_bytes=int(c)) for lv, c in zip(self.levels, capacities)
    ) + (self.levels[-1],)
    return dataclasses.replace(self, levels=levels)

  @property
  def fast_capacity_bytes(self) -> int:
    """The fast levels' capacities together."""
    return sum(lv.capacity_bytes for lv in self.levels[:-1])

  def with_fast_capacity(self, capacity_bytes: int) -> "Hardware":
    """The fast levels *together* hold `capacity_bytes`, shared in the ratio of their capacities
    here (nnpi-like's SRAM:LLC is 1:6), each rounded down to the alignment (at least one unit).

    Together, not the fastest level alone, so that a capacity below a program's peak contends
    every fast level: scaling the other levels with the fastest one gave nnpi-like an LLC of 6x
    the SRAM, which at "25% of peak" held 150% of the program and contended nothing."""
    if problem := self._capacity_problem(capacity_bytes):
      raise HardwareError(f"{self.name}: fast capacity {problem}")
    shares = np.array([lv.capacity_bytes for lv in self.levels[:-1]], np.float64)
    shares /= shares.sum()
    a = self.alignment_bytes
    caps = [max(a, int(capacity_bytes * share) // a * a) for share in shares]
    if len(caps) == 1:
      caps = [capacity_bytes]  # One fast level: exactly what was asked (as before).
    return self.with_fast_capacities(caps)

  def with_level_capacities(self, capacities: Mapping[str, int]) -> "Hardware":
    """The named fast levels get the given capacities; the others keep theirs."""
    fast = {lv.name: lv for lv in self.levels[:-1]}
    for name in capacities:
      if name not in fast:
        slow = (
          f"; '{name}' is the slow default memory, which always holds the whole program"
          if name == self.levels[-1].name
          else ""
        )
        raise HardwareError(
          f"{self.name}: no fast level '{name}' (fast levels: {', '.join(fast)}){slow}"
        )
    return self.with_fast_capacities(
      [capacities.get(lv.name, lv.capacity_bytes) for lv in self.levels[:-1]]
    )

  def _capacity_problem(self, capacity: int) -> str | None:
    """What is wrong with `capacity` bytes of fast memory here, else None: a fast level holds
    part of what the slow default memory holds, and at least one aligned unit, or no buffer fits."""
    slow, a = self.levels[-1], self.alignment_bytes
    if capacity <= 0:
      return f"must be positive, got {show_int(capacity)}"
    if capacity > MAX_CAPACITY_BYTES:
      return f"is beyond the limit of 2**62 bytes, got {show_int(capacity)}"
    if capacity > slow.capacity_bytes:
      return (
        f"{human_bytes(capacity)} ({capacity} bytes) exceeds the slow default memory "
        f"'{slow.name}' ({human_bytes(slow.capacity_bytes)}): give at most "
        f"{slow.capacity_bytes} bytes or other hardware; {fit_advice(capacity, exclude=self.name)}"
      )
    if capacity < a:
      return (
        f"{capacity} bytes is below the alignment of {a} bytes, so no buffer fits: give at "
        f"least {a} bytes"
      )
    return None

  def to_dict(self) -> dict[str, Any]:
    return {
      "name": self.name,
      "peak_flops_per_s": self.peak_flops_per_s,
      "copy_bandwidth_bytes_per_s": self.copy_bandwidth_bytes_per_s,
      "alignment_bytes": self.alignment_bytes,
      "levels": [dataclasses.asdict(lv) for lv in self.levels],
    }

  @classmethod
  def from_dict(cls, data: Any, where: str = "hardware") -> "Hardware":
    """The machine `data` describes, checked key by key (no key the format lacks, integers where
    it means integers); `where` starts every message."""
    if not isinstance(data, Mapping):
      raise HardwareError(f"{where}: expected a JSON object, got {type(data).__name__}")
    if problem := unknown_key(data, HARDWARE_KEYS):
      raise HardwareError(f"{where}: {problem}")
    raw_levels = data.get("levels", [])
    if not isinstance(raw_levels, list) or not all(isinstance(lv, Mapping) for lv in raw_levels):
      raise HardwareError(
        f"{where}: 'levels' must be a list of objects, got {show_value(raw_levels)}"
      )
    try:
      levels = tuple(_level(lv, j) for j, lv in enumerate(data["levels"]))
      return cls(
        name=_as_name(data.get("name", "custom")),
        levels=levels,
        peak_flops_per_s=_as_float(data["peak_flops_per_s"], "peak_flops_per_s"),
        copy_bandwidth_bytes_per_s=_as_float(
          data["copy_bandwidth_bytes_per_s"], "copy_bandwidth_bytes_per_s"
        ),
        alignment_bytes=_as_int(data.get("alignment_bytes", 1), "alignment_bytes"),
      )
    except KeyError as e:
      raise HardwareError(f"{where}: missing required key {e}") from None
    except (TypeError, ValueError) as e:
      if isinstance(e, HardwareError):
        raise HardwareError(f"{where}: {e}") from None
      raise HardwareError(f"{where}: malformed hardware description: {e}") from None


def _level(data: Mapping, j: int) -> MemoryLevel:
  """Level `j` of a hardware file; a problem is a HardwareError naming the level."""
  problem = unknown_key(data, LEVEL_KEYS)
  missing = next((k for k in LEVEL_KEYS if k not in data), None)
  if problem or missing:
    raise HardwareError(f"level {j}: {problem or f'missing required key {missing!r}'}")
  try:
    return MemoryLevel(
      _as_name(data["name"]),
      _as_int(data["capacity_bytes"], "capacity_bytes"),
      _as_float(data["bandwidth_bytes_per_s"], "bandwidth_bytes_per_s"),
    )
  except HardwareError as e:
    raise HardwareError(f"level {j}: {e}") from None


def _as_name(x: Any) -> str:
  if not isinstance(x, str) or not x.isprintable():
    raise HardwareError(f"a 'name' must be a string of printable text, got {show_value(x)}")
  return x


def _as_int(x: Any, key: str) -> int:
  if isinstance(x, bool) or not isinstance(x, int):
    raise HardwareError(f"'{key}' must be an integer, got {show_value(x)}")
  limit = MAX_ALIGNMENT_BYTES if key == "alignment_bytes" else MAX_CAPACITY_BYTES
  if abs(int(x)) > limit:
    digits = len(str(abs(int(x))))
    shown = str(int(x)) if digits <= 30 else f"a {digits}-digit number"
    raise HardwareError(f"'{key}' = {shown} is beyond the limit of 2**{limit.bit_length() - 1}")
  return int(x)


def _as_float(x: Any, key: str) -> float:
  if isinstance(x, bool) or not isinstance(x, (int, float)):
    raise HardwareError(f"'{key}' must be a number, got {show_value(x)}")
  try:
    return float(x)
  except OverflowError:
    raise HardwareError(f"'{key}' is too large a number") from None


def _check_hardware(hw: Hardware) -> None:
  def fail(msg: str) -> None:
    raise HardwareError(f"hardware '{hw.name}': {msg}")

  if len(hw.levels) < 2:
    fail("needs at least two memory levels (one fast level and the slow default memory)")
  for lv in hw.levels:
    if lv.capacity_bytes <= 0:
      fail(f"level '{lv.name}' has capacity {lv.capacity_bytes}; capacities must be positive")
    if lv.capacity_bytes > MAX_CAPACITY_BYTES:
      fail(f"level '{lv.name}' has capacity {lv.capacity_bytes}, beyond the limit of 2**62 bytes")
    if not np.isfinite(lv.bandwidth_bytes_per_s) or lv.bandwidth_bytes_per_s <= 0:
      fail(f"level '{lv.name}' has bandwidth {lv.bandwidth_bytes_per_s}; must be positive")
  for faster, slower in zip(hw.levels, hw.levels[1:]):
    if faster.bandwidth_bytes_per_s <= slower.bandwidth_bytes_per_s:
      fail(
        f"levels must be ordered fastest first: '{faster.name}' "
        f"({faster.bandwidth_bytes_per_s:g} B/s) is not faster than '{slower.name}' "
        f"({slower.bandwidth_bytes_per_s:g} B/s)"
      )
  if len({lv.name for lv in hw.levels}) != len(hw.levels):
    fail("level names must be unique")
  if not np.isfinite(hw.peak_flops_per_s) or hw.peak_flops_per_s <= 0:
    fail(f"peak_flops_per_s must be positive, got {hw.peak_flops_per_s}")
  if not np.isfinite(hw.copy_bandwidth_bytes_per_s) or hw.copy_bandwidth_bytes_per_s <= 0:
    fail(f"copy_bandwidth_bytes_per_s must be positive, got {hw.copy_bandwidth_bytes_per_s}")
  a = hw.alignment_bytes
  if a <= 0 or a & (a - 1):
    fail(f"alignment_bytes must be a positive power of two, got {a}")


# TPU v4i: 138 TFLOP/s bf16, 8 GiB HBM at 614 GB/s, 128 MiB on-chip CMEM (modelled at 4x HBM).
_TPU_V4I_LIKE = Hardware(
  name="tpu-v4i-like",
  levels=(MemoryLevel("CMEM", 128 * MiB, 4 * 614e9), MemoryLevel("HBM", 8 * GiB, 614e9)),
  peak_flops_per_s=138e12,
  copy_bandwidth_bytes_per_s=614e9,
  alignment_bytes=512,
)

# Intel NNP-I (EGRL seed): SRAM 4 MiB, LLC 24 MiB at 1/10 the SRAM bandwidth, DRAM 32 GiB at 1/100.
_NNPI_LIKE = Hardware(
  name="nnpi-like",
  levels=(
    MemoryLevel("SRAM", 4 * MiB, 4e12),
    MemoryLevel("LLC", 24 * MiB, 4e11),
    MemoryLevel("DRAM", 32 * GiB, 4e10),
  ),
  peak_flops_per_s=50e12,
  copy_bandwidth_bytes_per_s=4e10,
  alignment_bytes=64,
)

# For MiniMalloc CSV problems: zero-flop ops, so time saved is the placed buffers' accesses (a
# write and a read each, env/minimalloc_csv.py).
_MINIMALLOC = Hardware(
  name="minimalloc",
  levels=(MemoryLevel("fast", 1 * MiB, 1e12), MemoryLevel("slow", 1 << 62, 1e9)),
  peak_flops_per_s=1e15,
  copy_bandwidth_bytes_per_s=1e9,
  alignment_bytes=1,
)

# Today's accelerators, one device each (a chip; a GPU), modelled as tpu-v4i-like is: the fast level
# is the largest on-chip memory a compiler can keep a buffer in between ops, the slow level the
# HBM, the copy engine as fast as the HBM, alignment 512 B on TPUs (as tpu-v4i-like) and 256 B on
# GPUs (CUDA's allocators align to at least 256 B, CUDA C++ Programming Guide, "Device Memory
# Accesses"; taken for ROCm too). Figures are the vendor's unless the comment says otherwise; an
# on-chip bandwidth no vendor publishes is modelled at 4x the HBM's, as tpu-v4i-like's CMEM. Peak
# flops are bf16 dense (a datasheet that quotes 2:4 sparsity is halved). The sources are
# `PRESET_SOURCES`, which `malloczero hardware list` prints.

# TPU v4 (vendor: Google Cloud, "TPU v4", https://cloud.google.com/tpu/docs/v4): 275 TFLOP/s
# bf16, 32 GiB HBM2 at 1200 GB/s. On chip: 128 MiB CMEM (Jouppi et al., "TPU v4: An Optically
# Reconfigurable Supercomputer for Machine Learning with Hardware Support for Embeddings", ISCA
# 2023; JAX's pallas/mosaic/tpu_info.py: 134e6 B per chip), modelled at 4x HBM.
_TPU_V4 = Hardware(
  name="tpu-v4",
  levels=(MemoryLevel("CMEM", 128 * MiB, 4 * 1200e9), MemoryLevel("HBM", 32 * GiB, 1200e9)),
  peak_flops_per_s=275e12,
  copy_bandwidth_bytes_per_s=1200e9,
  alignment_bytes=512,
)

# TPU v5e (vendor: Google Cloud, "TPU v5e", https://cloud.google.com/tpu/docs/v5e): 197 TFLOP/s
# bf16, 16 GB HBM2 at 819 GB/s (16 GiB here: JAX's tpu_info.py gives 17.2e9 B). On chip: 128 MiB
# VMEM (JAX, "TPU Hardware Reference", https://docs.jax.dev/en/latest/pallas/tpu/hardware.html,
# and tpu_info.py), modelled at 4x HBM.
_TPU_V5E = Hardware(
  name="tpu-v5e",
  levels=(MemoryLevel("VMEM", 128 * MiB, 4 * 819e9), MemoryLevel("HBM", 16 * GiB, 819e9)),
  peak_flops_per_s=197e12,
  copy_bandwidth_bytes_per_s=819e9,
  alignment_bytes=512,
)

# TPU v5p (vendor: Google Cloud, "TPU v5p", https://cloud.google.com/tpu/docs/v5p): 459 TFLOP/s
# bf16, 95 GB HBM2e at 2765 GB/s (95 GiB here: JAX's tpu_info.py gives 103e9 B). On chip: 2 x 64
# MiB VMEM, one per TensorCore (JAX, "TPU Hardware Reference" and tpu_info.py), modelled as one
# 128 MiB level at 4x HBM.
_TPU_V5P = Hardware(
  name="tpu-v5p",
  levels=(MemoryLevel("VMEM", 128 * MiB, 4 * 2765e9), MemoryLevel("HBM", 95 * GiB, 2765e9)),
  peak_flops_per_s=459e12,
  copy_bandwidth_bytes_per_s=2765e9,
  alignment_bytes=512,
)

# TPU v6e, Trillium (vendor: Google Cloud, "TPU v6e", https://cloud.google.com/tpu/docs/v6e): 918
# TFLOP/s bf16, 32 GB HBM at 1638 GB/s (32 GiB here: JAX's tpu_info.py gives 34.4e9 B). On chip:
# 128 MiB VMEM (JAX, "TPU Hardware Reference" and tpu_info.py), modelled at 4x HBM.
_TPU_V6E = Hardware(
  name="tpu-v6e",
  levels=(MemoryLevel("VMEM", 128 * MiB, 4 * 1638e9), MemoryLevel("HBM", 32 * GiB, 1638e9)),
  peak_flops_per_s=918e12,
  copy_bandwidth_bytes_per_s=1638e9,
  alignment_bytes=512,
)

# NVIDIA H100 SXM5 (vendor: "NVIDIA H100 Tensor Core GPU" datasheet,
# https://www.nvidia.com/en-us/data-center/h100/): 1,979 TFLOP/s bf16 with sparsity (989.5
# dense), 80 GB HBM3 at 3.35 TB/s, 50 MB L2. The fast level is the L2, which CUDA lets a program
# set aside for data it keeps between kernels (L2 persistence, CUDA C++ Programming Guide,
# "Device Memory L2 Access Management"); 50 MB read as 50 MiB, modelled at 4x HBM.
_H100_SXM = Hardware(
  name="h100-sxm",
  levels=(MemoryLevel("L2", 50 * MiB, 4 * 3.35e12), MemoryLevel("HBM", 80 * 10**9, 3.35e12)),
  peak_flops_per_s=989.5e12,
  copy_bandwidth_bytes_per_s=3.35e12,
  alignment_bytes=256,
)

# NVIDIA H200 SXM (vendor: "NVIDIA H200 Tensor Core GPU" datasheet,
# https://www.nvidia.com/en-us/data-center/h200/): the H100's GH100 die (1,979 TFLOP/s bf16 with
# sparsity, 989.5 dense; 50 MB L2) with 141 GB HBM3e at 4.8 TB/s; L2 modelled as h100-sxm's.
_H200 = Hardware(
  name="h200",
  levels=(MemoryLevel("L2", 50 * MiB, 4 * 4.8e12), MemoryLevel("HBM", 141 * 10**9, 4.8e12)),
  peak_flops_per_s=989.5e12,
  copy_bandwidth_bytes_per_s=4.8e12,
  alignment_bytes=256,
)

# NVIDIA B200 as in HGX B200 (vendor: NVIDIA, "HGX Platform",
# https://www.nvidia.com/en-us/data-center/hgx/, per GPU): 4.5 PFLOP/s bf16 with sparsity (2.25
# dense), 180 GB HBM3e at 7.7 TB/s (the same per-GPU figures as hpc-ai.com's H200/B200 table).
# NVIDIA's sheets give no L2 size: 126 MB (read as MiB) as Chips and Cheese measured it ("Nvidia's
# B200: Keeping the CUDA Juggernaut Rolling", https://chipsandcheese.com/p/nvidias-b200-keeping-
# the-cuda-juggernaut), modelled at 4x HBM.
_B200 = Hardware(
  name="b200",
  levels=(MemoryLevel("L2", 126 * MiB, 4 * 7.7e12), MemoryLevel("HBM", 180 * 10**9, 7.7e12)),
  peak_flops_per_s=2.25e15,
  copy_bandwidth_bytes_per_s=7.7e12,
  alignment_bytes=256,
)

# AMD Instinct MI300X (vendor: "AMD Instinct MI300X Accelerator" datasheet,
# https://www.amd.com/en/products/accelerators/instinct/mi300/mi300x.html): 1,307.4 TFLOP/s bf16
# dense, 192 GB HBM3 at 5.3 TB/s, 256 MB (read as MiB) AMD Infinity Cache at a peak 17 TB/s (AMD's
# launch presentation, December 2023, as ServeTheHome reported it: https://servethehome.com/amd-
# instinct-mi300x-gpu-and-mi300a-apus-launched-for-ai-era/3): the one on-chip bandwidth here that a
# vendor publishes, so it is used as it is.
_MI300X = Hardware(
  name="mi300x",
  levels=(
    MemoryLevel("InfinityCache", 256 * MiB, 17e12),
    MemoryLevel("HBM", 192 * 10**9, 5.3e12),
  ),
  peak_flops_per_s=1307.4e12,
  copy_bandwidth_bytes_per_s=5.3e12,
  alignment_bytes=256,
)

PRESETS: dict[str, Hardware] = {
  h.name: h
  for h in (
    _TPU_V4I_LIKE,
    _NNPI_LIKE,
    _MINIMALLOC,
    _TPU_V4,
    _TPU_V5E,
    _TPU_V5P,
    _TPU_V6E,
    _H100_SXM,
    _H200,
    _B200,
    _MI300X,
  )
}

# Where each preset's figures come from (one line each; `malloczero hardware list` prints them).
PRESET_SOURCES: dict[str, str] = {
  "tpu-v4i-like": "Jouppi et al., 'Ten Lessons From Three Generations Shaped Google's TPUv4i', "
  "ISCA 2021; CMEM bandwidth modelled at 4x HBM",
  "nnpi-like": "Intel NNP-I as EGRL's seed (Khadka et al., 'Optimizing Memory Placement using "
  "Evolutionary Graph Reinforcement Learning', ICLR 2021); bandwidth ratios modelled",
  "minimalloc": "not a machine: MiniMalloc CSV problems (zero-flop ops, env/minimalloc_csv.py)",
  "tpu-v4": "Google Cloud 'TPU v4' (cloud.google.com/tpu/docs/v4); CMEM: ISCA 2023 TPU v4 paper; "
  "CMEM bandwidth modelled at 4x HBM",
  "tpu-v5e": "Google Cloud 'TPU v5e' (cloud.google.com/tpu/docs/v5e); VMEM: JAX 'TPU Hardware "
  "Reference'; VMEM bandwidth modelled at 4x HBM",
  "tpu-v5p": "Google Cloud 'TPU v5p' (cloud.google.com/tpu/docs/v5p); VMEM (2 x 64 MiB): JAX 'TPU "
  "Hardware Reference'; VMEM bandwidth modelled at 4x HBM",
  "tpu-v6e": "Google Cloud 'TPU v6e' (cloud.google.com/tpu/docs/v6e); VMEM: JAX 'TPU Hardware "
  "Reference'; VMEM bandwidth modelled at 4x HBM",
  "h100-sxm": "NVIDIA H100 datasheet (nvidia.com/en-us/data-center/h100), sparsity halved; L2 "
  "bandwidth modelled at 4x HBM",
  "h200": "NVIDIA H200 datasheet (nvidia.com/en-us/data-center/h200), sparsity halved; L2 as "
  "H100's, bandwidth modelled at 4x HBM",
  "b200": "NVIDIA HGX B200 (nvidia.com/en-us/data-center/hgx), per GPU, sparsity halved; L2: "
  "Chips and Cheese's measurement; L2 bandwidth modelled at 4x HBM",
  "mi300x": "AMD Instinct MI300X datasheet (amd.com/en/products/accelerators/instinct/mi300/"
  "mi300x.html); Infinity Cache 17 TB/s: AMD's launch figure",
}
# Presets that stand for no real machine, never proposed for a program that fits elsewhere.
NOT_MACHINES = frozenset({"minimalloc"})


def load_hardware(spec: str | os.PathLike) -> Hardware:
  """A preset name or a path to a hardware JSON file."""
  spec = os.fspath(spec)
  if spec in PRESETS:
    return PRESETS[spec]
  if not os.path.exists(spec):
    raise HardwareError(
      f"unknown hardware '{spec}': not a preset ({', '.join(PRESETS)}) and no such file"
    )
  return Hardware.from_dict(strict_json.load(spec, HardwareError), where=spec)


def presets_holding(num_bytes: int) -> list[Hardware]:
  """The presets of real machines whose slow default memory holds `num_bytes`, smallest first."""
  machines = [h for name, h in PRESETS.items() if name not in NOT_MACHINES]
  holders = [h for h in machines if h.levels[-1].capacity_bytes >= num_bytes]
  return sorted(holders, key=lambda h: h.levels[-1].capacity_bytes)


def fit_advice(num_bytes: int, exclude: str = "") -> str:
  """What to pass instead of a machine that cannot hold `num_bytes`: the presets that can, else a
  hardware file. Why: a refusal that only says 'too big' leaves a user with a 90 GiB training step
  guessing which machine would take it, or that they may describe their own."""
  holders = [h for h in presets_holding(num_bytes) if h.name != exclude]
  if holders:
    named = ", ".join(
      f"{h.name} ({human_bytes(h.levels[-1].capacity_bytes)} {h.levels[-1].name})" for h in holders
    )
    return f"presets that hold it: {named}; pass --hardware NAME ('malloczero hardware list')"
  largest = max(
    (h for name, h in PRESETS.items() if name not in NOT_MACHINES),
    key=lambda h: h.levels[-1].capacity_bytes,
  )
  return (
    f"no preset holds it (the largest, {largest.name}, has "
    f"{human_bytes(largest.levels[-1].capacity_bytes)} of {largest.levels[-1].name}): describe "
    "the machine in a hardware JSON file (README, 'Hardware files'; 'malloczero hardware show "
    f"{largest.name}' prints one to start from) and pass --hardware FILE.json"
  )


def check_fits(hw: Hardware, peak_live_bytes: int, where: str) -> None:
  """The slow default memory must hold the whole program (everything starts there); a program it
  cannot hold is refused with the presets that can (`fit_advice`)."""
  slow = hw.levels[-1]
  if peak_live_bytes > slow.capacity_bytes:
    raise HardwareError(
      f"{where}: peak live bytes {peak_live_bytes} exceed the slow memory '{slow.name}' "
      f"({slow.capacity_bytes} bytes) of hardware '{hw.name}' ({human_bytes(peak_live_bytes)} > "
      f"{human_bytes(slow.capacity_bytes)}); {fit_advice(peak_live_bytes, exclude=hw.name)}"
    )


# `--capacity` on the command line: (None, BYTES) for the fast levels together, or (LEVEL, BYTES).
Capacity = tuple[Optional[str], int]


def resolve_hardware(
  workload: Workload,
  hardware: str | None,
  capacities: Sequence[Capacity] | None,
  fallback: Hardware | None = None,
) -> Hardware:
  """The machine a program is mapped for: `hardware` (a preset or file), else `fallback` (a
  mapping's recorded hardware); `capacities` override fast sizes (see `apply_capacities`). A
  workload file records no hardware, so it needs one of those; a MiniMalloc CSV (bytes and
  lifetimes only) defaults to the 'minimalloc' machine, which needs a capacity."""
  capacities = list(capacities or ())
  if hardware is not None:
    hw = load_hardware(hardware)
  elif fallback is not None:
    hw = fallback
  elif workload.source == "minimalloc-csv":
    if not capacities:
      raise MalloczeroError("a MiniMalloc CSV needs --capacity BYTES (the fast memory size)")
    hw = PRESETS["minimalloc"]
  else:
    presets = f"--hardware ({', '.join(PRESETS)} or a hardware JSON file)"
    raise MalloczeroError(
      f"a workload file records no hardware: --capacity alone is for MiniMalloc CSVs; add {presets}"
      if capacities
      else f"a workload file records no hardware: pass {presets}; --capacity BYTES then sets its "
      "fast memory size"
    )
  # The program first: a machine too small for it is refused naming the presets that hold it,
  # before a fast capacity (a share of the program) is refused for the same reason.
  check_fits(hw, workload.peak_live_bytes, workload.name)
  return apply_capacities(hw, capacities)


def apply_capacities(hw: Hardware, capacities: Sequence[Capacity]) -> Hardware:
  """`--capacity BYTES`: the fast levels together hold BYTES, in the hardware's ratio (on
  nnpi-like, 1/7 SRAM and 6/7 LLC); `--capacity LEVEL=BYTES` (repeatable): that level alone."""
  together = [size for level, size in capacities if level is None]
  per_level: dict[str, int] = {}
  for level, size in capacities:
    if level is not None:
      if level in per_level:
        raise MalloczeroError(f"--capacity {level}=... given twice")
      per_level[level] = size
  if len(together) > 1:
    raise MalloczeroError("--capacity BYTES given twice")
  if together and per_level:
    raise MalloczeroError(
      "give either --capacity BYTES (the fast levels together) or "
      "--capacity LEVEL=BYTES per level, not both"
    )
  if together:
    return hw.with_fast_capacity(together[0])
  return hw.with_level_capacities(per_level) if per_level else hw


def describe_fast_levels(hw: Hardware) -> str:
  """'SRAM 1.00 MiB + LLC 6.00 MiB' (what --capacity set)."""
  return " + ".join(f"{lv.name} {human_bytes(lv.capacity_bytes)}" for lv in hw.levels[:-1])
