"""The FastAPI app of the omni ingress. Its routes are methods of ``OmniIngress`` and of
the route mixins it is made of (``audio_routes``), which all decorate this one app."""

from __future__ import annotations

from deployments.common import ingress_app

app = ingress_app("omni-serve")
