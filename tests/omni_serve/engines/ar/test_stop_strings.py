"""Which of a reply's newest tokens a stop string may still reach into, and which it took back."""

from __future__ import annotations

import random

import pytest

from omni_serve.engines.ar.stop_strings import StopStringWatch

PIECES = [b"Hel", b"lo", b" wor", b"ld", b"!", b"\xc3", b"\xa9"]  # 5 + 6: "é" in two tokens


def decode(ids: list[int]) -> str:
    return b"".join(PIECES[i] for i in ids).decode(errors="replace")


def in_doubt_after_each(stop: list[str], ids: list[int]) -> list[int]:
    watch = StopStringWatch(decode, stop)
    return [watch.add([i]) for i in ids]


def test_tokens_that_cannot_begin_a_stop_string_are_not_held():
    assert in_doubt_after_each(["The end", "\n\nUser:"], [0, 1, 2, 3, 4]) == [0, 0, 0, 0, 0]


def test_tokens_that_may_begin_a_stop_string_are_held_until_it_goes_another_way():
    # " wor" could begin " world?", then " world" could; "!" rules it out, all three settle
    assert in_doubt_after_each([" world?"], [0, 1, 2, 3, 4]) == [0, 0, 1, 2, 0]


def test_a_token_the_possible_start_cuts_through_is_held():
    # "o" could begin "orbit", then "or" could: "Hello w" settles, " wor" ends inside "or"
    assert in_doubt_after_each(["orbit"], [0, 1, 2]) == [0, 1, 1]


def test_an_unfinished_character_is_held_until_it_is_finished():
    assert in_doubt_after_each(["zz"], [0, 5, 6]) == [0, 1, 0]
    assert in_doubt_after_each(["zz"], [0, 5, 5, 6]) == [0, 1, 1, 0]  # the first is no character
    assert in_doubt_after_each(["é?"], [0, 5, 6, 4]) == [0, 1, 2, 0]


def test_tokens_arriving_together_settle_up_to_the_possible_start():
    watch = StopStringWatch(decode, ["ld?"])
    assert watch.add([0, 1, 2, 3]) == 1  # "ld" could begin "ld?"
    assert watch.add([4]) == 0


@pytest.mark.parametrize(
    ("stop", "reply", "text_len", "dropped"),
    [
        (["zz"], [0, 1, 2, 3, 4], len("Hello world!"), 0),  # nothing taken back
        (["!"], [0, 1, 2, 3, 4], len("Hello world"), 1),  # its token
        (["world"], [0, 1, 2, 3], len("Hello "), 2),  # " wor" is cut by the end, so it goes too
        (["orld"], [0, 1, 2, 3], len("Hello w"), 2),  # the same token, cut later
        (["Hello"], [0, 1], 0, 2),  # the reply opened with the stop string
    ],
)
def test_tokens_reaching_past_the_final_text_are_counted(stop, reply, text_len, dropped):
    """The reply ends with the token that completed the stop string, as vLLM ends it."""
    watch = StopStringWatch(decode, stop)
    for token in reply:
        watch.add([token])
    assert watch.past_text(text_len) == dropped


def test_a_long_reply_decodes_only_its_last_few_tokens():
    """The watch costs the same per token at token 2,000 as at token 10."""
    longest = 0

    def counting(ids: list[int]) -> str:
        nonlocal longest
        longest = max(longest, len(ids))
        return decode(ids)

    watch = StopStringWatch(counting, ["\n\nUser:"])
    for i in range(2000):
        watch.add([i % 5])
    assert longest <= 6  # the token added and the 5 read back for context


def settled_by_full_decodes(render, stop: list[str], ids: list[int]) -> int:
    """The definition, by decoding every prefix whole: the tokens whose text ends before the
    first place where the text left could begin a stop string (or an unfinished character)."""
    text = render(ids)
    whole = len(text) - text.endswith("\ufffd")
    start = next((p for p in range(whole) if any(s.startswith(text[p:whole]) for s in stop)), whole)
    return max(k for k in range(len(ids) + 1) if len(render(ids[:k])) <= start)


def test_the_watch_agrees_with_whole_decodes_on_the_real_tokenizer(omni_processor):
    """Reading back 5 tokens for context gives each token the text the whole reply gives it,
    with multi-byte characters split across tokens and random tokens."""
    tokenizer = omni_processor.tokenizer

    def render(part: list[int]) -> str:
        return tokenizer.decode(part, skip_special_tokens=True)

    stop = ["\n\nUser:", "再见。", " the end"]
    text = "Hello there.\n\nUs 好的，再见! and so to the en 再见 \n\nUser"
    spelled = tokenizer(text, add_special_tokens=False)["input_ids"]
    rng = random.Random(0)
    noise = [rng.randrange(len(tokenizer)) for _ in range(40)]
    for ids in (spelled, noise):
        watch = StopStringWatch(render, stop)
        for n in range(1, len(ids) + 1):
            held = watch.add(ids[n - 1 : n])
            assert n - held == settled_by_full_decodes(render, stop, ids[:n]), (ids[:n], held)


def test_a_real_tokenizer_cut_mid_token(omni_processor):
    tokenizer = omni_processor.tokenizer
    ids = tokenizer("Hello world, and more", add_special_tokens=False)["input_ids"]
    text = tokenizer.decode(ids)
    cut = text.index("world") + 2  # the text ends inside a token

    def render(part: list[int]) -> str:
        return tokenizer.decode(part, skip_special_tokens=True)

    watch = StopStringWatch(render, ["rld, and more"])
    watch.add(ids)
    dropped = watch.past_text(cut)
    kept = render(ids[: len(ids) - dropped])
    assert text[:cut].startswith(kept) and len(render(ids[: len(ids) - dropped + 1])) > cut
