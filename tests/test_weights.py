"""Eq 9 weight accounting against appendix A's numbers, and ``splash weights``."""

from __future__ import annotations

import json

import pytest

from splash_core.cli.main import main
from splash_core.planning.weight_bytes import weight_report
from splash_core.profiles import load
from splash_core.profiles.model import LayerKind
from splash_core.profiles.projections import projections

MIB = 1 << 20


def test_deepseek_v3_matches_appendix_a():
    model = load("model", "deepseek-v3")
    sizes = {p.name: p.bytes / MIB for p in projections(model, LayerKind.MLA, "bf16")}
    assert sizes == {"q_b": 72, "kv_b": 32, "o": 224}
    report = weight_report(model, 8, "bf16")
    (mla,) = report.kinds
    assert mla.layer_bytes == 328 * MIB
    assert mla.received_per_rank == 287 * MIB
    assert mla.received_by_group == 2296 * MIB
    assert weight_report(model, 8, "fp8").kinds[0].received_per_rank == 143.5 * MIB


def test_glm_stand_in_and_its_note():
    model = load("model", "glm-5.3")
    assert weight_report(model, 8).kinds[0].received_per_rank == 124.25 * MIB
    assert "145.73" in model.notes  # the profile says where the stand-in disagrees with the paper


def test_direct_query_projection_when_q_lora_rank_is_zero():
    data = {"name": "no-q-lora", "hidden_size": 64, "layers": {"count": 1},
            "mla": {"heads": 4, "q_lora_rank": 0, "kv_lora_rank": 16, "qk_nope_head_dim": 8,
                    "qk_rope_head_dim": 4, "v_head_dim": 8}, "weight_dtype": "fp32"}
    (q_b, kv_b, o) = projections(load("model", data), LayerKind.MLA)
    assert q_b.shape == (64, 4 * 12) and q_b.bytes == 64 * 48 * 4
    assert kv_b.shape == (16, 4 * 16) and o.shape == (32, 64)


def test_kda_projections():
    model = load("model", "tiny-hybrid")  # d 96, 12 KDA heads of 16, conv 4, fp32
    sizes = {p.name: p.params for p in projections(model, LayerKind.KDA)}
    hk = 12 * 16
    assert sizes == {"q": 96 * hk, "k": 96 * hk, "v": 96 * hk, "o": hk * 96, "beta": 96 * 12,
                     "f_b": 16 * hk, "g_b": 16 * hk, "decay": 12 + hk}
    report = weight_report(model, 3)
    assert [k.kind for k in report.kinds] == [LayerKind.MLA, LayerKind.KDA]
    assert report.model_bytes == sum(k.layers * k.layer_bytes for k in report.kinds)
    assert report.received_per_rank == sum(k.layers * k.layer_bytes * 2 // 3 for k in report.kinds)


def test_group_size_must_divide_the_heads():
    with pytest.raises(ValueError, match="T = 3 does not divide the model's 128 mla heads"):
        weight_report(load("model", "deepseek-v3"), 3)


def test_cli_json(capsys):
    assert main(["weights", "--model", "deepseek-v3", "--T", "8", "--dtype", "bf16", "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    (mla,) = out["kinds"]
    assert [p["bytes"] / MIB for p in mla["projections"]] == [72, 32, 224]
    assert mla["received_per_rank_per_layer"] == 287 * MIB
    assert mla["received_by_group_per_layer"] == 2296 * MIB
    assert "not measurements" in out["source"]


def test_cli_table_shows_the_profile_notes(capsys):
    assert main(["weights", "--model", "glm-5.3", "--T", "8"]) == 0
    out = capsys.readouterr().out
    assert "124.25" in out and "145.73" in out and "Eq 9" in out


def test_cli_errors_exit_2(capsys):
    assert main(["weights", "--model", "deepseek-v3", "--T", "3"]) == 2
    assert "does not divide" in capsys.readouterr().err
    assert main(["weights", "--model", "no-such-model", "--T", "8"]) == 2
    assert "no model profile named 'no-such-model'" in capsys.readouterr().err
