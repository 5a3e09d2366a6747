"""The result shapes of the benchmark programs in ``bench/`` (contract: docs/results.md).

One module per program, named after it (``gpu_kernels`` holds the shapes of
``bench/gpu_kernels.py``'s results), so a benchmark's program, its rank-side helpers
(``splash_bench.<program>``) and its shape are found by one name, and a new or retired program
adds or removes its own module without touching another's. The exception: ``cpu_timings``,
the one shape of the four CPU timing programs. Each module's ``SHAPES`` (benchmark name ->
:class:`~splash_core.results.shapes.Shape`) is an entry point of group
``splash.result_shapes`` in bench/pyproject.toml, the way :mod:`splash_core.results.registry`
finds it: the core imports no benchmark code.

The paper's benchmarks (``fixed_layout_sweep``, ``primitive_costs``, ``switch_overhead``,
``kv_capacity``, ``crossovers``) stay in the core (:mod:`splash_core.studies.result_shapes`):
``splash sweep`` and ``splash report`` write them too.
"""
