"""The encoder stage writes its rows into channel memory: the same rows torch.cat would give,
as float32 on the host; its items' rows are cached across requests."""

from __future__ import annotations

import torch

from deployments.encoder import _like
from omni_serve.transport import make_channel, take
from omni_serve.transport.base import cat_into, put_in_place


async def test_image_rows_with_deepstack_levels_arrive_as_their_concatenation_in_float32():
    gen = torch.Generator().manual_seed(0)
    items = [torch.randn(n, 8, generator=gen).to(torch.bfloat16) for n in (5, 1, 3)]
    like = _like(items)
    assert like.shape == (9, 8) and like.dtype == torch.float32
    ref = put_in_place(make_channel("shared_memory"), like, lambda rows: cat_into(rows, items))
    assert torch.equal(await take(ref), torch.cat(items).float())


async def test_videos_sent_as_frames_come_back_as_their_rows(tiny_omni_path):
    """The stage takes a prompt's videos as a media payload of frames and answers with the
    tower's rows for all of them, deepstack levels concatenated, in prompt order."""
    import numpy as np

    from deployments.encoder import EncoderDeployment
    from omni_serve.engines.encoders.base import TorchEncoderEngine
    from omni_serve.models.qwen3_omni.family import FAMILY
    from omni_serve.models.thinker_talker.media_payload import media_payload

    stage = object.__new__(EncoderDeployment.func_or_class)
    stage.items = FAMILY.load_encoders(tiny_omni_path, torch.float32, "cpu", 64 << 20)
    encoders = stage.items.encoders
    stage.video, stage.channel, stage.clips = (
        TorchEncoderEngine(stage.items.videos),
        make_channel(),
        0,
    )
    rng = np.random.default_rng(0)
    videos = [rng.integers(0, 255, (n, 64, 96, 3), dtype=np.uint8) for n in (3, 2)]
    tensors, layout = media_payload({"video": videos})
    rows = await take(await stage.encode_videos(make_channel().put(tensors), layout))
    with torch.no_grad():
        expected = encoders.encode_videos(videos)
    assert torch.equal(rows, torch.cat([expected.embeds, *expected.deepstack], dim=-1))
    grids = expected.meta["grid_thw"]
    assert grids[:, 0].tolist() == [2, 1]  # 3 frames and 2 frames: temporal patches of 2
    assert stage.clips == 2 and rows.shape[0] == int(grids.prod(-1).sum()) // 4  # 2x2 merge
    # the same videos again: the rows come from the stage's cache, not the tower
    again = await take(await stage.encode_videos(make_channel().put(tensors), layout))
    assert torch.equal(again, rows) and stage.stats()["item_cache"]["hits"] == 2
    stage.video.shutdown()
