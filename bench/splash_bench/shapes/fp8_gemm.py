"""Shape of the results of bench/fp8_gemm.py: ``fp8_gemm`` (docs/results.md).

Registered as entry point ``fp8_gemm`` of group ``splash.result_shapes`` in bench/pyproject.toml.
"""

from __future__ import annotations

from splash_core.results.shapes import Shape

SHAPES: dict[str, Shape] = {
    "fp8_gemm": Shape(
        doc="block-scaled FP8 GEMMs (Triton, and torch's block-scaled scaled_mm) beside bf16 and row-wise FP8 "
            "matmuls, with the peaks of the same run",
        summary={"peaks": "record", "points": "object", "scaled_mm_from_rows": "positive?"},
        rows={"peaks": {"bf16_tflops": "nonneg", "fp8_tflops": "nonneg"}},
        sample={"shape": "text", "m": "positive", "n": "positive", "k": "positive"},
        sources=frozenset({"measured"}),
    ),
}
