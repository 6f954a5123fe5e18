"""msa's jitted (numba) kernels, one module per structure they serve, each loaded by its Python
owner on first use (`malloczero.common.lazy.lazy_module`), so that importing the solvers or the
game does not load numba:

* `chunk_index`: the chunk heap's time index (env/msa/chunks.py's `ChunkHeap`): chunks filed by
  length class and start, a search collecting the chunks live in an interval.
* `live_lists`: the heap's live lists of address-range unions beside the index, and the
  best-fit searches that read them (`best_fit_indexed`, `best_chunk_candidate_indexed`).
* `copy_trees`: the copy resource's trees and op-by-op queue (env/msa/copy_resource.py).
* `prefetch`: the prefetch picker's window and start sequence (env/msa/interval_picker.py) and
  the prefetch loop over starts that combines them with the trees and the heap
  (`plan_prefetch_starts`, env/msa/allocate_segment.py).
* `solver_loop`: msa's own run (the `msa` solver) as one kernel over the buffers, calling the
  others (env/msa/solver_loop.py).
* `shared`: what more than one of them uses (the offset sort, the alignment rounding, the
  picker's elapsed time over an interval of a program with loops).

A program with loops hands the picker's, the start walk's and the chunk search's kernels its
`WhileNest` (interval_picker.py's "Loops") as a last argument, None without loops: an argument
that numba types as None compiles those kernels without their loop branches, so that programs
without loops run the code they always ran.

Why jitted: msa's decision process (`algorithm.py`, all options) runs these checks several times
per step, each over a few hundred ops or chunks; as numpy expressions their cost was mostly
numpy's per-call overhead. Each kernel computes exactly what the numpy code it replaced
computes, with the same floating-point operations in the same order (sequential cumulative
sums, as `np.cumsum`; no fastmath), so that no decision changes (tests/test_msa_index.py and
tests/test_msa_chunks.py, test_msa_interval_picker.py check them against the scans in
tests/msa_reference_kernels.py, XLA's cases, and the picker's numpy searches and iterator).

Arguments: a structure's arrays travel as plain tuples in the order of named tuples its owner
defines (`ChunkHeap.search_state()` is four: a `TimeIndex`', a `LiveLists`', a `Chunks`' and a
`Scratch`'s fields; the copy resource's `kernel_state()` a `CopyTrees`' ...), and a kernel called
from Python names them at once (`TimeIndex(*index)` costs nothing compiled). numba's dispatch types
an argument from a fingerprint it caches only while it is shorter than 40 bytes, about four arrays
and a few scalars; a longer one is typed in Python on every call (0.1 ms for the heap, where the
kernel runs in microseconds; msa calls these kernels about 70,000 times on a program of 20,000
buffers), and a named tuple field by field. So no tuple holds more than four arrays, and arrays a
kernel reads together are rows of one (the chunks' start, end, offset and size; a tree's values and
pending adds; the buckets' first row, chunk count and room).

Compiled on the first use on a machine (about a minute for all of them on 2 cores) and loaded
from numba's cache beside these files after that: each is compiled with env/kernel_cache.py's
`njit`, whose cache stamp covers every kernel module and the owners whose layouts they read, so
an edit to any of them compiles the kernels again rather than loading code that calls the old
version of another module's kernel.
"""
