"""What the chat pipeline sends to its stages: only small plain values and channel refs, since
every stage call pickles its arguments (a torch tensor ~100 us to pickle and load; an image
or an audio clip is megabytes)."""

from __future__ import annotations

import asyncio
import dataclasses
from typing import Any

import numpy as np
import pytest
import torch
from PIL import Image

from omni_serve.engines.codec.chunked import CodecInfo
from omni_serve.models.thinker_talker.chat_flow import ChatOptions, collect, stream_chat
from omni_serve.models.thinker_talker.media_payload import media_from_payload
from omni_serve.models.thinker_talker.messages import CodecFrame, SpeakRequest, ThinkerChunk
from omni_serve.models.thinker_talker.request import PreparedPrompt
from omni_serve.models.thinker_talker.session_rows import digest


def heavy_values_in(value: Any) -> list[Any]:
    """Tensors, arrays and images at any depth of a call's arguments."""
    if isinstance(value, torch.Tensor | np.ndarray | Image.Image):
        return [value]
    if dataclasses.is_dataclass(value):
        value = [getattr(value, f.name) for f in dataclasses.fields(value)]
    elif isinstance(value, dict):
        value = list(value.values())
    if isinstance(value, list | tuple):
        return [t for item in value for t in heavy_values_in(item)]
    return []


class RecordingClients:
    """The stages, recording what reaches them; the Talker says one frame and one token."""

    def __init__(self, encoder: bool = True) -> None:
        self.sent: dict[str, Any] = {}
        self.encoder = encoder
        self.put_payloads: list[dict[str, torch.Tensor]] = []

    def thinker(self, request):
        raise AssertionError("a spoken reply goes through the Talker")

    def speak(self, request: SpeakRequest):
        self.sent["speak"] = request

        async def events():
            yield CodecFrame(list(range(16)))
            yield ThinkerChunk([5], "hi", True, "stop", num_prompt_tokens=3)

        return events()

    async def code2wav(self, jobs):
        self.sent.setdefault("code2wav", []).append(jobs)
        return [np.zeros(4 * job.num_frames, np.float32) for job in jobs]

    async def codec_info(self) -> CodecInfo:
        return CodecInfo(4, 0, first_chunk_frames=1, chunk_frames=2, chunk_growth=2.0)

    async def encode_audio(self, features):
        raise AssertionError("no audio in this prompt")

    async def encode_images(self, images):
        self.sent["encode_images"] = images
        return "image-rows-ref" if self.encoder else None

    async def encode_videos(self, videos):
        self.sent["encode_videos"] = videos
        return "video-rows-ref" if self.encoder else None

    def put(self, payload):
        self.put_payloads.append(payload)
        return f"ref-{len(self.put_payloads)}"

    def release(self, *refs):
        self.sent.setdefault("released", []).extend(refs)


async def test_a_spoken_image_turn_sends_the_stages_no_torch_tensors():
    prompt = PreparedPrompt(
        [1, 2, 3],
        {"image": ["an image"]},
        image_grid_thw=torch.tensor([[1, 4, 4]]),
        audio_seqlens=torch.tensor([7]),
        counts={"image": 1},
    )
    clients = RecordingClients()
    result = await collect(stream_chat(clients, prompt, ChatOptions({}, want_audio=True), "r1"))
    assert result.text == "hi" and len(result.audio) == 4
    speak = clients.sent["speak"]
    assert heavy_values_in(speak) == [], speak
    assert speak.image_grid_thw == [[1, 4, 4]] and speak.audio_seqlens == [7]
    assert speak.thinker.image_rows == "image-rows-ref"
    assert clients.sent["encode_images"] == ["an image"]  # as the prompt has them: a list
    [[job]] = clients.sent["code2wav"]
    assert torch.equal(job.codes, torch.arange(16)[:, None])  # the frame, as a tensor again


async def test_the_thinker_request_carries_what_its_router_keys_on():
    """The affinity router reads the Thinker request: a session id, or a prompt_cache_key."""
    clients = RecordingClients()
    options = ChatOptions({}, want_audio=True, session_id=None, cache_key="tenant-7")
    await collect(stream_chat(clients, PreparedPrompt([1, 2, 3], {}), options, "r2"))
    thinker = clients.sent["speak"].thinker
    assert thinker.cache_key == "tenant-7" and thinker.session_id is None


def clip() -> np.ndarray:
    return np.linspace(-1, 1, 1600, dtype=np.float32)


def image() -> Image.Image:
    return Image.fromarray(np.full((8, 8, 3), 7, np.uint8))


@pytest.mark.parametrize(
    ("media", "encoder"),
    [
        ({"audio": (clip(), 16000), "image": image()}, True),  # vLLM encodes a mix itself
        ({"image": [image(), image()]}, False),  # a graph without an encoder stage
    ],
    ids=["audio-with-image", "no-encoder-stage"],
)
async def test_media_the_thinker_encodes_goes_on_the_channel(media, encoder):
    prompt = PreparedPrompt(
        [1, 2, 3],
        media,
        image_grid_thw=torch.tensor([[1, 4, 4]]),
        audio_seqlens=torch.tensor([7]),
        counts={"image": 1, "audio": int("audio" in media)},
    )
    clients = RecordingClients(encoder=encoder)
    await collect(stream_chat(clients, prompt, ChatOptions({}, want_audio=True), "r1"))
    thinker = clients.sent["speak"].thinker
    assert heavy_values_in(clients.sent["speak"]) == [], clients.sent["speak"]
    assert thinker.media.ref == "ref-1"
    [payload] = clients.put_payloads
    rebuilt = media_from_payload(payload, thinker.media.layout)
    assert rebuilt.keys() == media.keys()
    assert all(digest(rebuilt[kind]) == digest(media[kind]) for kind in media)


async def test_no_ref_is_made_before_the_codec_is_known():
    """A failure before the stage call starts must strand no channel ref: refs are freed when
    the call carrying them ends, and a call never made never ends."""

    class NoCodec(RecordingClients):
        async def codec_info(self):
            raise RuntimeError("code2wav unavailable")

    clients = NoCodec()
    media = {"audio": (clip(), 16000), "image": image()}
    prompt = PreparedPrompt([1], media, counts={"audio": 1, "image": 1})
    with pytest.raises(RuntimeError, match="code2wav"):
        await collect(stream_chat(clients, prompt, ChatOptions({}, want_audio=True), "r1"))
    assert clients.put_payloads == [] and "encode_images" not in clients.sent


def frames() -> np.ndarray:
    return np.zeros((4, 8, 8, 3), np.uint8)


def video_prompt(media: dict[str, Any]) -> PreparedPrompt:
    counts = {"video": 1, "image": int("image" in media), "audio": int("audio" in media)}
    return PreparedPrompt(
        [1, 2, 3],
        media,
        image_grid_thw=torch.tensor([[1, 4, 4]]) if "image" in media else None,
        counts=counts,
        video_grid_thw=torch.tensor([[2, 4, 4]]),
        video_second_per_grid=[1.0],
        mm_processor_kwargs={"fps": 2.0},
    )


async def test_images_and_videos_go_to_the_encoder_stage_together():
    video = frames()
    clients = RecordingClients()
    prompt = video_prompt({"image": image(), "video": video})
    await collect(stream_chat(clients, prompt, ChatOptions({}, want_audio=True), "r1"))
    thinker = clients.sent["speak"].thinker
    assert clients.sent["encode_videos"][0] is video
    assert [i.size for i in clients.sent["encode_images"]] == [(8, 8)]
    assert thinker.image_rows == "image-rows-ref" and thinker.image_grid_thw == [[1, 4, 4]]
    assert thinker.video_rows == "video-rows-ref" and thinker.video_grid_thw == [[2, 4, 4]]
    assert thinker.video_second_per_grid == [1.0]
    # nothing raw for vLLM, so none of its processor's video settings either
    assert thinker.media is None and thinker.mm_processor_kwargs is None
    assert clients.put_payloads == [] and "released" not in clients.sent


async def test_a_video_with_audio_stays_with_the_thinker():
    clients = RecordingClients()
    prompt = video_prompt({"audio": (clip(), 16000), "video": frames()})
    await collect(stream_chat(clients, prompt, ChatOptions({}, want_audio=True), "r1"))
    thinker = clients.sent["speak"].thinker
    assert "encode_videos" not in clients.sent and thinker.video_rows is None
    assert thinker.mm_processor_kwargs == {"fps": 2.0} and thinker.media.ref == "ref-1"


async def test_a_failed_video_encode_frees_the_image_rows_already_made():
    class VideoFails(RecordingClients):
        async def encode_videos(self, videos):
            raise RuntimeError("encoder replica died")

    clients = VideoFails()
    prompt = video_prompt({"image": image(), "video": frames()})
    with pytest.raises(RuntimeError, match="encoder replica died"):
        await collect(stream_chat(clients, prompt, ChatOptions({}, want_audio=True), "r1"))
    assert clients.sent["released"] == ["image-rows-ref"] and "speak" not in clients.sent


async def test_a_request_cancelled_mid_encode_frees_the_rows_already_made():
    video_started = asyncio.Event()

    class VideoHangs(RecordingClients):
        async def encode_videos(self, videos):
            video_started.set()
            await asyncio.Event().wait()  # an encoder that never answers

    clients = VideoHangs()
    prompt = video_prompt({"image": image(), "video": frames()})
    chat = asyncio.ensure_future(
        collect(stream_chat(clients, prompt, ChatOptions({}, want_audio=True), "r1"))
    )
    await video_started.wait()
    await asyncio.sleep(0)  # the image encode has answered by now
    chat.cancel()
    with pytest.raises(asyncio.CancelledError):
        await chat
    assert clients.sent["released"] == ["image-rows-ref"] and "speak" not in clients.sent


class TextClients(RecordingClients):
    """A Thinker that would answer a long text reply, and says when its stream is closed."""

    def __init__(self) -> None:
        super().__init__()
        self.closed = False

    def thinker(self, request):
        async def chunks():
            try:
                for i in range(1000):
                    yield ThinkerChunk([i], f"t{i} ", False)
            finally:
                self.closed = True

        return chunks()


async def test_a_chat_stream_closed_early_closes_the_stage_stream_at_once():
    """A cancelled answer (the client's cancel, barge-in, a client gone) stops the stages as
    the chat stream is closed, not when the garbage collector finds the stage stream."""
    clients = TextClients()
    stream = stream_chat(clients, PreparedPrompt([1, 2, 3], {}), ChatOptions({}), "r9")
    assert (await anext(stream)).text == "t0 "
    await stream.aclose()
    assert clients.closed


class OverlappingCodecClients(RecordingClients):
    """A stateless codec (two chunks in flight) taking ``delay(first frame)`` seconds a chunk;
    every sample of a chunk is its first frame's index."""

    def __init__(self, frames: int, delay) -> None:
        super().__init__()
        self.frames, self.delay, self.running, self.most = frames, delay, 0, 0

    def speak(self, request: SpeakRequest):
        async def events():
            for i in range(self.frames):
                yield CodecFrame([i])
            yield ThinkerChunk([5], "hi", True, "stop", num_prompt_tokens=3)

        return events()

    async def code2wav(self, jobs):
        self.running += 1
        self.most = max(self.most, self.running)
        try:
            await asyncio.sleep(self.delay(jobs[0].first_frame))
        finally:
            self.running -= 1
        return [np.full(4 * job.num_frames, job.first_frame, np.float32) for job in jobs]

    async def codec_info(self) -> CodecInfo:
        info = await super().codec_info()
        return dataclasses.replace(info, chunks_in_flight=2)


async def test_a_stateless_codec_decodes_chunks_side_by_side_and_the_audio_stays_in_order():
    clients = OverlappingCodecClients(frames=15, delay=lambda first: 0.02 / (1 + first))
    options = ChatOptions({}, want_audio=True)
    result = await collect(stream_chat(clients, PreparedPrompt([1, 2, 3], {}), options, "r3"))
    steady = [float(first) for first in range(1, 15, 2) for _ in range(4 * 2)]
    assert result.audio.tolist() == [0.0] * 4 + steady  # a 1-frame chunk, then 2-frame ones
    assert clients.most == 2


async def test_a_reply_closed_early_leaves_no_decode_running():
    clients = OverlappingCodecClients(frames=15, delay=lambda first: 0.0 if first == 0 else 10)
    stream = stream_chat(clients, PreparedPrompt([1, 2, 3], {}), ChatOptions({}, True), "r4")
    async for event in stream:
        if event.kind == "audio":
            break
    assert clients.running >= 1
    await stream.aclose()
    assert clients.running == 0
