"""bench/fp8_gemm.py on the CPU: its arguments (bad ones refused in one line), its refusal without
a GPU, a smoke run in Triton's interpreter that writes a valid result (plain and grouped), and its correctness gate
stopping the run when the kernel disagrees with the spec (a planted fault)."""

from __future__ import annotations

import kernel_interpreter  # noqa: F401  (must precede the kernels' import)
import pytest
import torch
from bench_scripts import load_bench

from splash_core.results import read_result


@pytest.fixture(scope="module")
def bench():
    return load_bench("fp8_gemm")


def test_arguments(bench, capsys):
    args = bench.parse_args([])
    assert args.m == [16, 64, 512, 8192] and [s.name for s in args.shapes] == list(bench.SHAPES)
    assert args.platform is None  # named after the GPU once main sees it
    args = bench.parse_args(["--m", "4,8", "--shapes", "kv_a"])
    assert args.m == [4, 8] and args.shapes == [bench.SHAPES["kv_a"]]
    for bad, why in ((["--m", "x"], "comma-separated integers"), (["--m", "0"], ">= 1"),
                     (["--shapes", "kv_a,nope"], "unknown nope"), (["--experts", "-1"], ">= 0")):
        with pytest.raises(SystemExit) as raised:
            bench.parse_args(bad)
        assert raised.value.code == 2 and why in capsys.readouterr().err


@pytest.mark.skipif(torch.cuda.is_available(), reason="a GPU is visible")
def test_without_a_gpu_it_says_so(bench, capsys):
    assert bench.main(["--out", "unused"]) == 2
    assert "no GPU visible" in capsys.readouterr().err


def test_smoke_run_writes_a_result(bench, tmp_path):
    assert bench.main(["--smoke", "--out", str(tmp_path)]) == 0
    result = read_result(tmp_path / "cpu" / "fp8_gemm.json")
    samples = result["samples"]
    assert [(s["shape"], s["m"]) for s in samples] == [
        *((n, m) for n in bench.SMOKE_SHAPES for m in (16, 20)), ("expert_smoke_x3", 16), ("expert_smoke_x3", 20)]
    assert all(s["tiles"] and all(t["ms"] for t in s["tiles"]) and s["bf16_ms"] for s in samples)
    assert set(result["summary"]["points"]) == {f"{s['shape']}/m{s['m']}" for s in samples}


def test_a_kernel_that_disagrees_stops_the_run(bench, tmp_path, monkeypatch):
    right = bench.fp8_block_gemm
    monkeypatch.setattr(bench, "fp8_block_gemm", lambda *a, **k: right(*a, **k) * 1.01)
    with pytest.raises(SystemExit, match="disagrees with the spec: error"):
        bench.main(["--smoke", "--out", str(tmp_path)])
    assert not (tmp_path / "cpu" / "fp8_gemm.json").exists()


def test_scaled_mm_threshold_and_provider_entry(bench, tmp_path):
    rows = [{"shape": s, "m": m, "triton_tflops": 100.0, "scaled_mm_block_tflops": t}
            for s, m, t in (("a", 16, 50.0), ("a", 512, 150.0), ("a", 8192, 300.0), ("b", 512, 90.0),
                            ("b", 8192, 200.0), ("c", 16, 10.0))]
    assert bench.scaled_mm_threshold(rows) == 8192  # b loses at 512
    rows[3]["scaled_mm_block_tflops"] = 120.0
    assert bench.scaled_mm_threshold(rows) == 512
    assert bench.scaled_mm_threshold([{"m": 64, "triton_tflops": 1.0}]) is None  # nothing measured
    path = tmp_path / "providers.json"
    path.write_text('{"decode": {"128": {"flashmla_from_kv_tokens": null}}}')
    entry = bench.write_providers(str(path), rows, "cmd", "machine")
    table = __import__("json").loads(path.read_text())
    assert entry["scaled_mm_from_rows"] == 512 and table["fp8_linear"] == entry and "decode" in table


def test_tiles_entry_keeps_what_this_run_did_not_measure(bench, tmp_path):
    path = tmp_path / "providers.json"
    path.write_text('{"fp8_linear": {"scaled_mm_from_rows": 512}, "fp8_tiles": {"weights": {"96x256": {"16": '
                    '[16, 32, 1, 1, 1, 0], "64": [64, 64, 4, 5, 1, 0]}, "8x8": {"16": [16, 16, 1, 1, 1, 0]}}}}')
    rows = [{"shape": "a", "m": 16, "n": 96, "k": 256, "triton_tile": [16, 64, 4, 4, 4, 1]},
            {"shape": "a_x3", "m": 16, "n": 96, "k": 256, "experts": 3, "triton_tile": [16, 32, 1, 1, 1, 0]}]
    entry = bench.write_tiles(str(path), rows, "cmd", "machine")
    table = __import__("json").loads(path.read_text())
    assert table["fp8_linear"] == {"scaled_mm_from_rows": 512} and table["fp8_tiles"] == entry
    assert entry["weights"] == {"96x256": {"16": [16, 64, 4, 4, 4, 1], "64": [64, 64, 4, 5, 1, 0]},
                                "8x8": {"16": [16, 16, 1, 1, 1, 0]}}  # the grouped row is not a plain weight's
