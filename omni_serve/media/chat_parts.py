"""Chat messages and their content parts, as OpenAI's chat API sends them: text, and media
by value (base64) or by URL. The model families build their prompts from these."""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import BaseModel, Discriminator, Field, Tag, field_validator, model_validator
from pydantic_core import PydanticCustomError


class TextPart(BaseModel):
    type: Literal["text"] = Field(description="Content part type.")
    text: str = Field(description="The text.")


class InputAudio(BaseModel):
    data: str = Field(description="Base64-encoded audio file bytes.")
    format: Literal["wav", "mp3", "flac", "ogg"] = Field(
        "wav", description="Container format of the audio; the bytes must be of this format."
    )


class AudioPart(BaseModel):
    type: Literal["input_audio"] = Field(description="Content part type.")
    input_audio: InputAudio = Field(description="The audio clip.")


class AudioUrl(BaseModel):
    url: str = Field(
        description="A data: URL of an audio file, or an http(s) URL where the server fetches "
        "them (api.allow_remote_urls)."
    )


class AudioUrlPart(BaseModel):
    """vLLM's audio part, for clients written for vLLM."""

    type: Literal["audio_url"] = Field(description="Content part type.")
    audio_url: AudioUrl = Field(description="The audio clip.")


class ImageUrl(BaseModel):
    url: str = Field(
        description="A data: URL, or an http(s) URL where the server fetches them "
        "(api.allow_remote_urls)."
    )


class ImagePart(BaseModel):
    type: Literal["image_url"] = Field(description="Content part type.")
    image_url: ImageUrl = Field(description="The image.")


class VideoUrl(BaseModel):
    url: str = Field(
        description="A data: URL of a video file (mp4, webm, ...), or an http(s) URL where "
        "the server fetches them (api.allow_remote_urls)."
    )


class VideoPart(BaseModel):
    type: Literal["video_url"] = Field(description="Content part type.")
    video_url: VideoUrl = Field(
        description="The video: its frames, and its audio track with use_audio_in_video."
    )


_PART_TYPES: dict[str, type[BaseModel]] = {
    "text": TextPart,
    "input_audio": AudioPart,
    "audio_url": AudioUrlPart,
    "image_url": ImagePart,
    "video_url": VideoPart,
}


def _part_kind(part: Any) -> str | None:
    """The part's model by its ``type``, so that a bad part is reported against the kind it
    says it is (not against every kind it is not). Tagged by class name: pydantic puts the tag
    in an error's location, and a class name reads as a branch, not a field
    (``omni_serve.api.validation_errors``)."""
    kind = part.get("type") if isinstance(part, dict) else getattr(part, "type", None)
    model = _PART_TYPES.get(kind) if isinstance(kind, str) else None
    return model.__name__ if model else None


ContentPart = Annotated[
    Annotated[TextPart, Tag("TextPart")]
    | Annotated[AudioPart, Tag("AudioPart")]
    | Annotated[AudioUrlPart, Tag("AudioUrlPart")]
    | Annotated[ImagePart, Tag("ImagePart")]
    | Annotated[VideoPart, Tag("VideoPart")],
    Discriminator(
        _part_kind,
        custom_error_type="unknown_content_part",
        custom_error_message="a content part's type is one of " + ", ".join(map(repr, _PART_TYPES)),
    ),
]


class EarlierAudio(BaseModel):
    id: str = Field(min_length=1, description="The audio id of an earlier spoken reply.")


class ChatMessage(BaseModel):
    role: Literal["system", "developer", "user", "assistant"] = Field(
        description="Who wrote the message; 'developer', OpenAI's newer name for the system "
        "role, is taken as 'system'."
    )
    content: str | list[ContentPart] | None = Field(
        None,
        description="Text, or a list of content parts. Required, except on an assistant "
        "message that names an earlier spoken reply by its audio id.",
    )
    audio: EarlierAudio | None = Field(
        None,
        description="OpenAI's way back to an earlier spoken reply (assistant messages): its "
        "audio id, whose transcript the server kept until the reply's expires_at. With "
        "content, the content is what the model hears of it.",
    )

    @field_validator("role")
    @classmethod
    def _developer_is_system(cls, role: str) -> str:
        return "system" if role == "developer" else role

    @model_validator(mode="after")
    def _has_content(self) -> ChatMessage:
        if self.audio is not None and self.role != "assistant":
            raise PydanticCustomError(
                "audio_not_assistant", "audio names an earlier spoken reply: assistant only"
            )
        if self.content is None and self.audio is None:
            raise PydanticCustomError("content_missing", "content is required")
        return self

    @property
    def reply_by_id(self) -> str | None:
        """The audio id of the earlier spoken reply this message stands for, when only its id
        was sent (the ingress puts the kept transcript in as its content)."""
        return self.audio.id if self.content is None and self.audio is not None else None
