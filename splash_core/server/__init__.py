"""``splash serve``: an OpenAI- and SGLang-compatible HTTP server on the live-switching engine.

Modules, one concept each:

- ``bodies``: the request bodies' allow-list (pydantic): every field implemented or refused by name.
- ``protocol``: request bodies read into calls (one per choice), and OpenAI-style errors.
- ``render``: response bodies and stream chunks, as OpenAI's and SGLang's APIs write them.
- ``logprobs``: log-probabilities in OpenAI's legacy completions and chat shapes.
- ``tokenize``: vLLM's ``/tokenize`` and ``/detokenize``.
- ``headers``: the API key and ``X-Request-Id`` (ASGI middleware).
- ``text``: a request's text as its tokens arrive (incremental detokenizing, stop strings).
- ``frontend``: requests in flight, the link to rank 0's engine loop, the server's state.
- ``metrics``: the Prometheus metrics of ``/metrics``.
- ``app``: the Starlette app (endpoints, streaming, the API key).
- ``launcher``: where HTTP lives and why, the group, signals and faults.

The engine's side of serving is :mod:`splash_core.engine.live`; the command line is
:mod:`splash_core.cli.serve`; ``docs/serving.md`` is the user's guide.
"""
