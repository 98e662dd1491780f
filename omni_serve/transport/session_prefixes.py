"""Encoded KV prefixes as they ride a turn (``KVPrefix.encode``): read one, or hand back the
buffers of one nobody will load. Where sessions' prefixes are kept between turns is
``omni_serve.kv_store``."""

from __future__ import annotations

import logging

from omni_serve.transport import release
from omni_serve.transport.kv_blocks import KVPrefix

log = logging.getLogger(__name__)


def decode_prefix(encoded: str | None) -> KVPrefix | None:
    """The prefix, or None for none or an unreadable one (logged)."""
    if not encoded:
        return None
    try:
        return KVPrefix.decode(encoded)
    except ValueError as exc:
        log.warning("unreadable KV prefix (%s): its lease reclaims its buffer", exc)
        return None


def free_prefix(encoded: str | None) -> None:
    """Hand back the buffers of an encoded prefix nobody will load (its companion too)."""
    prefix = decode_prefix(encoded)
    if prefix is not None:
        release(*prefix.refs())
