"""OpenAI's transcription forms: what this server cannot honour is a 400 naming the field,
and the answer comes in the shape the openai client reads."""

from __future__ import annotations

import io
import json
import types

import pytest
from fastapi import UploadFile

from omni_serve.api.errors import ApiError
from omni_serve.api.transcriptions import (
    TranscriptionForm,
    TranscriptWriter,
    TranslationForm,
    refuse_unsupported_form,
    transcript_budget,
    transcription_response,
    usage_tokens,
)


def form(cls=TranscriptionForm, **fields) -> TranscriptionForm:
    clip = UploadFile(io.BytesIO(b"RIFF"), filename="clip.wav")
    return cls.model_validate({"file": clip, "model": "qwen3-omni", **fields})


@pytest.mark.parametrize(
    ("fields", "param", "reason"),
    [
        ({"response_format": "srt"}, "response_format", "srt needs timestamps"),
        ({"response_format": "verbose_json"}, "response_format", "verbose_json needs timestamps"),
        ({"timestamp_granularities[]": ["word"]}, "timestamp_granularities", "timestamps"),
        ({"include[]": ["logprobs"]}, "include", "logprobs"),
        ({"stream": True, "response_format": "text"}, "response_format", "json events"),
    ],
)
def test_what_a_transcription_cannot_honour_is_a_400_naming_it(fields, param, reason):
    with pytest.raises(ApiError) as refused:
        refuse_unsupported_form(form(**fields))
    assert refused.value.status == 400 and refused.value.param == param
    assert reason in refused.value.message


def test_translations_refuse_timestamps_too_and_take_plain_forms():
    with pytest.raises(ApiError, match="vtt needs timestamps"):
        refuse_unsupported_form(form(TranslationForm, response_format="vtt"))
    for fields in ({}, {"response_format": "text", "prompt": "Names: Ana."}):
        refuse_unsupported_form(form(TranslationForm, **fields))
    refuse_unsupported_form(form(stream=True, language="fr", temperature=0.2))


def test_the_answer_as_json_text_or_events():
    usage = usage_tokens(50, 7)
    assert usage == {"type": "tokens", "input_tokens": 50, "output_tokens": 7, "total_tokens": 57}
    assert json.loads(transcription_response("hi", usage, "json").body) == {
        "text": "hi",
        "usage": usage,
    }
    plain = transcription_response("hi", usage, "text")
    assert plain.body == b"hi" and plain.media_type == "text/plain"
    writer = TranscriptWriter()
    result = types.SimpleNamespace(text="hi there", prompt_tokens=50, token_ids=[1, 2])
    lines = writer.start() + [
        line
        for event in (
            types.SimpleNamespace(kind="text", text="hi"),
            types.SimpleNamespace(kind="text", text=""),
            types.SimpleNamespace(kind="text", text=" there"),
            types.SimpleNamespace(kind="done", result=result),
        )
        for line in writer.event(event)
    ]
    events = [json.loads(line.removeprefix("data: ")) for line in lines]
    assert events == [
        {"type": "transcript.text.delta", "delta": "hi"},
        {"type": "transcript.text.delta", "delta": " there"},
        {"type": "transcript.text.done", "text": "hi there", "usage": usage_tokens(50, 2)},
    ]
    error = json.loads(writer.error("past the deadline", "timeout_error").removeprefix("data: "))
    assert error["type"] == "error" and error["error"]["type"] == "timeout_error"


@pytest.mark.parametrize(
    ("seconds", "limit", "budget"),
    [
        (1.0, 2048, 64),  # a short clip gets the floor
        (10.0, 2048, 160),  # 16 tokens a second of audio
        (60.0, 512, 512),  # never past the server's limit
        (None, 2048, 2048),  # a clip of unknown length: the limit
    ],
)
def test_a_transcripts_default_budget_follows_the_clips_length(seconds, limit, budget):
    assert transcript_budget(seconds, limit) == budget
