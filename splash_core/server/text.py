"""A request's generated text as its tokens arrive, one token at a time.

Tokens are decoded incrementally by the ``tokenizers`` library's ``DecodeStream`` (a character
split over several byte-level tokens comes out whole, once complete; special tokens such as EOS
are skipped), so the pieces joined equal decoding every token at once. Stop strings are cut
where they first appear (or just after, with ``include_stop``: vLLM's
``include_stop_str_in_output``): text that could still be the start of one is held back until it
cannot, so no client ever sees part of a stop string it will not get whole.
"""

from __future__ import annotations


class TextStream:
    """The text of one request; :meth:`push` each generated token, then :meth:`flush`."""

    def __init__(self, tokenizer, stop: tuple[str, ...] = (), include_stop: bool = False):
        from tokenizers.decoders import DecodeStream

        self.tokenizer, self.stop, self.include_stop = tokenizer, tuple(stop), include_stop
        self.decoder = DecodeStream(skip_special_tokens=True) if tokenizer is not None else None
        self.hold = max((len(s) for s in self.stop), default=1) - 1  # characters a stop string could still claim
        self.text = ""  # decoded so far (cut at a stop string once one appeared)
        self.sent = 0  # characters of ``text`` already handed out
        self.stopped = False  # a stop string appeared: the request is done

    def push(self, token: int) -> str:
        """The new text ``token`` lets out ("" while a character or a possible stop string is incomplete)."""
        if self.decoder is None or self.stopped:
            return ""
        before = len(self.text)
        self.text += self.decoder.step(self.tokenizer.fast, int(token)) or ""
        if self.stop:
            start = max(0, before - self.hold)  # a stop string may begin in text already held
            hits = [(i, i + len(s) * self.include_stop) for i, s in ((self.text.find(s, start), s) for s in self.stop)
                    if i >= 0]
            if hits:
                self.text, self.stopped = self.text[:min(hits)[1]], True
                return self.flush()
        ready = len(self.text) - self.hold
        if ready <= self.sent:
            return ""
        piece, self.sent = self.text[self.sent:ready], ready
        return piece

    def flush(self) -> str:
        """Whatever is held back (the request finished)."""
        piece, self.sent = self.text[self.sent:], len(self.text)
        return piece
