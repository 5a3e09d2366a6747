"""Log-probabilities in the shapes clients parse: OpenAI's legacy completions object
(``{tokens, token_logprobs, top_logprobs, text_offset}``, what lm-evaluation-harness reads for
loglikelihood tasks) and the chat object (``{content: [{token, logprob, bytes, top_logprobs}]}``).

A handle carries one :class:`~splash_core.engine.messages.TokenLogprob` per generated token and,
with ``echo``, one per prompt position (None for the first, which nothing predicts). A token is
named by its own decoding (special tokens included), as vLLM names it; each legacy
``top_logprobs`` entry maps the top k tokens and the chosen one to their logprobs.
"""

from __future__ import annotations

import math
import re

UNLIKELY = -9999.0  # what a logprob of -inf is reported as (JSON has no infinity; vLLM's value)


def _scored(handle) -> list:
    """[(token id, TokenLogprob or None)] of the echoed prompt, then of the generated tokens."""
    rows = []
    if handle.call.echo:
        rows += list(zip(handle.call.prompt_ids, handle.prompt_logprobs or [None] * len(handle.call.prompt_ids)))
    rows += [(lp.token, lp) for lp in handle.logprobs]
    return rows


def _finite(value: float) -> float:
    return value if math.isfinite(value) else UNLIKELY


def _byte_decoder() -> dict[str, int]:
    """GPT-2's byte-level alphabet (each byte as a printable character), inverted."""
    printable = [*range(ord("!"), ord("~") + 1), *range(ord("¡"), ord("¬") + 1), *range(ord("®"), ord("ÿ") + 1)]
    chars, extra = {}, 0
    for b in range(256):
        if b in printable:
            chars[chr(b)] = b
        else:
            chars[chr(256 + extra)] = b
            extra += 1
    return chars


BYTE_DECODER = _byte_decoder()


def token_bytes(tokenizer, token: int) -> tuple[str, bytes]:
    """(a token's name, its bytes). A token that is part of a character (byte-level or byte
    fallback) is named by its bytes, ``bytes:\\xe2\\x80``, as OpenAI names it: decoded, every such
    token would read as the same replacement character."""
    if tokenizer is None:
        return f"token_id:{token}", b""
    text = tokenizer.decode([token], skip_special_tokens=False)
    if "\ufffd" not in text:
        return text, text.encode()
    piece = tokenizer.fast.id_to_token(token) or ""
    fallback = re.fullmatch(r"<0x([0-9A-Fa-f]{2})>", piece)
    if fallback:
        raw = bytes([int(fallback[1], 16)])
    elif piece and all(c in BYTE_DECODER for c in piece):
        raw = bytes(BYTE_DECODER[c] for c in piece)
    else:
        return text, text.encode()
    return "bytes:" + "".join(f"\\x{b:02x}" for b in raw), raw


def _name(tokenizer, token: int) -> str:
    return token_bytes(tokenizer, token)[0]


def completion(handle, tokenizer) -> dict:
    """OpenAI's legacy ``logprobs`` of one choice; ``text_offset`` counts characters of the
    choice's ``text`` (the echoed prompt first)."""
    return _legacy(_scored(handle), tokenizer, 0)


def completion_token(handle, tokenizer, position: int, offset: int) -> dict:
    """The legacy ``logprobs`` of a stream chunk: generated token ``position``, whose text starts
    ``offset`` characters into the choice's text."""
    lp = handle.logprobs[position]
    return _legacy([(lp.token, lp)], tokenizer, offset)


def _legacy(rows: list, tokenizer, at: int) -> dict:
    tokens, values, tops, offsets = [], [], [], []
    for token, lp in rows:
        name = _name(tokenizer, token)
        tokens.append(name)
        offsets.append(at)
        at += len(name)
        values.append(None if lp is None else _finite(lp.logprob))
        if lp is None:
            tops.append(None)
            continue
        top = {_name(tokenizer, t): _finite(v) for t, v in lp.top}
        top.setdefault(name, _finite(lp.logprob))  # the chosen token, as OpenAI lists it beside the top k
        tops.append(top)
    return {"tokens": tokens, "token_logprobs": values, "top_logprobs": tops, "text_offset": offsets}


def chat(handle, tokenizer, positions: slice = slice(None)) -> dict:
    """OpenAI's chat ``logprobs`` of one choice: its generated tokens (those at ``positions``)
    and their top k."""

    def entry(token: int, value: float) -> dict:
        name, raw = token_bytes(tokenizer, token)
        return {"token": name, "logprob": _finite(value), "bytes": list(raw)}

    return {"content": [{**entry(lp.token, lp.logprob), "top_logprobs": [entry(t, v) for t, v in lp.top]}
                        for lp in handle.logprobs[positions]]}
