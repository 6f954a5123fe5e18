"""The learner's store of probed decisions (learner/probes/prober.py), sampled into every batch.

A probe is one decision with the exact advantage of every legal move over msa: the learner fits
its policy there to softmax(advantage / temperature) (learner/probes/loss.py `probe_policy_loss`).
The store is a ring of `capacity` decisions (the oldest replaced first), sampled uniformly, and
saved with the learner's checkpoint as a plain `.npz` (arrays only, loaded without pickle): a
probe costs one msa pass per legal move, so a resumed run keeps them.
"""

from __future__ import annotations

import os
import threading
from typing import Optional

import numpy as np

from malloczero.common.errors import MalloczeroError
from malloczero.common.files import atomic_write
from malloczero.env.game import GameConfig, observation_spec

PROBES_FILENAME = "probes.npz"


class ProbeStore:
  """Probed decisions of one game config: observations, advantages `[A]`, msa's moves."""

  def __init__(self, config: GameConfig, capacity: int, seed: int = 0):
    if capacity < 1:
      raise ValueError(f"the probe store needs a capacity of at least 1, got {capacity}")
    self._spec = observation_spec(config)
    self._capacity = capacity
    self._observations = {
      k: np.zeros((capacity,) + s.shape, s.dtype) for k, s in self._spec.items()
    }
    self._advantages = np.zeros((capacity, config.num_actions), np.float32)
    self._msa_actions = np.zeros(capacity, np.int32)
    self._size = 0
    self._next = 0
    self.num_added = 0
    self._rng = np.random.default_rng(seed)
    self._lock = threading.Lock()

  def __len__(self) -> int:
    return self._size

  def add(self, observation: dict[str, np.ndarray], advantages: np.ndarray, msa_action: int) -> int:
    """Stores one decision (replacing the oldest when full); returns the number stored.

    Raises ValueError when its shapes are not the game config's."""
    advantages = np.asarray(advantages, np.float32)
    if advantages.shape != self._advantages.shape[1:] or set(observation) != set(self._spec):
      raise ValueError("a probe whose shapes are not this run's game's")
    if not 0 <= int(msa_action) < len(advantages):
      raise ValueError(f"a probe's msa move {msa_action} is not one of its {len(advantages)} slots")
    # Every shape is checked before anything is written: a full ring's next row is its oldest
    # probe, which a half-written one would corrupt.
    values = {key: np.asarray(observation[key]) for key in self._spec}
    for key, spec in self._spec.items():
      if values[key].shape != spec.shape:
        raise ValueError(f"a probe's {key} has shape {values[key].shape}, not {spec.shape}")
    with self._lock:
      row = self._next
      for key, value in values.items():
        self._observations[key][row] = value
      self._advantages[row] = advantages
      self._msa_actions[row] = int(msa_action)
      self._next = (row + 1) % self._capacity
      self._size = min(self._size + 1, self._capacity)
      self.num_added += 1
      return self._size

  def sample(self, n: int) -> tuple[dict[str, np.ndarray], np.ndarray, np.ndarray]:
    """`n` decisions drawn uniformly with replacement: (observations `[n, ...]`, advantages
    `[n, A]`, msa's moves `[n]`). The store must not be empty."""
    with self._lock:
      if not self._size:
        raise ValueError("no probes to sample")
      rows = self._rng.integers(self._size, size=n)
      observations = {k: v[rows] for k, v in self._observations.items()}
      return observations, self._advantages[rows], self._msa_actions[rows]

  def save(self, directory: str) -> None:
    with self._lock:
      arrays = {f"observation/{k}": v[: self._size] for k, v in self._observations.items()}
      arrays["advantages"] = self._advantages[: self._size]
      arrays["msa_actions"] = self._msa_actions[: self._size]
      arrays["next"] = np.int64(self._next)
      arrays["num_added"] = np.int64(self.num_added)
    with atomic_write(os.path.join(directory, PROBES_FILENAME), "wb", fsync=True) as f:
      np.savez(f, **arrays)

  def restore(self, directory: str) -> Optional[int]:
    """Loads the probes saved in `directory`, if any; returns how many (None: no file).

    Raises MalloczeroError (one line) for a file that is not this run's probes."""
    path = os.path.join(directory, PROBES_FILENAME)
    if not os.path.exists(path):
      return None
    try:
      with np.load(path, allow_pickle=False) as f:
        arrays = {k: f[k] for k in f.files}
      size = len(arrays["advantages"])
      expected = {f"observation/{k}" for k in self._spec}
      expected |= {"advantages", "msa_actions", "next", "num_added"}
      if set(arrays) != expected or size > self._capacity:
        raise ValueError("unexpected contents")
      msa_actions = arrays["msa_actions"]
      if msa_actions.shape != (size,) or not np.all(
        (0 <= msa_actions) & (msa_actions < self._advantages.shape[1])
      ):
        raise ValueError("msa moves outside the action slots")
      with self._lock:
        for key, spec in self._spec.items():
          self._observations[key][:size] = arrays[f"observation/{key}"].astype(spec.dtype)
        self._advantages[:size] = arrays["advantages"]
        self._msa_actions[:size] = msa_actions
        self._size, self._next = size, int(arrays["next"]) % self._capacity
        self.num_added = int(arrays["num_added"])
    except (ValueError, KeyError, OSError) as e:
      raise MalloczeroError(f"{path}: not this run's probed decisions ({e})") from None
    return size
