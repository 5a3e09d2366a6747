"""Timed pieces of bench/gpu_kernels.py: device rates, MLA decode and prefill points, and
torch's own attention on the same inputs. Times are Triton's ``do_bench`` medians (L2
flushed before each run), in milliseconds."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from triton.testing import do_bench

HEADS, D_C, D_R, PAGE = 128, 512, 64, 64  # DeepSeek-V3 MLA, SGLang's page size
WIDTH = D_C + D_R
SCALE = (128 + 64) ** -0.5  # softmax scale of DeepSeek-V3 (qk_nope 128 + rope 64)
GB = 1e9


def ms(fn, rep: int = 40) -> float:
    return do_bench(fn, warmup=10, rep=rep, return_mode="median")


def copy_gbps(device, gib: float = 1.0) -> float:
    """HBM copy bandwidth: bytes read plus bytes written per second."""
    src = torch.empty(int(gib * (1 << 30)) // 2, dtype=torch.bfloat16, device=device).normal_()
    dst = torch.empty_like(src)
    return 2 * src.numel() * 2 / (ms(lambda: dst.copy_(src)) / 1e3) / GB


def matmul_tflops(device, n: int = 8192) -> float:
    a = torch.randn(n, n, device=device, dtype=torch.bfloat16)
    b = torch.randn(n, n, device=device, dtype=torch.bfloat16)
    out = torch.empty_like(a)
    return 2 * n**3 / (ms(lambda: torch.matmul(a, b, out=out)) / 1e3) / 1e12


class PagedPool:
    """One cache big enough for the largest point; every point takes distinct, shuffled pages."""

    def __init__(self, device, max_batch: int, max_context: int, seed: int = 0):
        self.device = device
        self.pages_per_request = max_context // PAGE
        pages = max_batch * self.pages_per_request
        self.cache = torch.empty(pages, PAGE, WIDTH, dtype=torch.bfloat16, device=device).normal_()
        g = torch.Generator(device=device).manual_seed(seed)
        self.order = torch.randperm(pages, generator=g, device=device).to(torch.int32)

    def tables(self, batch: int, context: int):
        pages = context // PAGE
        table = self.order[: batch * pages].view(batch, pages).contiguous()
        index = torch.arange(pages, dtype=torch.int32, device=self.device).expand(batch, pages).contiguous()
        return table, index

    def decode_args(self, batch: int, context: int, heads: int = HEADS):
        table, index = self.tables(batch, context)
        q = torch.randn(batch, heads, WIDTH, device=self.device, dtype=torch.bfloat16)
        rows = torch.arange(batch, dtype=torch.int32, device=self.device)
        pos = torch.full((batch,), context - 1, dtype=torch.int32, device=self.device)
        return q, self.cache, table, index, rows, pos, SCALE, D_C

    def prefill_args(self, rows: int, context: int, heads: int = HEADS):
        """The last ``rows`` positions of one request of ``context`` tokens (a prefill chunk)."""
        table, index = self.tables(1, context)
        q = torch.randn(rows, heads, WIDTH, device=self.device, dtype=torch.bfloat16)
        req = torch.zeros(rows, dtype=torch.int32, device=self.device)
        pos = torch.arange(context - rows, context, dtype=torch.int32, device=self.device)
        return q, self.cache, table, index, req, pos, SCALE, D_C


def decode_point(kernels, pool: PagedPool, batch: int, context: int) -> dict:
    args = pool.decode_args(batch, context)
    t = ms(lambda: kernels.decode(*args))
    kv_bytes = batch * context * WIDTH * 2
    flops = batch * HEADS * context * 2 * (WIDTH + D_C)
    return {"batch": batch, "context": context, "ms": t, "bytes": kv_bytes, "kv_gbps": kv_bytes / (t / 1e3) / GB,
            "tflops": flops / (t / 1e3) / 1e12}


def prefill_point(kernels, pool: PagedPool, rows: int, context: int) -> dict:
    args = pool.prefill_args(rows, context)
    t = ms(lambda: kernels.extend(*args), rep=200)
    visible = sum(range(context - rows + 1, context + 1))  # keys each row sees, summed
    flops = HEADS * visible * 2 * (WIDTH + D_C)
    return {"rows": rows, "context": context, "ms": t, "tflops": flops / (t / 1e3) / 1e12}


# ---- torch's own attention on the same inputs (latent gathered, heads as query rows) ----

def sdpa_backends():
    from torch.nn.attention import SDPBackend

    return {name: getattr(SDPBackend, name) for name in
            ("CUDNN_ATTENTION", "FLASH_ATTENTION", "EFFICIENT_ATTENTION", "MATH") if hasattr(SDPBackend, name)}


def gather_latent(args):
    """[B, 1, context, W]: the paged latent copied contiguous (MQA: one key head)."""
    q, cache, table, *_ = args
    return cache[table.long()].reshape(q.shape[0], 1, -1, WIDTH)


def sdpa(args, keys, backend):
    from torch.nn.attention import sdpa_kernel

    q = args[0].unsqueeze(1)  # [B, 1 head, 128 query rows, W]
    with sdpa_kernel([backend]):
        return F.scaled_dot_product_attention(q, keys, keys[..., :D_C], scale=SCALE).squeeze(1)


def best_sdpa(kernels, pool: PagedPool, batch: int, context: int) -> tuple[str | None, dict]:
    """Time every SDPA backend that runs these shapes and agrees with our kernel; the fastest."""
    args = pool.decode_args(batch, context)
    keys = gather_latent(args)
    ours, _ = kernels.decode(*args)
    report = {}
    for name, backend in sdpa_backends().items():
        try:
            out = sdpa(args, keys, backend)
            err = (out.float() - ours.float()).abs().max().item()
            report[name] = {"ms": ms(lambda: sdpa(args, keys, backend)), "max_abs_err_vs_triton": err}
        except RuntimeError as exc:  # backend does not take these shapes
            report[name] = {"error": str(exc).splitlines()[0][:200]}
    usable = {n: r["ms"] for n, r in report.items() if "ms" in r and r["max_abs_err_vs_triton"] < 5e-2}
    return (min(usable, key=usable.get) if usable else None), report


def sdpa_point(pool: PagedPool, batch: int, context: int, backend_name: str) -> dict:
    args = pool.decode_args(batch, context)
    gather_ms = ms(lambda: gather_latent(args))
    keys = gather_latent(args)
    backend = sdpa_backends()[backend_name]
    t = ms(lambda: sdpa(args, keys, backend))
    del keys
    return {"sdpa_ms": t, "sdpa_kv_gbps": batch * context * WIDTH * 2 / (t / 1e3) / GB, "gather_ms": gather_ms}
