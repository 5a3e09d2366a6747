"""SGLang's own load generator against ``splash serve`` (issue 25 §4), driven as a user would.

1. The model: the real-widths DeepSeek-V3 checkpoint of ``bench/real_widths.py`` (random-init,
   FP8 block-scaled on disk, as many layers as fit one device at T = 1, or ``--layers``), written
   here or reused from a kept one (``--reuse``, the folder ``real_widths.py --keep`` leaves), with
   a tokenizer that has a word for every id (:func:`cover_vocabulary`).
2. ``splash serve --deployment <that checkpoint> --port P`` (T = 1), waited on until ``/health``.
3. ``python -m sglang.bench_serving --backend sglang`` per request rate (default 1, 4, 16, inf):
   ``--num-prompts`` prompts of random token ids, ``--input-len`` tokens at most and
   ``--input-len`` x ``--range-ratio`` at least (1K-8K), every request generating exactly
   ``--output-len`` tokens (``ignore_eos``); after each rate, the server's ``/metrics`` and
   ``/server_info``. A rate that would not end within ``--budget-s`` is skipped, and says so.
4. SIGTERM to the server; its exit code is recorded.

Writes ``<out>/<platform>/served_bench.json``: the commands, every rate's bench_serving result
(TTFT, ITL, E2E and throughput, with the raw per-request samples), the metrics text after each
rate and the server's log tail. ``--tiny`` runs the same on CPU with real_widths.py's small
widths and the reference backend (a smoke test).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))

from splash_bench.platform_name import accelerator_platform  # noqa: E402


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--out", default=str(ROOT / "bench" / "results"), help="results root (<out>/<platform>/)")
    p.add_argument("--workdir", default="/tmp/splash-real-widths", help="where the checkpoint is (or is written)")
    p.add_argument("--reuse", action="store_true", help="serve the checkpoint a kept run left in --workdir")
    p.add_argument("--keep", action="store_true", help="keep the checkpoint afterwards")
    p.add_argument("--layers", type=int, default=0, help="layers to write (0: as many as fit)")
    p.add_argument("--tiny", action="store_true", help="the tiny CPU checkpoint, small lengths (smoke test)")
    p.add_argument("--rates", nargs="+", default=["1", "4", "16", "inf"], help="request rates (per second, or inf)")
    p.add_argument("--num-prompts", type=int, default=128)
    p.add_argument("--input-len", type=int, default=8192, help="longest prompt (tokens)")
    p.add_argument("--range-ratio", type=float, default=0.125, help="shortest prompt = input-len x this")
    p.add_argument("--output-len", type=int, default=256, help="tokens every request generates")
    p.add_argument("--max-running", type=int, default=128, help="splash serve --max-running")
    p.add_argument("--server-args", default="", help="more splash serve flags, one string")
    p.add_argument("--budget-s", type=float, default=330.0, help="start no rate expected to end past this")
    p.add_argument("--temperature", type=float, default=0.0, help="every request's temperature (0: greedy)")
    p.add_argument("--top-p", type=float, default=1.0, help="every request's top_p")
    p.add_argument("--ffn-weights", choices=("compute", "fp8"), default="compute",
                   help="fp8: the server keeps the feed-forward weights FP8 as stored (ffn_weights: fp8)")
    p.add_argument("--platform", default=None, help="results folder (default: the GPU's model, cpu with --tiny)")
    p.add_argument("--name", default="served_bench", help="result file name (<out>/<platform>/<name>.json)")
    return p.parse_args(argv)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def checkpoint(args) -> tuple[str, str]:
    """(deployment path or name, checkpoint folder) to serve."""
    import real_widths

    rw = real_widths.parse_args(["--workdir", args.workdir, "--batch", str(args.max_running),
                                 "--contexts", str(args.input_len + args.output_len), "--layers", str(args.layers),
                                 "--ffn-weights", args.ffn_weights] + ["--tiny"] * args.tiny)
    work = Path(args.workdir)
    folder = work / ("tiny-deepseek-v3-widths" if args.tiny else "deepseek-v3-real-widths")
    if not (args.reuse and (folder / "model.safetensors.index.json").is_file()):
        shutil.rmtree(work, ignore_errors=True)
        work.mkdir(parents=True)
        config = dict(real_widths.TINY if args.tiny else real_widths.V3)
        layers, accounting = real_widths.sizing(rw, config, shutil.disk_usage(work).free)
        layers = min(rw.layers or layers, config["num_hidden_layers"])  # --tiny: real_widths.py's 3
        config.update(num_hidden_layers=layers, first_k_dense_replace=min(config["first_k_dense_replace"], layers))
        folder.mkdir()
        (folder / "config.json").write_text(json.dumps(config, indent=2))
        print(f"writing {layers} layers ({accounting})", flush=True)
        subprocess.run([sys.executable, str(ROOT / "bench" / "real_widths.py"), "--write-only", str(folder)],
                       check=True, capture_output=True, text=True)
    cover_vocabulary(folder)
    from splash_core.profiles.checkpoint_config import profile_from_checkpoint

    profile = profile_from_checkpoint(folder)
    layers = profile.num_layers
    held = sum(real_widths.layer_bytes(profile, i, 2, real_widths.ffn_elem(rw)) for i in range(layers))
    path = real_widths.deployment(rw, folder, held)  # planning no more memory than this GPU has
    return str(path), str(folder)


def cover_vocabulary(folder: Path) -> bool:
    """Give the random-init checkpoint a tokenizer with a word for every id of its vocabulary
    (``t<id>``; BOS and EOS keep theirs), when its own covers fewer (real_widths.py writes a
    384-token BPE for a 129,280-id model): a random model generates ids all over the vocabulary,
    and bench_serving times only stream chunks that carry text. Returns whether it replaced it."""
    from tokenizers import Tokenizer, models, pre_tokenizers

    from splash_core.checkpoint.tiny import BOS, EOS

    vocab = json.loads((folder / "config.json").read_text())["vocab_size"]
    if Tokenizer.from_file(str(folder / "tokenizer.json")).get_vocab_size() >= vocab:
        return False
    words = {BOS: 0, EOS: 1, **{f"t{i}": i for i in range(2, vocab)}}
    tokenizer = Tokenizer(models.WordLevel(words, unk_token="t2"))
    tokenizer.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    tokenizer.add_special_tokens([BOS, EOS])
    tokenizer.save(str(folder / "tokenizer.json"))
    return True


def get(url: str, timeout: float = 30.0) -> bytes:
    with urllib.request.urlopen(url, timeout=timeout) as r:
        return r.read()


def run(args) -> int:
    start = time.perf_counter()
    probe = subprocess.run([sys.executable, "-c", "import sglang.bench_serving"], capture_output=True, text=True)
    if probe.returncode != 0:  # before minutes of writing and loading a checkpoint
        lines = probe.stderr.strip().splitlines() or ["(no output)"]
        print(f"cannot import sglang.bench_serving: {lines[-1]} (pip install -e '.[bench]' && pip install "
              f"--no-deps sglang==0.5.9; on the GPU machine, the wheels of bench/serve_wheels.sh)", file=sys.stderr)
        return 1
    deployment, folder = checkpoint(args)
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    serve_cmd = [shutil.which("splash") or "splash", "serve", "--deployment", deployment, "--port", str(port),
                 "--max-running", str(args.max_running), "--log-level", "warning", *args.server_args.split()]
    log = open(Path(args.workdir) / "splash-serve.log", "w+")
    server = subprocess.Popen(serve_cmd, stdout=log, stderr=subprocess.STDOUT)
    state = {"args": args, "folder": folder, "serve_cmd": serve_cmd, "runs": [], "skipped": [], "samples": [],
             "ready_s": 0.0, "log": log, "info": {}}
    code = None
    try:
        if not _wait_ready(server, url, log):
            return 1
        state["ready_s"] = time.perf_counter() - start
        print(f"server ready after {state['ready_s']:.0f} s", flush=True)
        last = None
        for rate in args.rates:
            left = args.budget_s - (time.perf_counter() - start)
            expected = _expected(last, rate, args.num_prompts)
            if last is not None and expected > left:
                state["skipped"].append(f"rate {rate}: expected {expected:.0f} s, {left:.0f} s of the budget left")
                continue
            last = _one_rate(state, url, rate)
            _write(state, code=-1)  # a run cut off later keeps every rate that finished
    finally:
        if server.poll() is None:
            server.send_signal(signal.SIGTERM)
        code = server.wait(timeout=120)
    path = _write(state, code)
    print(f"wrote {path}")
    if not (args.keep or args.reuse):
        shutil.rmtree(args.workdir, ignore_errors=True)
    return 0 if code == 0 and state["runs"] else 1


def _wait_ready(server, url: str, log) -> bool:
    while server.poll() is None:
        try:
            get(url + "/health", timeout=5)
            return True
        except OSError:
            time.sleep(1)
    log.seek(0)
    print(log.read()[-3000:], file=sys.stderr)
    return False


def _one_rate(state: dict, url: str, rate: str) -> dict:
    args = state["args"]
    result, seconds, cmd = bench(args, url, state["folder"], rate)
    state["info"] = info = json.loads(get(url + "/server_info"))
    state["runs"].append({"rate": rate, "seconds": seconds, "command": " ".join(cmd), "completed": result["completed"],
                          "metrics": get(url + "/metrics").decode(), "server_info": info,
                          "bench_serving": {k: v for k, v in result.items() if k not in _DETAILS}})
    for i, (n_in, n_out, ttft, itl) in enumerate(zip(result["input_lens"], result["output_lens"], result["ttfts"],
                                                     result["itls"])):
        state["samples"].append({"rate": rate, "request": i, "input_tokens": n_in, "output_tokens": n_out,
                                 "ttft_ms": ttft * 1e3, "itl_ms": [x * 1e3 for x in itl],
                                 "error": result["errors"][i] or None})
    print(f"rate {rate}: {result['completed']}/{args.num_prompts} completed, TTFT p50 {result['median_ttft_ms']:.0f} ms, "
          f"ITL p50 {result['median_itl_ms']:.1f} ms, {result['output_throughput']:.0f} output tok/s ({seconds:.0f} s)",
          flush=True)
    return {"rate": rate, "seconds": seconds}


def _write(state: dict, code: int) -> Path:
    """The result so far; ``code`` is the server's exit code (-1: still serving when written)."""
    from splash_core import results

    args, log = state["args"], state["log"]
    log.seek(0)
    tail = log.read()[-4000:]
    log.seek(0, 2)
    data = results.make_result(
        benchmark="served_bench", platform=args.platform or ("cpu" if args.tiny else accelerator_platform()),
        backend=state["info"].get("backend", "?"),
        model=Path(state["folder"]).name, T=1, dtype="fp32" if args.tiny else "bf16", samples=state["samples"],
        summary={"server_command": " ".join(state["serve_cmd"]), "server_ready_s": state["ready_s"],
                 "server_exit_code": code, "runs": state["runs"], "skipped": state["skipped"],
                 **({"server_log_tail": tail} if tail.strip() else {}),
                 "workload": {"num_prompts": args.num_prompts, "input_tokens": [int(args.input_len * args.range_ratio),
                                                                                args.input_len],
                              "output_tokens": args.output_len, "temperature": args.temperature,
                              "top_p": args.top_p, "ffn_weights": args.ffn_weights}},
        notes="sglang.bench_serving (sglang 0.5.9, installed --no-deps) against splash serve; random-init "
              "DeepSeek-V3 widths" + ("; --tiny: small widths on CPU" if args.tiny else ""))
    return results.write_result(data, args.out, args.name)


_DETAILS = ("input_lens", "output_lens", "ttfts", "itls", "generated_texts", "errors")


def bench(args, url: str, folder: str, rate: str):
    """One bench_serving run: (its result with details, seconds, the command)."""
    out = Path(args.workdir) / f"bench-{rate}.jsonl"
    out.unlink(missing_ok=True)
    every = {"max_new_tokens": args.output_len, "temperature": args.temperature, "top_p": args.top_p,
             "ignore_eos": True}  # the same length for all
    cmd = [sys.executable, "-m", "sglang.bench_serving", "--backend", "sglang", "--base-url", url,
           "--dataset-name", "random-ids", "--tokenizer", folder, "--num-prompts", str(args.num_prompts),
           "--random-input-len", str(args.input_len), "--random-output-len", str(args.output_len),
           "--random-range-ratio", str(args.range_ratio), "--request-rate", rate, "--tokenize-prompt",
           "--extra-request-body", json.dumps({"sampling_params": every}), "--output-file", str(out),
           "--output-details", "--disable-tqdm"]
    t0 = time.perf_counter()
    done = subprocess.run(cmd, capture_output=True, text=True, env={**os.environ, "HF_HUB_OFFLINE": "1"})
    if done.returncode != 0:
        raise RuntimeError(f"bench_serving exited {done.returncode}:\n{done.stdout[-2000:]}\n{done.stderr[-2000:]}")
    return json.loads(out.read_text().splitlines()[-1]), time.perf_counter() - t0, cmd


def _expected(last, rate: str, prompts: int) -> float:
    """Seconds a rate should take: the arrivals, or the last run's time if longer."""
    arrivals = 0.0 if rate == "inf" else prompts / float(rate)
    return max(arrivals, last["seconds"] if last else 0.0)


if __name__ == "__main__":
    sys.exit(run(parse_args()))
