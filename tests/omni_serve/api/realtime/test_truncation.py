"""A conversation that outgrows the model's context, as OpenAI's Realtime ``truncation``
has it: the oldest items leave the model's context (not the conversation), the cut holds
for later turns, ``retention_ratio`` cuts deeper so later turns fit, ``disabled`` fails the
answer. The scripted chat path counts a prompt one token per character (conftest.py)."""

from __future__ import annotations

from openai import AsyncOpenAI

from omni_serve.api.errors import ContextOverflow
from omni_serve.api.realtime.conversation import Conversation, Item, Part
from omni_serve.api.realtime.settings import Ask, Settings
from omni_serve.api.realtime.truncation import within_context
from omni_serve.testing.realtime_client import until, user_text
from tests.omni_serve.api.realtime.conftest import prompt_tokens

# 10 tokens kept free for each answer, so a prompt fits in 90 of the context's 100
SESSION = {
    "type": "realtime",
    "output_modalities": ["text"],
    "audio": {"input": {"turn_detection": None}},
    "max_output_tokens": 10,
}


def said(letter: str, n: int = 20, id_: str | None = None) -> dict:
    item = user_text(letter * n)
    return {**item, "id": id_} if id_ else item


def contents(messages: list[dict]) -> list[str]:
    return [
        m["content"] if isinstance(m["content"], str) else m["content"][0]["text"] for m in messages
    ]


async def answer(conn) -> object:
    await conn.response.create()
    return (await until(conn, "response.done"))[-1].response


async def test_the_oldest_items_leave_the_context_not_the_conversation_and_the_cut_holds(
    realtime_server,
):
    base_url, chat = realtime_server
    chat.context_tokens = 100
    async with AsyncOpenAI(base_url=base_url, api_key="-").realtime.connect(model="m") as conn:
        await conn.session.update(session={**SESSION, "instructions": "Hi"})
        for i, letter in enumerate("abcde"):  # 2 + 100 tokens: over the 90 that fit
            await conn.conversation.item.create(item=said(letter, id_=f"u{i}"))
        assert (await answer(conn)).status == "completed"
        first = chat.asks[-1].messages
        await conn.conversation.item.retrieve(item_id="u0")
        retrieved = (await until(conn, "conversation.item.retrieved"))[-1].item
        await conn.conversation.item.create(item=said("f", 5))
        assert (await answer(conn)).status == "completed"
    assert contents(first) == ["Hi", "b" * 20, "c" * 20, "d" * 20, "e" * 20]
    assert retrieved.content[0].text == "a" * 20  # still in the conversation
    # the next turn starts where the last cut left off, and cuts again only as it must
    second = chat.asks[-1].messages
    assert contents(second)[:2] == ["Hi", "c" * 20] and contents(second)[-1] == "f" * 5
    assert all(prompt_tokens(m) + 10 <= 100 for m in (first, second))


async def test_a_retention_ratio_cuts_deeper_so_the_next_turns_fit_without_a_cut(
    realtime_server,
):
    base_url, chat = realtime_server
    chat.context_tokens = 100
    ratio = {"type": "retention_ratio", "retention_ratio": 0.5}
    async with AsyncOpenAI(base_url=base_url, api_key="-").realtime.connect(model="m") as conn:
        await conn.session.update(session={**SESSION, "truncation": ratio})
        shown = (await until(conn, "session.updated"))[-1].session
        for letter in "abcde":
            await conn.conversation.item.create(item=said(letter))
        assert (await answer(conn)).status == "completed"
        overflows = chat.overflows
        await conn.conversation.item.create(item=said("f", 5))
        assert (await answer(conn)).status == "completed"
    assert shown.truncation.retention_ratio == 0.5
    assert contents(chat.asks[0].messages) == ["d" * 20, "e" * 20]  # within half of the 90
    assert contents(chat.asks[1].messages)[0] == "d" * 20 and chat.overflows == overflows


async def test_disabled_truncation_fails_the_answer_and_the_session_goes_on(realtime_server):
    base_url, chat = realtime_server
    chat.context_tokens = 100
    async with AsyncOpenAI(base_url=base_url, api_key="-").realtime.connect(model="m") as conn:
        await conn.session.update(session={**SESSION, "truncation": "disabled"})
        for letter in "abcde":
            await conn.conversation.item.create(item=said(letter))
        failed = await answer(conn)
        await conn.session.update(session={"truncation": "auto"})
        shown = (await until(conn, "session.updated"))[-1].session
        assert (await answer(conn)).status == "completed"
    assert failed.status == "failed"
    assert failed.status_details.error.code == "context_length_exceeded"
    assert shown.truncation == "auto"


async def test_an_item_too_long_alone_fails_its_turn_and_the_next_turn_leaves_it_out(
    realtime_server,
):
    base_url, chat = realtime_server
    chat.context_tokens = 100
    async with AsyncOpenAI(base_url=base_url, api_key="-").realtime.connect(model="m") as conn:
        await conn.session.update(session=SESSION)
        await conn.conversation.item.create(item=said("z", 200))
        failed = await answer(conn)
        await conn.conversation.item.create(item=said("y", 5))
        assert (await answer(conn)).status == "completed"
    assert failed.status_details.error.code == "context_length_exceeded"
    assert contents(chat.asks[-1].messages) == ["y" * 5]


async def test_token_limits_are_refused_naming_the_field(realtime_server):
    base_url, _ = realtime_server
    limits = {"post_instructions": 500}
    ratio = {"type": "retention_ratio", "retention_ratio": 0.8, "token_limits": limits}
    async with AsyncOpenAI(base_url=base_url, api_key="-").realtime.connect(model="m") as conn:
        await conn.session.update(session={**SESSION, "truncation": ratio})
        error = (await until(conn, "error"))[-1].error
    assert error.param == "session.truncation.token_limits.post_instructions"


async def test_an_early_answers_cut_outlasts_it_in_the_sessions_conversation():
    """An early answer hears a copy of the conversation with the user's turn so far; a cut
    it makes is kept in the session's conversation, so the next turn starts there too."""
    said_items = [Item("user", [Part("input_text", text=c * 20)]) for c in "abcde"]
    session = Conversation(list(said_items))
    turn = Conversation([*said_items, Item("user", [Part("input_text", text="f")])])
    asks = []

    async def respond(ask: Ask):
        n = prompt_tokens(ask.messages)
        if n + ask.reply_room > 100:
            raise ContextOverflow(n, 100, ask.reply_room)
        asks.append(ask)
        return iter(())

    settings = Settings(max_tokens=10)
    within = within_context(respond, turn, None, None, 1.0, keeps_cut=session)
    await within(settings.ask(turn.messages(None)))
    assert contents(asks[0].messages)[0] == "b" * 20
    assert session.context_from == said_items[1].id
    assert contents(session.messages(None))[0] == "b" * 20
