"""Checkpoint folders as a user points SPLASH at them: config.json -> model profile, the deployment's
``model: {path: ...}``, FP8 dequantization of unaligned slices, the tiny checkpoint SPLASH writes
itself (deterministic, loadable by transformers with the same logits), ``splash generate`` end to
end, and bad checkpoints refused in one line with exit code 2."""

from __future__ import annotations

import json
import shutil
import subprocess

import hf_checkpoints as hf
import pytest
import torch
from safetensors.torch import load_file, save_file

from splash_core.checkpoint import fp8, tiny
from splash_core.checkpoint.source import CheckpointWeights
from splash_core.checkpoint.tokenizer import Tokenizer
from splash_core.cli.main import main
from splash_core.profiles import load
from splash_core.profiles.checkpoint_config import profile_from_checkpoint
from splash_core.runtime.reference_model import ReferenceModel


@pytest.fixture(scope="module")
def v2_folder(tmp_path_factory):
    folder = tmp_path_factory.mktemp("v2") / "ckpt"
    hf.write("v2-lite", folder)
    return folder


def test_config_json_becomes_the_model_profile(v2_folder, tmp_path):
    p = profile_from_checkpoint(v2_folder)
    assert (p.mla.heads, p.mla.q_lora_rank, p.mla.kv_lora_rank, p.num_layers) == (4, 0, 32, 2)
    assert p.rope_interleave and p.rope_scaling.factor == 8.0 and p.rope_scaling.mscale_all_dim == 0.8
    assert (p.moe.n_routed_experts, p.moe.topk_method, p.moe.scoring_func, p.moe.first_k_dense_replace) == \
        (8, "group_limited_greedy", "softmax", 1)
    assert p.checkpoint == str(v2_folder.resolve()) and p.weight_dtype == "fp32"
    # a deployment names the folder; other keys override what config.json implies
    dep = tmp_path / "dep.yaml"
    dep.write_text(f"kind: deployment\nhardware: cpu\nbackend: reference\nT: 2\ncompute_dtype: fp32\n"
                   f"model: {{path: {v2_folder}, kv_cache: {{latent_dtype: fp32, rope_dtype: fp32}}}}\n")
    d = load("deployment", str(dep))
    assert d.model.mla == p.mla and d.model.kv_cache.latent_dtype == "fp32"


def test_fp8_slices_dequantize_like_the_published_format():
    w = torch.randn(300, 260) * 0.05
    q, scale = hf.quantize_fp8(w)
    full = hf.dequantize_fp8(q, scale)
    assert (full - w).abs().max() <= 0.07 * w.abs().max()  # e4m3 keeps ~3 significant bits
    mine, grid = fp8.quantize(w)  # the writer SPLASH's benchmarks use
    assert torch.equal(mine.float(), q.float()) and torch.equal(grid, scale)
    for rows, cols in ((slice(0, 300), slice(0, 260)), (slice(5, 270), slice(3, 140)), (slice(130, 131), slice(255, 260))):
        part = fp8.dequantize(q[rows, cols], scale[fp8.scale_rows(rows, 128), fp8.scale_rows(cols, 128)], rows, cols,
                              (128, 128))
        assert torch.equal(part, full[rows, cols])


def test_the_tiny_checkpoint_is_deterministic_and_transformers_computes_the_same(tmp_path):
    a, b = tiny.ensure("tiny-deepseek-v3", tmp_path / "a"), tiny.ensure("tiny-deepseek-v3", tmp_path / "b")
    for name in ("config.json", "model.safetensors", "tokenizer.json", "tokenizer_config.json"):
        assert (tmp_path / "a" / name).read_bytes() == (tmp_path / "b" / name).read_bytes(), name
    profile = profile_from_checkpoint(a)
    assert profile.rope_interleave and profile.rope_scaling and profile.moe.topk_method == "noaux_tc"
    ours = Tokenizer(a)
    theirs = hf.transformers.AutoTokenizer.from_pretrained(a)
    text = "Hello, world! SPLASH switches layouts."
    assert ours.encode(text) == theirs(text).input_ids and ours.decode(ours.encode(text)) == text
    model = hf.transformers.AutoModelForCausalLM.from_pretrained(a, dtype=torch.float32).eval()
    ids = torch.tensor(ours.encode(text * 3))
    with torch.no_grad():
        want = model(ids[None]).logits[0]
    ref = ReferenceModel(profile, CheckpointWeights(a, profile))
    got = ref.logits(ref.forward(0, 0, ids))
    assert (got - want).abs().max() <= 1e-4 * want.abs().max()
    with pytest.raises(ValueError, match="unknown builtin checkpoint"):
        tiny.ensure("tiny-nothing")


def test_splash_generate_as_a_user_types_it():
    exe = shutil.which("splash") or pytest.skip("console script `splash` not installed")
    done = subprocess.run([exe, "generate", "--prompt", "hello", "--max-new-tokens", "8", "--json"],
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    out = json.loads(done.stdout)
    folder = out["load"]["checkpoint"]
    tokenizer = Tokenizer(folder)
    assert out["prompt_token_ids"] == tokenizer.encode("hello") and out["text"] == tokenizer.decode(out["token_ids"])
    assert len(out["token_ids"]) == 8 or out["finish_reason"] == "stop"
    assert out["check"]["passed"] and out["check"]["exact"] and out["load"]["bytes_read"] > 0


def _broken(src, tmp_path, *, config=None, drop=None):
    folder = tmp_path / "broken"
    shutil.copytree(src, folder)
    if config:
        cfg = json.loads((folder / "config.json").read_text())
        cfg.update(config)
        (folder / "config.json").write_text(json.dumps(cfg))
    if drop:
        tensors = load_file(folder / "model.safetensors")
        del tensors[drop]
        save_file(tensors, str(folder / "model.safetensors"))
    return folder


@pytest.mark.parametrize("change, args, message", [
    (dict(drop="model.layers.1.mlp.experts.3.up_proj.weight"), [], "model.layers.1.mlp.experts.3.up_proj.weight: "
                                                                     "tensor missing"),
    (dict(config={"kv_lora_rank": 16}), [], "model.layers.0.self_attn.kv_a_proj_with_mqa.weight: shape [40, 64] "
                                            "disagrees with config.json, which implies [24, 64]"),
    (dict(config={"architectures": ["LlamaForCausalLM"]}), [], "architectures: SPLASH serves"),
    (dict(), ["--T", "3"], "T: must divide the model's 4 MLA heads (got 3)"),
    (dict(config={"hidden_act": "gelu"}), [], "hidden_act: not supported"),
    (dict(config={"rope_scaling": {"type": "linear", "factor": 2.0}}), [], "rope_scaling.type: SPLASH supports"),
    (dict(config={"quantization_config": {"quant_method": "gptq"}}), [], "quantization_config.quant_method"),
])
def test_a_bad_checkpoint_is_one_line_and_exit_code_2(v2_folder, tmp_path, capsys, change, args, message):
    folder = _broken(v2_folder, tmp_path, **change)
    assert main(["generate", "--model", str(folder), "--prompt-ids", "1,2,3", "--max-new-tokens", "2", *args]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and err.startswith("splash generate: error: ") and message in err, err
    if not args:  # splash run (no --T) refuses it alike
        assert main(["run", "--model", str(folder)]) == 2
        err = capsys.readouterr().err.strip()
        assert len(err.splitlines()) == 1 and err.startswith("splash run: error: ") and message in err, err


def test_splash_run_serves_a_checkpoint_folder(v2_folder, tmp_path, capsys):
    workload = tmp_path / "two.yaml"
    workload.write_text("kind: workload\nseed: 1\nrollout: {requests: 2, prompt_tokens: [5, 30], output_tokens: [3, 6]}\n")
    assert main(["run", "--model", str(v2_folder), "--workload", str(workload), "--policy", "script:TP,CP,DOP,DP",
                 "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["model"] == v2_folder.name and out["served"] == 2 and out["switch_count"] >= 3
    assert out["check"]["passed"] and out["check"]["exact"] and out["load"]["source"] == "checkpoint"


def test_each_rank_reads_only_its_shard(v2_folder):
    from splash_core.model.mla import MLAWeights
    from splash_core.model.weights import head_shard
    from splash_core.runtime.feed_forward import MoE

    profile = profile_from_checkpoint(v2_folder)

    def read(rank, T):
        source = CheckpointWeights(v2_folder, profile)
        moe = MoE.load(source, profile, 1, rank, T)
        attention = MLAWeights.load(source, profile, 1, head_shard(profile.mla.heads, rank, T))
        return source.bytes_read, moe, attention

    whole, full_moe, full_attention = read(0, 1)
    parts = [read(r, 2) for r in range(2)]
    assert [m.experts for _, m, _ in parts] == [range(0, 4), range(4, 8)]
    assert torch.equal(torch.cat([m.gate_up for _, m, _ in parts]), full_moe.gate_up)
    assert torch.equal(torch.cat([a.kv_b for _, _, a in parts]), full_attention.kv_b)
    replicated = sum(t.numel() * 4 for t in (full_moe.router, full_attention.kv_a, full_attention.kv_a_norm))
    assert all(n - replicated == (whole - replicated) // 2 for n, _, _ in parts)  # the rest exactly halves
