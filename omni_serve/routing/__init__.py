"""Request routers for stage deployments (``deployment.request_router`` in a pipeline config).

``policy`` holds the decisions as plain functions; ``routers`` adapts them to Serve's
``RequestRouter`` interface.
"""
