"""`kernels()`: msa's jitted kernels (`_jit_kernels.py`), imported on first use.

Why a loader: importing numba costs about 0.3 s, and importing the solvers (so `malloczero`)
must not pay it (env/solvers/__init__.py loads the pack solver lazily for the same reason); msa's
parts call `kernels()` in their checks instead of importing the kernels at module level.
"""

from malloczero.common.lazy import lazy_module

kernels = lazy_module("malloczero.env.msa._jit_kernels")
