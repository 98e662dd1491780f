"""One spoken reply: the Talker follows a Thinker that is still generating.

Consumes the Thinker's chunk stream, builds the Talker prompt as soon as the prompt rows and
the first token exist (and, for a family whose Talker reads each reply token's hidden row,
that token's row), feeds each later token as one trailing row, and merges the Thinker's
text and the Talker's codec frames into one event stream. A token is fed one step late, so
that the last token can be replaced by ``tts_eos`` even if the Thinker reports "finished" in
a chunk of its own. With stop strings, the Talker waits on the tokens a stop string may still
reach into (each chunk's ``stop_tokens``) and never hears those that spelled the string that
ended the reply, so it says what the text says (``omni_serve.engines.ar.stop_strings``). The
Talker may end first (its ``max_tokens``, or its end-of-speech code): the text then goes on
alone. Closing the stream cancels both sides.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any, Protocol

import torch

from omni_serve.engines.ar.base import ARRequest, SamplingConfig
from omni_serve.engines.ar.torch_engine import TorchAREngine
from omni_serve.models.thinker_talker.messages import (
    TOKEN_EMBEDDINGS,
    CodecFrame,
    SpeakEvent,
    SpeakRequest,
    TakenRows,
    ThinkerChunk,
    pack_rows,
    unpack_rows,
)

_END = object()


class TalkerFeed(Protocol):
    """A family's Talker inputs, as one spoken reply builds them."""

    # Whether each reply token's Thinker row (``ThinkerChunk.reply_rows``) goes into its
    # trailing row (and the first's into the prompt).
    reads_reply_rows: bool
    # Whether each sampled Talker token is a frame of one codebook (else the runner hands
    # whole frames out in its step outputs' ``codes``, as Qwen3-Omni's code predictor does).
    tokens_are_frames: bool

    def prompt(
        self,
        request: SpeakRequest,
        prompt_ids: list[int],
        rows: dict[int, torch.Tensor] | None,
        first_token: int,
        first_reply_row: torch.Tensor | None,
    ) -> tuple[torch.Tensor, dict[str, Any]]:
        """The Talker's prompt embeddings and its request ``extra`` (positions and the like).
        ``rows``: the Thinker's prompt rows by layer, None for ``TOKEN_EMBEDDINGS``."""

    def trailing_row(
        self, token: int, reply_row: torch.Tensor | None, is_last: bool
    ) -> torch.Tensor:
        """The row one later reply token adds to one Talker step."""


async def speak(
    thinker_chunks: AsyncIterator[ThinkerChunk],
    engine: TorchAREngine,
    feed_rows: TalkerFeed,
    request: SpeakRequest,
    sampling: Callable[[int], SamplingConfig],
    resolve_rows: Callable[[Any], Awaitable[dict[int, torch.Tensor]]],
    drop_rows: Callable[[Any], None],
) -> AsyncIterator[SpeakEvent]:
    """Yields the Thinker's chunks and the Talker's frames (one event per frame crosses to the
    ingress, its codes as a list of ints: a torch tensor costs ~100 us to pickle and load
    against a few us for the list).

    ``sampling(prompt_len)`` gives the Talker's sampling; ``resolve_rows`` turns the Thinker's
    prompt-rows reference (``TOKEN_EMBEDDINGS`` for a prompt without media: nothing to resolve)
    into ``{layer: [T, H]}`` (and owns it from then on); ``drop_rows``
    hands back a reference the Talker never got to (the reply ended, failed or was cancelled
    before its first token), which would otherwise hold its buffer until the channel's lease.
    """
    out: asyncio.Queue = asyncio.Queue()
    request_id = request.request_id

    async def run_talker(stream: AsyncIterator) -> None:
        try:
            async for chunk in stream:
                if not feed_rows.tokens_are_frames:  # frames come from the runner's outputs
                    if "codes" in chunk.outputs:
                        await out.put(CodecFrame(chunk.outputs["codes"].tolist()))
                    continue
                stop = chunk.finish_reason == "stop"  # the end code is no frame
                for code in chunk.token_ids[:-1] if stop else chunk.token_ids:
                    await out.put(CodecFrame([code]))
        except Exception as exc:
            await out.put(exc)
        finally:
            await out.put(_END)

    async def run_thinker() -> None:
        talker_task = None
        prompt_ids, rows, pending = request.prompt_ids, None, None
        heard: list[int] = []  # the Thinker's tokens
        tokens: list[int] = []  # those the Talker follows: all but the held back or taken back
        reply_rows: list[torch.Tensor] = []  # the reply tokens' Thinker rows, where read
        handed = False
        talking = True  # False once the Talker ended on its own (max_tokens, end of speech)

        def feed(index: int, is_last: bool) -> None:
            nonlocal talking
            if talking:  # the reply's text goes on without it
                row = reply_rows[index] if index < len(reply_rows) else None
                talking = engine.feed(
                    request_id, feed_rows.trailing_row(tokens[index], row, is_last)
                )

        def can_start() -> bool:
            rows_ready = reply_rows or not feed_rows.reads_reply_rows
            return talker_task is None and bool(tokens) and rows is not None and bool(rows_ready)

        try:
            async for chunk in thinker_chunks:
                await out.put(chunk)
                prompt_ids = chunk.prompt_token_ids or prompt_ids
                rows = chunk.prompt_rows or rows
                if chunk.reply_rows is not None:
                    reply_rows.extend(unpack_rows(chunk.reply_rows).unbind(0))
                heard += chunk.token_ids
                end = max(len(heard) - chunk.stop_tokens, 0)
                for token in heard[len(tokens) : end]:
                    tokens.append(token)
                    if talker_task is None:
                        continue  # the first token goes into the Talker prompt
                    if pending is not None:
                        feed(pending, is_last=False)
                    pending = len(tokens) - 1
                if can_start():
                    handed = True
                    talker_task = await _start_talker(prompt_ids, rows, tokens, reply_rows)
                    for index in range(1, len(tokens)):  # tokens that came before the start
                        if pending is not None:
                            feed(pending, is_last=False)
                        pending = index
        except Exception as exc:
            await out.put(exc)
        finally:
            try:
                held = rows is not None and not isinstance(rows, TakenRows)  # a reference
                if held and rows != TOKEN_EMBEDDINGS and not handed:
                    drop_rows(rows)
                if talker_task is not None:
                    if pending is not None:
                        feed(pending, is_last=True)
                    if talking:
                        engine.feed(request_id, None)  # text is done
                else:
                    await out.put(_END)  # no Talker ran: its end marker comes from here
            finally:  # whatever failed above, the stream must end, not wait forever
                await out.put(_END)

    async def _start_talker(
        prompt_ids: list[int], rows_ref: Any, tokens: list[int], reply_rows: list[torch.Tensor]
    ) -> asyncio.Task:
        if isinstance(rows_ref, TakenRows):  # given_reply's
            rows = rows_ref.rows
        else:
            rows = None if rows_ref == TOKEN_EMBEDDINGS else await resolve_rows(rows_ref)
        first_row = reply_rows[0] if reply_rows else None
        embeds, extra = feed_rows.prompt(request, prompt_ids, rows, tokens[0], first_row)
        ar = ARRequest(
            request_id, prompt_embeds=embeds, sampling=sampling(len(embeds)), extra=extra
        )
        stream = engine.generate(ar)  # registered now: feed() is valid from here on
        return asyncio.get_running_loop().create_task(run_talker(stream))

    thinker_task = asyncio.get_running_loop().create_task(run_thinker())
    ends = 0
    try:
        while ends < 2:
            item = await out.get()
            if item is _END:
                ends += 1
            elif isinstance(item, BaseException):
                raise item
            else:
                yield item
    finally:
        thinker_task.cancel()
        with contextlib.suppress(asyncio.CancelledError, Exception):
            await thinker_task
        await engine.abort(request_id)


async def given_reply(
    thinker_chunks: AsyncIterator[ThinkerChunk],
    reply_ids: list[int],
    resolve_rows: Callable[[Any], Awaitable[dict[int, torch.Tensor]]] | None = None,
) -> AsyncIterator[ThinkerChunk]:
    """Text-to-speech: the Thinker only prefills the prompt (for its rows); ``reply_ids`` stand
    in for the reply it would have generated, so the Talker speaks exactly that text.

    A Talker that reads each reply token's row needs the Thinker to have run those tokens:
    then its prompt was the speech prompt followed by ``reply_ids``, and ``resolve_rows`` is
    given. The rows it captured are split here: the prompt's go to the Talker's prompt (as
    resolved rows), the reply's become the reply rows."""
    first = None
    async for chunk in thinker_chunks:
        if first is None:
            first = chunk
        if chunk.prompt_rows is not None:
            first = dataclasses.replace(first, prompt_rows=chunk.prompt_rows)
    if first is None:
        raise RuntimeError("the Thinker returned nothing for the speech prompt")
    first = dataclasses.replace(
        first,
        token_ids=list(reply_ids),
        text="",
        finished=True,
        finish_reason="stop",
        stop_tokens=0,
        reply_rows=None,
    )
    if resolve_rows is not None and first.prompt_rows is not None:
        rows = await resolve_rows(first.prompt_rows)  # the prompt's, then the reply's
        ids = first.prompt_token_ids or []
        n = len(ids) - len(reply_ids)
        if n <= 0 or ids[n:] != list(reply_ids):
            raise RuntimeError("the Thinker's prompt does not end with the reply to speak")
        first = dataclasses.replace(
            first,
            prompt_token_ids=ids[:n],
            prompt_rows=TakenRows({k: v[:n] for k, v in rows.items()}),
            reply_rows=pack_rows(rows[max(rows)][n:]),
        )
    yield first
