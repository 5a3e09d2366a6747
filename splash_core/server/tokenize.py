"""vLLM's ``/tokenize`` and ``/detokenize``: a prompt (or chat messages, through the chat
template) to token ids, and token ids back to text, with the tokenizer the server uses."""

from __future__ import annotations

from .bodies import DetokenizeBody, TokenizeBody
from .protocol import Served, bad, check_model, render_chat, validated


def tokenize(body: dict, served: Served) -> dict:
    """``{"tokens", "count", "max_model_len"}`` of a ``prompt`` or of chat ``messages``."""
    b = validated(TokenizeBody, body)
    check_model(b.model, served)
    if (b.prompt is None) == (b.messages is None):
        raise bad("prompt", "give exactly one of prompt or messages",
                  "missing_required_parameter" if b.prompt is None else None)
    if served.tokenizer is None:
        raise bad("prompt", f"model {served.model!r} has no tokenizer")
    if b.prompt is not None:
        ids = served.tokenizer.encode(b.prompt, add_special_tokens=b.add_special_tokens is not False)
    else:
        text = render_chat(b.messages, served, b.add_generation_prompt, b.chat_template_kwargs)
        ids = served.tokenizer.encode(text, add_special_tokens=bool(b.add_special_tokens))
    return {"tokens": ids, "count": len(ids), "max_model_len": served.context_length}


def detokenize(body: dict, served: Served) -> dict:
    """``{"prompt"}``: the text of ``tokens`` (special tokens included, as vLLM decodes them)."""
    b = validated(DetokenizeBody, body)
    check_model(b.model, served)
    if served.tokenizer is None:
        raise bad("tokens", f"model {served.model!r} has no tokenizer")
    wrong = [t for t in b.tokens if not 0 <= t < served.vocab_size]
    if wrong:
        raise bad("tokens", f"token ids must be in [0, {served.vocab_size}) (got {wrong[:3]})")
    return {"prompt": served.tokenizer.decode(b.tokens, skip_special_tokens=False)}
