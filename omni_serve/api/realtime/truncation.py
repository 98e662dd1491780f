"""A Realtime conversation kept within the model's context: the session's ``truncation``.

A voice conversation grows by every turn, and a long one outgrows the Thinker's context. As
OpenAI's Realtime API does, an answer whose conversation (with room for the answer's
``max_output_tokens``) no longer fits leaves the oldest items out of the model's context:
they stay in the conversation, and the cut stays for later turns, so their prompts keep the
start the next turn's KV resumes from. ``retention_ratio`` cuts deeper than needed (to that
share of what fits), so several turns fit before the next cut. ``disabled`` fails the answer
with the context error instead.

The chat path counts the prompt's tokens (``ContextOverflow``); items vary in length (a
spoken turn heard as audio weighs far more than a line of text), so a cut takes the oldest
items in proportion to the tokens over, and the prompt is counted again until it fits.
"""

from __future__ import annotations

import math
from collections.abc import AsyncIterator
from dataclasses import replace
from typing import TYPE_CHECKING, Any

from omni_serve.api.errors import ContextOverflow
from omni_serve.api.realtime.conversation import Conversation
from omni_serve.api.realtime.settings import Ask

if TYPE_CHECKING:
    from omni_serve.api.realtime.session import Respond


def items_to_leave_out(over: ContextOverflow, kept_share: float, heard_items: int) -> int:
    """How many of the oldest heard items a cut takes: the share of the items that the
    tokens over ``kept_share`` of what fits are of the prompt, at least one."""
    excess = over.prompt_tokens - kept_share * over.fits
    return max(1, math.ceil(heard_items * excess / over.prompt_tokens))


def within_context(
    respond: Respond,
    heard: Conversation,
    instructions: str | None,
    audio_items: int | None,
    kept_share: float | None,
    keeps_cut: Conversation | None = None,
) -> Respond:
    """``respond``, cutting ``heard``'s oldest items while its prompt overflows. ``kept_share``
    ``None``: never cut. ``keeps_cut``: the session's conversation, where ``heard`` is a copy
    of it (an early answer's), so that the cut outlasts the answer."""
    if kept_share is None:
        return respond

    async def respond_within(ask: Ask) -> AsyncIterator[Any]:
        while True:
            try:
                return await respond(ask)
            except ContextOverflow as over:
                cut = items_to_leave_out(over, kept_share, heard.heard_count())
                if not heard.leave_out_oldest(cut):
                    raise  # the newest item alone is over: nothing left to cut
            if keeps_cut is not None:
                keeps_cut.context_from = heard.context_from
            ask = replace(ask, messages=heard.messages(instructions, audio_items))

    return respond_within
