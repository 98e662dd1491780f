"""Handle calls as the ingresses make them: cancelled downstream when the caller stops
waiting, retried once when the replica died before answering, and "no room" turned into a
clear 503.

- Serve cancels a replica's child requests when the replica's own request is cancelled (a
  client disconnect), but not when only a task inside it is (a server-side deadline): without
  the cancel here a timed-out request would go on running in every stage behind the ingress.
- A replica that dies (crash, OOM kill, node loss) fails its in-flight calls with
  ``RayActorError``. Stage calls are pure functions of their arguments, so a call that has
  produced nothing yet is sent again, to another replica; a stream that has already yielded
  is not (the client has part of the answer): it ends with ``ReplicaDied`` naming the stage
  (503 with Retry-After). So does a retry that finds the refs it carries gone: the dead
  replica had read them and handed them back (it finished with them, then died before its
  answer arrived), so only the whole request can be run again. A request whose client has
  seen nothing yet (a unary chat or speech request, an image) is run again from the start
  once: ``rerun_after_replica_death``.
- Serve's ``BackPressureError`` / ``DeploymentUnavailableError`` become ``StageUnavailable``
  (503 with Retry-After).
- Once a call has ended in any way (answered, refused, failed, cancelled while still queued at
  the replica), the tensor-channel refs it carried that no consumer read are freed here (else
  their shared-memory segments stay in use until the producer's lease runs out); refs a
  consumer read are its own to hand back.
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any, TypeVar

from ray.exceptions import RayActorError
from ray.serve.exceptions import BackPressureError, DeploymentUnavailableError

from omni_serve.api.errors import ReplicaDied, StageUnavailable
from omni_serve.compat.ray_serve import dead_deployment
from omni_serve.transport import ChannelError, TensorRef, release

log = logging.getLogger("ray.serve")
UNAVAILABLE_RETRY_AFTER_S = 5.0  # a stage with no running replica: Serve is replacing it
RETRIES_AFTER_REPLICA_DEATH = 1
T = TypeVar("T")


def _carried_refs(args: Any) -> list[TensorRef]:
    """Channel refs among a call's arguments, at any depth of the messages, dicts, lists and
    tuples it passes (a Talker request carries the Thinker request, which carries encoder
    rows)."""
    if isinstance(args, TensorRef):
        return [args]
    if dataclasses.is_dataclass(args) and not isinstance(args, type):
        args = [getattr(args, f.name) for f in dataclasses.fields(args)]
    elif isinstance(args, dict):
        args = list(args.values())
    if isinstance(args, list | tuple):
        return [ref for arg in args for ref in _carried_refs(arg)]
    return []


def _unavailable(exc: Exception) -> StageUnavailable:
    if isinstance(exc, BackPressureError):
        return StageUnavailable(f"server busy: {exc}", exc.retry_after_s)
    return StageUnavailable(f"stage unavailable: {exc}", UNAVAILABLE_RETRY_AFTER_S)


async def call(method: Any, *args: Any) -> Any:
    """``await method.remote(*args)`` for a handle method, e.g. ``call(handle.decode, x)``."""
    died: RayActorError | None = None
    try:
        for attempt in range(RETRIES_AFTER_REPLICA_DEATH + 1):
            response = method.remote(*args)
            try:
                return await response
            except asyncio.CancelledError:
                response.cancel()
                raise
            except (BackPressureError, DeploymentUnavailableError) as exc:
                raise _unavailable(exc) from None
            except RayActorError as exc:
                if attempt == RETRIES_AFTER_REPLICA_DEATH:
                    raise ReplicaDied(dead_deployment(exc)) from exc
                died = exc
                log.warning("a replica died during a stage call; sending it again: %s", exc)
            except ChannelError as exc:  # from the stage, as a RayTaskError that is one too
                if died is None:
                    raise
                raise ReplicaDied(dead_deployment(died)) from exc  # its inputs went with it
        raise AssertionError("unreachable")
    finally:
        release(*_carried_refs(args))


async def stream(method: Any, *args: Any) -> AsyncIterator[Any]:
    """``async for item in method.remote(*args)`` for a streaming handle method."""
    died: RayActorError | None = None
    try:
        for attempt in range(RETRIES_AFTER_REPLICA_DEATH + 1):
            responses = method.remote(*args)
            finished, yielded = False, False
            try:
                async for item in responses:
                    yielded = True
                    yield item
                finished = True
                return
            except (BackPressureError, DeploymentUnavailableError) as exc:
                raise _unavailable(exc) from None
            except RayActorError as exc:
                if yielded or attempt == RETRIES_AFTER_REPLICA_DEATH:
                    raise ReplicaDied(dead_deployment(exc)) from exc
                died = exc
                log.warning("a replica died before streaming anything; sending it again: %s", exc)
            except ChannelError as exc:
                if died is None:
                    raise
                raise ReplicaDied(dead_deployment(died)) from exc
            finally:  # cancelled, closed early, or failed: stop the stage's work on it
                if not finished:
                    responses.cancel()
    finally:
        release(*_carried_refs(args))


async def rerun_after_replica_death(run: Callable[[], Awaitable[T]]) -> T:
    """``await run()``, once more from the start if a stage replica died under it.

    For requests whose client has received nothing yet: the rerun waits for Serve's replacement
    replica (or goes to another one) and the client gets a whole answer instead of a 503.
    """
    try:
        return await run()
    except ReplicaDied as exc:
        log.warning("%s; running the request again", exc)
        return await run()


FAILED = object()  # what ``call_cache`` answers for a call that failed or did not answer


async def call_cache(method: Any, *args: Any, timeout_s: float) -> Any:
    """``await method.remote(*args)`` on one of the app's caches (the session store, the
    spoken replies): its answer, or ``FAILED`` (logged) when it fails or takes longer than
    ``timeout_s`` (being replaced, say). A cache that fails never fails a request."""
    try:
        return await asyncio.wait_for(method.remote(*args), timeout_s)
    except Exception as exc:
        log.warning("%s failed (%s): the request goes on without it", method, exc)
        return FAILED
