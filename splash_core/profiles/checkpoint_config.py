"""A checkpoint folder's ``config.json`` as a model profile (no hand-written YAML for a checkpoint).

Reads what DeepSeek's and transformers' configs of ``DeepseekV2ForCausalLM`` and
``DeepseekV3ForCausalLM`` say (which covers Kimi-K2 and Moonlight style checkpoints), with
transformers' defaults for keys a config leaves out. Both spellings of the rotary settings are
read: ``rope_theta`` + ``rope_scaling`` (DeepSeek's files, transformers 4) and ``rope_parameters``
(transformers 5). Keys that do not change inference (``initializer_range``, ``use_cache``,
``num_nextn_predict_layers``: MTP layers are never read...) are ignored; a key whose value SPLASH
cannot honour is refused with a :class:`CheckpointError` naming it.

Semantics that differ between the two families are resolved here, so the runtime sees one
definition: V2 always rotates interleaved pairs; V2's ``norm_topk_prob`` renormalises *instead of*
scaling by ``routed_scaling_factor`` (DeepSeek-V2's code), V3's before scaling.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from .builtin_checkpoints import BUILTINS, builtin_folder
from .model import ModelProfile
from .schema import ProfileError, build, convert

ARCHITECTURES = {"DeepseekV2ForCausalLM": "deepseek_v2", "DeepseekV3ForCausalLM": "deepseek_v3"}
# transformers' defaults for the keys read below (DeepseekV2Config / DeepseekV3Config)
_DEFAULTS = {
    "deepseek_v2": dict(q_lora_rank=1536, n_group=None, topk_group=None, topk_method="greedy", scoring_func="softmax",
                        first_k_dense_replace=0, norm_topk_prob=False, routed_scaling_factor=1.0,
                        n_shared_experts=2, n_routed_experts=64, moe_intermediate_size=1407, num_experts_per_tok=None,
                        rope_interleave=True, rms_norm_eps=1e-6, tie_word_embeddings=False, bos_token_id=1,
                        eos_token_id=2),
    "deepseek_v3": dict(q_lora_rank=1536, n_group=8, topk_group=4, topk_method="noaux_tc", scoring_func="sigmoid",
                        first_k_dense_replace=3, norm_topk_prob=True, routed_scaling_factor=2.5,
                        n_shared_experts=1, n_routed_experts=256, moe_intermediate_size=2048, num_experts_per_tok=8,
                        rope_interleave=True, rms_norm_eps=1e-6, tie_word_embeddings=False, bos_token_id=0,
                        eos_token_id=1),
}
_REQUIRED = ("hidden_size", "num_hidden_layers", "num_attention_heads", "kv_lora_rank", "qk_nope_head_dim",
             "qk_rope_head_dim", "v_head_dim", "vocab_size", "intermediate_size")
# keys whose only supported value is the one given (None: the key may be absent or null)
_MUST_BE = {"hidden_act": "silu", "attention_bias": False, "mlp_bias": False, "moe_layer_freq": 1,
            "pretraining_tp": 1}
_YARN_KEYS = {"type", "rope_type", "rope_theta", "factor", "original_max_position_embeddings", "beta_fast",
              "beta_slow", "mscale", "mscale_all_dim", "truncate"}
_DTYPES = {"float32": "fp32", "bfloat16": "bf16", "float16": "fp16"}


class CheckpointError(ProfileError):
    """A checkpoint SPLASH cannot serve: names the file, the key or tensor, and why (one line)."""


def read_config(folder: str | Path) -> tuple[Path, dict]:
    """(path of config.json, its contents) of a checkpoint folder."""
    folder = Path(folder).expanduser()
    path = folder / "config.json"
    if not folder.is_dir():
        raise CheckpointError(str(folder), "(folder)", "no checkpoint folder here")
    try:
        data = json.loads(path.read_text())
    except FileNotFoundError:
        raise CheckpointError(str(folder), "config.json", "missing: a checkpoint folder holds config.json") from None
    except (OSError, ValueError) as exc:
        raise CheckpointError(str(path), "(json)", f"cannot read: {exc}") from None
    if not isinstance(data, dict):
        raise CheckpointError(str(path), "(top)", "expected a JSON object")
    return path, data


def optional_json_object(path: Path) -> dict:
    """The JSON object in ``path`` ({} where there is no such file): a checkpoint's side files
    (tokenizer_config.json, generation_config.json)."""
    if not path.is_file():
        return {}
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError) as exc:
        raise CheckpointError(str(path), "(json)", f"cannot read: {exc}") from None
    if not isinstance(data, dict):
        raise CheckpointError(str(path), "(top)", f"expected a JSON object (got {type(data).__name__})")
    return data


def family(config: dict, file: str) -> str:
    """'deepseek_v2' or 'deepseek_v3', from ``architectures`` (else ``model_type``)."""
    archs = config.get("architectures") or []
    known = [ARCHITECTURES[a] for a in archs if a in ARCHITECTURES]
    if known:
        return known[0]
    if not archs and config.get("model_type") in ARCHITECTURES.values():
        return config["model_type"]
    raise CheckpointError(file, "architectures", f"SPLASH serves {', '.join(ARCHITECTURES)}",
                          archs or config.get("model_type"))


def profile_fields(folder: str | Path, raw: dict | None = None) -> tuple[dict, dict]:
    """(the model profile as a mapping of its fields, generation facts: bos/eos ids, tied
    embeddings, quantization) derived from ``folder``'s config.json (or ``raw``, the config of a
    folder not written yet)."""
    path, raw = read_config(folder) if raw is None else (Path(folder).expanduser() / "config.json", raw)
    file = str(path)
    kind = family(raw, file)
    c = _with_defaults(raw, kind)
    _check_supported(c, raw, file)
    fields: dict[str, Any] = {
        "name": Path(folder).expanduser().resolve().name,
        "source": f"{file} ({kind})",
        "hidden_size": c["hidden_size"],
        "vocab_size": c["vocab_size"],
        "intermediate_size": c["intermediate_size"],
        "layers": {"count": c["num_hidden_layers"], "pattern": ["mla"]},
        "mla": {"heads": c["num_attention_heads"], "q_lora_rank": c.get("q_lora_rank") or 0,
                "kv_lora_rank": c["kv_lora_rank"], "qk_nope_head_dim": c["qk_nope_head_dim"],
                "qk_rope_head_dim": c["qk_rope_head_dim"], "v_head_dim": c["v_head_dim"]},
        "rms_norm_eps": float(c["rms_norm_eps"]),
        "rope_interleave": True if kind == "deepseek_v2" else bool(c["rope_interleave"]),
        "checkpoint": str(Path(folder).expanduser().resolve()),
    }
    fields.update(_rope(raw, file))
    moe = _moe(c, kind, file)
    if moe:
        fields["moe"] = moe
    quant = _quantization(raw, file)
    dtype = _weight_dtype(raw, file)
    fields["weight_dtype"] = dtype
    fields["kv_cache"] = {"latent_dtype": dtype, "rope_dtype": dtype}
    if quant:
        fields["notes"] = (f"weights stored as FP8 e4m3 with {quant[0]}x{quant[1]} block scales "
                           f"(weight_scale_inv), dequantized to the compute format at load")
    return fields, _generation_facts(c, kind, quant, file)


def _with_defaults(raw: dict, kind: str) -> dict:
    """``raw`` over transformers' defaults for ``kind``."""
    # a null takes transformers' default, except where null means something (no Q-LoRA, no groups, no id)
    meaningful_null = {"q_lora_rank", "n_group", "topk_group", "bos_token_id", "eos_token_id", "n_routed_experts"}
    return {**_DEFAULTS[kind], **{k: v for k, v in raw.items() if v is not None or k in meaningful_null}}


def _check_supported(c: dict, raw: dict, file: str) -> None:
    """Refuse a config missing a required integer or setting a key SPLASH cannot honour."""
    for key in _REQUIRED:
        if not isinstance(c.get(key), int) or isinstance(c.get(key), bool):
            raise CheckpointError(file, key, "required integer is missing or not an integer", c.get(key))
    for key, want in _MUST_BE.items():
        if key in raw and raw[key] is not None and raw[key] != want:
            raise CheckpointError(file, key, f"not supported: SPLASH runs {key} = {json.dumps(want)}", raw[key])


def _weight_dtype(raw: dict, file: str) -> str:
    dtype = _DTYPES.get(raw.get("torch_dtype") or raw.get("dtype") or "bfloat16")
    if dtype is None:
        raise CheckpointError(file, "torch_dtype", f"expected one of {', '.join(_DTYPES)}",
                              raw.get("torch_dtype") or raw.get("dtype"))
    return dtype


def _generation_facts(c: dict, kind: str, quant: tuple[int, int] | None, file: str) -> dict:
    eos = c.get("eos_token_id")
    return {"family": kind, "bos_token_id": c.get("bos_token_id"),
            "eos_token_ids": tuple(eos if isinstance(eos, list) else [] if eos is None else [eos]),
            "tie_word_embeddings": bool(c.get("tie_word_embeddings")), "fp8_block": quant, "config": file}


def _rope(raw: dict, file: str) -> dict:
    params = raw.get("rope_parameters") or {}
    scaling = raw.get("rope_scaling") or params
    where = "rope_scaling" if raw.get("rope_scaling") else "rope_parameters"
    theta = raw.get("rope_theta", params.get("rope_theta", 10000.0))
    kind = scaling.get("rope_type", scaling.get("type", "default")) if scaling else "default"
    if raw.get("partial_rotary_factor", params.get("partial_rotary_factor", 1.0)) != 1.0:
        raise CheckpointError(file, "partial_rotary_factor", "not supported (SPLASH rotates all qk_rope_head_dim channels)")
    out = {"rope_theta": float(theta)}
    if kind in (None, "default"):
        return out
    if kind != "yarn":
        raise CheckpointError(file, f"{where}.type", "SPLASH supports default and yarn rotary scaling", kind)
    unknown = sorted(set(scaling) - _YARN_KEYS)
    if unknown:
        raise CheckpointError(file, f"{where}.{unknown[0]}", "not supported in yarn scaling", scaling[unknown[0]])
    if scaling.get("truncate", True) is not True:
        raise CheckpointError(file, f"{where}.truncate", "SPLASH rounds the correction range as DeepSeek does (true)",
                              scaling["truncate"])
    factor = scaling.get("factor")
    original = scaling.get("original_max_position_embeddings", raw.get("max_position_embeddings"))
    if factor is None or original is None:
        raise CheckpointError(file, f"{where}.factor", "yarn needs factor and original_max_position_embeddings")
    out["rope_scaling"] = {"factor": float(factor), "original_max_position_embeddings": int(original),
                           **{k: float(scaling[k]) for k in ("beta_fast", "beta_slow", "mscale", "mscale_all_dim")
                              if scaling.get(k) is not None}}
    return out


def _moe(c: dict, kind: str, file: str) -> dict | None:
    experts = c.get("n_routed_experts")
    if not experts:
        return None
    if c.get("num_experts_per_tok") is None:
        raise CheckpointError(file, "num_experts_per_tok", "required with n_routed_experts")
    norm = bool(c["norm_topk_prob"])
    scale = float(c["routed_scaling_factor"])
    if kind == "deepseek_v2" and norm and c["num_experts_per_tok"] > 1:
        scale = 1.0  # DeepSeek-V2 renormalises the chosen weights instead of scaling them
    return {"n_routed_experts": experts, "num_experts_per_tok": c["num_experts_per_tok"],
            "moe_intermediate_size": c["moe_intermediate_size"], "n_shared_experts": c.get("n_shared_experts") or 0,
            "first_k_dense_replace": min(c.get("first_k_dense_replace") or 0, c["num_hidden_layers"]),
            "scoring_func": c.get("scoring_func") or _DEFAULTS[kind]["scoring_func"],
            "topk_method": c.get("topk_method") or _DEFAULTS[kind]["topk_method"],
            "n_group": c.get("n_group") or 1, "topk_group": c.get("topk_group") or 1,
            "norm_topk_prob": norm, "routed_scaling_factor": scale}


def _quantization(raw: dict, file: str) -> tuple[int, int] | None:
    """The (rows, cols) of FP8 weight blocks, or None for an unquantized checkpoint."""
    q = raw.get("quantization_config")
    if not q:
        return None
    if q.get("quant_method") != "fp8":
        raise CheckpointError(file, "quantization_config.quant_method", "SPLASH reads fp8 block-scaled checkpoints",
                              q.get("quant_method"))
    if q.get("fmt", "e4m3") != "e4m3":
        raise CheckpointError(file, "quantization_config.fmt", "SPLASH reads e4m3", q.get("fmt"))
    block = q.get("weight_block_size")
    if not (isinstance(block, list) and len(block) == 2 and all(isinstance(b, int) and b > 0 for b in block)):
        raise CheckpointError(file, "quantization_config.weight_block_size", "expected [rows, cols]", block)
    return int(block[0]), int(block[1])


def profile_from_checkpoint(folder: str | Path, overrides: dict | None = None, *, file: str | None = None,
                            path: str = "", raw: dict | None = None) -> ModelProfile:
    """The :class:`~splash_core.profiles.model.ModelProfile` of a checkpoint folder, with
    ``overrides`` (profile keys, e.g. ``kv_cache``) applied and everything validated."""
    fields, _ = profile_fields(folder, raw)
    fields.update(overrides or {})
    return build(ModelProfile, fields, file=file or fields["source"].split(" (")[0], path=path)


def profile_from_mapping(value: dict, *, file: str, path: str):
    """A deployment's ``model: {path: DIR | builtin: NAME, ...overrides}`` as a profile."""
    value = dict(value)
    folder, builtin = value.pop("path", None), value.pop("builtin", None)
    if builtin is not None:
        value.setdefault("name", builtin)
        try:
            folder = builtin_folder(builtin, folder)
        except ValueError as exc:
            raise ProfileError(file, f"{path}.builtin" if path else "builtin", str(exc), builtin) from None
        return profile_from_checkpoint(folder, {**value, "builtin": builtin}, path=path,
                                       raw=BUILTINS[builtin]["config"])
    if not isinstance(folder, str):
        raise ProfileError(file, f"{path}.path" if path else "path", "expected the path of a checkpoint folder", folder)
    elif not Path(folder).expanduser().is_absolute():
        folder = str(Path(file).parent / folder) if not file.startswith("<") else folder
    return profile_from_checkpoint(folder, value, path=path)


def model_from_yaml(value: Any, *, file: str, path: str) -> ModelProfile:
    """A deployment's ``model:`` value: a profile's name or path, a mapping of its keys, or a
    checkpoint folder, ``{path: DIR}``, or the checkpoint SPLASH writes itself, ``{builtin: NAME}``
    (optionally into ``path``), each with optional overrides of derived fields (e.g. ``kv_cache``);
    a checkpoint's profile is derived from its ``config.json``."""
    if isinstance(value, dict) and ("path" in value or "builtin" in value):
        return profile_from_mapping(value, file=file, path=path)
    return convert(ModelProfile, value, file=file, path=path)
