#!/usr/bin/env python
"""SPLASH's MLA decode beside FlashMLA and SGLang's Triton decode on identical caches (issue 23 §4).

    python3 bench/peer_kernels.py --out OUT [--write-providers PATH] [--quick]
    python3 bench/peer_kernels.py --smoke --out /tmp/x      # the script's logic on CPU

One paged bf16 cache (pages of 64, DeepSeek-V3 MLA widths: 512 latent + 64 rotary, shuffled
pages, every point its own pages), the same queries for every kernel. Per point (batch,
heads per rank, context): each kernel's time (Triton's ``do_bench`` median, L2 flushed), the
KV bytes it must read per second, its attention TFLOP/s, and its time over FlashMLA's; plus
the copy bandwidth and bf16 matmul rate measured in the same run. Kernels:

- ``splash``: the hopper backend's Triton kernels (its tuned tiles);
- ``flashmla``: FlashMLA's dense decode (``sgl-flash-mla``), through the hopper backend's
  adapter (:mod:`splash_backend_hopper.flashmla`: its per-call ``cache_seqlens`` included, as
  serving runs it), if importable;
- ``sglang``: ``sglang.kernels.ops.attention.decode_attention.decode_attention_fwd`` (MLA
  mode, pages of 64), from the installed ``sglang`` package, if importable.

With ``--kv fp8`` (or ``both``, the default) the same points run again on the cache stored in
DeepSeek-V3.2's scaled fp8 format (656 bytes a token: e4m3 latent, 4 float32 scales, bf16
rotary key; KV bytes counted at 656): ``splash`` reads it in its Triton kernels, ``flashmla``
through its fp8 (sparse) decode where it serves the head count (64 and 128), ``sglang`` has no
such format. Each kernel first runs a small case against the torch reference (``correct``,
per format); a wrong one is timed but flagged. Extend is not compared here (FlashMLA's prefill
is not absorbed MLA). The provider table's ``decode`` comes from the bf16 points, its
``decode_fp8`` from the fp8 ones. ``--write-providers PATH`` writes the hopper
backend's provider table (``tuned/providers.json``): per head count, the fewest KV tokens of a
call from which FlashMLA was faster at every measured point
(:func:`splash_backend_hopper.providers.thresholds`); ``--providers-from FILE`` derives it from
an earlier run's ``peer_kernels.json`` instead of measuring. Writes
``OUT/<platform>/peer_kernels.json``.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

sys.path[:0] = [str(Path(__file__).resolve().parents[1]), str(Path(__file__).resolve().parent)]  # uninstalled checkout

import gpu_timing as gt  # noqa: E402
import torch  # noqa: E402
from splash_backend_hopper.providers import thresholds  # noqa: E402

from splash_bench import provider_table  # noqa: E402
from splash_core.model.fp8_cache import quantize  # noqa: E402
from splash_core.model.kv_format import ScaledFP8  # noqa: E402
from splash_core.reference import mla as ref_mla  # noqa: E402
from splash_core.results import machine_description, make_result, write_result  # noqa: E402
from splash_core.testing.mla_inputs import decode_case, scaled_fp8_case, tolerance  # noqa: E402

BATCHES, HEADS, CONTEXTS = (1, 16, 64), (16, 64, 128), (4096, 32768, 131072)
FP8 = ScaledFP8(512, 64, 4)  # DeepSeek-V3.2's cache entry, FlashMLA's layout: 656 bytes
FP8_HEADS = (64, 128)  # the head counts FlashMLA's fp8 decode is built for


def parse_args(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--out", default="bench/results", help="results root; the file goes to <out>/<platform>/")
    p.add_argument("--platform", default="h200")
    p.add_argument("--write-providers", default=None, help="write the hopper backend's provider table here")
    p.add_argument("--providers-from", default=None, help="an earlier peer_kernels.json to derive the table from")
    p.add_argument("--quick", action="store_true", help="batch 16 only")
    p.add_argument("--smoke", action="store_true", help="tiny shapes on CPU with the torch reference as 'splash'")
    p.add_argument("--kv", choices=("bf16", "fp8", "both"), default="both", help="cache formats to run (default both)")
    return p.parse_args(argv)


# ---- the kernels ----------------------------------------------------------------------------

def splash_decode(device):
    if device.type == "cpu":
        return ref_mla.attention, "reference (CPU smoke)"
    from splash_backend_hopper import tuned

    from splash_core.kernels import triton_mla_kernels

    config, _ = tuned.load()
    kernels = triton_mla_kernels(config.with_processors(torch.cuda.get_device_properties(device).multi_processor_count))
    return kernels.decode, kernels.name


def flashmla_decode():
    try:
        from splash_backend_hopper import flashmla

        if flashmla.missing_reason():
            return None, flashmla.missing_reason()

        def unusable(*args):
            raise RuntimeError("FlashMLA does not serve this call")

        import flash_mla

        return flashmla.decode(unusable), f"sgl-flash-mla {flash_mla.__version__}"
    except Exception as exc:  # noqa: BLE001 - a peer that cannot load is a result too
        return None, f"{type(exc).__name__}: {exc}"


def sglang_decode():
    """SGLang's Triton MLA decode behind SPLASH's decode signature (absorbed MLA, one KV head,
    token-granular indices as SGLang's Triton backend passes them); ``prepare(call)`` builds a
    call's indices once, outside the timing."""
    try:
        import sglang
        from sglang.kernels.ops.attention.decode_attention import decode_attention_fwd
    except Exception as exc:  # noqa: BLE001
        return None, f"{type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}"
    splits = 16

    def prepare(q, kv_cache, block_table, page_index, row_req, row_pos, scale, v_dim):
        page = kv_cache.shape[1]
        table, index = block_table[row_req.long()], page_index[row_req.long()]
        seen = (row_pos[:, None].long() + 1 - index.long() * page).clamp(0, page)
        seen = torch.where(table >= 0, seen, 0)
        tokens = table.long()[..., None] * page + torch.arange(page, device=q.device)
        indices = tokens[torch.arange(page, device=q.device) < seen[..., None]].to(torch.int32)
        indptr = torch.zeros(q.shape[0] + 1, dtype=torch.int32, device=q.device)
        indptr[1:] = torch.cumsum(seen.sum(1), 0)
        buffer = kv_cache.view(-1, 1, kv_cache.shape[-1])
        out = q.new_empty(q.shape[0], q.shape[1], v_dim)
        logits = torch.empty(q.shape[0], q.shape[1], splits, v_dim, dtype=torch.float32, device=q.device)
        lse = torch.empty(q.shape[0], q.shape[1], splits, dtype=torch.float32, device=q.device)
        num_splits = torch.full((q.shape[0],), splits, dtype=torch.int32, device=q.device)

        def call():
            decode_attention_fwd(q, buffer, buffer[..., :v_dim], out, indptr, indices, logits, lse, num_splits,
                                 splits, scale, 1.0, 1.0, has_mla=True)
            return out, None

        return call

    return prepare, f"sglang {sglang.__version__}"


def prepared(fn):
    """``prepare(call) -> thunk`` for a kernel with the decode signature."""
    return lambda *call: (lambda: fn(*call))


def check(prepare, device, kv: str = "bf16") -> dict:
    """The kernel on a small decode case against the torch reference (outputs; lse where given):
    CP-like holdings (pages missing from a request) and a request that sees no key included
    (fp8: 64 heads, where FlashMLA's fp8 decode serves)."""
    case = decode_case(device, torch.bfloat16, heads=16 if kv == "bf16" else 64, page=gt.PAGE)
    if kv == "fp8":
        case = scaled_fp8_case(case, FP8.groups)
    out, lse = prepare(*case)()
    ref_out, ref_lse = ref_mla.attention(*case)
    atol, rtol = tolerance(torch.bfloat16)
    seen = ~torch.isneginf(ref_lse)
    # allclose of empty selections is True: a case where no row sees a key compares nothing
    ok = bool(seen.any()) and torch.allclose(out[seen].float(), ref_out[seen].float(), atol=atol, rtol=rtol)
    if lse is not None:
        ok = ok and torch.allclose(lse[seen], ref_lse[seen], atol=atol, rtol=rtol)
    return {"correct": bool(ok), "max_abs_err": float((out[seen].float() - ref_out[seen].float()).abs().max())}


# ---- the run ----------------------------------------------------------------------------------

def points(args):
    if args.smoke:
        return [(2, 16, 128), (2, 128, 256)]
    batches = (16,) if args.quick else BATCHES
    return [(b, h, c) for h in HEADS for b in batches for c in CONTEXTS]


def time_ms(thunk, device) -> float:
    if device.type == "cpu":
        import time

        thunk()
        t0 = time.perf_counter()
        thunk()
        return (time.perf_counter() - t0) * 1e3
    return gt.ms(thunk)


def kernels_for(kv: str, device) -> dict:
    """{name: {fn: prepare or None, what, correct/skipped ...}} of the kernels that read ``kv`` caches."""
    splash, flash = splash_decode(device), flashmla_decode()
    peers = [("splash", (prepared(splash[0]), splash[1])), ("flashmla", (flash[0] and prepared(flash[0]), flash[1]))]
    peers.append(("sglang", sglang_decode() if kv == "bf16" else (None, "no scaled-fp8 MLA cache in SGLang's Triton decode")))
    kernels = {}
    for name, (fn, what) in peers:
        try:
            verdict = check(fn, device, kv) if fn is not None else {"skipped": what}
        except Exception as exc:  # noqa: BLE001 - a peer that fails to run is a result too
            fn, verdict = None, {"skipped": f"{type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}"}
        kernels[name] = {"fn": fn, "what": what, **verdict}
        print(f"{kv} {name}: {what} {kernels[name].get('correct', '')}", flush=True)
    return kernels


def fp8_cache(cache: torch.Tensor, chunk_pages: int = 4096) -> torch.Tensor:
    """``cache`` [pages, page, 576] stored in the scaled-fp8 format [pages, page, 656] (uint8), in chunks."""
    out = torch.empty(*cache.shape[:2], FP8.token_bytes, dtype=torch.uint8, device=cache.device)
    for first in range(0, cache.shape[0], chunk_pages):
        part = cache[first: first + chunk_pages]
        out[first: first + chunk_pages] = quantize(part.reshape(-1, part.shape[-1]), FP8).view(*part.shape[:2], -1)
    return out


def run(args) -> dict:
    device = torch.device("cpu" if args.smoke else "cuda")
    formats = ("bf16", "fp8") if args.kv == "both" else (args.kv,)
    kernels = {kv: kernels_for(kv, device) for kv in formats}
    rates = {} if args.smoke else {"copy_gbps": gt.copy_gbps(device), "matmul_tflops": gt.matmul_tflops(device)}
    todo = points(args)
    pool = gt.PagedPool(device, max(b for b, _, _ in todo), max(c for _, _, c in todo))
    samples = []
    for kv in formats:
        cache = pool.cache if kv == "bf16" else fp8_cache(pool.cache)
        token_bytes = gt.WIDTH * 2 if kv == "bf16" else FP8.token_bytes
        for batch, heads, context in todo:
            call = list(pool.decode_args(batch, context, heads))
            call[1] = cache
            kv_bytes = batch * context * token_bytes
            flops = batch * heads * context * 2 * (gt.WIDTH + gt.D_C)
            times = {}
            for name, k in kernels[kv].items():
                if k["fn"] is None or (name == "flashmla" and kv == "fp8" and heads not in FP8_HEADS):
                    continue  # FlashMLA's fp8 decode is built for 64 and 128 heads only
                times[name] = time_ms(k["fn"](*call), device)
            for name, t in times.items():
                samples.append({"kernel": name, "kv": kv, "batch": batch, "heads": heads, "context": context, "ms": t,
                                "kv_gbps": kv_bytes / (t / 1e3) / gt.GB, "tflops": flops / (t / 1e3) / 1e12,
                                "vs_flashmla": t / times["flashmla"] if "flashmla" in times else None})
            print(f"{kv} B={batch:3d} heads={heads:3d} {context // 1024:4d}K  " +
                  "  ".join(f"{n} {t:.3f} ms" for n, t in times.items()), flush=True)
        del cache
    described = {kv: {n: {k: v for k, v in info.items() if k != "fn"} for n, info in ks.items()}
                 for kv, ks in kernels.items()}
    summary = {"kernels": described.get("bf16", {}), "rates": rates,
               "providers": thresholds([s for s in samples if s["kv"] == "bf16"])}
    if "fp8" in described:
        summary["kernels_fp8"] = described["fp8"]
        summary["providers_fp8"] = thresholds([s for s in samples if s["kv"] == "fp8"])
    return {"samples": samples, "summary": summary}


def write_providers(path: str, decode: dict, command: str, machine: str, decode_fp8: dict | None = None) -> None:
    """Set the decode entries of the hopper backend's provider table (the other benchmarks' entries kept)."""
    provider_table.set_entries(path, {"source": "measured", **provider_table.provenance(command, machine),
                                      "decode": decode, **({"decode_fp8": decode_fp8} if decode_fp8 else {})})
    print("wrote", path)


def main(argv=None) -> int:
    args = parse_args(argv)
    command = "python3 bench/peer_kernels.py " + " ".join(argv if argv is not None else sys.argv[1:])
    if args.providers_from:
        from splash_core.results import read_result

        earlier = read_result(args.providers_from)
        by_kv = {kv: thresholds([s for s in earlier["samples"] if s.get("kv", "bf16") == kv]) for kv in ("bf16", "fp8")}
        write_providers(args.write_providers, by_kv["bf16"],
                        f"{command} (from {earlier['command']}, git {earlier['git_commit']})", earlier["machine"],
                        by_kv["fp8"])
        return 0
    data = run(args)
    result = make_result(benchmark="peer_kernels", platform="cpu" if args.smoke else args.platform,
                         backend="reference" if args.smoke else "hopper", model="deepseek-v3", T=1, dtype="bf16",
                         samples=data["samples"], summary=data["summary"], command=command,
                         notes="decode only (one query row per request); KV bytes counted once per point (bf16: "
                               "1152 a token, fp8: 656); vs_flashmla = this kernel's time / FlashMLA's at the "
                               "same point and format")
    print("wrote", write_result(result, args.out))
    if args.write_providers and data["summary"]["providers"]:
        write_providers(args.write_providers, data["summary"]["providers"], command, machine_description(),
                        data["summary"].get("providers_fp8"))
    return 0


if __name__ == "__main__":
    sys.exit(main())
