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
* `shared`: what more than one of them uses (the offset sort, the alignment rounding).

Why jitted: msa's decision process (`algorithm.py`, all options) runs these checks several times
per step, each over a few hundred ops or chunks; as numpy expressions their cost was mostly
numpy's per-call overhead. Each kernel computes exactly what the numpy code it replaced
computes, with the same floating-point operations in the same order (sequential cumulative
sums, as `np.cumsum`; no fastmath), so that no decision changes (tests/test_msa_index.py and
the msa part tests check them against the scans in tests/msa_reference_kernels.py, XLA's cases,
and the picker's numpy searches and iterator).

Arguments: a structure's arrays travel as one plain tuple in the order of the named tuple its
owner defines (`ChunkHeap.search_state()` is a `HeapSearch`'s fields, `kernel_state()` of the
copy resource a `CopyTrees`' ...), and a kernel called from Python names it at once
(`HeapSearch(...)` on the tuple's items costs nothing compiled). Plain, not named, because
numba's dispatch types a named tuple field by field in Python, about 0.35 us a field, while a
plain tuple of arrays is typed in C as fast as separate arguments; msa calls these kernels
tens of thousands of times per program.

Compiled on the first use on a machine (seconds) and loaded from numba's cache beside these
files after that (`cache=True`). numba's cache notices a change to a kernel's own file only:
after editing a module that another calls into (`shared`, `chunk_index`, `live_lists`,
`copy_trees`) or a layout its owner defines, delete this folder's `__pycache__`.
"""
