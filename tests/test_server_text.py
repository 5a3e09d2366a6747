"""The served text as tokens arrive: pieces joined equal decoding all tokens at once (characters
split over byte-level tokens come out whole), and stop strings are cut where they first appear,
with nothing of them ever handed out, even when one spans several tokens."""

from __future__ import annotations

import numpy as np
import pytest

from splash_core.checkpoint.tiny import ensure
from splash_core.checkpoint.tokenizer import Tokenizer
from splash_core.server.text import TextStream


@pytest.fixture(scope="module")
def tokenizer():
    return Tokenizer(ensure("tiny-deepseek-v3"))


def test_pieces_join_to_the_whole_decoding(tokenizer):
    ids = np.random.default_rng(1).integers(0, tokenizer.vocab_size, 300).tolist()  # random bytes: split characters
    stream = TextStream(tokenizer)
    pieces = [stream.push(t) for t in ids] + [stream.flush()]
    assert "".join(pieces) == tokenizer.decode(ids) == stream.text


@pytest.mark.parametrize("stop", [("quick brown",), ("fox", "quick"), ("lazy dog.", "jumps")])
def test_a_stop_string_is_cut_and_never_sent(tokenizer, stop):
    text = "The quick brown fox jumps over the lazy dog. Hello!"
    ids = tokenizer.encode(text, add_special_tokens=False)
    stream = TextStream(tokenizer, stop)
    sent = ""
    for t in ids:
        sent += stream.push(t)
        if stream.stopped:
            break
    first = min(text.find(s) for s in stop)
    assert stream.stopped and sent == text[:first] == stream.text
    assert stream.push(ids[-1]) == "" and stream.flush() == ""  # nothing after the stop
