"""Timed pieces of bench/gpu_kernels.py: device rates, MLA decode and prefill points, and
torch's own attention on the same inputs. Times are Triton's ``do_bench`` medians (L2
flushed before each run), in milliseconds, except :func:`decode_graph_ms` (CUDA-graph
replay: the GPU's time without the host's launch cost). :func:`attention_occupancy` reads
the registers and shared memory of a compiled attention tile."""

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

    def tables(self, batch: int, context: int, copy: int = 0):
        """Block table and page index of ``batch`` requests of ``context`` tokens; ``copy`` k
        takes the k-th disjoint set of pages (:meth:`copies` of them fit)."""
        pages = context // PAGE
        first = copy * batch * pages
        table = self.order[first: first + batch * pages].view(batch, pages).contiguous()
        index = torch.arange(pages, dtype=torch.int32, device=self.device).expand(batch, pages).contiguous()
        return table, index

    def copies(self, batch: int, context: int) -> int:
        return self.order.numel() // (batch * (context // PAGE))

    def decode_args(self, batch: int, context: int, heads: int = HEADS, copy: int = 0):
        table, index = self.tables(batch, context, copy)
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


def decode_point(kernels, pool: PagedPool, batch: int, context: int, heads: int = HEADS) -> dict:
    args = pool.decode_args(batch, context, heads)
    t = ms(lambda: kernels.decode(*args))
    kv_bytes = batch * context * WIDTH * 2
    flops = batch * heads * context * 2 * (WIDTH + D_C)
    return {"batch": batch, "context": context, "heads": heads, "ms": t, "bytes": kv_bytes,
            "kv_gbps": kv_bytes / (t / 1e3) / GB, "tflops": flops / (t / 1e3) / 1e12}


def decode_graph_ms(kernels, pool: PagedPool, batch: int, context: int, heads: int, budget_ms: float = 20.0) -> float:
    """Decode's GPU time per call: calls on disjoint page sets (together 3x the L2 cache, so no
    call finds its keys there) captured in one CUDA graph, replayed for about ``budget_ms``."""
    l2 = torch.cuda.get_device_properties(pool.device).L2_cache_size
    sets = max(1, min(-(-3 * l2 // (batch * context * WIDTH * 2)), pool.copies(batch, context), 32))
    calls = [pool.decode_args(batch, context, heads, copy=i) for i in range(sets)]
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):  # first calls (allocations, compiles) outside the capture
        for args in calls:
            kernels.decode(*args)
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        for args in calls:
            kernels.decode(*args)
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    graph.replay()
    end.record()
    end.synchronize()
    replays = max(3, int(budget_ms / max(start.elapsed_time(end), 1e-3)))
    start.record()
    for _ in range(replays):
        graph.replay()
    end.record()
    end.synchronize()
    return start.elapsed_time(end) / (replays * sets)


def prefill_point(kernels, pool: PagedPool, rows: int, context: int, heads: int = HEADS) -> dict:
    args = pool.prefill_args(rows, context, heads)
    t = ms(lambda: kernels.extend(*args), rep=200)
    visible = sum(range(context - rows + 1, context + 1))  # keys each row sees, summed
    flops = heads * visible * 2 * (WIDTH + D_C)
    return {"rows": rows, "context": context, "heads": heads, "ms": t, "tflops": flops / (t / 1e3) / 1e12}


def occupancy(device, regs: int, shared: int, warps: int) -> int:
    """Programs an SM holds at once with these resources (CUDA's occupancy rules: registers
    allocated per warp in units of 256, 1 KiB of shared memory reserved per program)."""
    props = torch.cuda.get_device_properties(device)
    regs_sm = getattr(props, "regs_per_multiprocessor", 65536)
    shared_sm = getattr(props, "shared_memory_per_multiprocessor", 233472)
    threads_sm = getattr(props, "max_threads_per_multi_processor", 2048)
    warp_regs = -(-max(regs, 1) * 32 // 256) * 256
    return max(0, min(regs_sm // warp_regs // warps, shared_sm // (shared + 1024), threads_sm // (warps * 32), 32))


def attention_occupancy(device, tile) -> dict | None:
    """Registers, shared memory and occupancy of ``tile``'s compiled attention kernel (the
    most demanding of its compiled variants), or None if it has not been compiled here."""
    from splash_core.kernels import attention

    fn = attention._attention_kernel
    want = {"ROWS": tile.rows, "HEADS": tile.heads, "KEYS": tile.keys, "VALUE_SPLIT": tile.value_split}
    found = None
    for cache, *_ in getattr(fn, "device_caches", {}).values():  # none in Triton's interpreter
        for kernel in list(cache.values()):
            meta = getattr(kernel, "metadata", None)
            if meta is None or (meta.num_warps, meta.num_stages) != (tile.warps, tile.stages):
                continue
            constants = {fn.arg_names[path[0]]: value for path, value in kernel.src.constants.items()}
            if any(constants.get(name) != value for name, value in want.items()):
                continue
            kernel._init_handles()  # loaded already when it ran; gives n_regs
            info = {"regs": kernel.n_regs, "spills": kernel.n_spills, "shared": meta.shared,
                    "occupancy": occupancy(device, kernel.n_regs, meta.shared, meta.num_warps)}
            if found is None or info["occupancy"] < found["occupancy"]:
                found = info
    return found


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


def best_sdpa(kernels, pool: PagedPool, batch: int, context: int, heads: int = HEADS) -> tuple[str | None, dict]:
    """Time every SDPA backend that runs these shapes and agrees with our kernel; the fastest."""
    args = pool.decode_args(batch, context, heads)
    keys = gather_latent(args)
    ours, _ = kernels.decode(*args)
    report = {}
    for name, backend in sdpa_backends().items():
        try:
            out = sdpa(args, keys, backend)
            err = (out.float() - ours.float()).abs().max().item()
            report[name] = {"ms": ms(lambda: sdpa(args, keys, backend)), "max_abs_err_vs_triton": err}
        except Exception as exc:  # backend does not take these shapes (RuntimeError: no kernel)
            report[name] = {"error": str(exc).splitlines()[0][:200]}
    usable = {n: r["ms"] for n, r in report.items() if "ms" in r and r["max_abs_err_vs_triton"] < 5e-2}
    return (min(usable, key=usable.get) if usable else None), report


def sdpa_point(pool: PagedPool, batch: int, context: int, backend_name: str, heads: int = HEADS) -> dict:
    args = pool.decode_args(batch, context, heads)
    gather_ms = ms(lambda: gather_latent(args))
    keys = gather_latent(args)
    backend = sdpa_backends()[backend_name]
    t = ms(lambda: sdpa(args, keys, backend))
    del keys
    return {"sdpa_ms": t, "sdpa_kv_gbps": batch * context * WIDTH * 2 / (t / 1e3) / GB, "gather_ms": gather_ms}
