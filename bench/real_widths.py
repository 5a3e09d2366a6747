"""DeepSeek-V3 at its real widths on one H200 (issue 21 §5), driven as a user would.

1. Sizing: as many layers as fit one device at T = 1 (the runtime holds weights in bf16, FP8
   dequantized at load; KV for B requests at the longest context; a margin for activations) and
   the disk (the checkpoint is stored as DeepSeek-V3 ships it: FP8 e4m3 with 128 x 128 block
   scales, embeddings, norms and router in BF16/FP32): the first 3 layers dense, the rest MoE.
2. Writing: a random-init checkpoint in the Hugging Face format (config.json of DeepSeek-V3 with
   ``num_hidden_layers`` cut, one safetensors shard per layer + index, a tokenizer), generated on
   the device by a child process; then every file is synced and dropped from the page cache
   (``posix_fadvise``), so the first load reads the disk.
3. ``splash generate --deployment <written> --prompt ... --json``: load time (GB read / s, from
   disk), memory per part (rank 0's model: attention projections, experts, MLP, KV pool...).
   ``--ffn-weights fp8`` keeps the feed-forward weights FP8 as stored (the deployment's
   ``ffn_weights``; issue 38): the sizing counts them at one byte, the result is ``real_widths-fp8``.
4. ``splash run --workload <B requests of C tokens> --policy TP --json`` per context C: prefill
   step times (chunks of --prefill-chunk rows) and decode step times (B rows), each beside its
   roofline (``roofline_ms``, ``over_roofline``; :func:`splash_bench.run_roofline.beside_floors`):
   a decode step's bytes (FP8 experts at one byte + scales with ``--ffn-weights fp8``) at the copy
   rate, a prefill chunk's FLOPs at the matmul rate, both measured after the runs on the same device
   (:func:`splash_bench.decode_step.device_rates`).

Writes ``<out>/<platform>/real_widths.json`` (command, machine, date, raw step samples). The
single-device reference check is off (``--no-check``): the reference expands every head and
runs every expert on every row, far too slow at these widths; correctness at these code paths
is proven against transformers on CPU (tests/test_checkpoint_transformers.py).

``--tiny`` runs the same steps on CPU with small widths (the test exercises it).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT), str(ROOT / "bench")]

from splash_bench.platform_name import accelerator_platform, device_memory_fraction  # noqa: E402
from splash_core.profiles import load  # noqa: E402

GIB = 1 << 30
# DeepSeek-V3's config.json (huggingface.co/deepseek-ai/DeepSeek-V3), less its MTP layer
V3 = {
    "architectures": ["DeepseekV3ForCausalLM"], "model_type": "deepseek_v3", "torch_dtype": "bfloat16",
    "vocab_size": 129280, "hidden_size": 7168, "intermediate_size": 18432, "moe_intermediate_size": 2048,
    "num_hidden_layers": 61, "num_attention_heads": 128, "num_key_value_heads": 128, "q_lora_rank": 1536,
    "kv_lora_rank": 512, "qk_nope_head_dim": 128, "qk_rope_head_dim": 64, "v_head_dim": 128,
    "n_routed_experts": 256, "num_experts_per_tok": 8, "n_shared_experts": 1, "first_k_dense_replace": 3,
    "moe_layer_freq": 1, "n_group": 8, "topk_group": 4, "topk_method": "noaux_tc", "scoring_func": "sigmoid",
    "norm_topk_prob": True, "routed_scaling_factor": 2.5, "hidden_act": "silu", "attention_bias": False,
    "rms_norm_eps": 1e-6, "rope_theta": 10000, "max_position_embeddings": 163840,
    "rope_scaling": {"type": "yarn", "factor": 40, "original_max_position_embeddings": 4096, "beta_fast": 32,
                     "beta_slow": 1, "mscale": 1.0, "mscale_all_dim": 1.0},
    "bos_token_id": 0, "eos_token_id": 1, "tie_word_embeddings": False, "num_nextn_predict_layers": 0,
    "quantization_config": {"quant_method": "fp8", "fmt": "e4m3", "activation_scheme": "dynamic",
                            "weight_block_size": [128, 128]},
}
TINY = {**V3, "vocab_size": 512, "hidden_size": 128, "intermediate_size": 256, "moe_intermediate_size": 64,
        "num_attention_heads": 8, "num_key_value_heads": 8, "q_lora_rank": 64, "kv_lora_rank": 64,
        "qk_nope_head_dim": 32, "qk_rope_head_dim": 16, "v_head_dim": 32, "n_routed_experts": 16,
        "num_experts_per_tok": 4, "first_k_dense_replace": 1, "n_group": 4, "topk_group": 2,
        "max_position_embeddings": 4096, "rope_scaling": {**V3["rope_scaling"], "factor": 4,
                                                          "original_max_position_embeddings": 64}}


# --flag: default (its type) and help
NUMBERS = {"--batch": (16, "requests decoding together (B)"),
           "--decode-tokens": (16, "full-batch decode steps after the prefill phase"),
           "--prefill-chunk": (8192, "prompt rows per prefill step"), "--device-memory-gib": (139.0, "for the sizing"),
           "--margin-gib": (10.0, "device memory kept for activations"), "--disk-margin-gib": (4.0, "disk left free"),
           "--budget-s": (290.0, "start no phase expected to end past this")}


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--out", default=str(ROOT / "bench" / "results"), help="results root (<out>/<platform>/)")
    p.add_argument("--workdir", default="/tmp/splash-real-widths", help="where the checkpoint is written")
    p.add_argument("--tiny", action="store_true", help="small widths on the CPU reference backend (smoke test)")
    p.add_argument("--layers", type=int, default=0, help="layers to write (0: as many as fit device and disk)")
    p.add_argument("--contexts", type=int, nargs="+", default=[8192, 32768])
    for flag, (default, text) in NUMBERS.items():
        p.add_argument(flag, type=type(default), default=default, help=text)
    p.add_argument("--ffn-weights", choices=("compute", "fp8"), default="compute",
                   help="hold the feed-forward weights in the compute format (dequantized at load) or FP8 as stored")
    p.add_argument("--keep", action="store_true", help="keep the checkpoint afterwards")
    p.add_argument("--reuse", action="store_true", help="serve the checkpoint a --keep run left in --workdir")
    p.add_argument("--write-only", metavar="FOLDER", help=argparse.SUPPRESS)  # the child that writes
    args = p.parse_args(argv)
    if args.tiny:
        args.contexts = [c for c in args.contexts if c <= 256] or [48, 96]
        args.batch, args.decode_tokens, args.prefill_chunk = min(args.batch, 4), min(args.decode_tokens, 3), 32
        args.layers = args.layers or 3
    return args


# ---- sizing -----------------------------------------------------------------------------

def layer_bytes(profile, layer: int, elem: int, ffn_elem: int | None = None) -> int:
    """Bytes of layer ``layer``'s weights at ``elem`` bytes an element, its feed-forward
    projections at ``ffn_elem`` (None: ``elem``; FP8 kept as stored: 1, their scales aside)."""
    from splash_core.model.weights import is_ffn_weight, layer_tensor_shapes

    ffn_elem = elem if ffn_elem is None else ffn_elem
    shapes = layer_tensor_shapes(profile, layer)
    return sum((ffn_elem if is_ffn_weight(n) else elem) * _numel(s) for n, s in shapes.items())


def _numel(shape) -> int:
    n = 1
    for s in shape:
        n *= s
    return n


def sizing(args, config: dict, free_disk: int) -> tuple[int, dict]:
    """(layers, the accounting): the most layers (<= 61) whose weights (bf16, the feed-forward
    ones FP8 with ``--ffn-weights fp8``) + KV fit the device and whose FP8 files fit the disk."""
    from splash_core.profiles.checkpoint_config import profile_from_checkpoint

    probe = Path(args.workdir) / "probe"
    probe.mkdir(parents=True, exist_ok=True)
    (probe / "config.json").write_text(json.dumps(config))
    profile = profile_from_checkpoint(probe)
    shutil.rmtree(probe)
    d, V, m = profile.hidden_size, profile.vocab_size, profile.mla
    longest = max(args.contexts) + -(-args.batch * max(args.contexts) // args.prefill_chunk) + args.decode_tokens
    kv_layer = args.batch * longest * (m.kv_lora_rank + m.qk_rope_head_dim) * 2
    ffn, first_moe = ffn_elem(args), profile.moe.first_k_dense_replace
    dense, moe = layer_bytes(profile, 0, 2, ffn), layer_bytes(profile, first_moe, 2, ffn)
    dense_disk, moe_disk = layer_bytes(profile, 0, 1), layer_bytes(profile, first_moe, 1)  # FP8 files
    fixed = 2 * V * d * 2 + d * 2
    budget = args.device_memory_gib * GIB - args.margin_gib * GIB
    layers, held, disk = 0, fixed, fixed
    while layers < config["num_hidden_layers"]:
        is_moe = layers >= profile.moe.first_k_dense_replace
        more, more_disk = (moe if is_moe else dense) + kv_layer, moe_disk if is_moe else dense_disk
        if held + more > budget or disk + more_disk > free_disk - args.disk_margin_gib * GIB:
            break
        layers, held, disk = layers + 1, held + more, disk + more_disk
    return layers, {"dense_layer_bytes": dense, "moe_layer_bytes": moe, "kv_bytes_per_layer": kv_layer,
                    "fixed_bytes": fixed, "device_budget_bytes": int(budget), "device_planned_bytes": held,
                    "disk_free_bytes": free_disk, "disk_planned_bytes": disk}


# ---- writing (child process, on the device) ---------------------------------------------

def write_checkpoint(folder: Path, seed: int = 0) -> dict:
    """Random-init weights of ``folder``'s config.json, FP8 where DeepSeek-V3 stores FP8."""
    import torch
    from safetensors.torch import save_file

    from splash_core.checkpoint import fp8
    from splash_core.checkpoint.tiny import write_tokenizer
    from splash_core.model.weights import layer_tensor_shapes
    from splash_core.profiles.checkpoint_config import profile_from_checkpoint

    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    profile = profile_from_checkpoint(folder)
    block = tuple(json.loads((folder / "config.json").read_text())["quantization_config"]["weight_block_size"])
    gen = torch.Generator(device=device).manual_seed(seed)
    d = profile.hidden_size
    groups = {"model-embed.safetensors": {"model.embed_tokens.weight": (profile.vocab_size, d),
                                          "model.norm.weight": (d,), "lm_head.weight": (profile.vocab_size, d)}}
    for i in range(profile.num_layers):
        groups[f"model-layer-{i:03d}.safetensors"] = layer_tensor_shapes(profile, i)
    weight_map, t0, written = {}, time.perf_counter(), 0
    for file, shapes in groups.items():
        tensors = {}
        for name, shape in shapes.items():
            w = torch.randn(shape, generator=gen, device=device, dtype=torch.float32)
            if "norm" in name:
                w = 1 + 0.1 * w
            elif name.endswith("e_score_correction_bias"):
                w = 0.01 * w
            elif len(shape) == 2 and "embed" not in name:
                w = w / shape[1] ** 0.5
            if name.endswith("proj.weight") or name.endswith("proj_with_mqa.weight"):
                q, scale = fp8.quantize(w, block)
                tensors[name], tensors[fp8.scale_name(name)] = q.cpu(), scale.cpu()
            else:
                keep = torch.float32 if ".gate." in name else torch.bfloat16
                tensors[name] = w.to(keep).cpu()
        save_file(tensors, str(folder / file), metadata={"format": "pt"})
        weight_map.update(dict.fromkeys(tensors, file))
        written += (folder / file).stat().st_size
        del tensors
    (folder / "model.safetensors.index.json").write_text(json.dumps({"metadata": {"total_size": written},
                                                                     "weight_map": weight_map}))
    write_tokenizer(folder, 384)
    seconds = time.perf_counter() - t0
    dropped = _drop_page_cache(folder)
    return {"bytes": written, "seconds": seconds, "gb_per_s": written / seconds / 1e9, "device": str(device),
            "page_cache_dropped": dropped}


def _drop_page_cache(folder: Path) -> bool:
    """Sync every file and ask the kernel to drop its cached pages, so the next read hits the disk."""
    ok = hasattr(os, "posix_fadvise")
    for f in folder.iterdir():
        fd = os.open(f, os.O_RDONLY)
        try:
            os.fsync(fd)
            if ok:
                os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
        finally:
            os.close(fd)
    return ok


# ---- driving splash as a user would -----------------------------------------------------

def splash(*args, timeout: float) -> tuple[dict, float]:
    exe = shutil.which("splash")
    cmd = ([exe] if exe else [sys.executable, "-m", "splash_core.cli.main"]) + [str(a) for a in args]
    t0 = time.perf_counter()
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout)
    if done.returncode != 0:
        raise RuntimeError(f"{' '.join(cmd)} exited {done.returncode}:\n{done.stderr[-3000:]}")
    return json.loads(done.stdout), time.perf_counter() - t0


def _held(args) -> str:
    """How the runtime holds the FP8 checkpoint's weights, for the result's notes."""
    kept = "feed-forward weights kept FP8 as stored, the rest " if args.ffn_weights == "fp8" else ""
    return f"{kept}dequantized to bf16"


def ffn_elem(args) -> int:
    """Bytes an element of the feed-forward weights the runtime holds: 1 kept FP8, else bf16's 2."""
    return 1 if args.ffn_weights == "fp8" else 2


def deployment(args, folder: Path, common_bytes: int) -> Path:
    path = Path(args.workdir) / "deployment.yaml"
    hw, backend, dtype = ("cpu", "reference", "fp32") if args.tiny else ("h200", "auto", "bf16")
    # the h200 profile on another GPU: plan no more memory than this one has
    fraction = 0.95 if args.tiny else device_memory_fraction(0.95, load("hardware", hw).memory_bytes / GIB)
    # the reserve is the prefill scratch: an 8K-row chunk through torch's SDPA at 128 heads copies its
    # operands beside the 1 GiB pass of expanded keys (about 3 GiB in all)
    reserve = 1.0 if args.tiny else 3.0
    path.write_text(f"kind: deployment\nname: real-widths-T1\nbackend: {backend}\nhardware: {hw}\nT: 1\n"
                    f"model: {{path: {folder}}}\nmemory_fraction: {fraction}\nreserve_gib: {reserve}\n"
                    f"common_gib: {common_bytes / GIB:.2f}\npage_size: 64\ncompute_dtype: {dtype}\n"
                    f"ffn_weights: {args.ffn_weights}\n"
                    f"notes: written by bench/real_widths.py\n")
    return path


def steps(summary: dict, context: int, batch: int) -> list[dict]:
    """Every step of a run as a sample: prefill steps carry a chunk of a prompt (and one row of
    each request already decoding), decode steps one row per request."""
    return [{"phase": "decode" if rows == reqs else "prefill", "context": context, "rows": rows, "requests": reqs,
             "step_ms": ms, "full_batch": rows == reqs == batch}
            for ms, rows, reqs in zip(summary["step_ms"], summary["step_rows"], summary["step_requests"])]


def run(args) -> int:
    from splash_core import results

    work = Path(args.workdir)
    folder = work / ("tiny-deepseek-v3-widths" if args.tiny else "deepseek-v3-real-widths")
    reuse = args.reuse and (folder / "model.safetensors.index.json").is_file()
    if work.exists() and not reuse:
        shutil.rmtree(work)
    work.mkdir(parents=True, exist_ok=True)
    start = time.perf_counter()
    config = dict(TINY if args.tiny else V3)
    if reuse:
        config = json.loads((folder / "config.json").read_text())
        layers, accounting = config["num_hidden_layers"], {"reused": str(folder)}
        written = {"reused": True, "bytes": sum(f.stat().st_size for f in folder.iterdir()),
                   "page_cache_dropped": _drop_page_cache(folder)}
    else:
        layers, accounting = sizing(args, config, shutil.disk_usage(work).free)
        layers = min(args.layers or layers, config["num_hidden_layers"])
        if layers < 1:
            print(f"nothing fits: {accounting}", file=sys.stderr)
            return 1
        config.update(num_hidden_layers=layers, first_k_dense_replace=min(config["first_k_dense_replace"], layers))
        folder.mkdir()
        (folder / "config.json").write_text(json.dumps(config, indent=2))
        print(f"{layers} layers ({config['first_k_dense_replace']} dense); accounting {accounting}", flush=True)
        t0 = time.perf_counter()
        child = subprocess.run([sys.executable, __file__, "--write-only", str(folder)], capture_output=True, text=True)
        if child.returncode != 0:
            print(child.stderr[-3000:], file=sys.stderr)
            return 1
        written = json.loads(child.stdout.strip().splitlines()[-1])
        print(f"wrote {written['bytes'] / 1e9:.1f} GB in {time.perf_counter() - t0:.0f} s", flush=True)
    from splash_core.profiles.checkpoint_config import profile_from_checkpoint

    profile = profile_from_checkpoint(folder)
    held = sum(layer_bytes(profile, i, 2, ffn_elem(args)) for i in range(layers))  # M0 of Eq 6: their weights
    dep = deployment(args, folder, held)
    left = lambda: args.budget_s - (time.perf_counter() - start)  # noqa: E731
    gen, gen_s = splash("generate", "--deployment", dep, "--prompt", "The capital of France is", "--max-new-tokens",
                        args.decode_tokens, "--no-check", "--json", timeout=max(60.0, left()))
    print(f"generate: load {gen['load']['seconds']:.1f} s, {gen['load']['gb_per_s']:.2f} GB/s; "
          f"{gen_s:.0f} s in all", flush=True)
    samples, runs, skipped, measured = [], [], [], []
    for context in sorted(args.contexts):
        estimate = _estimate(runs[-1], context, args) if runs else 0.0
        if runs and estimate > left():
            skipped.append({"context": context, "why": f"estimated {estimate:.0f} s, {left():.0f} s of the budget left"})
            continue
        # prompts are prefilled one chunk per step while the earlier ones decode: every request
        # generates through the whole prefill phase, then --decode-tokens steps run the full batch
        outputs = -(-args.batch * context // args.prefill_chunk) + args.decode_tokens
        workload = work / f"b{args.batch}-{context}.yaml"
        workload.write_text(f"kind: workload\nname: b{args.batch}-{context}\nsweep: {{requests: {args.batch}, "
                            f"input_tokens: {context}, output_tokens: {outputs}}}\n")
        summary, seconds = splash("run", "--deployment", dep, "--workload", workload, "--policy", "TP",
                                  "--prefill-chunk", args.prefill_chunk, "--no-check", "--json",
                                  timeout=max(60.0, left()))
        rows = steps(summary, context, args.batch)
        samples += rows
        measured.append((rows, summary))
        decode = [r["step_ms"] for r in rows if r["full_batch"]]
        prefill = [r["step_ms"] for r in rows if r["phase"] == "prefill"]
        runs.append({"context": context, "output_tokens": outputs, "seconds": seconds, "load_s": summary["load"]["seconds"],
                     "load_gb_per_s": summary["load"]["gb_per_s"], "full_batch_decode_steps": len(decode),
                     "decode_step_ms_p50": results_p50(decode[1:] or decode),
                     "prefill_step_ms_p50": results_p50(prefill), "prefill_rows": args.prefill_chunk,
                     "tokens_per_s": summary["tokens_per_s"], "kv_pages": summary["kv_pages"]})
        print(f"run at {context}: decode p50 {runs[-1]['decode_step_ms_p50']:.1f} ms, prefill p50 "
              f"{runs[-1]['prefill_step_ms_p50']:.1f} ms ({seconds:.0f} s)", flush=True)
    rates = _rooflines(args, dep, runs, measured)
    platform = "cpu" if args.tiny else accelerator_platform()
    load = gen["load"]
    data = results.make_result(
        benchmark="real_widths", platform=platform, backend=gen["backend"], model=profile.name, T=1,
        dtype="fp32" if args.tiny else "bf16", samples=samples,
        summary={"layers": layers, "dense_layers": config["first_k_dense_replace"], "batch": args.batch,
                 "written": written, "load": {k: load[k] for k in ("seconds", "bytes_read", "gb_per_s", "format",
                                                                    "dtype", "device_memory")},
                 "memory_bytes": load["memory"], "sizing": accounting, "runs": runs, "skipped": skipped,
                 "generated_text": gen["text"], "generate_seconds": gen_s, "ffn_weights": args.ffn_weights,
                 "rates": rates},
        notes=(f"random-init DeepSeek-V3 widths, FP8 block-scaled on disk, {_held(args)} at load; "
               "the first load reads the disk (page cache dropped after writing), splash run's loads may hit the "
               "page cache" + ("; --tiny: small widths on CPU" if args.tiny else "")))
    name = "real_widths" + {"fp8": "-fp8"}.get(args.ffn_weights, "")
    path = results.write_result(data, args.out, name=name + "".join(f"-{c}" for c in args.contexts)
                                if args.reuse else name)
    print(f"wrote {path}")
    if not args.keep:
        shutil.rmtree(work, ignore_errors=True)
    return 0


def _rooflines(args, dep: Path, runs: list[dict], measured: list) -> dict:
    """The device's copy and matmul rates, measured now on one rank; every run's steps beside their floors."""
    import torch

    from splash_bench.decode_step import device_rates
    from splash_bench.run_roofline import beside_floors, deployment_costs
    from splash_core.profiles import load
    from splash_core.runtime.spawn import RankPool

    with RankPool(1, backend="reference" if args.tiny else "auto", timeout_s=300) as pool:
        rates = pool.run(device_rates, 8 if args.tiny else 2048, 128 if args.tiny else 8192,
                         torch.float32 if args.tiny else torch.bfloat16, fp8=args.ffn_weights == "fp8")[0]
    deployment = load("deployment", str(dep))
    costs = deployment_costs(deployment)
    for run, (rows, summary) in zip(runs, measured):
        requests = [(run["context"], run["output_tokens"])] * args.batch
        run.update(beside_floors(rows, summary, costs, requests, args.prefill_chunk, deployment.prefill_attention,
                                 rates))
        replayed = "replayed" if run["schedule_matches"] else f"differs: {run['schedule_difference']}"
        print(f"run at {run['context']}: decode roofline {run['decode_roofline_ms_p50']:.1f} ms, prefill roofline "
              f"{run['prefill_roofline_ms_p50']:.1f} ms (schedule {replayed})", flush=True)
    return rates


def _estimate(last: dict, context: int, args) -> float:
    """Seconds a run at ``context`` should take, from the last run: its load and start-up, then
    prefill chunks whose attention grows with the context they reach, and decode steps."""
    ratio = context / last["context"]
    chunks = -(-args.batch * context // args.prefill_chunk)
    return (last["seconds"] - last["prefill_step_ms_p50"] * -(-args.batch * last["context"] // args.prefill_chunk) / 1e3
            + chunks * last["prefill_step_ms_p50"] / 1e3 * (1 + ratio) / 2 * 1.5
            + args.decode_tokens * last["decode_step_ms_p50"] / 1e3 * ratio)


def results_p50(values) -> float:
    from splash_core.results.stats import percentile

    return percentile(list(values), 50) if values else 0.0


if __name__ == "__main__":
    a = parse_args()
    if a.write_only:
        print(json.dumps(write_checkpoint(Path(a.write_only))))
        sys.exit(0)
    sys.exit(run(a))
