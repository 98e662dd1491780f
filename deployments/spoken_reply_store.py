"""The app's spoken replies by audio id (``omni_serve.sessions.spoken_replies``), one replica
shared by every ingress replica: a conversation's next turn reaches whichever ingress replica
Serve's proxy picks, so each ingress keeping its own would miss most lookups. One handle call
per spoken reply, and one per turn that names a reply by its id."""

from __future__ import annotations

from ray import serve
from ray.serve.handle import DeploymentHandle

from deployments.handle_calls import FAILED, call_cache
from omni_serve.sessions.spoken_replies import SpokenReplies

KEEP_TIMEOUT_S = 1.0  # a reply waits at most this on a store being replaced
LOOKUP_TIMEOUT_S = 5.0


@serve.deployment(
    num_replicas=1,
    max_ongoing_requests=1000,
    ray_actor_options={"num_cpus": 0},
    health_check_period_s=10,
)
class SpokenReplyStore:
    def __init__(self, ttl_s: float, max_bytes: int) -> None:
        self.replies = SpokenReplies(ttl_s, max_bytes)

    async def keep(self, audio_id: str, transcript: str) -> bool:
        return self.replies.keep(audio_id, transcript)

    async def transcripts(self, audio_ids: list[str]) -> list[str | None]:
        return [self.replies.transcript(audio_id) for audio_id in audio_ids]

    async def stats(self) -> dict[str, int]:
        return {"replies": len(self.replies), "bytes": self.replies.nbytes}


class SpokenReplyClient:
    """The ingress's side. A store that fails or does not answer fails no reply (its audio id
    then names nothing: a later turn naming it gets the 400 asking for its text)."""

    def __init__(self, handle: DeploymentHandle) -> None:
        self.handle = handle

    async def keep(self, audio_id: str, transcript: str) -> None:
        await call_cache(self.handle.keep, audio_id, transcript, timeout_s=KEEP_TIMEOUT_S)

    async def transcripts(self, audio_ids: list[str]) -> list[str | None] | None:
        """Each reply's text (None: not kept); None when the store could not be asked."""
        found = await call_cache(self.handle.transcripts, audio_ids, timeout_s=LOOKUP_TIMEOUT_S)
        return None if found is FAILED else found

    async def stats(self) -> dict[str, int]:
        stats = await call_cache(self.handle.stats, timeout_s=LOOKUP_TIMEOUT_S)
        return {"replies": 0, "bytes": 0} if stats is FAILED else stats
