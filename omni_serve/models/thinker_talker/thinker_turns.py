"""A Thinker turn's part in its session: the KV it hands over and the rows it keeps.

A session's turn exports its prompt's KV for the next turn (``kv_params``), and a spoken turn
hands the Talker its prompt's rows (``prompt_rows``) and keeps the rows at its media positions
(at every position, its reply's included, for a Talker that reads them ``everywhere``) for the
session's next spoken turn (``session_rows``). Those kept rows ride the exported KV prefix as
its companion, so they follow the KV wherever it goes.
"""

from __future__ import annotations

import dataclasses
import logging
from dataclasses import dataclass, field
from typing import Any

import torch

from omni_serve.models.thinker_talker.messages import ThinkerRequest
from omni_serve.models.thinker_talker.session_rows import (
    SessionRows,
    assemble,
    covers,
    rows_to_keep,
)
from omni_serve.transport import Channel, ChannelError, TensorRef, take
from omni_serve.transport.base import cat_into, put_in_place
from omni_serve.transport.kv_blocks import (
    CHANNEL_KEY,
    EXPORT_KEY,
    MEDIA_KEY,
    PREFIX_KEY,
    PROMPT_KEY,
    export_backend,
)
from omni_serve.transport.session_prefixes import decode_prefix, free_prefix

log = logging.getLogger("ray.serve")


@dataclass
class Turn:
    """A turn's session rows: those handed to it (``kept``) and those it keeps (``new``);
    whatever it neither read nor handed on is freed when the turn ends."""

    capturing: bool
    kept: SessionRows | None = None
    kept_taken: bool = False  # read (or found gone): freed, not to be handed on
    kept_rows: torch.Tensor | None = None
    new: SessionRows | None = None
    handed: SessionRows | None = None
    media: dict[str, list[str]] | None = None  # its media digests (a session's spoken turn)
    ids: list[int] = field(default_factory=list)  # the prompt as the engine ran it

    def unhanded(self) -> list[TensorRef]:
        left = [] if self.kept is None or self.kept_taken else [self.kept]
        left += [] if self.new is None else [self.new]
        return [rows.ref for rows in left if rows is not self.handed]


class ThinkerTurns:
    """What one Thinker replica does for its turns' sessions.

    ``rows``: the channel the Talker's prompt rows go on; ``sessions``: the ``session_kv``
    edge's channel (None: no KV handover); ``accept_layer``: the layer whose rows the Talker
    reads at media positions; ``placeholders``: modality -> placeholder token id;
    ``everywhere``: the Talker reads ``accept_layer`` at every position and for every reply
    token (``ThinkerModel.reply_layer``), so a turn keeps them all."""

    def __init__(
        self,
        rows: Channel,
        sessions: Channel | None,
        embed_tokens: torch.Tensor,
        accept_layer: int,
        placeholders: dict[str, int],
        everywhere: bool = False,
    ) -> None:
        self.rows, self.sessions = rows, sessions
        self.embed_tokens, self.accept_layer = embed_tokens, accept_layer
        self.placeholders, self.everywhere = placeholders, everywhere

    @property
    def hands_over_kv(self) -> bool:
        return self.sessions is not None

    def kv_params(
        self,
        request: ThinkerRequest,
        capturing: bool,
        spliced: list[tuple[int, str]] | None = None,
    ) -> dict[str, Any] | None:
        """A session's turn exports its prompt's KV and loads the previous turn's, except when
        it captures rows for the Talker with no rows kept to stand in for cached ones (rows of
        loaded tokens are never computed). An embeddings prompt (``spliced``: the encoder
        stage's items in it) names its token ids and items, which vLLM does not see, for the
        connector to match prefixes on."""
        offered = request.session_kv
        if self.sessions is None or not request.session_id:
            free_prefix(offered)
            return None
        params: dict[str, Any] = {EXPORT_KEY: True}
        backend = export_backend(self.sessions)
        if backend is not None:
            params[CHANNEL_KEY] = backend
        if spliced is not None:
            params[PROMPT_KEY], params[MEDIA_KEY] = list(request.prompt_ids), spliced
        if offered and not capturing:
            params[PREFIX_KEY] = offered
        else:
            free_prefix(offered)
        return params

    @staticmethod
    def take_session_rows(request: ThinkerRequest, turn: Turn) -> ThinkerRequest:
        """The rows the session's last spoken turn kept ride its prefix: this turn owns them
        now (``turn.kept``); the prefix goes on without them."""
        prefix = decode_prefix(request.session_kv)
        if prefix is None or prefix.companion is None:
            return request
        turn.kept = SessionRows(ref=prefix.companion, **prefix.companion_meta)
        prefix.companion, prefix.companion_meta = None, {}
        return dataclasses.replace(request, session_kv=prefix.encode())

    @staticmethod
    async def read_kept_rows(turn: Turn, cached: int) -> bool:
        """Whether the kept rows cover the cached media, read now if so (a ref that is gone,
        its producer replica having died, counts as not)."""
        if not covers(turn.kept, turn.ids, turn.media or {}, cached):
            return False
        try:
            turn.kept_rows = await take(turn.kept.ref)
        except ChannelError as exc:
            log.warning("session rows unreadable (%s)", exc)
            return False
        finally:
            turn.kept_taken = True
        return True

    def prompt_rows(
        self, rows: dict[int, list[torch.Tensor]], cached: int, finished: bool, turn: Turn
    ) -> TensorRef | None:
        """A ref to the prompt's rows for the Talker once the engine has them all (kept rows
        at cached media positions, token embeddings at cached text ones), and what this turn
        keeps for the session's next spoken turn. Computed rows go straight from the engine's
        chunks into channel memory (no concatenated copy in between)."""
        ids = turn.ids
        captured = sum(v.shape[0] for v in rows[min(rows)])
        if captured < len(ids) - cached and not finished:
            return None
        if cached:
            new = torch.cat(rows[self.accept_layer])[: len(ids) - cached]
            accept = assemble(turn.kept, turn.kept_rows, new, cached)
            if self.everywhere:  # kept with the reply's rows, at the turn's end (keep_reply)
                return self.rows.put({self.accept_layer: accept})
            self._keep(turn, accept)
            embeds = self.embed_tokens[torch.tensor(ids)]
            return self.rows.put({0: embeds, self.accept_layer: accept})
        count = min(captured, len(ids))
        like = {
            k: torch.empty((count, v[0].shape[-1]), dtype=v[0].dtype, device="meta")
            for k, v in rows.items()
        }

        def fill(out: dict[int, torch.Tensor]) -> None:
            for k, parts in rows.items():
                cat_into(out[k], parts)
            if not self.everywhere:
                self._keep(turn, out[self.accept_layer])  # a copy: read before the commit

        return put_in_place(self.rows, like, fill)

    def keep_reply(
        self, turn: Turn, rows: dict[int, list[torch.Tensor]], cached: int, reply: list[int]
    ) -> None:
        """At a turn's end, where the Talker reads rows ``everywhere``: keep those of its prompt
        and of its reply's tokens (all but the last, whose row the Thinker never computes), as
        the next turn's prompt starts with both."""
        if not self.everywhere or not turn.ids or not rows.get(self.accept_layer):
            return
        captured = torch.cat(rows[self.accept_layer])
        if turn.media is None or self.sessions is None or turn.kept_rows is None and cached:
            return  # nothing to keep, or cached rows nobody kept
        accept = assemble(turn.kept, turn.kept_rows, captured, cached)
        ids = [*turn.ids, *reply][: accept.shape[0]]
        self._keep(turn, accept[: len(ids)], ids)

    def _keep(self, turn: Turn, accept: torch.Tensor, ids: list[int] | None = None) -> None:
        """The accept-layer rows at the turn's kept positions, for its session's next turn."""
        if turn.media is not None and self.sessions is not None:
            ids = ids or turn.ids
            keep = rows_to_keep(ids, accept, self.placeholders, self.everywhere)
            turn.new = SessionRows(
                ids, turn.media, self.sessions.put(keep), self.placeholders, self.everywhere
            )

    @staticmethod
    def with_rows(encoded: str | None, turn: Turn) -> str | None:
        """The turn's export, carrying the rows for the next spoken turn: this turn's own, or
        (a turn that computed none) those it was handed, still right for what extends them."""
        companion = turn.new or (None if turn.kept_taken else turn.kept)
        prefix = decode_prefix(encoded)
        if prefix is None or companion is None:
            return encoded
        prefix.companion = companion.ref
        prefix.companion_meta = {
            "ids": companion.ids,
            "media": companion.media,
            "placeholders": companion.placeholders,
            "everywhere": companion.everywhere,
        }
        turn.handed = companion
        return prefix.encode()
