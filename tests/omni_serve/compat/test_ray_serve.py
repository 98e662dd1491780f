"""A dead replica's deployment is read from Ray's error, bare or wrapped by the replica that
was waiting on it, so clients hear which stage died; the internal KV degrades to "unknown"
when Ray's API fails; a stopped head's address file is removed only when it names that head."""

from __future__ import annotations

from ray.core.generated.common_pb2 import ActorDiedErrorContext
from ray.exceptions import ActorDiedError, RayTaskError

from omni_serve.compat import ray_serve
from omni_serve.compat.ray_serve import dead_deployment, forget_cluster_address


def test_the_dead_deployment_is_named_bare_and_wrapped():
    context = ActorDiedErrorContext(class_name="ServeReplica:default:thinker", actor_id=bytes(16))
    died = ActorDiedError(context)
    assert dead_deployment(died) == "thinker"
    wrapped = RayTaskError(
        "speak",
        f"Traceback ...\nray.exceptions.ActorDiedError: {died}",
        died,
        proctitle="ray::ServeReplica:default:talker",
    )
    assert dead_deployment(wrapped) == "thinker"


def test_an_error_without_the_class_name_names_nothing():
    assert dead_deployment(ActorDiedError()) is None


def test_the_kv_reads_none_and_warns_once_when_rays_api_fails(monkeypatch, caplog):
    import ray.experimental.internal_kv as internal_kv

    def broken(*args, **kwargs):
        raise RuntimeError("internal KV gone")

    monkeypatch.setattr(internal_kv, "_internal_kv_get", broken)
    monkeypatch.setattr(internal_kv, "_internal_kv_put", broken)
    monkeypatch.setattr(internal_kv, "_internal_kv_del", broken)
    monkeypatch.setattr(ray_serve, "_kv_failed", False)
    ray_serve.kv_put("host_id/n1", "h#1")  # no exception: the caller asks the nodes instead
    ray_serve.kv_del("host_id/n0")
    assert ray_serve.kv_get("host_id/n1") is None
    warnings = [r for r in caplog.records if "internal KV is not usable" in r.getMessage()]
    assert len(warnings) == 1


def test_a_stopped_heads_address_file_is_removed_only_when_it_names_that_head(
    monkeypatch, tmp_path
):
    import ray._common.utils as ray_utils

    path = tmp_path / "ray_current_cluster"
    monkeypatch.setattr(ray_utils, "get_ray_address_file", lambda temp_dir: str(path))
    path.write_text("10.0.0.9:6379")
    forget_cluster_address("10.0.0.1:6379")  # another cluster's: kept
    assert path.read_text() == "10.0.0.9:6379"
    forget_cluster_address("10.0.0.9:6379")
    assert not path.exists()
    forget_cluster_address("10.0.0.9:6379")  # no file: nothing to do
