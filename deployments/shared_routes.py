"""The routes every ingress serves the same way: ``/v1/models``, ``/health`` and ``/metrics``.

They are added to each ingress's FastAPI app by ``ingress_app`` and answer from the replica's
ingress object (``ServedIngress``), which Serve hands them as it hands a route method its
``self``. Plain functions rather than methods of a shared base class: Serve binds a method route
to one ingress class, and both apps would share its function.
"""

from __future__ import annotations

from typing import Annotated, Any, Protocol

from fastapi import Depends, FastAPI
from fastapi.responses import JSONResponse, Response
from ray import serve
from ray.serve.handle import DeploymentHandle

from deployments.common import ingress_stats, serve_problems
from omni_serve.api.errors import check_model
from omni_serve.api.protocol import model_card, model_list
from omni_serve.config import PipelineConfig
from omni_serve.observability.health import stage_health
from omni_serve.observability.metrics import ApiMetrics

PROMETHEUS_TEXT = "text/plain; version=0.0.4"


class ServedIngress(Protocol):
    config: PipelineConfig
    handles: dict[str, DeploymentHandle]  # its stages, by name
    metrics: ApiMetrics
    created: int  # when it started, for the model card

    async def observe_stores(self) -> None:
        """Its stores' sizes into ``metrics``, at each scrape (nothing to do without one)."""

    async def degraded(self) -> dict[str, str]:
        """What works with less than it should (a store's tier that cannot write), and why."""


def serving_ingress() -> ServedIngress:
    """This replica's ingress object."""
    return serve.get_replica_context().servable_object


Ingress = Annotated[ServedIngress, Depends(serving_ingress)]


def add_shared_routes(app: FastAPI) -> None:
    @app.get("/v1/models")
    async def models(ingress: Ingress) -> dict[str, Any]:
        return model_list(ingress.config.served_model_name, ingress.created)

    @app.get("/v1/models/{model_id:path}")  # an id may hold a slash (org/name)
    async def model(model_id: str, ingress: Ingress) -> dict[str, Any]:
        check_model(model_id, ingress.config.served_model_name)
        return model_card(model_id, ingress.created)

    @app.get("/health")
    async def health(ingress: Ingress) -> JSONResponse:
        return await stage_health(
            ingress.handles, explain=serve_problems, degraded=await ingress.degraded()
        )

    @app.get("/metrics")
    async def metrics(ingress: Ingress) -> Response:
        await ingress.metrics.poll_stages(ingress.handles)
        ingress.metrics.observe_channel("ingress", ingress_stats())
        await ingress.observe_stores()
        return Response(ingress.metrics.render(), media_type=PROMETHEUS_TEXT)
