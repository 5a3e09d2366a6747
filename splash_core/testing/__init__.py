"""SPLASH's conformance suite: what a backend must do to be a SPLASH backend.

Run it against an installed backend with one command::

    python -m pytest --pyargs splash_core.testing --splash-backend NAME

(or ``python -m splash_core.testing --backend NAME``). Options: ``--splash-ranks T``
(ranks for the collective checks, default 2) and ``--splash-dtype bf16|fp16|fp32``
(default bf16 on accelerators, fp32 on the host).

It checks the backend's description and availability, its device and process-group
backend, its hardware profile against the schema, its streams and events, its collectives
(uneven all-to-all, zero-row and idle ranks, async handles, a second communicator) on T
spawned ranks, and its MLA and KDA kernels against the torch reference within a tolerance
set by the dtype. The options and fixtures come from :mod:`splash_core.testing.plugin`,
which SPLASH registers with pytest (entry point ``pytest11``).
"""
