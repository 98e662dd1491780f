"""Batch generation as a Ray job: ``python -m omni_serve.jobs.batch`` (see docs/operations.md)."""
