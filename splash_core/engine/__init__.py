"""The serving engine: continuous batching on T ranks with live layout switching (issue 7).

Modules, one concept each:

- ``requests``: a request's lifecycle (waiting, prefilling, decoding, finished, rejected, aborted).
- ``admission``: the KV pool's size and first-come-first-served admission by KV capacity.
- ``policy``: who picks each step's layout: the scheduler (SPLASH), a fixed layout, a script.
- ``controller``: rank 0's decisions each step (admission, rows per request, layout).
- ``sampling``: each request's next token (greedy, temperature, top-k, top-p, seed) and stop ids.
- ``plan``: the compact step plan rank 0 broadcasts so every rank runs the same step.
- ``steps``: the step loop every rank runs, and the hooks through which rank 0 does more.
- ``engine``: :func:`serve`, a job (a workload or prompts) on every rank (torchrun or a RankPool worker).
- ``live``: :func:`~splash_core.engine.live.serve_live`, requests as a server's clients send them.
- ``preflight``: what ``splash run`` checks before any rank starts (KV format, requests that fit).
- ``launch``: :func:`run_job` starts the group (torchrun or spawned ranks) and serves a job.
- ``reference_check``: outputs against the single-device reference model.
- ``summary``, ``progress``: what a run reports, and the progress bar while it runs.

``splash run`` (:mod:`splash_core.cli.run`), ``splash generate`` (:mod:`splash_core.cli.generate`)
and ``splash serve`` (:mod:`splash_core.cli.serve`, :mod:`splash_core.server`) are the faces.
"""

from .engine import EngineError, Job, serve
from .launch import run_job
from .summary import RunSummary

__all__ = ["EngineError", "Job", "RunSummary", "run_job", "serve"]
