"""The KubeRay manifest deploys this repo's Qwen3-Omni app as Serve would accept it, on pods
with room for every stage's first replica (it cannot run here: no Kubernetes, no GPUs)."""

from __future__ import annotations

from pathlib import Path

import ray
import yaml

from omni_serve.config import load_pipeline_config
from omni_serve.scaling.pipeline_policy import PipelineAutoscalingPolicy

REPO = Path(__file__).parents[3]
MANIFEST = REPO / "configs" / "kuberay" / "qwen3_omni_rayservice.yaml"


def manifest() -> dict:
    return yaml.safe_load(MANIFEST.read_text())


def test_the_serve_config_is_one_serve_accepts_and_names_this_repos_parts():
    from ray.serve.schema import ServeDeploySchema

    service = manifest()
    assert (service["apiVersion"], service["kind"]) == ("ray.io/v1", "RayService")
    serve_yaml = yaml.safe_load(service["spec"]["serveConfigV2"])
    serve_config = ServeDeploySchema.model_validate(serve_yaml)
    [app] = serve_config.applications
    assert app.import_path == "graphs.qwen3_omni:build_app"
    pipeline = load_pipeline_config(REPO / app.args["pipeline_config"])
    assert pipeline.api.api_key_env == "OMNI_SERVE_API_KEY"  # the proxy binds 0.0.0.0
    policy = app.autoscaling_policy
    assert policy["policy_function"].endswith(":PipelineAutoscalingPolicy")
    follow = PipelineAutoscalingPolicy(**policy["policy_kwargs"]).follow
    assert set(follow) | {r.leader for r in follow.values()} <= {s.name for s in pipeline.stages}


def test_the_cluster_runs_the_installed_ray_and_hands_every_pod_the_api_key():
    cluster = manifest()["spec"]["rayClusterConfig"]
    assert cluster["rayVersion"] == ray.__version__
    pods = [cluster["headGroupSpec"]] + cluster["workerGroupSpecs"]
    for pod in pods:
        [container] = pod["template"]["spec"]["containers"]
        assert "OMNI_SERVE_API_KEY" in {e["name"] for e in container["env"]}


def test_every_pod_mounts_memory_on_dev_shm():
    """A pod's own /dev/shm is 64 MB: the channel's shared memory would not fit (and Ray's
    object store would fall back to disk)."""
    cluster = manifest()["spec"]["rayClusterConfig"]
    for pod in [cluster["headGroupSpec"]] + cluster["workerGroupSpecs"]:
        spec = pod["template"]["spec"]
        [container] = spec["containers"]
        [mount] = [m for m in container["volumeMounts"] if m["mountPath"] == "/dev/shm"]
        [volume] = [v for v in spec["volumes"] if v["name"] == mount["name"]]
        assert volume["emptyDir"]["medium"] == "Memory"


def test_the_minimum_gpu_workers_hold_every_stages_first_replica():
    service = manifest()
    app = yaml.safe_load(service["spec"]["serveConfigV2"])["applications"][0]
    pipeline = load_pipeline_config(REPO / app["args"]["pipeline_config"])
    gpus_needed = 0.0
    for stage in pipeline.stages:
        deployment = stage.deployment
        first = (
            deployment.autoscaling_config.min_replicas
            if deployment.autoscaling_config
            else (deployment.num_replicas)
        )
        gpus_needed += first * deployment.ray_actor_options.num_gpus
    [gpu_group] = service["spec"]["rayClusterConfig"]["workerGroupSpecs"]
    [container] = gpu_group["template"]["spec"]["containers"]
    gpus_per_pod = int(container["resources"]["limits"]["nvidia.com/gpu"])
    assert gpu_group["minReplicas"] * gpus_per_pod >= gpus_needed > 0
