"""The ingress's stage clients send media to the encoder on the tensor channel, never as
pickled handle arguments."""

from __future__ import annotations

import types

import numpy as np
import pytest
import torch

from deployments.omni_stage_clients import HandleStageClients
from omni_serve.transport import ChannelError, SharedMemoryChannel, TensorRef, make_channel, take


class RecordingMethod:
    """A handle method: records its arguments and, as the stage would, takes the ref it got
    before answering (the caller frees what its callee did not read)."""

    def __init__(self) -> None:
        self.calls: list[tuple] = []
        self.taken: list[torch.Tensor] = []

    def remote(self, ref, *args):
        self.calls.append((ref, *args))

        async def respond():
            self.taken.append(await take(ref))
            return "rows-ref"

        return respond()


class Answering:
    """A handle method that answers with ``answer``."""

    def __init__(self, answer) -> None:
        self.answer = answer

    def remote(self, *args):
        async def respond():
            return self.answer

        return respond()


def clients(code2wav_refs: list[TensorRef] | None = None):
    stream = types.SimpleNamespace(options=lambda **_: None)
    encoder = types.SimpleNamespace(
        encode_audio=RecordingMethod(),
        encode_images=RecordingMethod(),
        encode_videos=RecordingMethod(),
    )
    code2wav = types.SimpleNamespace(decode=Answering(code2wav_refs))
    handles = {"thinker": stream, "talker": stream, "code2wav": code2wav, "encoder": encoder}
    return HandleStageClients(handles, make_channel(), make_channel()), encoder


async def test_audio_clips_reach_the_encoder_as_one_channel_ref_and_their_lengths():
    ingress, encoder = clients()
    clips = [
        np.random.default_rng(0).standard_normal(48000).astype(np.float32),
        np.zeros(1200, np.float32),
    ]  # 3 s and a short clip
    assert await ingress.encode_audio(clips) == "rows-ref"
    [(ref, lengths)] = encoder.encode_audio.calls
    assert isinstance(ref, TensorRef) and lengths == [48000, 1200]
    assert torch.equal(encoder.encode_audio.taken[0], torch.from_numpy(np.concatenate(clips)))


async def test_images_go_on_the_channel_as_their_rgb_pixels():
    from PIL import Image

    from omni_serve.models.thinker_talker.media_payload import media_from_payload

    ingress, encoder = clients()
    images = [Image.fromarray(np.full((8, 12, 3), v, np.uint8)) for v in (5, 9)]
    assert await ingress.encode_images(images) == "rows-ref"
    [(ref, layout)] = encoder.encode_images.calls
    assert isinstance(ref, TensorRef)
    rebuilt = media_from_payload(encoder.encode_images.taken[0], layout)["image"]
    assert [np.asarray(i).tolist() for i in rebuilt] == [np.asarray(i).tolist() for i in images]


async def test_videos_go_on_the_channel_as_their_uint8_frames():
    from omni_serve.models.thinker_talker.media_payload import media_from_payload

    ingress, encoder = clients()
    videos = [np.full((4, 16, 16, 3), 9, np.uint8), np.full((2, 8, 8, 3), 3, np.uint8)]
    assert await ingress.encode_videos(videos) == "rows-ref"
    [(ref, layout)] = encoder.encode_videos.calls
    assert isinstance(ref, TensorRef)
    taken = encoder.encode_videos.taken[0]
    assert all(t.dtype == torch.uint8 for t in taken.values())
    rebuilt = media_from_payload(taken, layout)["video"]
    assert [np.array_equal(a, b) for a, b in zip(rebuilt, videos, strict=True)] == [True, True]


async def test_put_puts_a_payload_on_the_ingress_channel():
    ingress, _ = clients()
    payload = {"audio.0": torch.randn(160_000), "image.0": torch.zeros(8, 8, 3, dtype=torch.uint8)}
    ref = ingress.put(payload)
    assert isinstance(ref, TensorRef)
    taken = await take(ref)
    assert all(torch.equal(taken[k], payload[k]) for k in payload)


async def test_code2wav_chunks_arrive_as_arrays_and_their_segments_go_back_at_once():
    """Chunks come back on the channel; the ingress copies them out, so Code2wav's segments
    are free while the reply is still being assembled (a view would hold one per chunk)."""
    channel = SharedMemoryChannel()
    chunks = [torch.randn(48_000), torch.randn(96_000)]  # 2 s and 4 s at 24 kHz
    refs = [channel.put(chunk) for chunk in chunks]
    ingress, _ = clients(code2wav_refs=refs)
    audio = await ingress.code2wav(["job"] * 2)
    assert all(isinstance(a, np.ndarray) for a in audio)
    assert all(np.array_equal(a, c.numpy()) for a, c in zip(audio, chunks, strict=True))
    for ref in refs:  # freed, with the arrays still alive
        with pytest.raises(ChannelError, match="freed"):
            await take(ref)


async def test_code2wav_chunks_not_taken_are_freed_when_taking_fails():
    channel = SharedMemoryChannel()
    gone, waiting = channel.put(torch.randn(48_000)), channel.put(torch.randn(48_000))
    channel.free(gone)
    ingress, _ = clients(code2wav_refs=[gone, waiting])
    with pytest.raises(ChannelError):
        await ingress.code2wav(["job"] * 2)
    with pytest.raises(ChannelError, match="freed"):
        await take(waiting)


async def test_media_go_on_the_channels_of_the_ingress_edges():
    """The pipeline's ``ingress -> encoder`` and ``ingress -> thinker`` media edges pick their
    backends, as every other edge does (before, the ingress always used ``auto``)."""
    stream = types.SimpleNamespace(options=lambda **_: None)
    encoder = types.SimpleNamespace(encode_audio=RecordingMethod(), encode_videos=RecordingMethod())
    handles = {"thinker": stream, "talker": stream, "code2wav": None, "encoder": encoder}
    ingress = HandleStageClients(handles, make_channel("shared_memory"), make_channel("inline"))
    await ingress.encode_audio([np.zeros(512, np.float32)])  # 2 KB: auto would send it inline
    await ingress.encode_videos([np.zeros((1, 4, 4, 3), np.uint8)])  # 48 bytes
    assert [call[0].backend for call in encoder.encode_audio.calls] == ["shared_memory"]
    assert [call[0].backend for call in encoder.encode_videos.calls] == ["shared_memory"]
    ref = ingress.put({"audio.0": torch.randn(1 << 16)})  # 256 KB: auto would not inline it
    assert ref.backend == "inline"
    await take(ref)
