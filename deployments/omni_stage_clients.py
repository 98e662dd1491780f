"""How the Thinker-Talker ingress calls its stages: the ``StageClients`` that
``omni_serve.models.thinker_talker.chat_flow`` drives, over Serve handles and the ingress's
channels.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

import numpy as np
import torch
from ray.serve.handle import DeploymentHandle

from deployments import handle_calls
from omni_serve.engines.codec.chunked import CodecInfo, DecodeJob
from omni_serve.models.thinker_talker.media_payload import media_payload
from omni_serve.models.thinker_talker.messages import (
    SpeakEvent,
    SpeakRequest,
    ThinkerChunk,
    ThinkerRequest,
    decoded,
)
from omni_serve.transport import Channel, release, take
from omni_serve.transport.base import cat_into, put_in_place


class HandleStageClients:
    """``StageClients`` over Serve handles."""

    def __init__(
        self, handles: dict[str, DeploymentHandle], to_encoder: Channel, to_thinker: Channel
    ) -> None:
        """``to_encoder``, ``to_thinker``: the channels of the ingress's media edges (audio
        samples, image pixels and video frames for the encoder stage; the media of a
        prompt the Thinker encodes itself)."""
        self._thinker = handles["thinker"].options(stream=True)
        talker = handles.get("talker")  # none in a text-only pipeline
        self._talker = talker.options(stream=True) if talker is not None else None
        self._code2wav = handles.get("code2wav")
        self._encoder = handles.get("encoder")
        self._to_encoder, self._to_thinker = to_encoder, to_thinker
        self._codec_info: CodecInfo | None = None

    def thinker(self, request: ThinkerRequest) -> AsyncIterator[ThinkerChunk]:
        return decoded(handle_calls.stream(self._thinker.generate, request))

    def speak(self, request: SpeakRequest) -> AsyncIterator[SpeakEvent]:
        return decoded(handle_calls.stream(self._talker.speak, request))

    async def code2wav(self, jobs: list[DecodeJob]) -> list[np.ndarray]:
        refs = await handle_calls.call(self._code2wav.decode, jobs)
        try:
            # Copied out (188 KB: ~2 us from cache): a view would hold Code2wav's segment (1 MiB
            # at least) until the whole reply is sent, one per chunk of every reply in flight.
            return [(await take(ref)).numpy().copy() for ref in refs]
        finally:  # cancelled between takes: the rest are freed now, not by the lease
            release(*refs)

    async def encode_audio(self, clips: list[np.ndarray]) -> Any | None:
        """The clips' samples go one after another in one tensor on the channel (a 30 s clip
        is 1.9 MB); their lengths ride the call."""
        if self._encoder is None:
            return None
        lengths = [len(clip) for clip in clips]
        like = torch.empty(sum(lengths), dtype=torch.float32, device="meta")
        tensors = [torch.from_numpy(np.asarray(clip, dtype=np.float32)) for clip in clips]
        ref = put_in_place(self._to_encoder, like, lambda out: cat_into(out, tensors, dim=0))
        return await handle_calls.call(self._encoder.encode_audio, ref, lengths)

    async def encode_images(self, images: list[Any]) -> Any | None:
        """The images go on the channel as their RGB pixels: their patches would be ~3x the
        bytes, and are made in the encoder stage."""
        return await self._encode_pixels("image", images)

    async def encode_videos(self, videos: list[np.ndarray]) -> Any | None:
        """The videos' frames go on the channel as they are (uint8), as images do."""
        return await self._encode_pixels("video", videos)

    async def _encode_pixels(self, kind: str, items: list[Any]) -> Any | None:
        if self._encoder is None:
            return None
        tensors, layout = media_payload({kind: list(items)})
        method = getattr(self._encoder, f"encode_{kind}s")
        return await handle_calls.call(method, self._to_encoder.put(tensors), layout)

    def put(self, payload: dict[str, torch.Tensor]) -> Any:
        return self._to_thinker.put(payload)

    def release(self, *refs: Any) -> None:
        release(*refs)

    async def codec_info(self) -> CodecInfo:
        if self._codec_info is None:
            self._codec_info = await self._code2wav.codec_info.remote()
        return self._codec_info
