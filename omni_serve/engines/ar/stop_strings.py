"""Which of a reply's tokens a stop string took back.

vLLM ends a reply's text before the first stop string in it but keeps the tokens that spelled
the string (``include_stop_str_in_output`` off, vLLM 0.32). A stage that follows the tokens,
the Talker speaking the reply, must not follow those: it holds back as many tokens as a stop
string could span until the reply goes on past them, and at the end leaves out the ones that
reached into the string.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence


def stop_hold_back(stop: Sequence[str]) -> int:
    """The most tokens one of these strings can span: a token adds at least a byte."""
    return max((len(s.encode()) for s in stop), default=0)


def tokens_past_text(
    decode: Callable[[list[int]], str], token_ids: Sequence[int], text_len: int
) -> int:
    """How many of the last ``token_ids`` reach past the first ``text_len`` characters of
    their text (a token cut by the end counts: its sound would say part of the string).

    Decodes the whole reply at most once per token left out, and only for replies a stop
    string ended, which leave out a few."""
    for dropped in range(len(token_ids) + 1):
        if len(decode(list(token_ids[: len(token_ids) - dropped]))) <= text_len:
            return dropped
    return len(token_ids)
