"""What the chat pipeline sends to its stages: only small plain values and channel refs, since
every stage call pickles its arguments (a torch tensor ~100 us to pickle and load)."""

from __future__ import annotations

from typing import Any

import numpy as np
import torch

from omni_serve.models.qwen3_omni.pipeline import ChatOptions, collect, stream_chat
from omni_serve.models.qwen3_omni.request import PreparedPrompt


def tensors_in(value: Any) -> list[torch.Tensor]:
    if isinstance(value, torch.Tensor):
        return [value]
    if isinstance(value, dict):
        value = list(value.values())
    if isinstance(value, list | tuple):
        return [t for item in value for t in tensors_in(item)]
    return []


class RecordingClients:
    """The stages, recording what reaches them; the Talker says one frame and one token."""

    def __init__(self) -> None:
        self.sent: dict[str, Any] = {}

    def thinker(self, request: dict[str, Any]):
        raise AssertionError("a spoken reply goes through the Talker")

    def speak(self, request: dict[str, Any]):
        self.sent["speak"] = request

        async def events():
            yield {"kind": "codes", "codes": list(range(16))}
            yield {"kind": "text", "token_ids": [5], "text": "hi", "finished": True,
                   "finish_reason": "stop", "num_prompt_tokens": 3}  # fmt: skip

        return events()

    async def code2wav(self, jobs):
        self.sent.setdefault("code2wav", []).append(jobs)
        return [np.zeros(4 * job.num_frames, np.float32) for job in jobs]

    async def codec_info(self) -> dict[str, Any]:
        return {"samples_per_frame": 4, "left_context": 0, "first_chunk_frames": 1,
                "chunk_frames": 2, "chunk_growth": 2.0}  # fmt: skip

    async def encode_audio(self, features):
        raise AssertionError("no audio in this prompt")

    async def encode_images(self, pixels, grid_thw):
        self.sent["encode_images"] = grid_thw
        return "image-rows-ref"


async def test_a_spoken_image_turn_sends_the_stages_no_torch_tensors():
    prompt = PreparedPrompt(
        [1, 2, 3], {"image": ["an image"]}, image_grid_thw=torch.tensor([[1, 4, 4]]),
        audio_seqlens=torch.tensor([7]), counts={"image": 1}, image_pixels=torch.zeros(16, 8),
    )  # fmt: skip
    clients = RecordingClients()
    result = await collect(stream_chat(clients, prompt, ChatOptions({}, want_audio=True), "r1"))
    assert result.text == "hi" and len(result.audio) == 4
    speak = clients.sent["speak"]
    assert tensors_in(speak) == [], speak
    assert speak["image_grid_thw"] == [[1, 4, 4]] and speak["audio_seqlens"] == [7]
    assert speak["thinker"]["image_rows"] == "image-rows-ref"
    assert clients.sent["encode_images"] == [[1, 4, 4]]
    [[job]] = clients.sent["code2wav"]
    assert torch.equal(job.codes, torch.arange(16)[:, None])  # the frame, as a tensor again
