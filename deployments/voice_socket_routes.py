"""The omni ingress's voice WebSocket, ``/v1/audio/stream``: requests one at a time, the
client's voice in as binary PCM16 frames, text and speech streamed out
(``omni_serve.api.websocket``).

A mixin of ``OmniIngress``, as ``AudioRoutes`` is: each request goes through its chat path
(``self.chat``, an ``OmniChat``).
"""

from __future__ import annotations

import logging
import time
import uuid
from collections.abc import AsyncIterator
from contextlib import aclosing
from typing import Any

from fastapi import WebSocket, WebSocketDisconnect

from deployments.omni_api import app
from deployments.omni_chat import OmniChat
from omni_serve.api.deadline import iterate_within
from omni_serve.api.protocol import ChatCompletionRequest, new_id, reply_usage
from omni_serve.api.speech import SpeechRequest
from omni_serve.api.websocket import IdleTimeout, VoiceSocket, error_event
from omni_serve.config import PipelineConfig
from omni_serve.media.audio_codec import encode_audio
from omni_serve.models.thinker_talker.chat_flow import ChatEvent
from omni_serve.models.thinker_talker.family import SAMPLE_RATE

log = logging.getLogger("ray.serve")


class VoiceSocketRoutes:
    config: PipelineConfig
    chat: OmniChat

    @app.websocket("/v1/audio/stream")
    async def audio_stream(self, ws: WebSocket) -> None:
        """Requests one at a time (``omni_serve.api.websocket``): JSON in, the client's voice
        as binary PCM16 frames; JSON events and binary PCM16 frames out."""
        await ws.accept()
        api = self.config.api
        socket = VoiceSocket(ws, api.ws_idle_timeout_s, api.max_audio_bytes, api.max_audio_seconds)
        try:
            while True:
                message, said = await socket.next_request()
                try:
                    events = await self._ws_events(message, said)
                except Exception as exc:  # bad input: say why, keep the socket
                    await socket.send(error_event(exc))
                    continue
                response_id = new_id("resp")
                await socket.answer(response_id, self._ws_answer(socket, response_id, events))
        except (WebSocketDisconnect, IdleTimeout):
            return
        finally:
            await socket.close()

    async def _ws_events(
        self, message: Any, said: dict[str, Any] | None
    ) -> AsyncIterator[ChatEvent]:
        if not isinstance(message, dict) or message.get("type") not in ("chat", "speech"):
            raise ValueError(
                'send {"type": "chat", "messages": [...]} or {"type": "speech", "input": "..."}'
            )
        fields = {k: v for k, v in message.items() if k not in ("type", "input_audio")}
        fields.setdefault("model", self.config.served_model_name)
        voice = fields.pop("voice", "ethan")
        if message["type"] == "speech":
            body = SpeechRequest.model_validate({**fields, "voice": voice})
            self.chat.check_speech(body, "type")
            return await self.chat.speech_events(body)
        if said is not None:  # the frames sent before it, as the conversation's last message
            messages = fields.get("messages", [])
            fields["messages"] = [*messages, said] if isinstance(messages, list) else messages
        spoken = {"modalities": ["text", "audio"], "audio": {"voice": voice, "format": "pcm16"}}
        if not self.chat.speaks:  # a text-only pipeline: the text streams alone
            spoken = {"modalities": ["text"]}
        body = ChatCompletionRequest.model_validate({**fields, "stream": True, **spoken})
        start = time.perf_counter()
        prompt, options = await self.chat.prepare(body)
        prepare_s = time.perf_counter() - start
        events = self.chat.events(prompt, options, uuid.uuid4().hex)
        return self.chat.observed(iterate_within(events, self.chat.deadline(body)), prepare_s)

    async def _ws_answer(
        self, socket: VoiceSocket, response_id: str, events: AsyncIterator[ChatEvent]
    ) -> None:
        await socket.send({"type": "response.created", "id": response_id})
        try:
            async with aclosing(events):  # also when cancelled: the stages stop at once
                async for event in events:
                    if event.kind == "text":
                        await socket.send({"type": "response.text.delta", "delta": event.text})
                    elif event.kind == "audio":
                        pcm = encode_audio(event.audio, SAMPLE_RATE, "pcm16")
                        meta = {
                            "type": "response.audio.delta",
                            "bytes": len(pcm),
                            "sample_rate": SAMPLE_RATE,
                            "format": "pcm16",
                        }
                        await socket.send(meta, pcm)
                    else:
                        result = event.result
                        await socket.send(
                            {
                                "type": "response.done",
                                "id": response_id,
                                "status": "completed",
                                "usage": reply_usage(result),
                                "timings": result.timings,
                            }
                        )
        except WebSocketDisconnect:
            raise
        except Exception as exc:
            log.exception("websocket request failed in a stage")
            await socket.send(error_event(exc))
