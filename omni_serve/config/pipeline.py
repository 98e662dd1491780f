"""The pipeline schema: one served model as stages, the edges between them, and its API."""

from __future__ import annotations

from typing import Any, Literal
from urllib.parse import urlsplit

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from omni_serve.config.deployment import DeploymentSettings
from omni_serve.config.engine import EngineSettings, StageKind, check_stage_engine
from omni_serve.config.kv_store import KVStoreConfig

ChannelBackend = Literal[
    "auto", "inline", "object_store", "shared_memory", "direct", "shared_memory_direct"
]


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid")


class StageConfig(_Strict):
    name: str = Field(pattern=r"^[a-z][a-z0-9_]*$", description="Unique stage name in the graph.")
    kind: StageKind = Field(description="What the stage does; picks its deployment class.")
    engine: EngineSettings | None = Field(
        None, description="Engine for the stage; none for stages without a model (ingress)."
    )
    deployment: DeploymentSettings = Field(
        default_factory=DeploymentSettings, description="Serve deployment settings."
    )

    def serve_options(self) -> dict[str, Any]:
        """``Deployment.options`` for the stage: its deployment settings, plus a placement
        group holding the replica and its parallel workers on one node when it has them."""
        opts = self.deployment.serve_options()
        parallel = self.engine.parallel if self.engine is not None else None
        if parallel is not None and parallel.world_size > 1:
            actor = self.deployment.ray_actor_options
            worker = {"CPU": parallel.worker_cpus, "GPU": parallel.worker_gpus}
            opts["placement_group_bundles"] = [
                {"CPU": actor.num_cpus, "GPU": actor.num_gpus},
                *([worker] * parallel.world_size),
            ]
            opts["placement_group_strategy"] = "STRICT_PACK"
        return opts


class ChannelSettings(_Strict):
    backend: ChannelBackend = Field(
        "auto", description="Tensor channel backend; auto picks by payload size and locality."
    )
    inline_max_bytes: int = Field(
        64 * 1024, ge=0, description="Payloads up to this size ride the handle call itself."
    )


class EdgeConfig(_Strict):
    source: str = Field(description="Stage that produces the payload.")
    target: str = Field(description="Stage that consumes it.")
    payload: str = Field(description="What flows (e.g. 'thinker_rows', 'codec_frames').")
    channel: ChannelSettings = Field(
        default_factory=ChannelSettings, description="How heavy tensors on this edge travel."
    )


class ApiSettings(_Strict):
    """The HTTP API. Where it listens is Serve's ``http_options`` (Serve config YAML), not this."""

    served_model_name: str | None = Field(
        None, description="Model id clients send; defaults to the pipeline name."
    )
    max_tokens_limit: int = Field(
        2048, ge=1, description="Largest max_tokens a request may ask for."
    )
    default_max_tokens: int = Field(256, ge=1, description="max_tokens when a request omits it.")
    max_request_bytes: int = Field(
        32 * 1024 * 1024,
        ge=1024,
        description="Largest request body accepted (413 past it), before any parsing; leaves "
        "room for base64 media up to max_audio_bytes.",
    )
    max_audio_bytes: int = Field(
        10 * 1024 * 1024, ge=1, description="Largest decoded input audio file accepted."
    )
    max_audio_seconds: float = Field(60.0, gt=0, description="Longest input audio accepted.")
    max_video_bytes: int = Field(
        16 * 1024 * 1024, ge=1, description="Largest decoded input video file accepted."
    )
    max_video_seconds: float = Field(
        30.0,
        gt=0,
        description="Longest input video accepted (its frames are decoded in the ingress).",
    )
    video_fps: float = Field(
        2.0,
        gt=0,
        description="Frames taken per second of input video; the Thinker's positions place "
        "them in time at this rate.",
    )
    max_image_bytes: int = Field(
        20 * 1024 * 1024,
        ge=1,
        description="Largest input image file accepted (data: URL or fetched).",
    )
    max_input_image_pixels: int = Field(
        50_000_000,
        ge=1,
        description="Most pixels an input image may have, checked from its header before it "
        "is decoded (a small PNG can hold gigabytes of pixels); a 48-megapixel photo fits.",
    )
    allow_remote_urls: bool = Field(
        False,
        description="Whether the ingress fetches http(s) audio, image and video URLs. Off by "
        "default: clients could make the server read its own network (cloud metadata, "
        "internal services); name the hosts allowed in allowed_media_domains.",
    )
    allowed_media_domains: list[str] | None = Field(
        None,
        description="With allow_remote_urls: the only hosts (exact names) media URLs and "
        "their redirects may name. None: any host.",
    )
    allow_private_media_addresses: bool = Field(
        False,
        description="With allow_remote_urls: whether media URLs may reach hosts that resolve to "
        "loopback, private, link-local (cloud metadata) or other non-public addresses. Off: "
        "such a URL is a 400, checked on every redirect hop where the connection is opened, "
        "and fetches do not use HTTP(S)_PROXY (see media_proxy). On only for media servers "
        "on an internal network, best with allowed_media_domains naming them.",
    )
    media_proxy: str | None = Field(
        None,
        description="With allow_remote_urls: the HTTP proxy (http://host:port) media fetches go "
        "through, for servers whose egress must. The address check still runs: each URL's "
        "host is resolved and checked before the proxy is asked, and a plain http request "
        "names the checked address. None: direct connections.",
    )
    media_fetch_timeout_s: float = Field(
        15.0, gt=0, description="Longest the fetches of one request's media URLs may take."
    )
    api_key: str | None = Field(
        None, description="If set, requests must send 'Authorization: Bearer <api_key>'."
    )
    api_key_env: str | None = Field(
        None,
        description="Name of an environment variable (in the ingress replica) holding the API "
        "key; keeps the secret out of the config file. Exclusive with api_key.",
    )
    allow_unauthenticated: bool = Field(
        False,
        description="Serve without an API key even when Serve's HTTP proxy binds a non-loopback "
        "address (only behind a gateway that authenticates). Off: such a deployment fails to "
        "start until a key is set.",
    )
    request_timeout_s: float | None = Field(
        600.0,
        gt=0,
        description="Longest a request may run on the server; past it the request is "
        "cancelled in every stage (504, or an error event once streaming). None = no limit.",
    )
    ws_idle_timeout_s: float | None = Field(
        300.0,
        gt=0,
        description="A WebSocket client that sends no request for this long is closed (it "
        "holds an ingress slot while open). None = never.",
    )
    playground: bool = Field(
        True,
        description="Serve the playground page at / (talk to the model, make images, in a "
        "browser); its files are open, everything it calls needs the API key. Turn it off "
        "for production.",
    )
    realtime_early_answer_ms: int | None = Field(
        200,
        ge=0,
        description="/v1/realtime with server_vad: once the user has been silent this long, "
        "start the answer unseen, so its first audio is ready when the silence window ends; "
        "speech that resumes discards it. None = answer only when the turn ends.",
    )
    realtime_start_cushion_ms: int = Field(
        400,
        ge=0,
        description="/v1/realtime: audio held back at the start of an answer, for each other "
        "spoken chat the ingress replica is running (any way in; not the session's own, not "
        "text-only chats), then sent at once. Concurrent answers' first frames come slower "
        "than real time, and a client that plays on arrival falls silent mid-sentence; this "
        "trades turn latency under load for unbroken speech. Alone, an answer holds nothing. "
        "0 = send audio as it is made.",
    )
    realtime_max_conversation_bytes: int | None = Field(
        64 * 1024 * 1024,
        ge=64 * 1024,
        description="/v1/realtime: the most text and audio one session's conversation holds. "
        "Past it, audio the model no longer hears as audio (its earlier answers', the user's "
        "turns before the last few) is let go, oldest first, keeping their transcripts; an "
        "item the model would still hear past it is refused with an error asking the client "
        "to delete items. None = no limit (a session's memory then grows with its length).",
    )
    spoken_reply_ttl_s: float = Field(
        3600.0,
        ge=0,
        description="A spoken reply's transcript is kept this long under its audio id (the "
        "reply's expires_at), so a later turn may name the reply by that id as OpenAI's "
        "multi-turn audio does. 0 = keep none (such a turn must send the transcript).",
    )
    spoken_reply_max_bytes: int = Field(
        64 * 1024 * 1024,
        ge=0,
        description="The most transcript bytes kept under audio ids; past it the least "
        "recently used are dropped (a turn naming one then gets a 400 asking for its text).",
    )
    image_default_size: str = Field(
        "1024x1024", description="Image size ('WxH') when a request omits it (image models)."
    )
    image_default_steps: int = Field(
        28, ge=1, le=100, description="Denoising steps when a request omits them."
    )
    image_max_pixels: int = Field(
        1024 * 1024, ge=64 * 64, description="Largest image (width x height) a request may ask for."
    )

    @model_validator(mode="after")
    def _one_key_source(self) -> ApiSettings:
        if self.api_key is not None and self.api_key_env is not None:
            raise ValueError("set api_key or api_key_env, not both")
        return self

    @field_validator("media_proxy")
    @classmethod
    def _proxy_url(cls, value: str | None) -> str | None:
        if value is not None:
            url = urlsplit(value)
            if url.scheme not in ("http", "https") or not url.hostname:
                raise ValueError(f"media_proxy must be an http(s)://host:port URL, not {value!r}")
        return value

    @model_validator(mode="after")
    def _fetch_settings_need_remote_urls(self) -> ApiSettings:
        for name in ("allowed_media_domains", "allow_private_media_addresses", "media_proxy"):
            if getattr(self, name) not in (None, False) and not self.allow_remote_urls:
                raise ValueError(
                    f"{name} is set but allow_remote_urls is false: no media URL would be fetched"
                )
        return self


class PipelineConfig(_Strict):
    name: str = Field(description="Pipeline (and default served model) name.")
    family: Literal["qwen3_omni", "qwen2_5_omni", "qwen_image"] = Field(
        description="Model family; names the glue code in omni_serve/models/<family>/."
    )
    model: str = Field(
        description="A preset (e.g. tiny-qwen3-omni, built on first use) or a checkpoint dir."
    )
    stages: list[StageConfig] = Field(min_length=1, description="The graph's stages.")
    edges: list[EdgeConfig] = Field(
        default_factory=list, description="Payload flows between stages."
    )
    api: ApiSettings = Field(default_factory=ApiSettings, description="HTTP API settings.")
    kv_store: KVStoreConfig = Field(
        default_factory=KVStoreConfig,
        description="With a session_kv edge: where conversations' KV prefixes are kept between "
        "turns (memory, then disk) and found again (by session or by prompt content).",
    )

    @model_validator(mode="after")
    def _graph_is_consistent(self) -> PipelineConfig:
        names = [s.name for s in self.stages]
        duplicates = sorted({n for n in names if names.count(n) > 1})
        if duplicates:
            raise ValueError(f"duplicate stage names: {duplicates}")
        for i, edge in enumerate(self.edges):
            for end in ("source", "target"):
                if getattr(edge, end) not in names:
                    raise ValueError(
                        f"edges[{i}].{end}: unknown stage {getattr(edge, end)!r} (stages: {names})"
                    )
        for stage in self.stages:
            gpus = stage.deployment.ray_actor_options.num_gpus
            check_stage_engine(stage.name, stage.kind, stage.engine, gpus, self.family)
        return self

    def stage(self, name: str) -> StageConfig:
        for stage in self.stages:
            if stage.name == name:
                return stage
        raise KeyError(f"pipeline {self.name!r} has no stage {name!r}")

    @property
    def served_model_name(self) -> str:
        return self.api.served_model_name or self.name
