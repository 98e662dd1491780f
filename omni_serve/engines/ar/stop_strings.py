"""Which of a reply's newest tokens a stop string may still take back.

vLLM ends a reply's text before the first stop string in it but keeps the tokens that spelled
the string (``include_stop_str_in_output`` off, vLLM 0.32), and it knows the string is there
only at its last token. A stage that follows the tokens as they come, the Talker speaking the
reply, must not follow one a stop string may yet reach into: it would say what the text leaves
out. Holding back as many tokens as the longest string has bytes is safe but delays the
Talker by that many tokens on every reply; ``StopStringWatch`` instead holds back only the
tokens whose text could still begin a stop string (usually none), and at the end names those
that did.
"""

from __future__ import annotations

from bisect import bisect_right
from collections.abc import Callable, Sequence

# Tokens decoded before the first one in doubt, so that a tokenizer that renders a token by
# its neighbours (SentencePiece's leading space) gives each token its text in context: vLLM's
# incremental detokenizer reads the same 5 back.
_CONTEXT_TOKENS = 5
# Byte-level tokens that end inside a character decode to one of these at the end of the text
# (the lossy UTF-8 decoding of both Python and HF tokenizers); one earlier in the text stands
# for bytes that are no character and stays.
_INCOMPLETE = "\ufffd"


class StopStringWatch:
    """Follows one reply's tokens and says how many of the newest could be part of a stop
    string. ``decode`` must render tokens as vLLM's detokenizer does.

    Decodes only the tokens still in doubt (plus a few before them) per update, so a long
    reply costs no more per token than a short one."""

    def __init__(self, decode: Callable[[list[int]], str], stop: Sequence[str]) -> None:
        self._decode = decode
        self._stop = [s for s in stop if s]
        self._longest = max((len(s) for s in self._stop), default=0)
        self._ids: list[int] = []
        self._settled = 0  # leading tokens no stop string can reach into any more
        self._settled_chars = 0  # the length of their text

    def add(self, token_ids: Sequence[int]) -> int:
        """Takes the reply's next tokens; returns how many of its newest tokens a stop string
        may still reach into (their text could begin one)."""
        self._ids += token_ids
        offsets, text = self._unsettled_text()
        start = self._earliest_possible_start(text)
        settled = bisect_right(offsets, start) - 1  # tokens whose text ends by ``start``
        self._settled += settled
        self._settled_chars += offsets[settled]
        return len(self._ids) - self._settled

    def past_text(self, text_len: int) -> int:
        """At the end of a reply: how many of its last tokens reach past the first
        ``text_len`` characters of its text (a token the end cuts through counts: its sound
        would say part of the string)."""
        offsets, _ = self._unsettled_text()
        kept = bisect_right(offsets, text_len - self._settled_chars) - 1
        return len(self._ids) - self._settled - max(kept, 0)

    def _unsettled_text(self) -> tuple[list[int], str]:
        """The text of the tokens after the settled ones, and where each token ends in it
        (``offsets[0]`` is 0, ``offsets[i]`` the end of the i-th)."""
        context = max(self._settled - _CONTEXT_TOKENS, 0)
        before = len(self._decode(self._ids[context : self._settled]))
        text = self._decode(self._ids[context:])[before:]
        inner = range(self._settled + 1, len(self._ids))
        offsets = [len(self._decode(self._ids[context:end])) - before for end in inner]
        return [0, *offsets, len(text)] if len(self._ids) > self._settled else [0], text

    def _earliest_possible_start(self, text: str) -> int:
        """The first position in ``text`` where a stop string could begin: what follows it is
        the start of one, or all of one (the reply ends there, and its tokens are taken back).
        An unfinished character could be anything, so it is always in doubt. ``len(text)``
        when no position is."""
        whole = len(text) - text.endswith(_INCOMPLETE)
        for start in range(max(whole - self._longest, 0), whole):
            if any(s.startswith(text[start:whole]) for s in self._stop):
                return start
        return whole
