"""Paged-MLA inputs with the awkward parts of real serving: pages shuffled in the cache,
requests of different lengths, a CP-style request holding every other page only, a request
holding nothing, and extend rows of several requests interleaved (some seeing no key).

Shared by the conformance suite, the CPU tests and the GPU benchmark.
"""

from __future__ import annotations

import torch

MLA_DIMS = (512, 64)  # d_c, d_r


def tolerance(dtype: torch.dtype) -> tuple[float, float]:
    """(atol, rtol) for a kernel against the float32 reference on the same inputs."""
    return (2e-2, 2e-2) if dtype in (torch.bfloat16, torch.float16) else (2e-4, 2e-4)


def paged_cache(lengths, held, *, page: int, width: int, device, dtype, seed: int = 0, spare_pages: int = 2):
    """(kv_cache, block_table, page_index) for requests of ``lengths`` tokens where request i
    holds the logical pages ``held[i]`` (None: all of them), at shuffled physical pages."""
    g = torch.Generator().manual_seed(seed)
    logical = [list(range(-(-n // page))) if h is None else list(h) for n, h in zip(lengths, held)]
    total = sum(len(p) for p in logical)
    physical = torch.randperm(total + spare_pages, generator=g)[:total].tolist()
    cache = torch.randn(total + spare_pages, page, width, generator=g) / 2
    width_p = max([len(p) for p in logical] + [1]) + 1  # one unused column of -1
    table = torch.full((len(lengths), width_p), -1, dtype=torch.int32)
    index = torch.zeros((len(lengths), width_p), dtype=torch.int32)
    for r, pages in enumerate(logical):
        for slot, logical_page in enumerate(pages):
            table[r, slot] = physical.pop()
            index[r, slot] = logical_page
    return cache.to(device=device, dtype=dtype), table.to(device), index.to(device)


def _queries(rows: int, heads: int, width: int, device, dtype, seed: int):
    g = torch.Generator().manual_seed(seed + 1)
    return torch.randn(rows, heads, width, generator=g).to(device=device, dtype=dtype)


# Request lengths (tokens) and held pages for page size 16: a long one, one ending mid-page,
# a CP-style one holding odd pages only, and one holding nothing here.
LENGTHS = (150, 37, 100, 20)
HELD = (None, None, (1, 3, 5), ())


def decode_case(device, dtype, *, heads: int = 16, dims=MLA_DIMS, page: int = 16, seed: int = 0):
    """Arguments of ``decode``: one row per request at its last position."""
    d_c, d_r = dims
    cache, table, index = paged_cache(LENGTHS, HELD, page=page, width=d_c + d_r, device=device, dtype=dtype, seed=seed)
    rows = torch.arange(len(LENGTHS), dtype=torch.int32, device=device)
    pos = torch.tensor([n - 1 for n in LENGTHS], dtype=torch.int32, device=device)
    q = _queries(len(LENGTHS), heads, d_c + d_r, device, dtype, seed)
    return q, cache, table, index, rows, pos, (d_c + d_r) ** -0.5, d_c


def extend_case(device, dtype, *, heads: int = 16, dims=MLA_DIMS, page: int = 16, seed: int = 0):
    """Arguments of ``extend``: chunks of several requests, rows interleaved; request 2's row
    at position 5 sees no key (it holds no page starting at or before it)."""
    d_c, d_r = dims
    cache, table, index = paged_cache(LENGTHS, HELD, page=page, width=d_c + d_r, device=device, dtype=dtype, seed=seed)
    rows = [(0, p) for p in range(140, 150)] + [(1, p) for p in range(30, 37)] + [(2, 5), (2, 99), (3, 19)]
    order = torch.randperm(len(rows), generator=torch.Generator().manual_seed(seed + 2)).tolist()
    rows = [rows[i] for i in order]
    req = torch.tensor([r for r, _ in rows], dtype=torch.int32, device=device)
    pos = torch.tensor([p for _, p in rows], dtype=torch.int32, device=device)
    q = _queries(len(rows), heads, d_c + d_r, device, dtype, seed)
    return q, cache, table, index, req, pos, (d_c + d_r) ** -0.5, d_c


def scaled_fp8_case(case, groups: int):
    """``case`` (from :func:`decode_case` or :func:`extend_case`) with its cache stored in the
    scaled-fp8 format of ``groups`` scales per token (a uint8 cache): the kernels must read back
    what the reference dequantizes."""
    from ..model.fp8_cache import quantize
    from ..model.kv_format import ScaledFP8

    q, cache, *rest = case
    v_dim = rest[-1]
    layout = ScaledFP8(v_dim, cache.shape[2] - v_dim, groups)
    pages, page = cache.shape[:2]
    stored = quantize(cache.reshape(pages * page, -1).float(), layout).view(pages, page, layout.token_bytes)
    return (q, stored, *rest)


EXPANDED_DIMS = (128, 64, 128)  # d_n, d_r, d_v


def expanded_case(device, dtype, *, heads: int = 16, dims=EXPANDED_DIMS, seed: int = 0):
    """Arguments of ``expanded``: keys of four requests packed one after another (a long one, one
    of 37 keys whose positions are not in index order, a CP-style one holding every other run of
    16 positions, one holding none), K and V as views into one expanded tensor; query rows
    interleaved, one (request 2 at position 5) seeing no key, request 3's seeing none at all."""
    d_n, d_r, d_v = dims
    g = torch.Generator().manual_seed(seed)
    positions = [list(range(150)), torch.randperm(37, generator=g).tolist(),
                 [p for p in range(100) if (p // 16) % 2 == 1], []]
    starts = [0]
    for p in positions:
        starts.append(starts[-1] + len(p))
    keys = starts[-1]
    kvb = (torch.randn(keys, heads, d_n + d_v, generator=g) / 2).to(device=device, dtype=dtype)
    k_rope = (torch.randn(keys, d_r, generator=g) / 2).to(device=device, dtype=dtype)
    rows = [(0, p) for p in range(140, 150)] + [(1, p) for p in range(30, 37)] + [(2, 5), (2, 99), (3, 19)]
    order = torch.randperm(len(rows), generator=torch.Generator().manual_seed(seed + 2)).tolist()
    rows = [rows[i] for i in order]
    q = _queries(len(rows), heads, d_n + d_r, device, dtype, seed)
    as_int = lambda values: torch.tensor(values, dtype=torch.int32, device=device)  # noqa: E731
    return (q, kvb[..., :d_n], k_rope, kvb[..., d_n:], as_int([r for r, _ in rows]), as_int([p for _, p in rows]),
            as_int(starts), as_int([p for ps in positions for p in ps]), (d_n + d_r) ** -0.5)
