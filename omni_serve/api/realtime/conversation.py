"""A Realtime session's conversation: its items, as the client sees them (OpenAI's item
shapes) and as the model hears them (chat messages).

An assistant's spoken item is heard as its transcript. When the user cut it short, only
what was played is kept: the audio up to ``audio_end_ms`` and the share of the transcript
that time covers (the words are spoken in order, at close to an even pace, so the share of
the audio played is the share of the words said; an approximation, not an alignment).
"""

from __future__ import annotations

import base64
import binascii
import io
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import soundfile as sf

from omni_serve.api.errors import ApiError
from omni_serve.api.realtime.protocol import PCM_RATE, ItemIn, item_id

BYTES_PER_MS = PCM_RATE * 2 // 1000


# What an item costs the session beyond its text and audio (its objects and ids), so that a
# flood of tiny items counts against the conversation's bytes too.
ITEM_BYTES = 1024


@dataclass
class Part:
    type: str  # input_text, input_audio, output_text, output_audio
    text: str | None = None
    pcm: bytes = b""  # PCM16 mono 24 kHz
    transcript: str | None = None
    # its audio was let go to make room (Conversation.make_room): heard as its transcript
    let_go: bool = False

    @property
    def has_audio(self) -> bool:
        return self.type.endswith("audio") and bool(self.pcm or self.let_go)

    def as_json(self) -> dict[str, Any]:
        shown: dict[str, Any] = {"type": self.type}
        if self.type.endswith("text"):
            shown["text"] = self.text or ""
        else:
            shown["transcript"] = self.transcript
        return shown


@dataclass
class Item:
    role: str
    parts: list[Part]
    id: str = field(default_factory=item_id)
    status: str = "completed"

    def as_json(self, audio: bool = False) -> dict[str, Any]:
        """OpenAI's item; its audio (base64) only with ``audio``, as
        ``conversation.item.retrieved`` shows it (the other events carry items without)."""
        content = [p.as_json() for p in self.parts]
        for part, shown in zip(self.parts, content, strict=True):
            if audio and part.pcm:
                shown["audio"] = base64.b64encode(part.pcm).decode()
        return {
            "id": self.id,
            "object": "realtime.item",
            "type": "message",
            "status": self.status,
            "role": self.role,
            "content": content,
        }

    @property
    def spoken(self) -> bool:
        return self.role == "user" and any(p.has_audio for p in self.parts)

    def held_bytes(self) -> int:
        said = sum(len(p.pcm) + len(p.text or "") + len(p.transcript or "") for p in self.parts)
        return ITEM_BYTES + said

    def heard(self, audio: bool = True) -> dict[str, Any] | None:
        """The chat message the model hears for this item (``None``: nothing to hear).
        Without ``audio`` a user's audio is heard as its transcript, or not at all."""
        if self.role != "user":
            text = "".join(
                (p.text if p.type.endswith("text") else p.transcript) or "" for p in self.parts
            )
            return {"role": self.role, "content": text} if text else None
        content = []
        for part in self.parts:
            if part.type == "input_text" and part.text:
                content.append({"type": "text", "text": part.text})
            elif audio and part.pcm:
                wav = pcm_to_wav_b64(part.pcm)
                content.append(
                    {"type": "input_audio", "input_audio": {"data": wav, "format": "wav"}}
                )
            elif part.has_audio and part.transcript:
                content.append({"type": "text", "text": part.transcript})
        return {"role": "user", "content": content} if content else None

    def truncate(self, audio_end_ms: int) -> bool:
        """Keeps the audio up to ``audio_end_ms`` and the transcript's share of it; whether
        anything was cut."""
        audio = next((p for p in self.parts if p.type == "output_audio"), None)
        if audio is None:
            raise ApiError(400, "only an assistant's audio can be truncated", "item_id")
        end = min(audio_end_ms * BYTES_PER_MS, len(audio.pcm))
        if end == len(audio.pcm):
            return False
        if audio.pcm and audio.transcript:
            words = audio.transcript.split(" ")
            keep = round(len(words) * end / len(audio.pcm))
            audio.transcript = " ".join(words[:keep])
        audio.pcm = audio.pcm[:end]
        self.status = "incomplete"
        return True


def pcm_to_wav_b64(pcm: bytes) -> str:
    wav = io.BytesIO()
    sf.write(wav, np.frombuffer(pcm, "<i2"), PCM_RATE, format="WAV", subtype="PCM_16")
    return base64.b64encode(wav.getvalue()).decode()


def pcm_from_b64(data: str, param: str) -> bytes:
    """The PCM16 bytes of a base64 ``audio`` field; a 400 naming it when they are not."""
    try:
        pcm = base64.b64decode(data, validate=True)
    except (binascii.Error, ValueError):
        raise ApiError(400, "audio is not valid base64", param) from None
    if len(pcm) % 2:
        raise ApiError(400, "audio must hold whole PCM16 samples (an even byte count)", param)
    return pcm


_ROLE_PARTS = {
    "user": ("input_text", "input_audio"),
    "system": ("input_text",),
    "assistant": ("output_text", "output_audio", "text", "audio"),
}


def item_from_client(item: ItemIn) -> Item:
    """The conversation item a ``conversation.item.create`` asks for; a 400 naming the field
    for what this model cannot hold."""
    if item.type != "message":
        raise ApiError(
            400, f"{item.type} items need tools; this model does not call tools", "item.type"
        )
    if item.role is None:
        raise ApiError(400, "a message item needs a role", "item.role")
    if not item.content:
        raise ApiError(400, "a message item needs content", "item.content")
    parts = []
    for i, part in enumerate(item.content):
        where = f"item.content[{i}]"
        if part.type not in _ROLE_PARTS[item.role]:
            raise ApiError(
                400,
                f"a {item.role} item takes {list(_ROLE_PARTS[item.role])} parts",
                f"{where}.type",
            )
        kind = {"text": "output_text", "audio": "output_audio"}.get(part.type, part.type)
        pcm = pcm_from_b64(part.audio, f"{where}.audio") if part.audio else b""
        if kind == "input_audio" and not pcm:
            raise ApiError(400, "an input_audio part needs its audio", f"{where}.audio")
        if kind.endswith("text") and part.text is None:
            raise ApiError(400, f"the {part.type} part needs its text", f"{where}.text")
        if kind == "output_audio" and not part.transcript:
            message = "the model hears its earlier answers as text: give the transcript"
            raise ApiError(400, message, f"{where}.transcript")
        parts.append(Part(kind, part.text, pcm, part.transcript))
    return Item(item.role, parts, **({"id": item.id} if item.id else {}))


@dataclass
class Conversation:
    items: list[Item] = field(default_factory=list)
    # The first spoken user turn still heard as audio: the model takes a few audio items per
    # prompt (the Thinker's limit_mm_per_prompt), so earlier ones are heard as transcripts.
    heard_from: str | None = None
    # The first item in the model's context: the session's truncation left out those before
    # it (they stay in the conversation).
    context_from: str | None = None
    # The most bytes of text and audio the conversation holds (api.realtime_max_conversation_
    # bytes); None: no limit.
    max_bytes: int | None = None

    def add(
        self, item: Item, previous_item_id: str | None = None, *, checked: bool = True
    ) -> str | None:
        """Adds ``item`` after ``previous_item_id`` (last when ``None``, first when "root");
        the id of the item before it, as the created event names it. ``checked``: make room
        for it first (``make_room``); an answer's item is checked when the answer starts."""
        if any(i.id == item.id for i in self.items):
            raise ApiError(400, f"an item {item.id!r} is in the conversation already", "item.id")
        at = len(self.items)
        if previous_item_id == "root":  # OpenAI's name for "first"
            at = 0
        elif previous_item_id is not None:
            at = self.index(previous_item_id, "previous_item_id") + 1
        if checked:
            self.make_room(item)
        self.items.insert(at, item)
        return self.items[at - 1].id if at else None

    def index(self, id_: str, param: str = "item_id") -> int:
        for i, item in enumerate(self.items):
            if item.id == id_:
                return i
        raise ApiError(400, f"no item {id_!r} in this conversation", param, code="item_not_found")

    def get(self, id_: str) -> Item:
        return self.items[self.index(id_)]

    def delete(self, id_: str) -> None:
        del self.items[self.index(id_)]

    def messages(
        self, instructions: str | None, audio_items: int | None = None
    ) -> list[dict[str, Any]]:
        """The chat the model answers: the instructions as the system message, then every
        item it can hear. At most ``audio_items`` spoken user turns are heard as audio: past
        that, the window moves on to the last half of them at once (so the prompt's start,
        and the KV a next turn resumes from, stays put for the turns after), and the turns
        before it are heard as their transcripts (input transcription), or not at all. Items
        before ``context_from`` are not heard (the session's truncation left them out)."""
        first = self._context_start()
        start = self._audio_start(audio_items, first)
        heard = (item.heard(audio=i >= start) for i, item in enumerate(self.items) if i >= first)
        said = [m for m in heard if m is not None]
        return [{"role": "system", "content": instructions}, *said] if instructions else said

    def leave_out_oldest(self, count: int) -> bool:
        """Moves the model's context past the ``count`` oldest items it hears, never past the
        newest; False when only that one is left to hear."""
        first = self._context_start()
        new = min(first + count, len(self.items) - 1)
        if new <= first:
            return False
        self.context_from = self.items[new].id
        return True

    def make_room(self, item: Item) -> None:
        """Room for ``item`` within ``max_bytes``: past it, the audio the model no longer hears
        goes, oldest first (the item keeps its transcript); a 400 when what the model still
        hears leaves no room. A session's audio would otherwise grow without end, an
        hour of two-way speech being ~170 MB, and a client adding items faster still."""
        if self.max_bytes is None:
            return
        over = sum(i.held_bytes() for i in self.items) + item.held_bytes() - self.max_bytes
        if over <= 0:
            return
        unheard = self._unheard_audio()
        if over > sum(len(part.pcm) for part in unheard):  # refused: nothing let go
            message = (
                f"the conversation would pass {self.max_bytes} bytes of text and audio "
                "(api.realtime_max_conversation_bytes) with what the model still hears; "
                "delete items (conversation.item.delete) to make room"
            )
            raise ApiError(400, message, code="conversation_full")
        for part in unheard:
            if over <= 0:
                return
            over -= len(part.pcm)
            part.pcm, part.let_go = b"", True

    def _unheard_audio(self) -> list[Part]:
        """The audio parts the model does not hear as audio, oldest first: every answer's
        but the newest (the model hears its answers as text; a barge-in truncates the last
        one's audio), and the user's before the window heard as audio (``messages``)."""
        ids = [item.id for item in self.items]
        window = self._context_start()
        if self.heard_from in ids:
            window = max(window, ids.index(self.heard_from))
        answers = [i for i, item in enumerate(self.items) if item.role == "assistant"]
        newest_answer = answers[-1] if answers else None
        return [
            part
            for i, item in enumerate(self.items)
            if (item.role == "assistant" and i != newest_answer) or (item.spoken and i < window)
            for part in item.parts
            if part.pcm
        ]

    def heard_count(self) -> int:
        """How many items the model's context holds (those before ``context_from`` left out)."""
        return len(self.items) - self._context_start()

    def _context_start(self) -> int:
        ids = [item.id for item in self.items]
        return ids.index(self.context_from) if self.context_from in ids else 0

    def _audio_start(self, audio_items: int | None, first: int) -> int:
        if audio_items is None:
            return first
        ids = [item.id for item in self.items]
        start = max(first, ids.index(self.heard_from) if self.heard_from in ids else 0)
        spoken = [i for i, item in enumerate(self.items) if i >= start and item.spoken]
        if len(spoken) > audio_items:
            start = spoken[-max(1, audio_items // 2)]
            self.heard_from = self.items[start].id
        return start
