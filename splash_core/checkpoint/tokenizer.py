"""A checkpoint's tokenizer: ``tokenizer.json`` through the ``tokenizers`` library, with what
``tokenizer_config.json`` and ``generation_config.json`` add (BOS, end-of-sequence ids, the chat
template), as transformers' fast tokenizers read them. The chat template is rendered by jinja2
in a sandbox configured as transformers configures it (trimmed blocks, loop controls,
``raise_exception``), so a template renders here as it does in transformers."""

from __future__ import annotations

import json
from pathlib import Path

from ..profiles.checkpoint_config import CheckpointError, read_config


def _json(path: Path) -> dict:
    if not path.is_file():
        return {}
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError) as exc:
        raise CheckpointError(str(path), "(json)", f"cannot read: {exc}") from None
    return data if isinstance(data, dict) else {}


def _token(value) -> str | None:
    """A special token as tokenizer_config.json writes it (a string or {"content": ...})."""
    return value.get("content") if isinstance(value, dict) else value


class Tokenizer:
    """Text <-> token ids for one checkpoint folder."""

    def __init__(self, folder: str | Path):
        from tokenizers import Tokenizer as Fast

        self.folder = Path(folder).expanduser()
        path = self.folder / "tokenizer.json"
        if not path.is_file():
            raise CheckpointError(str(self.folder), "tokenizer.json", "missing: text prompts need the checkpoint's "
                                  "tokenizer (or pass token ids)")
        try:
            self.fast = Fast.from_file(str(path))
        except Exception as exc:  # the library raises its own exception type
            raise CheckpointError(str(path), "(tokenizer)", f"cannot load: {exc}") from None
        self.config = _json(self.folder / "tokenizer_config.json")
        generation = _json(self.folder / "generation_config.json")
        _, model_config = read_config(self.folder)
        bos = _token(self.config.get("bos_token"))
        self.bos_token, self.eos_token = bos, _token(self.config.get("eos_token"))
        self.bos_token_id = self.fast.token_to_id(bos) if bos else model_config.get("bos_token_id")
        eos = generation.get("eos_token_id", model_config.get("eos_token_id"))
        if eos is None and _token(self.config.get("eos_token")):
            eos = self.fast.token_to_id(_token(self.config["eos_token"]))
        self.eos_token_ids: tuple[int, ...] = tuple(eos if isinstance(eos, list) else [] if eos is None else [eos])
        self.chat_template: str | None = self.config.get("chat_template")

    @property
    def vocab_size(self) -> int:
        return self.fast.get_vocab_size(with_added_tokens=True)

    def encode(self, text: str, add_special_tokens: bool = True) -> list[int]:
        """Token ids of ``text``, with the checkpoint's special tokens (BOS where it asks for one)
        unless ``add_special_tokens`` is False (a rendered chat template holds them already)."""
        ids = self.fast.encode(text, add_special_tokens=add_special_tokens).ids
        if (add_special_tokens and self.config.get("add_bos_token") and self.bos_token_id is not None
                and ids[:1] != [self.bos_token_id]):
            ids = [self.bos_token_id] + ids
        return ids

    def render_chat(self, messages: list[dict], add_generation_prompt: bool = True) -> str:
        """``messages`` ([{role, content}]) through the chat template, as text."""
        if not self.chat_template:
            raise CheckpointError(str(self.folder), "tokenizer_config.json: chat_template", "missing")
        from jinja2.ext import loopcontrols
        from jinja2.sandbox import ImmutableSandboxedEnvironment

        def raise_exception(message):
            raise ValueError(f"chat template: {message}")

        env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True, extensions=[loopcontrols])
        env.globals["raise_exception"] = raise_exception
        return env.from_string(self.chat_template).render(
            messages=messages, add_generation_prompt=add_generation_prompt, bos_token=self.bos_token or "",
            eos_token=self.eos_token or "")

    def decode(self, ids, skip_special_tokens: bool = True) -> str:
        return self.fast.decode(list(ids), skip_special_tokens=skip_special_tokens)
