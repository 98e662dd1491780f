"""A dead replica's deployment is read from Ray's error, bare or wrapped by the replica that
was waiting on it, so clients hear which stage died."""

from __future__ import annotations

from ray.core.generated.common_pb2 import ActorDiedErrorContext
from ray.exceptions import ActorDiedError, RayTaskError

from omni_serve.compat.ray_serve import dead_deployment


def test_the_dead_deployment_is_named_bare_and_wrapped():
    context = ActorDiedErrorContext(class_name="ServeReplica:default:thinker", actor_id=bytes(16))
    died = ActorDiedError(context)
    assert dead_deployment(died) == "thinker"
    wrapped = RayTaskError("speak", f"Traceback ...\nray.exceptions.ActorDiedError: {died}", died,
                           proctitle="ray::ServeReplica:default:talker")  # fmt: skip
    assert dead_deployment(wrapped) == "thinker"


def test_an_error_without_the_class_name_names_nothing():
    assert dead_deployment(ActorDiedError()) is None
