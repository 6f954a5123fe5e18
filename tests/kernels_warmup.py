"""Compiles the numba kernels the tests run into numba's on-disk cache before the test workers
start (`pytest_sessionstart` in conftest.py, under pytest-xdist).

In a fresh clone (CI) nothing is cached: each worker, and each process a test starts before the
cache is written, compiled the same kernels again, about 90 s on one core each time
(env/kernel_cache.py). `make test` on 2 cores took 866 s from a fresh clone and 697 s with the
kernels cached (2026-12-05). The work is in two parts of about 55 s each, run side by side:
`python -m tests.kernels_warmup PART`.
"""

from __future__ import annotations

import sys

# The two parts, each with what the other does not compile first: the game and msa's own kernels,
# and msa on a program with loops (the picker's loop paths), the baselines' and the validator's
# overlap sweep (`bench`'s own warm-up, launch/scale_bench.py `_warm_kernels`).
PARTS = {
  "game": ("game", "msa", "evo"),
  "loops": ("loops", "bestfit", "pack", "bench"),
}


def warm(part: str) -> None:
  """Runs each step of `PARTS[part]`: a tiny training program's msa game played to its end, a
  solve of it by each baseline (its mapping validated), msa on a program with loops, and the
  bench's warm-up of msa and the validator's overlap sweep."""
  from malloczero.actors.games import suite_games
  from malloczero.configs.config import get_config
  from malloczero.env.game import make_game
  from malloczero.env.programs.suites import get_suite
  from malloczero.env.solvers import solve
  from malloczero.env.validator import validate_mapping

  spec = suite_games("tiny", "train")[0]
  for step in PARTS[part]:
    if step == "game":
      game = make_game(spec.workload, spec.hardware, get_config("tiny").game)
      timestep = game.reset()
      while not timestep.last():
        timestep = game.step(0)
    elif step == "loops":
      looped = next(e for e in get_suite("default").entries if e.program == "gru-b1-infer")
      solve(*looped.load(), "msa")
    elif step == "bench":
      from malloczero.launch.scale_bench import _warm_kernels

      _warm_kernels()
    else:
      result = solve(spec.workload, spec.hardware, step)
      validate_mapping(spec.workload, spec.hardware, result.mapping)


if __name__ == "__main__":
  warm(sys.argv[1])
