"""Bad profiles are rejected with ``file: key.path: reason (got X)``, by the loader and by the
CLI (exit code 2, one line, no traceback); every shipped profile loads."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from splash_core.cli.main import main
from splash_core.profiles import ProfileError, available, kinds, load, load_file
from splash_core.profiles.loader import builtin_root

SHIPPED = builtin_root()
MODEL = """\
kind: model
name: broken
hidden_size: 64
layers: {count: 2, pattern: [mla]}
mla: {heads: 4, q_lora_rank: 8, kv_lora_rank: 8, qk_nope_head_dim: 4, qk_rope_head_dim: 4, v_head_dim: 4}
"""
DEPLOYMENT = """\
kind: deployment
name: broken
hardware: cpu
model: tiny-mla
T: 2
memory_fraction: 0.5
"""
HARDWARE = (SHIPPED / "hardware" / "cpu.yaml").read_text()

# (kind, text, key path, reason, shown value) per documented failure
BAD = {
    "unknown key": ("model", MODEL.replace("hidden_size", "hiden_size"), "hiden_size", "unknown key", None),
    "wrong type": ("model", MODEL.replace("hidden_size: 64", "hidden_size: big"), "hidden_size",
                   "expected an integer", "(got 'big')"),
    "T not dividing heads": ("deployment", DEPLOYMENT.replace("T: 2", "T: 5"), "T",
                             "must divide the model's 12 MLA heads", "(got 5)"),
    "memory fraction above 1": ("deployment", DEPLOYMENT.replace("0.5", "1.5"), "memory_fraction",
                                "must be in (0, 1]", "(got 1.5)"),
    "memory fraction of 0": ("deployment", DEPLOYMENT.replace("0.5", "0"), "memory_fraction",
                             "must be in (0, 1]", "(got 0)"),
    "unknown layer kind": ("model", MODEL.replace("pattern: [mla]", "pattern: [mla, lstm]"),
                           "layers.pattern[1]", "must be one of mla, kda", "(got 'lstm')"),
    "negative bandwidth": ("hardware", re.sub(r"all_gather_gbps: \{value: [0-9.]+", "all_gather_gbps: {value: -2.0", HARDWARE),
                           "all_gather_gbps.value", "must be >= 0", "(got -2.0)"),
    "broken YAML": ("model", MODEL.replace("layers: {count: 2", "layers: {count: [2"), "(yaml)",
                    "not valid YAML at line 4", None),
}


def write(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "bad.yaml"
    path.write_text(text)
    return path


@pytest.mark.parametrize("case", list(BAD))
def test_loader_names_file_key_and_reason(tmp_path, case):
    kind, text, key, reason, got = BAD[case]
    path = write(tmp_path, text)
    with pytest.raises(ProfileError) as info:
        load_file(kind, path)
    message = str(info.value)
    assert message.startswith(f"{path}: {key}: {reason}"), message
    if got:
        assert message.endswith(got), message


@pytest.mark.parametrize("case", list(BAD))
def test_cli_check_exits_2_with_one_line(tmp_path, capsys, case):
    kind, text, key, reason, _ = BAD[case]
    path = write(tmp_path, text)
    assert main(["profiles", "check", str(path)]) == 2
    captured = capsys.readouterr()
    lines = captured.err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith(f"{path}: {key}: {reason}"), captured.err
    assert "Traceback" not in captured.err + captured.out


def test_commands_that_load_a_bad_profile_exit_2(tmp_path, capsys):
    path = write(tmp_path, BAD["unknown layer kind"][1])
    assert main(["weights", "--model", str(path), "--T", "2"]) == 2
    assert f"splash weights: error: {path}: layers.pattern[1]" in capsys.readouterr().err


def test_check_reports_every_file_and_a_missing_one(tmp_path, capsys):
    good = SHIPPED / "models" / "tiny-mla.yaml"
    bad = write(tmp_path, BAD["wrong type"][1])
    assert main(["profiles", "check", str(good), str(bad), str(tmp_path / "nope.yaml"), "--json"]) == 2
    results = json.loads(capsys.readouterr().out)
    assert [r["ok"] for r in results] == [True, False, False]
    assert results[0]["kind"] == "model" and results[2]["error"] == f"{tmp_path / 'nope.yaml'}: (file): the file does not exist"


def test_check_needs_a_kind(tmp_path, capsys):
    path = write(tmp_path, MODEL.replace("kind: model\n", ""))
    assert main(["profiles", "check", str(path)]) == 2
    assert f"{path}: kind: cannot tell the profile kind" in capsys.readouterr().err


def test_every_shipped_profile_checks(capsys):
    files = sorted(str(p) for p in SHIPPED.glob("*/*.yaml"))
    assert main(["profiles", "check", *files]) == 0
    assert capsys.readouterr().out.count("ok  ") == len(files)


def test_list_and_show(capsys):
    assert main(["profiles", "--json"]) == 0
    listing = json.loads(capsys.readouterr().out)["profiles"]
    assert set(listing) == set(kinds())
    assert "deepseek-v3" in listing["model"] and listing["model"] == available("model")
    assert main(["profiles", "show", "model", "deepseek-v3", "--json"]) == 0
    shown = json.loads(capsys.readouterr().out)
    assert shown["kind"] == "model" and shown["mla"]["heads"] == 128
    assert main(["profiles", "show", "hardware", "h200-paper"]) == 0
    out = capsys.readouterr().out
    # provenance travels with every number: paper figures are labelled as such
    assert "all_gather_gbps" in out and "(paper: Figure 11b" in out
    assert main(["profiles", "show", "gizmo", "x"]) == 2
    assert "unknown profile kind 'gizmo'" in capsys.readouterr().err
    assert load("model", "deepseek-v3").name == "deepseek-v3"
