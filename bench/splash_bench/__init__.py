"""Rank-side work of the benchmark programs in ``bench/`` (installed by the test set-up:
``pip install -e bench``), kept out of ``splash_core`` so the product imports no benchmark code.

Modules: ``step`` (``runtime_step.py``: equivalence in the compute format, layers that fit,
timed steps), ``switch`` (``switch_bench.py``: primitive costs and the overhead table),
``layer_probe`` (per-layer waits and compute of a switching step, through the executor's
tracer), ``switch_host_profile`` (``switch_host_profile.py``), ``device_trace``
(``switch_trace.py``), ``copy_interference`` (``copy_interference.py``) and
``host_profile_ranks`` (``runtime_host_profile.py``).

Functions taking ``ctx`` run on every rank of a :class:`~splash_core.runtime.spawn.RankPool`.
"""
