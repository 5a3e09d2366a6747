"""Whole-page gather and scatter between the paged cache and contiguous switch buffers.

One program copies one block of one page, so a switch's pack or unpack of thousands of
pages is a single launch instead of a Python loop per page.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from .config import MLAKernelConfig


@triton.jit
def _copy_pages(Src, Dst, Pages, page_elems, s_src, s_dst, GATHER: tl.constexpr, BLOCK: tl.constexpr):
    i = tl.program_id(0).to(tl.int64)
    offs = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < page_elems
    page = tl.load(Pages + i).to(tl.int64)
    if GATHER:  # cache page -> buffer slot i
        src = Src + page * s_src + offs
        dst = Dst + i * s_dst + offs
    else:  # buffer slot i -> cache page
        src = Src + i * s_src + offs
        dst = Dst + page * s_dst + offs
    tl.store(dst, tl.load(src, mask=mask).to(Dst.dtype.element_ty), mask=mask)


def _check_cache(cache) -> int:
    if cache.dim() != 3 or cache.stride(2) != 1 or cache.stride(1) != cache.shape[2]:
        raise ValueError(f"page copy needs a cache [pages, page_size, W] whose pages are contiguous "
                         f"(got shape {tuple(cache.shape)}, strides {cache.stride()})")
    return cache.shape[1] * cache.shape[2]


def _launch(src, dst, pages, page_elems, s_src, s_dst, gather: bool, config: MLAKernelConfig):
    if pages.numel() == 0:
        return
    grid = (pages.numel(), triton.cdiv(page_elems, config.copy_block))
    _copy_pages[grid](src, dst, pages, page_elems, s_src, s_dst, GATHER=gather, BLOCK=config.copy_block,
                      num_warps=4)


def pack(cache, pages, out=None, *, config: MLAKernelConfig):
    """:attr:`MLAKernels.pack`: the listed pages as one contiguous [n, page_size, W] buffer
    (``out``, if given)."""
    page_elems = _check_cache(cache)
    pages = pages.to(device=cache.device, dtype=torch.int32).contiguous()
    buf = _packed(cache, pages.numel(), out)
    _launch(cache, buf, pages, page_elems, cache.stride(0), page_elems, True, config)
    return buf


def _packed(cache, n: int, out):
    """``out`` checked as a pack's destination, or a new one."""
    shape = (n, *cache.shape[1:])
    if out is None:
        return torch.empty(shape, dtype=cache.dtype, device=cache.device)
    if tuple(out.shape) != shape or out.dtype != cache.dtype or not out.is_contiguous():
        raise ValueError(f"pack out= must be a contiguous {cache.dtype} tensor of shape {list(shape)} "
                         f"(got {out.dtype} {list(out.shape)}, strides {out.stride()})")
    return out


def unpack(cache, pages, buf, *, config: MLAKernelConfig) -> None:
    """:attr:`MLAKernels.unpack`: write ``buf`` [n, page_size, W] into ``pages`` of ``cache``."""
    page_elems = _check_cache(cache)
    pages = pages.to(device=cache.device, dtype=torch.int32).contiguous()
    if tuple(buf.shape) != (pages.numel(), *cache.shape[1:]):
        raise ValueError(f"unpack buffer must be [{pages.numel()}, {cache.shape[1]}, {cache.shape[2]}] "
                         f"(got {tuple(buf.shape)})")
    buf = buf.contiguous()
    _launch(buf, cache, pages, page_elems, page_elems, cache.stride(0), False, config)
