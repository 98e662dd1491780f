"""Application-level autoscaling: the stages of one pipeline scale together.

Per-stage autoscaling reacts to each stage's own queue, so a burst of spoken requests first
scales the Thinker, and the Talker and Code2wav follow only once their queues have grown
(a look-back window later), while those requests' audio is already late. Here every stage
still gets what its own queue asks for, and a stage that serves another one's output (the
Talker follows the Thinker, Code2wav follows the Talker) gets at least ``ratio`` replicas per
replica its leader is given, in the same decision.

Named in a Serve config's application as ``autoscaling_policy``, with ``policy_function:
omni_serve.scaling.pipeline_policy:PipelineAutoscalingPolicy`` and ``policy_kwargs: {follow:
{talker: {leader: thinker, ratio: 1.0}, ...}}``; Serve applies each stage's own
``min/max_replicas`` and up/downscale delays on top.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

log = logging.getLogger("ray.serve")


@dataclass(frozen=True)
class StageLoad:
    current_replicas: int
    ongoing_requests: float  # running + queued, averaged over the look-back window
    target_per_replica: float
    min_replicas: int
    max_replicas: int

    def clamp(self, replicas: int) -> int:
        return max(self.min_replicas, min(self.max_replicas, replicas))

    def own_demand(self) -> int:
        if self.ongoing_requests <= 0:
            return self.clamp(0)
        return self.clamp(math.ceil(self.ongoing_requests / self.target_per_replica))


@dataclass(frozen=True)
class Follow:
    leader: str
    ratio: float = 1.0


def desired_replicas(
    loads: Mapping[str, StageLoad], follow: Mapping[str, Follow]
) -> dict[str, int]:
    """Replicas per stage: its own demand, raised to ``ratio`` x its leader's decision."""
    desired = {name: load.own_demand() for name, load in loads.items()}
    for _ in range(len(follow)):  # chains (thinker -> talker -> code2wav) settle in order
        for name, rule in follow.items():
            if name in loads and rule.leader in desired:
                paced = math.ceil(desired[rule.leader] * rule.ratio)
                desired[name] = loads[name].clamp(max(desired[name], paced))
    return desired


class PipelineAutoscalingPolicy:
    """Serve's application-level policy interface over ``desired_replicas``."""

    def __init__(self, follow: Mapping[str, Mapping[str, Any]] | None = None) -> None:
        self.follow = {name: Follow(**rule) for name, rule in (follow or {}).items()}
        self._last_wanted: dict[str, str] = {}  # Serve asks every ~0.1 s: log changes only
        for name, rule in self.follow.items():
            if rule.ratio <= 0:
                raise ValueError(f"follow.{name}.ratio must be > 0, got {rule.ratio}")

    def __call__(self, contexts: Mapping[Any, Any]) -> tuple[dict[Any, int], dict[Any, dict]]:
        by_name = {
            ctx.deployment_name: (deployment_id, ctx) for deployment_id, ctx in contexts.items()
        }
        loads = {
            name: StageLoad(
                current_replicas=ctx.current_num_replicas,
                ongoing_requests=float(ctx.total_num_requests),
                target_per_replica=ctx.config.get_target_ongoing_requests(),
                min_replicas=ctx.capacity_adjusted_min_replicas,
                max_replicas=ctx.capacity_adjusted_max_replicas,
            )
            for name, (_, ctx) in by_name.items()
        }
        desired = desired_replicas(loads, self.follow)
        changes = {
            n: f"{loads[n].current_replicas}->{r}"
            for n, r in desired.items()
            if r != loads[n].current_replicas
        }
        if changes and changes != self._last_wanted:  # Serve's delays and bounds then act
            ongoing = {n: round(load.ongoing_requests, 1) for n, load in loads.items()}
            log.info("pipeline autoscaling wants %s (ongoing requests %s)", changes, ongoing)
        self._last_wanted = changes
        decisions = {by_name[name][0]: replicas for name, replicas in desired.items()}
        return decisions, {deployment_id: {} for deployment_id in decisions}
