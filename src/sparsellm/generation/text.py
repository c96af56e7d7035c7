"""Streaming text: incremental detokenization that never splits a character, and stop strings."""

from __future__ import annotations

import codecs
from collections.abc import Sequence
from typing import Any

_CONTEXT_TOKENS = 4  # prompt tokens kept so tokenizers that strip a leading space decode right
_WINDOW_TOKENS = 12  # the decode window restarts from the last delta once it is this long


class IncrementalDetokenizer:
    """Turns a growing list of token ids into text deltas, never splitting a character.

    Byte-level BPE tokenizers (`Tokenizer.token_bytes`) decode by joining each token's bytes:
    each new token's bytes go through an incremental UTF-8 decoder, which holds back an
    incomplete character until its last byte arrives. This runs once per token of every stream
    just after a decode step's weight stream has flushed the CPU caches, where a table lookup
    costs a few microseconds and a call into the tokenizer ~50 us.

    Other tokenizers (SentencePiece's leading space depends on what comes before) decode a short
    window of recent ids and emit only the new suffix, once it no longer ends in an incomplete
    UTF-8 sequence (U+FFFD). The window's start stays put for a few deltas, so the text before
    the new token is the previous call's decode: one decode per token, not two.
    """

    def __init__(self, tokenizer: Any, prompt_ids: Sequence[int] = (), skip_special: bool = True):
        self.tokenizer = tokenizer
        self.skip_special = skip_special
        table = getattr(tokenizer, "token_bytes", None)
        self.pieces: list[bytes] | None = table(skip_special) if table else None
        if self.pieces is not None:
            self.utf8 = codecs.getincrementaldecoder("utf-8")("replace")
            return
        self.ids = list(prompt_ids[-_CONTEXT_TOKENS:])
        self.window = 0  # the decode window is ids[window:]
        self.read = len(self.ids)  # ids before `read` have been emitted
        self.prefix = self._decode(self.ids)  # text of ids[window:read]

    def _decode(self, ids: list[int]) -> str:
        return self.tokenizer.decode(ids, skip_special_tokens=self.skip_special)

    def add(self, token_id: int) -> str:
        if self.pieces is not None:  # ids past the tokenizer's vocabulary decode to nothing
            return self.utf8.decode(self.pieces[token_id] if token_id < len(self.pieces) else b"")
        self.ids.append(token_id)
        text = self._decode(self.ids[self.window:])
        if len(text) <= len(self.prefix) or text.endswith("\ufffd"):
            return ""
        delta = text[len(self.prefix):]
        last_read, self.read = self.read, len(self.ids)
        if self.read - self.window > _WINDOW_TOKENS:  # restart the window at the last delta
            self.window = last_read
            self.prefix = self._decode(self.ids[self.window:self.read])
        else:
            self.prefix = text
        return delta

    def flush(self) -> str:
        """Whatever is still pending (an incomplete character is emitted as U+FFFD)."""
        if self.pieces is not None:
            return self.utf8.decode(b"", final=True)
        text = self._decode(self.ids[self.window:])
        self.window = self.read = len(self.ids)
        delta, self.prefix = text[len(self.prefix):], ""
        return delta


class StopStrings:
    """Finds stop strings in generated text and says how much text is safe to stream.

    Text that could still become a stop string is held back, so a client never sees part of one.
    """

    def __init__(self, stops: Sequence[str]):
        self.stops = [s for s in stops if s]

    def find(self, text: str, start: int = 0) -> int:
        """Index of the earliest stop string in text[start':] (start' = start - len(stop) + 1),
        or -1."""
        hits = [text.find(s, max(0, start - len(s) + 1)) for s in self.stops]
        hits = [h for h in hits if h >= 0]
        return min(hits) if hits else -1

    def safe_length(self, text: str) -> int:
        """Length of the prefix of `text` that cannot be the start of a stop string."""
        held = 0
        for s in self.stops:
            for n in range(min(len(s) - 1, len(text)), held, -1):
                if text.endswith(s[:n]):
                    held = n
                    break
        return len(text) - held
