"""A Thinker-Talker omni model as a graph of Serve deployments: Ingress → (Encoder) → Thinker
(→ Talker → Code2wav). The same deployments serve every family (Qwen3-Omni, Qwen2.5-Omni): the
pipeline config's ``family`` picks what each stage loads (``models/thinker_talker/family.py``).
``graphs/qwen3_omni.py`` and ``graphs/qwen2_5_omni.py`` are the apps, with their defaults.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from ray.serve import Application

from deployments.code2wav import Code2WavDeployment
from deployments.common import find_edge
from deployments.encoder import EncoderDeployment
from deployments.omni_ingress import OmniIngress
from deployments.session_store import SessionStore
from deployments.spoken_reply_store import SpokenReplyStore
from deployments.talker import TalkerDeployment
from deployments.thinker import ThinkerDeployment
from graphs.pipeline_paths import pipeline_path
from omni_serve.config import PipelineConfig, load_pipeline_config

# Without an encoder the Thinker encodes media itself; without a Talker and Code2wav the app
# answers in text only (what the Thinking and Captioner checkpoints, which have no Talker, need).
OPTIONAL_STAGES = ("encoder", "talker", "code2wav")
STAGE_CLASSES = {
    "encoder": EncoderDeployment,
    "thinker": ThinkerDeployment,
    "talker": TalkerDeployment,
    "code2wav": Code2WavDeployment,
}


def build_thinker_talker_app(args: dict[str, Any] | None, default_pipeline: Path) -> Application:
    """``args``: a Serve config's application args, ``{pipeline_config: <path>}`` (relative
    paths resolve against the repo root as well as the working directory, so the same YAML
    works for ``serve run`` and ``serve deploy``)."""
    args = args or {}
    config: PipelineConfig = load_pipeline_config(
        pipeline_path(args.get("pipeline_config", default_pipeline))
    )
    data = config.model_dump(mode="json")
    kinds = {s.kind for s in config.stages}
    if ("talker" in kinds) != ("code2wav" in kinds):
        raise ValueError(
            f"pipeline {config.name!r}: talker and code2wav stages go together (a "
            "spoken reply needs both); leave both out to serve text only"
        )
    bound = {}
    for kind, cls in STAGE_CLASSES.items():
        stage = next((s for s in config.stages if s.kind == kind), None)
        if stage is None:
            if kind in OPTIONAL_STAGES:
                continue
            raise ValueError(f"pipeline {config.name!r} has no {kind!r} stage")
        options = stage.serve_options()
        upstream = (bound["thinker"],) if kind == "talker" else ()  # the Talker pulls text
        bound[kind] = cls.options(name=stage.name, **options).bind(data, stage.name, *upstream)
    # One store for the app, so a session's turns find their prefix from any ingress replica.
    store = None
    if find_edge(config, "thinker", "session_kv"):
        store = SessionStore.options(name="sessions").bind(data)
    # One keeper of spoken replies' transcripts, so a later turn may name a reply by its id.
    replies = None
    if "talker" in kinds and config.api.spoken_reply_ttl_s > 0:
        api = config.api
        replies = SpokenReplyStore.options(name="spoken_replies").bind(
            api.spoken_reply_ttl_s, api.spoken_reply_max_bytes
        )
    ingress = next(s for s in config.stages if s.kind == "ingress")
    return OmniIngress.options(name=ingress.name, **ingress.deployment.serve_options()).bind(
        data,
        bound["thinker"],
        bound.get("talker"),
        bound.get("code2wav"),
        bound.get("encoder"),
        store,
        replies,
    )
