"""A checkpoint folder's ``config.json`` as a model profile (no hand-written YAML for a checkpoint).

The family named by ``architectures`` (:data:`~splash_core.profiles.checkpoint_families.FAMILIES`)
supplies transformers' defaults, the keys it reads beyond the common ones and the keys it knows do
not change outputs; any other key is refused with a :class:`CheckpointError` naming it, as is a key
whose value SPLASH cannot honour. Both spellings of the rotary settings are read: ``rope_theta`` +
``rope_scaling`` (DeepSeek's files, transformers 4) and ``rope_parameters`` (transformers 5).
Semantics that differ between families are resolved by the family's ``normalize``, so the runtime
sees one definition.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from .builtin_checkpoints import BUILTINS, builtin_folder
from .checkpoint_families import FAMILIES
from .checkpoint_family import CheckpointError, CheckpointFamily
from .model import ModelProfile
from .schema import ProfileError, build, convert

_REQUIRED = ("hidden_size", "num_hidden_layers", "num_attention_heads", "kv_lora_rank", "qk_nope_head_dim",
             "qk_rope_head_dim", "v_head_dim", "vocab_size", "intermediate_size")
# keys whose only supported value is the one given (None: the key may be absent or null)
_MUST_BE = {"hidden_act": "silu", "attention_bias": False, "mlp_bias": False, "moe_layer_freq": 1,
            "pretraining_tp": 1}
_YARN_KEYS = {"type", "rope_type", "rope_theta", "factor", "original_max_position_embeddings", "beta_fast",
              "beta_slow", "mscale", "mscale_all_dim", "truncate"}
_DTYPES = {"float32": "fp32", "bfloat16": "bf16", "float16": "fp16"}


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


def family(config: dict, file: str) -> CheckpointFamily:
    """The family that reads ``config``, from ``architectures`` (else ``model_type``)."""
    archs = config.get("architectures") or []
    known = [FAMILIES[a] for a in archs if a in FAMILIES]
    if known:
        return known[0]
    by_type = {f.kind: f for f in FAMILIES.values()}
    if not archs and config.get("model_type") in by_type:
        return by_type[config["model_type"]]
    raise CheckpointError(file, "architectures", f"SPLASH serves {', '.join(FAMILIES)}",
                          archs or config.get("model_type"))


def profile_fields(folder: str | Path, raw: dict | None = None) -> tuple[dict, dict]:
    """(the model profile as a mapping of its fields, generation facts: bos/eos ids, tied
    embeddings, quantization, ignored MTP layers) derived from ``folder``'s config.json (or
    ``raw``, the config of a folder not written yet)."""
    path, raw = read_config(folder) if raw is None else (Path(folder).expanduser() / "config.json", raw)
    file = str(path)
    fam = family(raw, file)
    _refuse_unknown_keys(raw, fam, file)
    c = _with_defaults(raw, fam)
    _check_supported(c, raw, file)
    c = fam.normalize(c, file) if fam.normalize else c
    fields: dict[str, Any] = {
        "name": Path(folder).expanduser().resolve().name,
        "source": f"{file} ({fam.kind})",
        "hidden_size": c["hidden_size"],
        "vocab_size": c["vocab_size"],
        "intermediate_size": c["intermediate_size"],
        "layers": {"count": c["num_hidden_layers"], "pattern": ["mla"]},
        "mla": {"heads": c["num_attention_heads"], "q_lora_rank": c.get("q_lora_rank") or 0,
                "kv_lora_rank": c["kv_lora_rank"], "qk_nope_head_dim": c["qk_nope_head_dim"],
                "qk_rope_head_dim": c["qk_rope_head_dim"], "v_head_dim": c["v_head_dim"]},
        "rms_norm_eps": float(c["rms_norm_eps"]),
        "rope_interleave": bool(c["rope_interleave"]),
        "checkpoint": str(Path(folder).expanduser().resolve()),
    }
    fields.update(_rope(raw, file))
    moe = _moe(c, file)
    if moe:
        fields["moe"] = moe
    if fam.extra_fields:
        fields.update(fam.extra_fields(c, file))
    quant = _quantization(raw, file)
    dtype = _weight_dtype(raw, file)
    fields["weight_dtype"] = dtype
    if quant:
        fields["weight_scale_block"] = list(quant)
    fields["kv_cache"] = {"latent_dtype": dtype, "rope_dtype": dtype}
    facts = _generation_facts(c, fam, quant, file)
    notes = [f"weights stored as FP8 e4m3 with {quant[0]}x{quant[1]} block scales (weight_scale_inv), "
             f"dequantized to the compute format at load"] if quant else []
    if facts["mtp_layers"]:
        notes.append(f"MTP layers {facts['mtp_layers'].start}..{facts['mtp_layers'].stop - 1} "
                     f"(num_nextn_predict_layers) ignored: they feed nothing back into the model's outputs")
    if notes:
        fields["notes"] = "; ".join(notes)
    return fields, facts


def _refuse_unknown_keys(raw: dict, fam: CheckpointFamily, file: str) -> None:
    """A key neither read nor known to be inert may change outputs: refuse it by name."""
    unknown = sorted(set(raw) - fam.known_keys())
    if unknown:
        raise CheckpointError(file, unknown[0], f"config key not supported by SPLASH's {fam.kind} reader "
                              f"(refused rather than ignored: it may change outputs)", raw[unknown[0]])


def _with_defaults(raw: dict, fam: CheckpointFamily) -> dict:
    """``raw`` over transformers' defaults for the family."""
    # a null takes transformers' default, except where null means something (no Q-LoRA, no groups, no id)
    meaningful_null = {"q_lora_rank", "n_group", "topk_group", "bos_token_id", "eos_token_id", "n_routed_experts"}
    return {**fam.defaults, **{k: v for k, v in raw.items() if v is not None or k in meaningful_null}}


def _check_supported(c: dict, raw: dict, file: str) -> None:
    """Refuse a config missing a required integer or setting a key SPLASH cannot honour."""
    for key in _REQUIRED:
        if not isinstance(c.get(key), int) or isinstance(c.get(key), bool):
            raise CheckpointError(file, key, "required integer is missing or not an integer", c.get(key))
    for key, want in _MUST_BE.items():
        if key in raw and raw[key] is not None and raw[key] != want:
            raise CheckpointError(file, key, f"not supported: SPLASH runs {key} = {json.dumps(want)}", raw[key])
    kv_heads = raw.get("num_key_value_heads")
    if kv_heads is not None and kv_heads != c["num_attention_heads"]:
        raise CheckpointError(file, "num_key_value_heads", "MLA expands keys per query head: must equal "
                              "num_attention_heads", kv_heads)


def _weight_dtype(raw: dict, file: str) -> str:
    dtype = _DTYPES.get(raw.get("torch_dtype") or raw.get("dtype") or "bfloat16")
    if dtype is None:
        raise CheckpointError(file, "torch_dtype", f"expected one of {', '.join(_DTYPES)}",
                              raw.get("torch_dtype") or raw.get("dtype"))
    return dtype


def _generation_facts(c: dict, fam: CheckpointFamily, quant: tuple[int, int] | None, file: str) -> dict:
    eos = c.get("eos_token_id")
    layers, mtp = c["num_hidden_layers"], c.get("num_nextn_predict_layers") or 0
    if not isinstance(mtp, int) or isinstance(mtp, bool) or mtp < 0:
        raise CheckpointError(file, "num_nextn_predict_layers", "expected a count of MTP layers", mtp)
    return {"family": fam.kind, "bos_token_id": c.get("bos_token_id"),
            "eos_token_ids": tuple(eos if isinstance(eos, list) else [] if eos is None else [eos]),
            "tie_word_embeddings": bool(c.get("tie_word_embeddings")), "fp8_block": quant, "config": file,
            "mtp_layers": range(layers, layers + mtp), "inert_tensors": fam.inert_tensors,
            "stored_name": fam.stored_name or str}


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


def _moe(c: dict, file: str) -> dict | None:
    experts = c.get("n_routed_experts")
    if not experts:
        return None
    if c.get("num_experts_per_tok") is None:
        raise CheckpointError(file, "num_experts_per_tok", "required with n_routed_experts")
    norm = bool(c["norm_topk_prob"])
    scale = float(c["routed_scaling_factor"])
    return {"n_routed_experts": experts, "num_experts_per_tok": c["num_experts_per_tok"],
            "moe_intermediate_size": c["moe_intermediate_size"], "n_shared_experts": c.get("n_shared_experts") or 0,
            "first_k_dense_replace": min(c.get("first_k_dense_replace") or 0, c["num_hidden_layers"]),
            "scoring_func": c["scoring_func"], "topk_method": c["topk_method"],
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
