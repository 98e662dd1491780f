"""Which tokens a stop string took back from a reply, and how far behind a follower waits."""

from __future__ import annotations

import pytest

from omni_serve.engines.ar.stop_strings import stop_hold_back, tokens_past_text

PIECES = ["Hel", "lo", " wor", "ld", "!"]


def decode(ids: list[int]) -> str:
    return "".join(PIECES[i] for i in ids)


@pytest.mark.parametrize(
    ("text_len", "dropped"),
    [
        (len("Hello world!"), 0),  # nothing taken back (the text is whole)
        (len("Hello world"), 1),  # stop "!": its token
        (len("Hello "), 3),  # stop "world": " wor" is cut by the end, so it goes too
        (len("Hello w"), 3),  # stop "orld": the same token, cut later
        (0, 5),  # the reply opened with the stop string
    ],
)
def test_tokens_reaching_past_the_text_are_counted(text_len, dropped):
    assert tokens_past_text(decode, [0, 1, 2, 3, 4], text_len) == dropped


def test_the_hold_back_covers_the_longest_string_in_bytes():
    assert stop_hold_back([]) == 0
    assert stop_hold_back(["!", "The end"]) == 7
    assert stop_hold_back(["é"]) == 2  # byte-level tokens may split a character


def test_a_real_tokenizer_cut_mid_token(omni_processor):
    tokenizer = omni_processor.tokenizer
    ids = tokenizer("Hello world, and more", add_special_tokens=False)["input_ids"]
    text = tokenizer.decode(ids)
    cut = text.index("world") + 2  # the text ends inside a token

    def render(part: list[int]) -> str:
        return tokenizer.decode(part, skip_special_tokens=True)

    dropped = tokens_past_text(render, ids, cut)
    kept = render(ids[: len(ids) - dropped])
    assert text[:cut].startswith(kept) and len(render(ids[: len(ids) - dropped + 1])) > cut
