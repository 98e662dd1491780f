"""A chat's media parts decode by their path, ahead of the prompt. A chat with a video part
becomes the Thinker's prompt: one video placeholder, the sampled frames for vLLM, the frame
rate for its processor, and the grids the Talker's positions need, counted as transformers'
processor counts them."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from transformers import AutoProcessor

from omni_serve.config import ApiSettings
from omni_serve.media.chat_parts import ChatMessage
from omni_serve.media.decode import MediaError
from omni_serve.models.qwen3_omni.family import FAMILY
from omni_serve.models.thinker_talker.request import (
    decode_media,
    has_media_parts,
    over_media_limits,
    prepare_prompt,
)
from omni_serve.models.thinker_talker.thinker_inputs import (
    audio_frames,
    clip_features,
    min_audio_samples,
    video_grids,
)
from omni_serve.testing.media import gray_frames, png_data_url, video_data_url, wav_b64

TEXT = {"type": "text", "text": "Hi"}


def user_message(*parts: dict) -> ChatMessage:
    return ChatMessage.model_validate({"role": "user", "content": list(parts)})


def video_message(url: str) -> ChatMessage:
    return ChatMessage.model_validate(
        {
            "role": "user",
            "content": [
                {"type": "video_url", "video_url": {"url": url}},
                {"type": "text", "text": "What happens?"},
            ],
        }
    )


@pytest.mark.parametrize("shape", [(5, 64, 96), (4, 32, 32), (1, 240, 320), (3, 700, 1100)])
def test_video_grids_are_the_processors(omni_processor, shape):
    """As the whole processor counts them (its defaults for videos are Qwen3-Omni's)."""
    frames = np.zeros((*shape, 3), np.uint8)
    text = "<|vision_start|><|video_pad|><|vision_end|>"
    expected = omni_processor(text=text, videos=[frames], return_tensors="pt")
    assert video_grids(omni_processor, [frames]).tolist() == expected["video_grid_thw"].tolist()


def test_a_video_part_becomes_frames_a_rate_and_grids(omni_processor):
    api = ApiSettings(video_fps=4.0)
    prompt = prepare_prompt(
        omni_processor, [video_message(video_data_url(gray_frames(10)))], api, family=FAMILY
    )
    video_token = omni_processor.tokenizer.convert_tokens_to_ids("<|video_pad|>")
    assert prompt.prompt_ids.count(video_token) == 1  # vLLM expands it
    frames = prompt.multi_modal_data["video"]
    assert frames.shape == (4, 64, 96, 3)  # 1 s of video at 4 fps
    assert prompt.counts == {"audio": 0, "image": 0, "video": 1}
    assert prompt.mm_processor_kwargs == {"fps": 4.0}
    assert prompt.video_second_per_grid == [0.5]  # 2 frames per temporal patch at 4 fps
    assert prompt.video_grid_thw.tolist() == video_grids(omni_processor, [frames]).tolist()
    assert prompt.audio_clips == [] and prompt.image_grid_thw is None


def test_media_decoded_ahead_are_named_by_their_part_and_used(omni_processor):
    """The ingress decodes media off its event loop first; the prompt takes what it decoded."""
    from PIL import Image

    api = ApiSettings()
    tone = np.sin(np.arange(8000) / 5).astype(np.float32) * 0.3
    image = Image.fromarray(np.full((56, 84, 3), 120, np.uint8))
    messages = [
        ChatMessage(role="system", content="Be brief."),
        ChatMessage.model_validate(
            {
                "role": "user",
                "content": [
                    {"type": "text", "text": "Look:"},
                    {"type": "video_url", "video_url": {"url": video_data_url(gray_frames(10))}},
                    {"type": "input_audio", "input_audio": {"data": wav_b64(tone, 16000)}},
                    {"type": "image_url", "image_url": {"url": png_data_url(image)}},
                ],
            }
        ),
    ]
    assert has_media_parts(messages) and not has_media_parts(messages[:1])
    decoded = decode_media(omni_processor, messages, api)
    video, audio, picture = (f"messages[1].content[{i}]" for i in (1, 2, 3))
    assert list(decoded) == [video, audio, picture]
    assert decoded[video].shape[0] == 2  # 1 s at 2 fps
    assert decoded[audio].shape == (8000,) and decoded[picture].size == (84, 56)
    ahead = {video: gray_frames(3, step=70), audio: tone[:4000], picture: image.resize((28, 28))}
    prompt = prepare_prompt(omni_processor, messages, api, ahead, family=FAMILY)
    assert prompt.multi_modal_data["video"] is ahead[video]
    assert prompt.multi_modal_data["audio"][0] is ahead[audio]  # (samples, rate)
    assert prompt.multi_modal_data["image"] is ahead[picture]
    assert prompt.counts == {"audio": 1, "image": 1, "video": 1}


def test_an_audio_url_part_is_the_clip_an_input_audio_part_is(omni_processor):
    """vLLM's ``audio_url`` part (a data: URL here) gives the same prompt and samples."""
    tone = np.sin(np.arange(12000) / 5).astype(np.float32) * 0.3
    data = wav_b64(tone, 16000)
    parts = [
        {"type": "audio_url", "audio_url": {"url": "data:audio/wav;base64," + data}},
        {"type": "input_audio", "input_audio": {"data": data, "format": "wav"}},
    ]
    by_url, inline = (
        prepare_prompt(omni_processor, [user_message(part, TEXT)], ApiSettings(), family=FAMILY)
        for part in parts
    )
    assert by_url.prompt_ids == inline.prompt_ids and by_url.counts["audio"] == 1
    assert np.array_equal(by_url.multi_modal_data["audio"][0], inline.multi_modal_data["audio"][0])
    assert by_url.expanded_ids == inline.expanded_ids


def test_media_limits_count_each_kind_over_all_messages():
    image = {"type": "image_url", "image_url": {"url": "data:image/png;base64,AAAA"}}
    audio = {"type": "input_audio", "input_audio": {"data": "AAAA"}}
    audio_url = {"type": "audio_url", "audio_url": {"url": "data:audio/wav;base64,AAAA"}}
    messages = [
        ChatMessage.model_validate({"role": "user", "content": [image, audio]}),
        ChatMessage(role="assistant", content="Seen."),
        ChatMessage.model_validate({"role": "user", "content": [image, audio_url]}),
    ]
    assert over_media_limits(messages, {"image": 2, "audio": 2}) is None
    found = over_media_limits(messages, {"audio": 1})  # both audio forms count
    assert found == "at most 1 audio item(s) per request; this one has 2"
    assert over_media_limits(messages, {}) is None  # no limit given: none applied
    found = over_media_limits(messages, {"image": {"count": 1, "width": 512}})
    assert found == "at most 1 image item(s) per request; this one has 2"


def test_a_heard_video_brings_its_track_as_the_prompts_audio(omni_processor):
    """use_audio_in_video: one video placeholder (the processors interleave the track's tokens
    with the frames'), the track as an audio item, and vLLM told to pair them."""
    tone = (np.round(np.sin(np.arange(24000) / 7) * 0.3 * 32768) / 32768).astype(np.float32)
    url = video_data_url(gray_frames(10, step=20), lossless=True, audio=tone)
    api = ApiSettings()
    prompt = prepare_prompt(
        omni_processor, [video_message(url)], api, use_audio_in_video=True, family=FAMILY
    )
    tokens = omni_processor.tokenizer.convert_tokens_to_ids(["<|video_pad|>", "<|audio_pad|>"])
    assert [prompt.prompt_ids.count(t) for t in tokens] == [1, 0]
    assert prompt.counts == {"audio": 1, "image": 0, "video": 1}
    track, rate = prompt.multi_modal_data["audio"]
    assert rate == 16000 and np.array_equal(track, tone)
    assert prompt.multi_modal_data["video"].shape[0] == 2
    assert prompt.mm_processor_kwargs == {"fps": 2.0, "use_audio_in_video": True}
    assert prompt.audio_seqlens.tolist() == [150]
    assert prompt.audio_clips == []  # with a video: the Thinker's vLLM encodes both


def test_a_heard_videos_track_too_short_for_the_features_is_refused(omni_processor):
    short = np.full(min_audio_samples(omni_processor) - 1, 0.1, np.float32)
    url = video_data_url(gray_frames(4), lossless=True, audio=short)
    with pytest.raises(
        MediaError, match="audio track is 200 samples; the shortest the model takes is 201"
    ):
        decode_media(omni_processor, [video_message(url)], ApiSettings(), use_audio_in_video=True)
    assert decode_media(omni_processor, [video_message(url)], ApiSettings())  # not heard: fine


def test_with_heard_videos_audio_parts_are_refused_and_tracks_count_as_audio():
    video = {"type": "video_url", "video_url": {"url": "data:video/mp4;base64,AAAA"}}
    audio = {"type": "input_audio", "input_audio": {"data": "AAAA"}}
    both = [ChatMessage.model_validate({"role": "user", "content": [video, audio]})]
    assert "send no input_audio parts" in over_media_limits(both, {}, use_audio_in_video=True)
    assert over_media_limits(both, {}) is None  # not heard: an audio part is fine
    videos = [ChatMessage.model_validate({"role": "user", "content": [video, video]})]
    limits = {"video": 2, "audio": 1}
    assert over_media_limits(videos, limits) is None
    found = over_media_limits(videos, limits, use_audio_in_video=True)
    assert found == "at most 1 audio item(s) per request; this one has 2"


def test_a_clips_features_do_not_depend_on_the_clips_beside_it(omni_processor):
    """Each clip's features as if alone (transformers' processor pads a shorter clip to the
    longest, which changes its last frame): the same clip, the same encoder input, in every
    turn of a chat; alone, exactly the processor's features. The prompt carries the clips'
    samples (the encoder stage makes their features) and their frame counts."""
    from tests.reference import sample_audio

    api = ApiSettings()
    short, longer = sample_audio()[:12000], sample_audio()[4000:] * 0.5

    def chat(*clips) -> list[ChatMessage]:
        parts = [
            {"type": "input_audio", "input_audio": {"data": wav_b64(c, 16000, "FLOAT")}}
            for c in clips
        ]
        return [ChatMessage.model_validate({"role": "user", "content": parts})]

    beside = prepare_prompt(omni_processor, chat(short, longer), api, family=FAMILY)
    assert np.array_equal(beside.audio_clips[0], short)
    assert beside.audio_seqlens.tolist() == [75, 125]
    alone = clip_features(omni_processor.feature_extractor, short)
    text = "<|audio_start|><|audio_pad|><|audio_end|>"
    theirs = omni_processor(text=text, audio=[short], return_tensors="pt")
    assert torch.equal(alone, theirs["input_features"][0])
    batched = omni_processor(text=text * 2, audio=[short, longer], return_tensors="pt")
    assert not torch.equal(alone, batched["input_features"][0][:, :75])
    assert batched["feature_attention_mask"].sum(-1).tolist() == [75, 125]


@pytest.mark.parametrize("samples", [201, 319, 320, 321, 16001, 479999, 480000, 500123])
def test_frame_counts_are_the_feature_extractors(omni_processor, samples):
    clip = np.random.default_rng(samples).standard_normal(samples).astype(np.float32) * 0.1
    assert audio_frames(omni_processor, [clip]).tolist() == [
        clip_features(omni_processor.feature_extractor, clip).shape[1]
    ]


def test_a_clip_too_short_for_the_features_is_refused(omni_processor):
    """The feature extractor's STFT needs more than n_fft/2 samples (it raised a RuntimeError
    on 200, which was a 500)."""
    shortest = min_audio_samples(omni_processor)
    clip = np.full(shortest - 1, 0.1, np.float32)
    part = {"type": "input_audio", "input_audio": {"data": wav_b64(clip, 16000, "FLOAT")}}
    with pytest.raises(MediaError, match=f"the shortest the model takes is {shortest}"):
        decode_media(omni_processor, [user_message(part)], ApiSettings())
    clip_features(omni_processor.feature_extractor, np.full(shortest, 0.1, np.float32))


@pytest.mark.parametrize("shape", [(64, 96), (28, 28), (1080, 1920), (3000, 200), (17, 900)])
def test_image_grids_are_the_processors(omni_processor, shape):
    from PIL import Image

    from omni_serve.models.thinker_talker.thinker_inputs import image_grids

    image = Image.fromarray(np.zeros((*shape, 3), np.uint8))
    expected = omni_processor.image_processor(images=[image], return_tensors="pt")
    assert image_grids(omni_processor, [image]).tolist() == expected["image_grid_thw"].tolist()


PRESET_FIXTURES = {"qwen3_omni": "tiny_omni_path", "qwen2_5_omni": "tiny_qwen2_5_omni_path"}


CLIP_SECONDS = [[1.5], [0.75, 2.5, 0.1], [30.0, 4.0]]


@pytest.mark.parametrize(
    ("family", "seconds"),
    [("qwen3_omni", s) for s in [*CLIP_SECONDS, [31.0, 4.0]]]
    + [("qwen2_5_omni", s) for s in CLIP_SECONDS],  # it hears 30 s at most
)
def test_audio_placeholders_expand_as_the_processor_expands_them(family, seconds, request):
    """Each family's rule (its ``audio_tokens``) counts what its own processor expands."""
    from omni_serve.models.registry import thinker_talker_family
    from tests.reference import sample_audio

    path = request.getfixturevalue(PRESET_FIXTURES[family])
    processor = AutoProcessor.from_pretrained(path)
    clips = [np.resize(sample_audio(), int(16000 * s)) for s in seconds]
    parts = [
        {"type": "input_audio", "input_audio": {"data": wav_b64(c, 16000, "FLOAT")}} for c in clips
    ]
    text_part = {"type": "text", "text": "What is said?"}
    messages = [ChatMessage.model_validate({"role": "user", "content": [*parts, text_part]})]
    api = ApiSettings(max_audio_seconds=60)
    rules = thinker_talker_family(family)
    prompt = prepare_prompt(processor, messages, api, family=rules)
    text = processor.tokenizer.decode(prompt.prompt_ids)
    theirs = processor(text=text, audio=clips, return_tensors="pt")["input_ids"][0]
    assert prompt.expanded_ids == theirs.tolist()


def test_a_developer_message_is_the_system_prompt(omni_processor):
    """OpenAI's newer name for the system role: the model sees a system turn."""
    chats = [
        [ChatMessage(role=role, content="Answer briefly."), ChatMessage(role="user", content="Hi")]
        for role in ("developer", "system")
    ]
    prompts = [
        prepare_prompt(omni_processor, chat, ApiSettings(), family=FAMILY).prompt_ids
        for chat in chats
    ]
    assert prompts[0] == prompts[1]
    system = omni_processor.tokenizer.encode("<|im_start|>system")
    assert prompts[0][: len(system)] == system


def _image_part(color: int) -> dict:
    from PIL import Image

    url = png_data_url(Image.new("RGB", (56, 56), (color, 40, 90)))
    return {"type": "image_url", "image_url": {"url": url}}


def test_a_prompts_content_key_places_each_images_digest_where_its_placeholder_starts(
    omni_processor,
):
    from omni_serve.kv_store.content_key import block_hashes
    from tests.omni_serve.kv_store.conftest import shared_blocks

    system = ChatMessage.model_validate({"role": "system", "content": "Be brief. " * 30})
    asked = [system, user_message(_image_part(10), TEXT)]
    same = prepare_prompt(omni_processor, asked, ApiSettings(), family=FAMILY).content
    again = prepare_prompt(omni_processor, asked, ApiSettings(), family=FAMILY).content
    other = prepare_prompt(
        omni_processor,
        [system, user_message(_image_part(200), TEXT)],
        ApiSettings(),
        family=FAMILY,
    ).content
    pad = omni_processor.tokenizer.convert_tokens_to_ids(omni_processor.image_token)
    ((offset, digest),) = same.media
    assert same.token_ids[offset] == pad and same.token_ids[offset - 1] != pad
    assert same == again and other.token_ids == same.token_ids and other.media != same.media
    ours, theirs = (block_hashes(c, 16, "ns") for c in (same, other))
    assert shared_blocks(ours, theirs) == offset // 16  # equal up to the image's block


@pytest.mark.parametrize("family", ["qwen3_omni", "qwen2_5_omni"])
def test_a_clip_longer_than_the_model_hears_is_refused_naming_it(family, request):
    """Qwen2.5-Omni's processor cuts a clip at 30 s (vLLM would hear only that much, and the
    Talker would place the whole): a 400 naming the part. Qwen3-Omni hears it whole."""
    from omni_serve.models.registry import thinker_talker_family

    processor = AutoProcessor.from_pretrained(request.getfixturevalue(PRESET_FIXTURES[family]))
    clip = np.full(16000 * 31, 0.1, np.float32)
    part = {"type": "input_audio", "input_audio": {"data": wav_b64(clip, 16000, "FLOAT")}}
    messages = [user_message(part, TEXT)]
    api = ApiSettings(max_audio_seconds=60)
    rules = thinker_talker_family(family)
    if family == "qwen3_omni":
        assert prepare_prompt(processor, messages, api, family=rules).counts["audio"] == 1
        return
    with pytest.raises(MediaError) as caught:
        prepare_prompt(processor, messages, api, family=rules)
    assert caught.value.param == "messages[0].content[0]"
    assert "at most 30 s of audio per clip; this one is 31.0 s" in str(caught.value)
