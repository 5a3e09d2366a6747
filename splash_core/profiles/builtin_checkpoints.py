"""The tiny checkpoints SPLASH writes itself, as data: a DeepSeek-V3-format model small enough for
the CPU main job (deployment ``cpu-tiny``: ``model: {builtin: tiny-deepseek-v3}``).

Each is a ``config.json`` (``DeepseekV3ForCausalLM``: MLA, a dense first layer then routed experts
with grouped top-k and a shared expert, YaRN ``rope_scaling``, interleaved rotary), the seed its
weights are drawn from, and the vocabulary of the tokenizer trained on :data:`CORPUS`. A profile is
derived from the config alone; :mod:`splash_core.checkpoint.tiny` writes the files on first use,
into ``~/.cache/splash/checkpoints/NAME-DIGEST`` (``$XDG_CACHE_HOME`` is honoured; the digest
covers everything that determines the files) or into a folder the deployment names.
"""

from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path

WRITER_VERSION = 1
BOS, EOS, USER, ASSISTANT = "<｜begin▁of▁sentence｜>", "<｜end▁of▁sentence｜>", "<｜User｜>", "<｜Assistant｜>"
CHAT_TEMPLATE = (
    "{{ bos_token }}{% for m in messages %}{% if m['role'] == 'system' %}{{ m['content'] }}"
    "{% elif m['role'] == 'user' %}" + USER + "{{ m['content'] }}"
    "{% else %}" + ASSISTANT + "{{ m['content'] }}" + EOS + "{% endif %}{% endfor %}"
    "{% if add_generation_prompt %}" + ASSISTANT + "{% endif %}")
CORPUS = (
    "SPLASH switches the parallel layout of multi-head latent attention while requests keep running. "
    "Tensor parallelism shards the heads; context parallelism splits each history by position; "
    "data-parallel attention keeps every request on its owner; DOP shards the projections and sends "
    "query rows to their owners. Hello! hello, world. Once upon a time a model generated tokens one "
    "at a time, and the scheduler asked which layout makes the next step fastest. "
    "The quick brown fox jumps over the lazy dog. 0 1 2 3 4 5 6 7 8 9 10 100 1000. "
    "What is the capital of France? Paris. Why is the sky blue? Because of Rayleigh scattering.")

BUILTINS = {
    "tiny-deepseek-v3": {
        "seed": 21,
        "tokenizer_vocab": 384,
        "config": {
            "architectures": ["DeepseekV3ForCausalLM"], "model_type": "deepseek_v3", "torch_dtype": "bfloat16",
            "vocab_size": 384, "hidden_size": 96, "intermediate_size": 192, "moe_intermediate_size": 32,
            "num_hidden_layers": 4, "num_attention_heads": 12, "num_key_value_heads": 12,
            "q_lora_rank": 32, "kv_lora_rank": 32, "qk_nope_head_dim": 16, "qk_rope_head_dim": 8, "v_head_dim": 16,
            "n_routed_experts": 8, "num_experts_per_tok": 2, "n_shared_experts": 1, "first_k_dense_replace": 1,
            "moe_layer_freq": 1, "n_group": 4, "topk_group": 2, "topk_method": "noaux_tc", "scoring_func": "sigmoid",
            "norm_topk_prob": True, "routed_scaling_factor": 2.5, "hidden_act": "silu", "attention_bias": False,
            "rms_norm_eps": 1e-6, "rope_theta": 10000.0, "rope_interleave": True, "max_position_embeddings": 512,
            "rope_scaling": {"type": "yarn", "factor": 4.0, "original_max_position_embeddings": 128,
                             "beta_fast": 32, "beta_slow": 1, "mscale": 1.0, "mscale_all_dim": 1.0},
            "bos_token_id": 0, "eos_token_id": 1, "tie_word_embeddings": False, "num_nextn_predict_layers": 0,
        },
    },
}


def cache_root() -> Path:
    return Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "splash" / "checkpoints"


def digest(name: str) -> str:
    spec = json.dumps({"v": WRITER_VERSION, "spec": BUILTINS[name], "corpus": CORPUS, "chat": CHAT_TEMPLATE},
                      sort_keys=True)
    return hashlib.sha256(spec.encode()).hexdigest()[:12]


def builtin_folder(name: str, folder: str | Path | None = None) -> Path:
    """Where builtin checkpoint ``name`` lives: ``folder``, or its digest-named folder in the cache."""
    if name not in BUILTINS:
        raise ValueError(f"unknown builtin checkpoint (known: {', '.join(BUILTINS)})")
    return Path(folder).expanduser() if folder else cache_root() / f"{name}-{digest(name)}"
