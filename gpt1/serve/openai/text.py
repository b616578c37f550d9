"""The text of a completion as GPT-1's tokenizer writes it: token pieces, offsets, stop strings.

GPT-1's tokenizer is not reversible (it lowercases and splits words with spaCy), so a prompt is
shown the way the model reads it: `Tokenizer.decode` of its tokens (pieces joined, `</w>` written
as a space except on the last token; a newline token is a newline). A continuation is what the new
tokens add to that text: " walked away" after "the old man" (a new word starts with its space).
"""

from __future__ import annotations

from collections.abc import Sequence

from gpt1.errors import DataError
from gpt1.text.tokenizer import EOW


def piece(tokenizer, token: int) -> str:
    """One token's text as `Tokenizer.decode` joins it: `</w>` becomes a space."""
    text = tokenizer.decoder.get(int(token))
    if text is None:
        raise DataError(f"token id {int(token)} is outside this vocabulary")
    return text.replace(EOW, " ")


def last_piece(tokenizer, token: int) -> str:
    """One token's text when it ends the text (`Tokenizer.decode`): its `</w>` is dropped."""
    return tokenizer.pieces([token])[0].replace(EOW, "")


def first_stop(text: str, stops: Sequence[str]) -> int | None:
    """Where the earliest stop string starts in `text`, or None."""
    hits = [i for i in (text.find(s) for s in stops) if i >= 0]
    return min(hits) if hits else None


def held_back(text: str, stops: Sequence[str]) -> int:
    """How many trailing characters of `text` could begin a stop string (not shown yet)."""
    longest = 0
    for stop in stops:
        for n in range(min(len(stop) - 1, len(text)), longest, -1):
            if text.endswith(stop[:n]):
                longest = n
                break
    return longest


class Continuation:
    """The text of one choice as its tokens arrive: `push(token)` returns the text that is now
    certain (never text a stop string could still cut); `stopped` once a stop string appeared,
    after which `text` ends before it."""

    def __init__(self, tokenizer, prompt: Sequence[int], stops: Sequence[str]):
        self.tokenizer, self.stops, self.prompt = tokenizer, list(stops), list(prompt)
        self.prompt_raw = "".join(piece(tokenizer, t) for t in prompt)
        self.prompt_text = tokenizer.decode(prompt)
        self.raw = ""  # the new tokens' pieces
        self.tokens: list[int] = []
        self.shown = 0  # characters of `text` handed out by push
        self.cut: int | None = None

    @property
    def text(self) -> str:
        full = self.tokenizer.decode([*self.prompt, *self.tokens])[len(self.prompt_text) :]
        return full if self.cut is None else full[: self.cut]

    @property
    def stopped(self) -> bool:
        return self.cut is not None

    def push(self, token: int) -> str:
        if self.stopped:  # the answer ended at the stop: later tokens are not part of it
            return ""
        self.tokens.append(int(token))
        self.raw += piece(self.tokenizer, token)
        text = self.text
        self.cut = first_stop(text, self.stops)
        end = len(text) - held_back(text, self.stops) if self.cut is None else self.cut
        return self._release(max(end, self.shown))

    def finish(self) -> str:
        """The text not handed out yet (what was held back, once no stop can follow)."""
        return self._release(len(self.text))

    def _release(self, end: int) -> str:
        out = self.text[self.shown : end]
        self.shown = end
        return out

    def kept_tokens(self) -> list[int]:
        """The new tokens whose text the answer shows, in whole or in part (all of them without
        a stop): a token a stop string cuts is kept, so the usage and the logprobs count the
        token that made the text returned (" bl" of " blue" is one token)."""
        if self.cut is None:
            return list(self.tokens)
        # The first new token starts after the prompt's trailing space, if any.
        at, kept = len(self.prompt_raw) - len(self.prompt_text), []
        for token in self.tokens:
            if at >= self.cut:  # nothing of it is shown
                break
            kept.append(token)
            at += len(piece(self.tokenizer, token))
        return kept


def text_offsets(tokenizer, tokens: Sequence[int], first: int) -> list[int]:
    """Where each token's text starts in a string whose first token starts at `first`."""
    out, at = [], first
    for token in tokens:
        out.append(max(at, 0))
        at += len(piece(tokenizer, token))
    return out
