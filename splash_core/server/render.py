"""Response bodies, field for field as the APIs clients know write them: OpenAI's completions
and chat completions (whole and as stream chunks), SGLang's ``/generate`` output and its
``/model_info`` and ``/server_info``.

A token event is ``("token", text piece, token id or None, finish reason or None)``
(:mod:`~splash_core.server.frontend`); each renderer turns one into a stream chunk
(``chunk``), and a finished request into the whole response (``whole``).
"""

from __future__ import annotations

import time
import types

from .. import __version__


def _head(handle, prefix: str, obj: str) -> dict:
    return {"id": f"{prefix}-{handle.id}", "object": obj, "created": handle.created, "model": handle.call.model}


def _usage_chunk(handle, prefix: str, obj: str) -> dict:
    return {**_head(handle, prefix, obj), "choices": [], "usage": handle.usage()}


def _completion_chunk(handle, event, first: bool) -> dict:
    _, piece, _, reason = event
    return {**_head(handle, "cmpl", "text_completion"), "usage": None,
            "choices": [{"index": 0, "text": piece, "logprobs": None, "finish_reason": reason}]}


def _completion_whole(handle) -> dict:
    return {**_head(handle, "cmpl", "text_completion"), "usage": handle.usage(),
            "choices": [{"index": 0, "text": handle.text.text, "logprobs": None, "finish_reason": handle.finish_reason}]}


def _chat_chunk(handle, event, first: bool) -> dict:
    _, piece, _, reason = event
    delta = {"role": "assistant", "content": piece} if first else {"content": piece}
    return {**_head(handle, "chatcmpl", "chat.completion.chunk"), "usage": None,
            "choices": [{"index": 0, "delta": delta, "logprobs": None, "finish_reason": reason}]}


def _chat_whole(handle) -> dict:
    message = {"role": "assistant", "content": handle.text.text}
    return {**_head(handle, "chatcmpl", "chat.completion"), "usage": handle.usage(),
            "choices": [{"index": 0, "message": message, "logprobs": None, "finish_reason": handle.finish_reason}]}


def _generate_meta(handle, reason: str | None) -> dict:
    finish = None
    if reason == "length":
        finish = {"type": "length", "length": handle.call.max_new_tokens}
    elif reason == "stop":
        finish = {"type": "stop", "matched": handle.token_ids[-1] if handle.token_ids else None}
    elif reason is not None:
        finish = {"type": reason}
    usage = handle.usage()
    meta = {"id": str(handle.id), "prompt_tokens": usage["prompt_tokens"],
            "completion_tokens": usage["completion_tokens"], "finish_reason": finish}
    if reason is not None:
        meta["e2e_latency"] = time.monotonic() - handle.arrived
    return meta


def _generate_chunk(handle, event, first: bool) -> dict:
    return {"text": handle.text.text[:handle.text.sent], "output_ids": list(handle.token_ids),
            "meta_info": _generate_meta(handle, event[3])}


def _generate_whole(handle) -> dict:
    return {"text": handle.text.text, "output_ids": list(handle.token_ids),
            "meta_info": _generate_meta(handle, handle.finish_reason)}


completion = types.SimpleNamespace(chunk=_completion_chunk, whole=_completion_whole,
                                   usage_chunk=lambda h: _usage_chunk(h, "cmpl", "text_completion"))
chat = types.SimpleNamespace(chunk=_chat_chunk, whole=_chat_whole,
                             usage_chunk=lambda h: _usage_chunk(h, "chatcmpl", "chat.completion.chunk"))
generate = types.SimpleNamespace(chunk=_generate_chunk, whole=_generate_whole, usage_chunk=lambda h: None)


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
