"""Per-rank memory from the tensors the runtime loads (splash_core.checkpoint.footprint,
splash_core.engine.memory_plan): the plan equals what the loaders hold, FP8-kept bytes equal the
slices as stored (shards starting mid-block), headers and config.json alone agree, the real
DeepSeek-V3 671B is refused on 8 H200s held in bf16 before any weight is read, and the CLI prints
it per layout with one-line errors for bad input."""

from __future__ import annotations

import dataclasses
import json

import pytest
import torch
from cli_lines import one_line
from hf_checkpoints import quantize_fp8, quantized
from safetensors import safe_open
from safetensors.torch import load_file, save_file

from splash_core.checkpoint.deployments import resolve
from splash_core.checkpoint.footprint import RankWeights, stored_tensors
from splash_core.checkpoint.fp8_blocks import read_block_scaled
from splash_core.checkpoint.source import CheckpointWeights
from splash_core.checkpoint.tiny import ensure
from splash_core.cli.main import main
from splash_core.engine.memory_plan import deployment_memory, refusal
from splash_core.engine.policy import make_policy
from splash_core.engine.preflight import JobError, check_requests
from splash_core.layouts import Layout
from splash_core.model.mla import MLAWeights
from splash_core.planning.weight_bytes import weight_report
from splash_core.profiles import load
from splash_core.profiles.checkpoint_config import profile_from_checkpoint
from splash_core.profiles.model import LayerKind
from splash_core.profiles.workload import RequestSpec
from splash_core.runtime.feed_forward import load_feed_forward

GIB = 1 << 30

# DeepSeek-V3's published config.json (huggingface.co/deepseek-ai/DeepSeek-V3), auto_map left out
DEEPSEEK_V3 = {
    "architectures": ["DeepseekV3ForCausalLM"], "model_type": "deepseek_v3", "hidden_size": 7168,
    "intermediate_size": 18432, "moe_intermediate_size": 2048, "num_hidden_layers": 61, "num_attention_heads": 128,
    "num_key_value_heads": 128, "n_shared_experts": 1, "n_routed_experts": 256, "routed_scaling_factor": 2.5,
    "kv_lora_rank": 512, "q_lora_rank": 1536, "qk_rope_head_dim": 64, "v_head_dim": 128, "qk_nope_head_dim": 128,
    "topk_method": "noaux_tc", "n_group": 8, "topk_group": 4, "num_experts_per_tok": 8, "moe_layer_freq": 1,
    "first_k_dense_replace": 3, "norm_topk_prob": True, "scoring_func": "sigmoid", "aux_loss_alpha": 0.001,
    "seq_aux": True, "hidden_act": "silu", "max_position_embeddings": 163840, "initializer_range": 0.02,
    "rms_norm_eps": 1e-06, "use_cache": True, "pretraining_tp": 1, "tie_word_embeddings": False, "rope_theta": 10000,
    "rope_scaling": {"beta_fast": 32, "beta_slow": 1, "factor": 40, "mscale": 1.0, "mscale_all_dim": 1.0,
                     "original_max_position_embeddings": 4096, "type": "yarn"},
    "attention_bias": False, "attention_dropout": 0.0, "bos_token_id": 0, "eos_token_id": 1,
    "torch_dtype": "bfloat16", "transformers_version": "4.33.1", "vocab_size": 129280,
    "num_nextn_predict_layers": 1, "ep_size": 1,
    "quantization_config": {"activation_scheme": "dynamic", "fmt": "e4m3", "quant_method": "fp8",
                            "weight_block_size": [128, 128]},
}


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    """(bf16 folder, FP8 block-scaled folder, config.json-only FP8 folder) of the tiny DeepSeek-V3."""
    root = tmp_path_factory.mktemp("capacity")
    bf16 = root / "bf16"
    ensure("tiny-deepseek-v3", bf16)
    fp8, bare = root / "fp8", root / "bare"
    fp8.mkdir()
    written = {}
    for name, t in load_file(bf16 / "model.safetensors").items():
        if quantized(name):
            written[name], written[f"{name}_scale_inv"] = quantize_fp8(t.float())
        else:
            written[name] = t
    save_file(written, str(fp8 / "model.safetensors"))
    config = json.loads((bf16 / "config.json").read_text())
    config["quantization_config"] = {"quant_method": "fp8", "fmt": "e4m3", "weight_block_size": [128, 128]}
    for folder in (fp8, bare):
        folder.mkdir(exist_ok=True)
        (folder / "config.json").write_text(json.dumps(config))
    return bf16, fp8, bare


def test_plan_equals_what_the_loaders_hold_on_every_rank(tiny):
    bf16 = tiny[0]
    profile = profile_from_checkpoint(bf16)
    source = CheckpointWeights(bf16, profile)
    tensors, _ = stored_tensors(profile, None, "fp32")
    T = 2
    table = RankWeights(profile, tensors, T, "fp32")
    for rank in range(T):
        mods = [load_feed_forward(source, profile, i, rank, T, dtype=torch.float32) for i in range(profile.num_layers)]
        for part in ("experts", "mlp"):
            want = sum(m.nbytes()[part] for m in mods)
            assert want > 0
            assert table.held(Layout.TP, rank)[part].runtime == want, (part, rank)
        for layout, heads in ((Layout.TP, range(rank * 6, rank * 6 + 6)), (Layout.DP, None)):
            loaded = [MLAWeights.load(source, profile, i, heads, dtype=torch.float32)
                      for i in range(profile.num_layers)]
            want = sum(w.q_b.nbytes + w.kv_b.nbytes + w.o.nbytes for w in loaded)
            assert table.held(layout, rank)["attention (head-indexed)"].runtime == want, (layout, rank)


def test_head_indexed_bytes_are_eq9_in_a_hybrid_model():
    """KDA and MLA layers: what DP holds of the head-indexed tensors is Eq 9's W_A, TP's shards sum to it."""
    deployment = resolve("cpu-tiny-hybrid")
    model = deployment.model
    tensors, _ = stored_tensors(model, None, deployment.compute_dtype)
    table = RankWeights(model, tensors, deployment.T, deployment.compute_dtype)
    eq9 = weight_report(model, deployment.T, deployment.compute_dtype).model_bytes
    assert {LayerKind.KDA, LayerKind.MLA} <= set(model.layer_kinds) and eq9 > 0
    assert table.held(Layout.DP, 0)["attention (head-indexed)"].runtime == eq9
    assert sum(table.held(Layout.TP, r)["attention (head-indexed)"].runtime for r in range(deployment.T)) == eq9


def test_fp8_kept_bytes_are_the_slices_as_stored_and_headers_agree_with_config(tiny):
    _, fp8, bare = tiny
    profile = profile_from_checkpoint(fp8)
    from_headers, where = stored_tensors(profile, None, "bf16")
    from_config, where_config = stored_tensors(profile_from_checkpoint(bare), None, "bf16")
    assert "safetensors headers" in where and "config.json" in where_config
    assert from_headers == from_config
    assert sum(t.block is not None for t in from_headers.values()) > 0
    table = RankWeights(profile, from_headers, 2, "bf16")
    with safe_open(str(fp8 / "model.safetensors"), framework="pt") as handle:
        for rank in range(2):  # rank 1's Q-B shard (rows 144..287 of 288) starts inside a 128-row block
            want = 0
            for i in range(profile.num_layers):
                a = f"model.layers.{i}.self_attn"
                want += read_block_scaled(handle, f"{a}.q_b_proj.weight", rows=slice(144 * rank, 144 * rank + 144)
                                          ).stored_bytes
                want += read_block_scaled(handle, f"{a}.kv_b_proj.weight", rows=slice(192 * rank, 192 * rank + 192)
                                          ).stored_bytes
                want += read_block_scaled(handle, f"{a}.o_proj.weight", cols=slice(96 * rank, 96 * rank + 96)
                                          ).stored_bytes
            held = table.held(Layout.DOP, rank)["attention (head-indexed)"]
            assert held.fp8 == want < held.runtime


def test_real_deepseek_v3_on_eight_h200s_is_refused_in_bf16_and_fits_fp8_kept(tmp_path):
    (tmp_path / "config.json").write_text(json.dumps(DEEPSEEK_V3))
    deployment = resolve("h200-x8-deepseek-v3.2", model=str(tmp_path))
    plan = deployment_memory(deployment)
    experts_fp8 = 32 * 58 * 3 * (2048 * 7168 + 4 * 16 * 56)  # 32 experts x 58 MoE layers, codes + scales
    for m in plan.layouts:
        assert m.parts["experts"] == 32 * 58 * 3 * 2048 * 7168 * 2
        assert m.fp8_parts["experts"] == experts_fp8
        assert m.kv_tokens() == 0 and m.kv_tokens(True) > 500_000
    assert plan.of(Layout.DP).weights - plan.of(Layout.TP).weights == 7 * 61 * 2 * 128 * (
        192 * 1536 + 256 * 512 + 7168 * 128) // 8
    line = refusal(plan)
    assert "rank 0 in CP" in line and "experts 152.25 GiB" in line and "59.55 GiB over" in line
    with pytest.raises(JobError, match="does not fit: the weights"):
        check_requests(deployment, [RequestSpec(0, 8, 8)], 1, make_policy("DP", deployment), None, "test")
    kept = dataclasses.replace(deployment, ffn_weights="fp8")  # the runtime keeps experts and MLPs as stored
    plan = deployment_memory(kept)
    assert plan.of(Layout.DP).parts["experts"] == experts_fp8 and refusal(plan) is None
    policy = make_policy("splash", kept)
    assert check_requests(kept, [RequestSpec(0, 8, 8)], 1, policy, None, "test").pages == 1
    many = [RequestSpec(i, 100_000, 8) for i in range(64)]  # more than any pool: it gets what the counted weights leave
    capacity = check_requests(kept, many, 64, policy, None, "test")
    kept_plan = deployment_memory(kept, tuple(policy.layouts))
    assert capacity.pages == min(m.kv_pages() for m in kept_plan.layouts) > 1000
    assert "memory left after the weights" in capacity.source
    assert refusal(kept_plan, capacity.pages * int(kept.kv_page_bytes)) is None
    assert refusal(kept_plan, (capacity.pages + 1) * int(kept.kv_page_bytes)) is not None  # not a page more


def test_preflight_passes_what_fits_and_names_a_kv_pool_that_does_not():
    deployment = resolve("cpu-tiny")
    assert refusal(deployment_memory(deployment)) is None
    policy = make_policy("TP", deployment)
    assert check_requests(deployment, [RequestSpec(0, 8, 8)], 1, policy, None, "test").pages > 0
    huge = int(deployment.memory_budget_bytes // deployment.kv_page_bytes) + 1  # planted: one page too many
    with pytest.raises(JobError, match="a KV pool of .* does not fit .*lower --kv-pages"):
        check_requests(deployment, [RequestSpec(0, 8, 8)], 1, policy, huge, "test")
    tight = load("deployment", "cpu-tiny")
    with pytest.raises(JobError, match="does not fit"):  # planted: a budget smaller than the weights
        check_requests(_with_memory(tight, 1e-4), [RequestSpec(0, 8, 8)], 1, policy, None, "test")


def _with_memory(deployment, gib: float):
    hw = deployment.hardware
    return dataclasses.replace(deployment, hardware=dataclasses.replace(
        hw, memory_gib=dataclasses.replace(hw.memory_gib, value=gib)))


def test_cli_prints_each_layout_and_refuses_bad_input_in_one_line(tmp_path, capsys):
    (tmp_path / "config.json").write_text(json.dumps(DEEPSEEK_V3))
    assert main(["capacity", "--deployment", "h200-x8-deepseek-v3.2", "--model", str(tmp_path), "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert [r["layout"] for r in out["layouts"]] == ["TP", "CP", "DP", "DOP"]
    assert out["refusal"] and all(r["left_bytes"] < 0 < r["fp8_left_bytes"] for r in out["layouts"])
    assert main(["capacity", "--deployment", "cpu-tiny"]) == 0
    assert "KV tok/rank" in capsys.readouterr().out
    assert main(["capacity", "--deployment", "b200-x8-glm-5.3", "--hardware", "h200", "--json"]) == 0
    glm = json.loads(capsys.readouterr().out)["layouts"]
    # (the H200's 0.13 GiB graph pool counted: GLM-5's sparse decode is captured)
    assert glm[0]["budget_bytes"] == int(139.8007 * 0.85 * GIB) and glm[0]["fp8_kv_tokens_per_rank"] == 475_904
    for argv, cause in ((["--deployment", "nope"], "no deployment profile named 'nope'"),
                        (["--deployment", "cpu-tiny", "--model", str(tmp_path / "none")], "no checkpoint folder"),
                        (["--deployment", "cpu-tiny", "--hardware", "nope"], "no hardware profile named 'nope'"),
                        (["--scenario", "fig7-h200", "--model", str(tmp_path)], "--model goes with --deployment")):
        assert main(["capacity", *argv]) == 2
        assert cause in one_line(capsys, "capacity")


def test_serve_refuses_a_pool_that_does_not_fit_before_loading(capsys):
    from splash_core.cli.main import main

    deployment = resolve("cpu-tiny")
    huge = int(deployment.memory_budget_bytes // deployment.kv_page_bytes) + 1  # planted: one page too many
    assert main(["serve", "--kv-pages", str(huge), "--port", "0"]) == 2
    err = capsys.readouterr().err.strip()
    assert "\n" not in err and "does not fit" in err and "MiB over" in err, err
