"""A checkpoint's tokenizer: ``tokenizer.json`` through the ``tokenizers`` library, with what
``tokenizer_config.json`` and ``generation_config.json`` add (BOS, end-of-sequence ids, the chat
template), as transformers' fast tokenizers read them. The chat template is the first of: one given
(``splash serve --chat-template FILE``), ``chat_template.jinja`` beside the tokenizer (where
transformers 5 writes it), ``tokenizer_config.json``'s ``chat_template`` (its ``default`` where it
holds named templates). It is rendered by jinja2 in a sandbox configured as transformers configures
it (trimmed blocks, loop controls, ``raise_exception``, ``strftime_now``, its ``tojson`` and
``{% generation %}`` blocks), so a template renders here as it does in transformers."""

from __future__ import annotations

import datetime
import json
from pathlib import Path

from ..profiles.checkpoint_config import CheckpointError, optional_json_object, read_config


def _token(value) -> str | None:
    """A special token as tokenizer_config.json writes it (a string or {"content": ...})."""
    return value.get("content") if isinstance(value, dict) else value


class Tokenizer:
    """Text <-> token ids for one checkpoint folder."""

    def __init__(self, folder: str | Path, chat_template: str | None = None, chat_template_source: str = ""):
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
        self.config = optional_json_object(self.folder / "tokenizer_config.json")
        generation = optional_json_object(self.folder / "generation_config.json")
        _, model_config = read_config(self.folder)
        bos = _token(self.config.get("bos_token"))
        self.bos_token, self.eos_token = bos, _token(self.config.get("eos_token"))
        self.bos_token_id = self.fast.token_to_id(bos) if bos else model_config.get("bos_token_id")
        eos = generation.get("eos_token_id", model_config.get("eos_token_id"))
        if eos is None and _token(self.config.get("eos_token")):
            eos = self.fast.token_to_id(_token(self.config["eos_token"]))
        self.eos_token_ids: tuple[int, ...] = tuple(eos if isinstance(eos, list) else [] if eos is None else [eos])
        self.chat_template, self.chat_template_source = _chat_template(self.folder, self.config, chat_template,
                                                                       chat_template_source)
        self._template = _compile(self.chat_template, self.chat_template_source) if self.chat_template else None

    @property
    def vocab_size(self) -> int:
        return self.fast.get_vocab_size(with_added_tokens=True)

    def encode(self, text: str, add_special_tokens: bool = True) -> list[int]:
        """Token ids of ``text``, with the checkpoint's special tokens (BOS where it asks for one)
        unless ``add_special_tokens`` is False (a rendered chat template holds them already)."""
        # encode_batch lets go of the GIL while it works (encode holds it): a server tokenizing a huge
        # prompt on a worker thread keeps answering other clients meanwhile
        ids = self.fast.encode_batch([text], add_special_tokens=add_special_tokens)[0].ids
        if (add_special_tokens and self.config.get("add_bos_token") and self.bos_token_id is not None
                and ids[:1] != [self.bos_token_id]):
            ids = [self.bos_token_id] + ids
        return ids

    def render_chat(self, messages: list[dict], /, add_generation_prompt: bool = True, **kwargs) -> str:
        """``messages`` ([{role, content}]) through the chat template, as text; ``kwargs`` are the
        template's own variables (a request's ``chat_template_kwargs``, e.g. ``enable_thinking``; they
        may replace ``bos_token``, as in transformers, never the messages)."""
        if self._template is None:
            raise CheckpointError(str(self.folder), "chat_template.jinja", "missing (nor in tokenizer_config.json)")
        if "messages" in kwargs:
            raise ValueError("chat template: messages cannot be set as a template variable")
        variables = {"bos_token": self.bos_token or "", "eos_token": self.eos_token or "", **kwargs}
        return self._template.render(messages=messages, add_generation_prompt=add_generation_prompt, **variables)

    def decode(self, ids, skip_special_tokens: bool = True) -> str:
        return self.fast.decode(list(ids), skip_special_tokens=skip_special_tokens)


def _chat_template(folder: Path, config: dict, given: str | None, given_source: str) -> tuple[str | None, str]:
    """(the chat template, where it came from) by the precedence of the module docstring."""
    if given is not None:
        return given, given_source or "given"
    beside = folder / "chat_template.jinja"
    if beside.is_file():
        try:
            return beside.read_text(), str(beside)
        except (OSError, UnicodeDecodeError) as exc:
            raise CheckpointError(str(beside), "(template)", f"cannot read: {exc}") from None
    template = config.get("chat_template")
    if isinstance(template, list):  # named templates: [{"name", "template"}]
        named = {t.get("name"): t.get("template") for t in template if isinstance(t, dict)}
        template = named.get("default")
    source = str(folder / "tokenizer_config.json") + ": chat_template"
    return (template, source) if isinstance(template, str) and template else (None, "")


def _compile(template: str, source: str):
    """The template compiled once, as transformers compiles it; a template that does not parse is a
    start-up error naming where it came from, not a failure of every chat request."""
    from jinja2 import TemplateSyntaxError
    from jinja2.ext import loopcontrols
    from jinja2.sandbox import ImmutableSandboxedEnvironment

    def raise_exception(message):
        raise ValueError(f"chat template: {message}")

    def strftime_now(fmt: str) -> str:
        return datetime.datetime.now().strftime(fmt)

    def tojson(x, ensure_ascii=False, indent=None, separators=None, sort_keys=False):  # not HTML-escaped
        return json.dumps(x, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys)

    env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True,
                                        extensions=[loopcontrols, _generation_blocks()])
    env.globals.update(raise_exception=raise_exception, strftime_now=strftime_now)
    env.filters["tojson"] = tojson
    try:
        return env.from_string(template)
    except TemplateSyntaxError as exc:
        raise CheckpointError(source, "(template)", f"does not parse: line {exc.lineno}: {exc.message}") from None


def _generation_blocks():
    """The ``{% generation %}...{% endgeneration %}`` tag transformers adds (it marks the assistant's
    text for training masks); rendering a prompt, its body renders as it stands."""
    from jinja2 import nodes
    from jinja2.ext import Extension

    class Generation(Extension):
        tags = {"generation"}

        def parse(self, parser):
            lineno = next(parser.stream).lineno
            body = parser.parse_statements(("name:endgeneration",), drop_needle=True)
            return nodes.CallBlock(self.call_method("_body"), [], [], body).set_lineno(lineno)

        def _body(self, caller):
            return caller()

    return Generation
