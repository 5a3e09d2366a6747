"""Response bodies, field for field as the APIs clients know write them: OpenAI's completions
and chat completions (whole and as stream chunks), SGLang's ``/generate`` output and its
``/model_info`` and ``/server_info``.

One response (:class:`Reply`) gathers the handles of its choices (``n`` per prompt, in index
order). A token event is ``("token", text piece, token id or None, finish reason or None)``
(:mod:`~splash_core.server.frontend`); each renderer turns one into a stream chunk (``chunk``),
and a finished reply into the whole response (``whole``). Logprobs come from each handle's
:class:`~splash_core.engine.messages.TokenLogprob` s (:mod:`~splash_core.server.logprobs`).
"""

from __future__ import annotations

import dataclasses
import time
import types
import uuid
from typing import Any

from .. import __version__
from . import logprobs


@dataclasses.dataclass
class Reply:
    """One response: its id (unique across restarts), when it was created, the handles of its
    choices in index order (``n`` per prompt) and the tokenizer that names tokens."""

    prefix: str  # cmpl, chatcmpl or gen
    handles: list
    n: int = 1
    tokenizer: Any = None
    id: str = ""
    created: int = dataclasses.field(default_factory=lambda: int(time.time()))

    def __post_init__(self):
        self.id = self.id or f"{self.prefix}-{uuid.uuid4().hex}"

    def usage(self) -> dict:
        """Each prompt's tokens once (not once per choice), every choice's output tokens."""
        prompt = sum(len(h.call.prompt_ids) for h in self.handles[::self.n])
        completion = sum(len(h.token_ids) for h in self.handles)
        return {"prompt_tokens": prompt, "completion_tokens": completion, "total_tokens": prompt + completion}

    def head(self, obj: str) -> dict:
        return {"id": self.id, "object": obj, "created": self.created, "model": self.handles[0].call.model}


def _usage_chunk(reply: Reply, obj: str) -> dict:
    return {**reply.head(obj), "choices": [], "usage": reply.usage()}


def _completion_chunk(reply: Reply, handle, event, first: bool, at: tuple[int, int]) -> dict:
    """``at``: (the event's token's position among the choice's tokens, characters sent before it)."""
    _, piece, token, reason = event
    scored = None
    if handle.call.logprobs is not None and token is not None:
        scored = logprobs.completion_token(handle, reply.tokenizer, *at)
    return {**reply.head("text_completion"), "usage": None,
            "choices": [{"index": handle.call.index, "text": piece, "logprobs": scored, "finish_reason": reason}]}


def _completion_whole(reply: Reply) -> dict:
    choices = []
    for h in reply.handles:
        prompt = _prompt_text(h, reply.tokenizer) if h.call.echo else ""
        scored = None if h.call.logprobs is None else logprobs.completion(h, reply.tokenizer)
        choices.append({"index": h.call.index, "text": prompt + h.text.text, "logprobs": scored,
                        "finish_reason": h.finish_reason})
    return {**reply.head("text_completion"), "usage": reply.usage(), "choices": choices}


def _prompt_text(handle, tokenizer) -> str:
    call = handle.call
    if call.prompt_text is not None:
        return call.prompt_text
    # special tokens included: the echoed text is what the logprobs' tokens spell
    return tokenizer.decode(call.prompt_ids, skip_special_tokens=False) if tokenizer is not None else ""


def _chat_chunk(reply: Reply, handle, event, first: bool, at: tuple[int, int]) -> dict:
    _, piece, token, reason = event
    delta = {"role": "assistant", "content": piece} if first else {"content": piece}
    scored = None
    if handle.call.logprobs is not None and token is not None:
        scored = logprobs.chat(handle, reply.tokenizer, slice(at[0], at[0] + 1))
    return {**reply.head("chat.completion.chunk"), "usage": None,
            "choices": [{"index": handle.call.index, "delta": delta, "logprobs": scored, "finish_reason": reason}]}


def _chat_whole(reply: Reply) -> dict:
    choices = []
    for h in reply.handles:
        scored = None if h.call.logprobs is None else logprobs.chat(h, reply.tokenizer)
        choices.append({"index": h.call.index, "message": {"role": "assistant", "content": h.text.text},
                        "logprobs": scored, "finish_reason": h.finish_reason})
    return {**reply.head("chat.completion"), "usage": reply.usage(), "choices": choices}


def _generate_meta(reply: Reply, handle, reason: str | None) -> dict:
    finish = None
    if reason == "length":
        finish = {"type": "length", "length": handle.call.max_new_tokens}
    elif reason == "stop":
        finish = {"type": "stop", "matched": handle.token_ids[-1] if handle.token_ids else None}
    elif reason is not None:
        finish = {"type": reason}
    usage = reply.usage()
    meta = {"id": reply.id, "prompt_tokens": usage["prompt_tokens"], "completion_tokens": usage["completion_tokens"],
            "finish_reason": finish}
    if reason is not None:
        meta["e2e_latency"] = time.monotonic() - handle.arrived
    return meta


def _generate_chunk(reply: Reply, handle, event, first: bool, at: tuple[int, int]) -> dict:
    return {"text": handle.text.text[:handle.text.sent], "output_ids": list(handle.token_ids),
            "meta_info": _generate_meta(reply, handle, event[3])}


def _generate_whole(reply: Reply) -> dict:
    handle = reply.handles[0]
    return {"text": handle.text.text, "output_ids": list(handle.token_ids),
            "meta_info": _generate_meta(reply, handle, handle.finish_reason)}


completion = types.SimpleNamespace(prefix="cmpl", chunk=_completion_chunk, whole=_completion_whole,
                                   usage_chunk=lambda r: _usage_chunk(r, "text_completion"))
chat = types.SimpleNamespace(prefix="chatcmpl", chunk=_chat_chunk, whole=_chat_whole,
                             usage_chunk=lambda r: _usage_chunk(r, "chat.completion.chunk"))
generate = types.SimpleNamespace(prefix="gen", chunk=_generate_chunk, whole=_generate_whole, usage_chunk=lambda r: None)


def model_card(frontend) -> dict:
    info = frontend.info
    return {"id": frontend.served.model, "object": "model", "created": info["started"], "owned_by": "splash",
            "root": info.get("model_path"), "max_model_len": frontend.served.context_length}


def model_info(frontend) -> dict:
    info = frontend.info
    return {"model_path": info.get("model_path"), "tokenizer_path": info.get("tokenizer_path"),
            "served_model_name": frontend.served.model, "is_generation": True,
            "max_context_length": frontend.served.context_length}


def server_info(frontend) -> dict:
    """What SGLang's ``/server_info`` has that applies here, and SPLASH's live state."""
    info = frontend.info
    pools = [{"rank": r, **p} for r, p in enumerate(frontend.pools or ())]
    state = {"layout": frontend.layout, "running": frontend.running, "waiting": frontend.waiting}
    return {"version": __version__, "status": frontend.state, "cause": frontend.cause or None,
            "deployment": info.get("deployment"), "backend": info.get("backend"), "T": info.get("T"),
            "policy": info.get("policy"), "layout": frontend.layout, "model_path": info.get("model_path"),
            "tokenizer_path": info.get("tokenizer_path"), "served_model_name": frontend.served.model,
            "context_length": frontend.served.context_length, "max_running_requests": info.get("max_running"),
            "kv_pool": {"pages_per_layer": info.get("kv_pages"), "page_size": info.get("page_size"), "ranks": pools},
            "prefill_chunk": info.get("prefill_chunk"), "in_flight": frontend.in_flight,
            "internal_states": [state]}
