"""One spoken reply: the Talker follows a Thinker that is still generating.

Consumes the Thinker's chunk stream, builds the Talker prompt as soon as the prompt rows and
the first token exist, feeds each later token as one trailing row, and merges the Thinker's
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
from typing import Any

import torch

from omni_serve.engines.ar.base import ARRequest, SamplingConfig
from omni_serve.engines.ar.torch_engine import TorchAREngine
from omni_serve.models.qwen3_omni.talker_inputs import TOKEN_EMBEDDINGS, TalkerInputBuilder
from omni_serve.models.thinker_talker.messages import (
    CodecFrame,
    SpeakEvent,
    SpeakRequest,
    ThinkerChunk,
)

_END = object()


def _tensor(small: Any) -> torch.Tensor | None:
    """A request's grid or lengths (lists on the wire) as the tensor the builder takes."""
    return None if small is None else torch.as_tensor(small)


async def speak(
    thinker_chunks: AsyncIterator[ThinkerChunk],
    engine: TorchAREngine,
    builder: TalkerInputBuilder,
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
                if "codes" in chunk.outputs:
                    await out.put(CodecFrame(chunk.outputs["codes"].tolist()))
        except Exception as exc:
            await out.put(exc)
        finally:
            await out.put(_END)

    async def run_thinker() -> None:
        talker_task = None
        prompt_ids, rows, pending = request.prompt_ids, None, None
        heard: list[int] = []  # the Thinker's tokens
        tokens: list[int] = []  # those the Talker follows: all but the held back or taken back
        handed = False
        talking = True  # False once the Talker ended on its own (max_tokens, end of speech)

        def feed(token: int, is_last: bool) -> None:
            nonlocal talking
            if talking:  # the reply's text goes on without it
                talking = engine.feed(request_id, builder.trailing_row(token, is_last))

        try:
            async for chunk in thinker_chunks:
                await out.put(chunk)
                prompt_ids = chunk.prompt_token_ids or prompt_ids
                rows = chunk.prompt_rows or rows
                heard += chunk.token_ids
                end = max(len(heard) - chunk.stop_tokens, 0)
                for token in heard[len(tokens) : end]:
                    tokens.append(token)
                    if talker_task is None:
                        continue  # the first token goes into the Talker prompt
                    if pending is not None:
                        feed(pending, is_last=False)
                    pending = token
                if talker_task is None and tokens and rows is not None:
                    handed = True
                    talker_task = await _start_talker(prompt_ids, rows, tokens)
                    for token in tokens[1:]:  # tokens that arrived with the first chunk
                        if pending is not None:
                            feed(pending, is_last=False)
                        pending = token
        except Exception as exc:
            await out.put(exc)
        finally:
            try:
                if rows is not None and rows != TOKEN_EMBEDDINGS and not handed:
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

    async def _start_talker(prompt_ids, rows_ref, tokens) -> asyncio.Task:
        embed_rows = accept_rows = None  # TOKEN_EMBEDDINGS: the builder looks them up
        if rows_ref != TOKEN_EMBEDDINGS:
            rows = await resolve_rows(rows_ref)
            layers = sorted(rows)
            embed_rows, accept_rows = rows[layers[0]], rows[layers[-1]]
        prompt = builder.build_prompt(
            prompt_ids,
            embed_rows,
            accept_rows,
            tokens[0],
            request.voice,
            image_grid_thw=_tensor(request.image_grid_thw),
            video_grid_thw=_tensor(request.video_grid_thw),
            video_second_per_grid=_tensor(request.video_second_per_grid),
            audio_seqlens=_tensor(request.audio_seqlens),
        )
        ar = ARRequest(
            request_id,
            prompt_embeds=prompt.embeds,
            sampling=sampling(len(prompt.embeds)),
            extra={"position_ids": prompt.position_ids, "rope_delta": prompt.rope_delta},
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
    thinker_chunks: AsyncIterator[ThinkerChunk], reply_ids: list[int]
) -> AsyncIterator[ThinkerChunk]:
    """Text-to-speech: the Thinker only prefills the prompt (for its rows); ``reply_ids`` stand
    in for the reply it would have generated, so the Talker speaks exactly that text."""
    first = None
    async for chunk in thinker_chunks:
        if first is None:
            first = chunk
        if chunk.prompt_rows is not None:
            first = dataclasses.replace(first, prompt_rows=chunk.prompt_rows)
    if first is None:
        raise RuntimeError("the Thinker returned nothing for the speech prompt")
    yield dataclasses.replace(
        first,
        token_ids=list(reply_ids),
        text="",
        finished=True,
        finish_reason="stop",
        stop_tokens=0,
    )
