"""Checkpoint strictness: config keys and tensors SPLASH does not map are refused by name, never
dropped silently; MTP layers are the one thing ignored, and the load says so.

The motivating case: a DeepSeek-V3.2 folder (written by transformers) relabelled
``DeepseekV3ForCausalLM`` used to be served with dense attention and no warning; now its
``index_*`` keys are refused, and with those keys stripped its indexer tensors are."""

from __future__ import annotations

import json
import shutil

import hf_checkpoints as hf
import pytest
import torch
from safetensors.torch import load_file, save_file
from transformers import AutoModelForCausalLM, DeepseekV32Config

from splash_core.checkpoint.source import CheckpointWeights
from splash_core.cli.main import main
from splash_core.profiles.checkpoint_config import CheckpointError, profile_from_checkpoint
from splash_core.profiles.checkpoint_deepseek import DEEPSEEK_V3


@pytest.fixture(scope="module")
def folders(tmp_path_factory):
    """{'v3': a transformers V3 folder, 'v32': a transformers V3.2 folder relabelled V3}."""
    root = tmp_path_factory.mktemp("strict")
    hf.write("v3-rotate-half", root / "v3")
    spec = {k: v for k, v in {**hf.BASE, **hf.VARIANTS["v3-rotate-half"]}.items()
            if k not in ("arch", "rope_interleave")}
    v32 = DeepseekV32Config(**spec, index_n_heads=2, index_head_dim=16, index_topk=4)
    model = AutoModelForCausalLM.from_config(v32)
    model.save_pretrained(root / "v32")
    cfg = json.loads((root / "v32" / "config.json").read_text())
    (root / "v32" / "config.json").write_text(json.dumps({**cfg, "architectures": ["DeepseekV3ForCausalLM"],
                                                          "model_type": "deepseek_v3"}))
    return {"v3": root / "v3", "v32": root / "v32"}


def _copy(src, dst, *, config=None, drop_keys=(), tensors=None):
    shutil.copytree(src, dst)
    cfg = {k: v for k, v in json.loads((dst / "config.json").read_text()).items() if k not in drop_keys}
    (dst / "config.json").write_text(json.dumps({**cfg, **(config or {})}))
    if tensors:
        stored = load_file(dst / "model.safetensors")
        save_file({**stored, **tensors}, str(dst / "model.safetensors"))
    return dst


def _refused_in_one_line(folder, capsys) -> str:
    assert main(["generate", "--model", str(folder), "--prompt-ids", "1,2,3", "--max-new-tokens", "2"]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and err.startswith("splash generate: error: "), err
    return err


def test_a_relabelled_v32_folder_is_refused_naming_its_index_keys(folders, capsys):
    with pytest.raises(CheckpointError, match=r"index_head_dim: config key not supported"):
        profile_from_checkpoint(folders["v32"])
    assert "index_head_dim" in _refused_in_one_line(folders["v32"], capsys)


def test_its_indexer_tensors_are_refused_once_the_keys_are_stripped(folders, tmp_path, capsys):
    cfg = json.loads((folders["v32"] / "config.json").read_text())
    folder = _copy(folders["v32"], tmp_path / "stripped", drop_keys=set(cfg) - DEEPSEEK_V3.known_keys())
    profile_from_checkpoint(folder)  # the config alone now reads as V3 ...
    with pytest.raises(CheckpointError, match=r"model\.layers\.0\.self_attn\.indexer\.\S+: tensor SPLASH does not map"):
        CheckpointWeights(folder)  # ... but the tensors give it away
    assert "self_attn.indexer." in _refused_in_one_line(folder, capsys)


def test_an_unknown_tensor_or_key_is_refused_by_name_and_a_v3_folder_loads(folders, tmp_path, capsys):
    CheckpointWeights(folders["v3"])  # the clean folder: every key and tensor mapped
    odd = _copy(folders["v3"], tmp_path / "odd", tensors={"model.layers.1.self_attn.q_norm.weight": torch.ones(4)})
    err = _refused_in_one_line(odd, capsys)
    assert "model.layers.1.self_attn.q_norm.weight: tensor SPLASH does not map" in err
    key = _copy(folders["v3"], tmp_path / "key", config={"sliding_window": 128})
    assert "sliding_window: config key not supported" in _refused_in_one_line(key, capsys)
    heads = _copy(folders["v3"], tmp_path / "heads", config={"num_key_value_heads": 2})
    assert "num_key_value_heads: MLA expands keys" in _refused_in_one_line(heads, capsys)


def test_mtp_layers_are_ignored_and_said_so_but_nothing_past_them(folders, tmp_path):
    mtp = {f"model.layers.2.{n}": torch.ones(64) for n in ("enorm.weight", "hnorm.weight")}
    refused = _copy(folders["v3"], tmp_path / "no-mtp", config={"num_nextn_predict_layers": 0}, tensors=mtp)
    with pytest.raises(CheckpointError, match=r"model\.layers\.2\.enorm\.weight: tensor SPLASH does not map"):
        CheckpointWeights(refused)  # a third layer where the config declares no MTP layer is unknown
    folder = _copy(folders["v3"], tmp_path / "mtp", config={"num_nextn_predict_layers": 1}, tensors=mtp)
    weights = CheckpointWeights(folder)
    assert "MTP layers 2..2 (num_nextn_predict_layers) ignored" in weights.profile.notes
    beyond = _copy(folders["v3"], tmp_path / "beyond", config={"num_nextn_predict_layers": 1},
                   tensors={**mtp, "model.layers.3.enorm.weight": torch.ones(64)})
    with pytest.raises(CheckpointError, match=r"model\.layers\.3\.enorm\.weight"):
        CheckpointWeights(beyond)
