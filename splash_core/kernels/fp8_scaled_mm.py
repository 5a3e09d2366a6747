"""``y = x W^T`` for a block-scaled FP8 weight through torch's ``scaled_mm`` with DeepSeek's block
scales (activations in 1 x 128 token groups, the weight in 128 x 128 blocks), for torch builds whose
device library multiplies them natively (torch 2.9+ with a 12.9+ vendor BLAS on sm_90 devices;
elsewhere torch refuses and a backend keeps its own kernel: :func:`available` says which).

torch wants each operand's scales in a layout of its own (what its tests pass; read in torch's
``test_scaled_matmul_cuda.py``):

- activations [m, k] e4m3 row-major, ``m`` a multiple of 16: rows are padded with zeros up to it;
  scales [m, k / 128] float32 *outer-dim-major* (stride (1, m));
- the weight as ``codes.t()`` [k, n] (column-major, as the codes [n, k] are stored); scales
  [n / 128, k / 128] with the column-block count padded to a multiple of 4 and then transposed
  ([L4, n / 128], stride (1, L4)). Made once per weight and kept while the weight lives.

Both scales are decoding scales (value = code x scale), as :mod:`splash_core.model.fp8_blocks`
stores them. Only whole blocks are taken (:func:`fits`): a slice starting inside a block, or a width
that is not a multiple of 128, stays with the portable kernel. The result is checked against the
dequantized spec like every FP8 GEMM (``splash_core.testing``); :func:`emulate` reads the same
argument layouts in plain torch, so a CPU test proves the layouts without the device library.
"""

from __future__ import annotations

import weakref
from typing import Callable

import torch

from ..model.fp8_blocks import BLOCK, BlockScaledFP8, TokenGroupsFP8

ROW_MULTIPLE = 16  # activation rows torch's FP8 matmul takes
SCALE_COLUMNS_MULTIPLE = 4  # the 128 x 128 scales' column-block count is padded to this

__all__ = ["available", "emulate", "fits", "operands", "scaled_mm", "scaled_mm_linear"]

_WEIGHT_SCALES: dict[int, torch.Tensor] = {}  # id of a weight's scales -> their layout here, while they live


def fits(w: BlockScaledFP8) -> bool:
    """Whether ``w`` is one weight of whole 128 x 128 blocks (not experts, not starting mid-block)."""
    n, k = w.codes.shape[-2:]
    return (w.codes.dim() == 2 and w.start == (0, 0) and w.block == (BLOCK, BLOCK)
            and n % BLOCK == 0 and k % BLOCK == 0 and n > 0 and k > 0)


def weight_scales(w: BlockScaledFP8) -> torch.Tensor:
    """``w``'s scales as torch's 128 x 128 recipe reads them ([L4, n / 128], stride (1, L4)), kept per weight."""
    key = id(w.scales)
    kept = _WEIGHT_SCALES.get(key)
    if kept is None:
        col_blocks = w.scales.shape[1]
        pad = -col_blocks % SCALE_COLUMNS_MULTIPLE
        kept = torch.nn.functional.pad(w.scales, (0, pad), value=1.0).t()
        _WEIGHT_SCALES[key] = kept
        weakref.finalize(w.scales, _WEIGHT_SCALES.pop, key, None)  # (a tensor is no dict key: == is elementwise)
    return kept


def operands(x: TokenGroupsFP8, w: BlockScaledFP8) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """``(a, b, scale_a, scale_b)`` of ``scaled_mm`` for quantized activations ``x`` (rows already a
    multiple of :data:`ROW_MULTIPLE`) times ``w``."""
    if not fits(w) or x.start != 0 or x.group != BLOCK or x.codes.shape[0] % ROW_MULTIPLE:
        raise ValueError(f"scaled_mm takes whole 128-blocks and rows in multiples of {ROW_MULTIPLE} "
                         f"(activations {list(x.codes.shape)} from {x.start}, weight {list(w.codes.shape)} from {w.start})")
    return x.codes, w.codes.t(), x.scales.t().contiguous().t(), weight_scales(w)


def scaled_mm(a, b, scale_a, scale_b, out_dtype):
    """torch's block-scaled FP8 matmul of :func:`operands`' arguments (``out_dtype`` results)."""
    functional = getattr(torch.nn.functional, "scaled_mm", None)
    if functional is not None:
        recipe = torch.nn.functional.ScalingType
        return functional(a, b, scale_a, recipe.BlockWise1x128, scale_b, recipe.BlockWise128x128,
                          output_dtype=out_dtype)
    return torch._scaled_mm(a, b, scale_a, scale_b, out_dtype=out_dtype)  # the recipe read from the scale shapes


def scaled_mm_linear(quantize: Callable[..., TokenGroupsFP8], call: Callable = scaled_mm) -> Callable:
    """``linear(x, w)`` (:class:`~splash_core.platform.interfaces.FP8LinearKernels`' contract) for a
    weight that :func:`fits`: ``x`` [m, k] quantized by ``quantize(x, start, group)`` (rows padded to
    a multiple of :data:`ROW_MULTIPLE`), multiplied by ``call`` (torch's; :func:`emulate` in tests)."""

    def linear(x: torch.Tensor, w: BlockScaledFP8) -> torch.Tensor:
        m = x.shape[0]
        pad = -m % ROW_MULTIPLE
        padded = torch.nn.functional.pad(x, (0, 0, 0, pad)) if pad else x
        y = call(*operands(quantize(padded, 0, BLOCK), w), x.dtype)
        return y[:m] if pad else y

    return linear


def emulate(a, b, scale_a, scale_b, out_dtype):
    """What torch's block-scaled ``scaled_mm`` computes from these argument layouts, in float32."""
    m, k = a.shape
    n = b.shape[1]
    blocks = k // BLOCK
    if scale_a.shape != (m, blocks) or scale_a.stride(0) != 1:
        raise ValueError(f"scale_a must be [{m}, {blocks}] outer-dim-major (got {list(scale_a.shape)}, "
                         f"strides {scale_a.stride()})")
    padded = blocks + -blocks % SCALE_COLUMNS_MULTIPLE
    if scale_b.shape != (padded, n // BLOCK) or scale_b.stride(0) != 1:
        raise ValueError(f"scale_b must be [{padded}, {n // BLOCK}] with stride (1, {padded}) (got "
                         f"{list(scale_b.shape)}, strides {scale_b.stride()})")
    y = torch.zeros(m, n, dtype=torch.float32, device=a.device)
    for kb in range(blocks):
        cols = slice(kb * BLOCK, (kb + 1) * BLOCK)
        part = a[:, cols].float() @ b[cols].float()
        y += part * scale_a[:, kb:kb + 1] * scale_b[kb].repeat_interleave(BLOCK)[None, :]
    return y.to(out_dtype)


def available(device) -> str:
    """"" where ``scaled_mm`` with block scales runs on ``device``, else why not (one line)."""
    try:
        a = torch.zeros(ROW_MULTIPLE, BLOCK, device=device).to(torch.float8_e4m3fn)
        w = BlockScaledFP8(torch.zeros(BLOCK, BLOCK, device=device).to(torch.float8_e4m3fn),
                           torch.ones(1, 1, device=device))
        x = TokenGroupsFP8(a, torch.ones(ROW_MULTIPLE, 1, device=device))
        scaled_mm(*operands(x, w), torch.bfloat16)
    except (RuntimeError, NotImplementedError, TypeError, ValueError, AttributeError) as exc:
        return (str(exc).strip().splitlines() or [type(exc).__name__])[0]
    return ""
