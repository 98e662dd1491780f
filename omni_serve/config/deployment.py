"""Per-stage Ray Serve deployment settings: replicas, autoscaling, resources, routing."""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

ROUTER_CLASSES = {  # Serve imports these by path in every process that calls the stage
    "least_loaded": "omni_serve.routing.routers:LeastLoadedRouter",
    "affinity": "omni_serve.routing.routers:AffinityRouter",
}


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid")


class AutoscalingConfig(_Strict):
    """Serve autoscaling, with defaults tuned for streaming (Serve's own react in 30 s+)."""

    min_replicas: int = Field(1, ge=0, description="Fewest replicas kept running.")
    max_replicas: int = Field(4, ge=1, description="Most replicas the stage may scale to.")
    target_ongoing_requests: float = Field(
        2.0, gt=0, description="Ongoing requests per replica the autoscaler aims for."
    )
    upscale_delay_s: float = Field(
        1.0, ge=0, description="How long load must stay high before adding replicas."
    )
    downscale_delay_s: float = Field(
        10.0, ge=0, description="How long load must stay low before removing replicas."
    )
    look_back_period_s: float = Field(
        2.0, gt=0, description="Window over which ongoing requests are averaged."
    )
    metrics_interval_s: float = Field(
        1.0, gt=0, description="How often replicas report their load."
    )

    @model_validator(mode="after")
    def _bounds(self) -> AutoscalingConfig:
        if self.min_replicas > self.max_replicas:
            raise ValueError(
                f"min_replicas ({self.min_replicas}) > max_replicas ({self.max_replicas})"
            )
        return self


class RayActorOptions(_Strict):
    num_cpus: float = Field(0.5, ge=0, description="CPUs Ray reserves for each replica.")
    num_gpus: float = Field(0, ge=0, description="GPUs Ray reserves for each replica.")
    memory: int | None = Field(None, ge=0, description="Bytes of memory reserved per replica.")
    resources: dict[str, float] = Field(
        default_factory=dict, description="Custom Ray resources per replica (e.g. node labels)."
    )
    runtime_env: dict[str, Any] = Field(
        default_factory=dict, description="Ray runtime_env for the replica (env_vars, pip, ...)."
    )


class DeploymentSettings(_Strict):
    """How one stage runs as a Serve deployment. Exactly one of num_replicas / autoscaling."""

    num_replicas: int | None = Field(
        None, ge=1, description="Fixed replica count; leave unset to autoscale."
    )
    autoscaling_config: AutoscalingConfig | None = Field(
        None, description="Autoscaling settings; used when num_replicas is unset."
    )
    max_ongoing_requests: int = Field(
        16, ge=1, description="Requests one replica works on at once (batching happens inside)."
    )
    max_queued_requests: int = Field(
        64, ge=-1, description="Requests queued per caller before 503 backpressure; -1 = no limit."
    )
    retry_after_s: float = Field(
        1.0,
        ge=0,
        description="Retry-After (seconds) sent with the 503 that refuses a request when this "
        "stage's replicas and queue are full.",
    )
    ray_actor_options: RayActorOptions = Field(
        default_factory=RayActorOptions, description="Resources reserved for each replica."
    )
    request_router: Literal["power_of_two", "least_loaded", "affinity"] = Field(
        "power_of_two",
        description="How callers pick a replica of this stage: Serve's power of two choices; "
        "least_loaded (shortest queue of all replicas); affinity (a conversation's requests "
        "go to the replica holding its prefix cache unless it is overloaded; for the Thinker).",
    )
    request_router_kwargs: dict[str, Any] = Field(
        default_factory=dict,
        description="Router settings, e.g. affinity's prefix_tokens (64) and "
        "imbalance_threshold (4 requests); for both routers local_slack (2 requests: replicas "
        "on the caller's node come first while their queue is within this of the shortest; "
        "-1 turns it off).",
    )
    cpu_cores: list[int] | None = Field(
        None,
        description="CPU cores the stage's engine is pinned to, so stages do not share a core "
        "(cores the node lacks are left out, with a warning).",
    )

    @model_validator(mode="after")
    def _replicas_xor_autoscaling(self) -> DeploymentSettings:
        if self.num_replicas is not None and self.autoscaling_config is not None:
            raise ValueError("set num_replicas or autoscaling_config, not both")
        if self.num_replicas is None and self.autoscaling_config is None:
            self.num_replicas = 1
        return self

    def serve_options(self) -> dict[str, Any]:
        """Keyword arguments for ``Deployment.options``."""
        opts: dict[str, Any] = {
            "max_ongoing_requests": self.max_ongoing_requests,
            "max_queued_requests": self.max_queued_requests,
            "backpressure_config": {"status_code": 503, "retry_after_s": self.retry_after_s},
            "ray_actor_options": self.ray_actor_options.model_dump(exclude_none=True),
        }
        if self.request_router != "power_of_two":
            opts["request_router_config"] = {
                "request_router_class": ROUTER_CLASSES[self.request_router],
                "request_router_kwargs": self.request_router_kwargs,
            }
        if self.autoscaling_config is not None:
            opts["autoscaling_config"] = self.autoscaling_config.model_dump()
        else:
            opts["num_replicas"] = self.num_replicas
        return opts
