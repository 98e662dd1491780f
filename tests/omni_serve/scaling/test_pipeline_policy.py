"""The pipeline autoscaling policy: each stage gets its own demand, and a follower stage is
raised with its leader in the same decision (within its own bounds)."""

from __future__ import annotations

import logging

import pytest
from ray.serve._private.common import DeploymentID
from ray.serve.config import AutoscalingConfig, AutoscalingContext

from omni_serve.scaling.pipeline_policy import (
    Follow,
    PipelineAutoscalingPolicy,
    StageLoad,
    desired_replicas,
)


def load(ongoing: float, current: int = 1, lo: int = 1, hi: int = 8) -> StageLoad:
    return StageLoad(current, ongoing, target_per_replica=2.0, min_replicas=lo, max_replicas=hi)


def test_each_stage_gets_its_own_queue_demand_within_bounds():
    loads = {"thinker": load(7), "vae": load(0), "dit": load(40, hi=4)}
    assert desired_replicas(loads, {}) == {"thinker": 4, "vae": 1, "dit": 4}


def test_followers_scale_with_their_leader_in_the_same_decision():
    loads = {"thinker": load(12), "talker": load(1), "code2wav": load(0, hi=3)}
    follow = {"talker": Follow("thinker", 1.0), "code2wav": Follow("talker", 0.5)}
    assert desired_replicas(loads, follow) == {"thinker": 6, "talker": 6, "code2wav": 3}
    busier = {"thinker": load(2), "talker": load(9), "code2wav": load(0)}
    assert desired_replicas(busier, follow)["talker"] == 5  # its own queue still counts


def context(name: str, ongoing: float, current: int = 1) -> AutoscalingContext:
    config = AutoscalingConfig(min_replicas=1, max_replicas=6, target_ongoing_requests=2)
    return AutoscalingContext(
        deployment_id=DeploymentID(name=name, app_name="omni"),
        deployment_name=name,
        app_name="omni",
        current_num_replicas=current,
        target_num_replicas=current,
        running_replicas=[],
        total_num_requests=ongoing,
        total_queued_requests=0.0,
        aggregated_metrics={},
        raw_metrics={},
        capacity_adjusted_min_replicas=1,
        capacity_adjusted_max_replicas=6,
        policy_state={},
        last_scale_up_time=None,
        last_scale_down_time=None,
        current_time=0.0,
        config=config,
    )


def test_the_policy_speaks_serves_interface():
    policy = PipelineAutoscalingPolicy(follow={"talker": {"leader": "thinker", "ratio": 1.0}})
    contexts = {c.deployment_id: c for c in (context("thinker", 8), context("talker", 0))}
    decisions, state = policy(contexts)
    assert {d.name: n for d, n in decisions.items()} == {"thinker": 4, "talker": 4}
    assert set(state) == set(contexts)
    with pytest.raises(ValueError, match="ratio must be > 0"):
        PipelineAutoscalingPolicy(follow={"talker": {"leader": "thinker", "ratio": 0}})


def test_the_policy_logs_what_it_asks_for_once_per_change(caplog):
    """Serve asks every ~0.1 s: the controller log gets one line per new decision."""
    policy = PipelineAutoscalingPolicy(follow={"talker": {"leader": "thinker", "ratio": 1.0}})
    busy = {c.deployment_id: c for c in (context("thinker", 8), context("talker", 0))}
    with caplog.at_level(logging.INFO, logger="ray.serve"):
        for _ in range(5):
            policy(busy)
    wants = [r.getMessage() for r in caplog.records if "pipeline autoscaling" in r.getMessage()]
    assert len(wants) == 1 and "'talker': '1->4'" in wants[0] and "'thinker': 8.0" in wants[0]
