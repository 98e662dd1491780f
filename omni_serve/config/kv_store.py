"""Settings of the app's KV store: the tiers a conversation's prefix is kept in between turns,
and the cost model that decides whether loading one beats recomputing it."""

from __future__ import annotations

import os

from pydantic import BaseModel, ConfigDict, Field

# Where the disk tier's pages go unless the config says: this variable, else DEFAULT_DISK_PATH.
DISK_PATH_ENV = "OMNI_SERVE_KV_PAGES"
DEFAULT_DISK_PATH = "~/.cache/omni_serve/kv_pages"


class KVStoreConfig(BaseModel):
    model_config = ConfigDict(extra="forbid")

    host_max_bytes: int = Field(
        1 << 30,
        ge=0,
        description="The most KV-prefix bytes kept in the store's memory; past it the least "
        "recently used prefix moves to the disk tier (or is freed without one).",
    )
    host_ttl_s: float = Field(
        300.0,
        gt=0,
        description="A prefix no turn used for this long leaves memory (to the disk tier).",
    )
    disk_path: str | None = Field(
        default_factory=lambda: os.environ.get(DISK_PATH_ENV, DEFAULT_DISK_PATH),
        description="Directory of the disk tier's pages (one subdirectory per model "
        f"namespace; kept across restarts); default ${DISK_PATH_ENV}, else "
        f"{DEFAULT_DISK_PATH}. None = no disk tier: what leaves memory is freed.",
    )
    disk_max_bytes: int = Field(
        8 << 30,
        ge=0,
        description="The most bytes of pages on disk; past it the least recently used page "
        "is deleted. Pages being written count.",
    )
    block_tokens: int = Field(
        64,
        gt=0,
        description="Tokens per block of the content key (the chain of block hashes a prefix "
        "is found by): a prompt matches a kept prefix up to the last whole block they share.",
    )
    prefill_tokens_per_s: float = Field(
        2000.0,
        gt=0,
        description="Cost model: how fast the Thinker computes a prompt. A prefix on disk is "
        "loaded only if reading it is expected to beat computing its tokens at this rate "
        "(measure yours with load_tests/bench_session_tiers.py).",
    )
    disk_read_bytes_per_s: float = Field(
        500e6,
        gt=0,
        description="Cost model: the disk tier's read rate before any load is measured; the "
        "store then follows what its loads take.",
    )
    spill_on_stop_s: float = Field(
        10.0,
        ge=0,
        description="A store that stops (the app is shut down, or its replica replaced "
        "gracefully) writes the prefixes only its memory holds to the disk tier, waiting at "
        "most this long, so the store that follows finds them. 0 = no spill. Keep it under "
        "the deployment's graceful_shutdown_timeout_s (Serve's default: 20 s).",
    )
