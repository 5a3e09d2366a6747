"""Writing the tiny checkpoints SPLASH ships as data (:mod:`splash_core.profiles.builtin_checkpoints`):
the CPU main job's model (deployment ``cpu-tiny``: ``model: {builtin: tiny-deepseek-v3}``), written
on first use.

A folder as Hugging Face ships one: ``config.json``, ``model.safetensors`` (BF16, DeepSeek's tensor
names, weights drawn from a seed at unit scale), and a byte-level BPE tokenizer trained by the
``tokenizers`` library on a fixed text (``tokenizer.json``, ``tokenizer_config.json`` with a chat
template, ``generation_config.json``). A folder is written whole into a temporary sibling and
renamed, so ranks that start together never see half of one. A profile that names a builtin
checkpoint points at its folder before it is written; :func:`ensure_written` writes it where a
reader is about to open its files.
"""

from __future__ import annotations

import json
import os
import shutil
import tempfile
from pathlib import Path

from ..profiles.builtin_checkpoints import ASSISTANT, BOS, BUILTINS, CHAT_TEMPLATE, CORPUS, EOS, USER, builtin_folder


def ensure(name: str, folder: str | Path | None = None) -> str:
    """The folder of builtin checkpoint ``name``, written first if it is not there yet."""
    target = builtin_folder(name, folder)
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


def ensure_written(profile) -> str | None:
    """The checkpoint folder of model profile ``profile`` (None: it has none), written first when
    it is a builtin one not written yet: what every reader of a checkpoint's files calls."""
    if profile.builtin:
        ensure(profile.builtin, profile.checkpoint)
    return profile.checkpoint or None


def write(name: str, folder: Path) -> None:
    """Write builtin checkpoint ``name``'s files into ``folder``."""
    import torch
    from safetensors.torch import save_file

    from ..model.weights import SeededWeights, tensor_shapes
    from ..profiles.checkpoint_config import profile_from_checkpoint

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
