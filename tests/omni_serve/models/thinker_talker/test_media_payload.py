"""Raw media for the Thinker round-trips the tensor channel into what vLLM takes (numpy clips
with their rates, RGB PIL images, uint8 video frames), one item or a list as it was given."""

from __future__ import annotations

import numpy as np
import pytest
from PIL import Image

from omni_serve.models.thinker_talker.media_payload import media_from_payload, media_payload
from omni_serve.models.thinker_talker.session_rows import digest
from omni_serve.transport import make_channel, take


def clip(seconds: float, seed: int) -> np.ndarray:
    return np.random.default_rng(seed).uniform(-1, 1, int(16000 * seconds)).astype(np.float32)


def picture(size: tuple[int, int], seed: int) -> Image.Image:
    pixels = np.random.default_rng(seed).integers(0, 256, (size[1], size[0], 3), np.uint8)
    return Image.fromarray(pixels)


def frames(count: int, seed: int) -> np.ndarray:
    return np.random.default_rng(seed).integers(0, 256, (count, 24, 40, 3), np.uint8)


def same_media(got: dict, sent: dict) -> bool:
    """Equal content in vLLM's form: digests match (they cover dtypes, shapes, modes, pixels)."""
    return got.keys() == sent.keys() and all(digest(got[k]) == digest(sent[k]) for k in sent)


def listed(entry) -> list:
    return [] if entry is None else entry if isinstance(entry, list) else [entry]


MEDIA = {
    "one clip": {"audio": (clip(2.0, 0), 16000)},
    "clips and images": {
        "audio": [(clip(1.0, 1), 16000), (clip(0.5, 2), 24000)],
        "image": [picture((64, 48), 3), picture((32, 32), 4)],
    },
    "one image with a clip": {"audio": (clip(0.01, 5), 16000), "image": picture((640, 480), 6)},
    "one video": {"video": frames(5, 7)},
    "videos, an image and a clip": {
        "video": [frames(3, 8), frames(1, 9)],
        "image": picture((32, 32), 10),
        "audio": (clip(0.5, 11), 16000),
    },
}


@pytest.mark.parametrize("backend", ["auto", "inline", "shared_memory"])
@pytest.mark.parametrize("name", list(MEDIA))
async def test_media_round_trips_the_channel_in_vllms_form(name, backend):
    sent = MEDIA[name]
    tensors, layout = media_payload(sent)
    got = media_from_payload(await take(make_channel(backend).put(tensors)), layout)
    assert same_media(got, sent)
    assert {k: isinstance(v, list) for k, v in got.items()} == {
        k: isinstance(v, list) for k, v in sent.items()
    }
    for array, rate in listed(got.get("audio")):
        assert isinstance(array, np.ndarray) and array.dtype == np.float32 and type(rate) is int
    for image in listed(got.get("image")):
        assert isinstance(image, Image.Image) and image.mode == "RGB"
    for video in listed(got.get("video")):
        assert isinstance(video, np.ndarray) and video.dtype == np.uint8 and video.ndim == 4


def test_an_image_in_another_mode_arrives_as_rgb():
    gray = Image.fromarray(np.arange(64, dtype=np.uint8).reshape(8, 8))
    tensors, layout = media_payload({"image": gray})
    image = media_from_payload(tensors, layout)["image"]
    assert image.mode == "RGB" and np.array_equal(np.array(image), np.array(gray.convert("RGB")))


def test_the_layout_is_small_and_plain():
    """Only the layout rides the calls: no arrays or images in it."""
    _, layout = media_payload(MEDIA["clips and images"])
    assert layout == {
        "audio": {"rates": [16000, 24000], "many": True},
        "image": {"count": 2, "many": True},
    }


def test_a_media_kind_without_a_layout_is_refused():
    with pytest.raises(ValueError, match="point_cloud"):
        media_payload({"point_cloud": np.zeros((2, 3), np.float32)})
