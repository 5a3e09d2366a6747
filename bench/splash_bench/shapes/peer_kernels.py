"""Shape of the results of bench/peer_kernels.py: ``peer_kernels`` (docs/results.md).

Registered as entry point ``peer_kernels`` of group ``splash.result_shapes`` in bench/pyproject.toml.
"""

from __future__ import annotations

from splash_core.results.shapes import Shape

SHAPES: dict[str, Shape] = {
    "peer_kernels": Shape(
        doc="MLA decode of SPLASH's kernel, FlashMLA and SGLang's Triton decode on identical caches (one GPU)",
        summary={"kernels": "object", "rates": "object", "providers": "object", "kernels_fp8": "object?",
                 "providers_fp8": "object?"},
        sample={"kernel": "text", "batch": "positive", "heads": "positive", "context": "positive", "ms": "nonneg",
                "kv_gbps": "nonneg", "tflops": "nonneg", "kv": "text?"},
        sources=frozenset({"measured"}),
    ),
}
