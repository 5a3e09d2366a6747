"""Tiny checkpoints in DeepSeek-V3's real format that SPLASH writes itself, deterministically, on
first use: the CPU main job's model (deployment ``cpu-tiny``: ``model: {builtin: tiny-deepseek-v3}``).

A folder as Hugging Face ships one: ``config.json`` (``DeepseekV3ForCausalLM``: MLA, a dense
first layer then routed experts with grouped top-k and a shared expert, YaRN ``rope_scaling``,
interleaved rotary), ``model.safetensors`` (BF16, DeepSeek's tensor names, weights drawn from a
seed at unit scale), and a byte-level BPE tokenizer trained by the ``tokenizers`` library on a
fixed text (``tokenizer.json``, ``tokenizer_config.json`` with a chat template,
``generation_config.json``). It is written into ``~/.cache/splash/checkpoints/NAME-DIGEST``
(``$XDG_CACHE_HOME`` is honoured), the digest covering everything that determines the files, or
into a folder the deployment names; a folder is written whole into a temporary sibling and
renamed, so ranks that start together never see half of one.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import tempfile
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


def ensure(name: str, folder: str | Path | None = None) -> str:
    """The folder of builtin checkpoint ``name``, written first if it is not there yet."""
    if name not in BUILTINS:
        raise ValueError(f"unknown builtin checkpoint (known: {', '.join(BUILTINS)})")
    target = Path(folder).expanduser() if folder else cache_root() / f"{name}-{digest(name)}"
    if (target / "config.json").is_file():
        return str(target)
    target.parent.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=f".{target.name}-", dir=target.parent))
    try:
        write(name, staging)
        os.rename(staging, target)
    except OSError:
        if not (target / "config.json").is_file():  # not a rank that lost the race to another
            raise
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    return str(target)


def write(name: str, folder: Path) -> None:
    """Write builtin checkpoint ``name``'s files into ``folder``."""
    import torch
    from safetensors.torch import save_file

    from ..runtime.weights import SeededWeights, tensor_shapes
    from .config import profile_from_checkpoint

    spec = BUILTINS[name]
    (folder / "config.json").write_text(json.dumps(spec["config"], indent=2, sort_keys=True) + "\n")
    profile = profile_from_checkpoint(folder)
    seeded = SeededWeights(spec["seed"])
    tensors = {}
    for tensor, shape in tensor_shapes(profile).items():
        t = seeded.get(tensor, shape)
        if tensor.endswith("e_score_correction_bias"):
            t = 0.1 * t  # a bias of the scale real routers learn, small beside the sigmoid scores
        tensors[tensor] = t.to(torch.bfloat16).contiguous()
    save_file(tensors, str(folder / "model.safetensors"), metadata={"format": "pt"})
    write_tokenizer(folder, spec["tokenizer_vocab"])
    (folder / "generation_config.json").write_text(json.dumps(
        {"bos_token_id": spec["config"]["bos_token_id"], "eos_token_id": spec["config"]["eos_token_id"]}, indent=2) + "\n")


def write_tokenizer(folder: Path, vocab: int) -> None:
    """A byte-level BPE of ``vocab`` tokens trained on :data:`CORPUS`, DeepSeek's special tokens first."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=vocab, special_tokens=[BOS, EOS, USER, ASSISTANT],
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False)
    tok.train_from_iterator([CORPUS], trainer)
    tok.post_processor = processors.TemplateProcessing(single=f"{BOS} $A", special_tokens=[(BOS, 0)])
    tok.save(str(folder / "tokenizer.json"))
    (folder / "tokenizer_config.json").write_text(json.dumps({
        "tokenizer_class": "PreTrainedTokenizerFast", "bos_token": BOS, "eos_token": EOS, "add_bos_token": True,
        "model_max_length": 512, "chat_template": CHAT_TEMPLATE}, indent=2) + "\n")
