"""The tiered store of conversations' KV prefixes: memory, then local disk.

A turn's exported prefix is kept under its session and under its content key (the chain of
block hashes of its prompt). The next turn, of this session or of any other whose prompt
begins the same (a shared system prompt, the same image at the same place), gets a fresh
channel copy of the kept prefix sharing the most with its prompt. A prefix memory pushes out
goes to disk in the background; a turn whose best prefix is on disk loads it back when the
cost model says reading it beats recomputing it.

Concurrent turns share one store without a lock: the index changes only between awaits, and
a disk read (off the event loop) holds no other turn up.
"""

from __future__ import annotations

import asyncio
import logging
import time
import uuid
from concurrent.futures import Future
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from omni_serve.config.kv_store import KVStoreConfig
from omni_serve.kv_store.block_pool import engine_block_keys
from omni_serve.kv_store.content_key import PromptContent, block_hashes
from omni_serve.kv_store.disk_tier import DiskTier, PageRefused
from omni_serve.kv_store.host_tier import HostTier
from omni_serve.kv_store.kept_prefix import KeptPrefix, PrefixFacts
from omni_serve.transport import Channel, ChannelError, release
from omni_serve.transport.session_prefixes import decode_prefix

log = logging.getLogger(__name__)
_READ_RATE_WEIGHT = 0.3  # of each measured load, in the running estimate of the read rate
_LOAD_OVERHEAD_S = 0.005


@dataclass
class _Entry:
    entry_id: str
    session_id: str | None
    hashes: list[str]
    nbytes: int
    block_size: int
    used_at: float = field(default_factory=time.monotonic)


@dataclass
class TierCounts:
    hits: int = 0
    load_s: float = 0.0  # summed over its hits


class TieredPrefixStore:
    def __init__(self, config: KVStoreConfig, namespace: str, channel: Channel) -> None:
        self.config, self.namespace, self.channel = config, namespace, channel
        self.host = HostTier(config.host_max_bytes, config.host_ttl_s)
        self.disk = None
        if config.disk_path is not None:
            root = Path(config.disk_path).expanduser()
            self.disk = DiskTier(root, config.disk_max_bytes, namespace)
        self.counts = {"host": TierCounts(), "disk": TierCounts()}
        self.misses = self.declined = 0
        self.read_bytes_per_s = config.disk_read_bytes_per_s
        self._entries: dict[str, _Entry] = {}
        self._by_hash: dict[str, set[str]] = {}
        self._by_session: dict[str, str] = {}
        self._writing: dict[str, Future[bool]] = {}
        self._reading: dict[str, int] = {}  # entry -> turns reading its page now
        # Forgotten entries whose page goes once nobody reads it and its write is done.
        self._orphans: dict[str, Future[bool] | None] = {}
        if self.disk is not None:
            for page in self.disk.scan():
                self._index(page.entry_id, page.facts, page.nbytes)

    # -- the two calls a turn makes ----------------------------------------------------------

    async def find(self, session_id: str | None, content: PromptContent | None) -> str | None:
        """An encoded prefix for the Thinker to load (its own copy), or None."""
        self._spill(self.host.expire())
        for entry, tokens in self._candidates(session_id, content):
            kept = await self._fetch(entry, tokens)
            if kept is not None:
                entry.used_at = time.monotonic()
                return kept.to_channel(self.channel).encode()
        self.misses += 1
        return None

    async def keep(
        self, session_id: str | None, encoded: str | None, content: PromptContent | None
    ) -> None:
        """Keeps a turn's export as its session's newest prefix (replacing the last one)."""
        prefix = decode_prefix(encoded)
        if prefix is None:
            return
        if not session_id:  # only session turns export; one without would be unreachable
            release(*prefix.refs())
            return
        content = content or PromptContent(list(prefix.token_ids))
        try:
            kept = await KeptPrefix.from_channel(prefix, content, session_id)
        except (ChannelError, ValueError) as exc:
            log.warning("a session's KV prefix could not be kept: %s", exc)
            return
        keys = self._block_keys(kept)
        if {len(blocks) for blocks in kept.kv.values()} != {len(keys)}:
            log.warning("a session's KV prefix not kept: its blocks do not match its tokens")
            return
        if session_id in self._by_session:
            self._forget(self._by_session[session_id])
        entry_id = uuid.uuid4().hex
        self._index(entry_id, kept.facts, kept.nbytes)
        self._spill(self.host.put(entry_id, kept, keys))

    # -- lookup ------------------------------------------------------------------------------

    def _candidates(
        self, session_id: str | None, content: PromptContent | None
    ) -> list[tuple[_Entry, int]]:
        """Kept prefixes sharing the most whole blocks with the prompt (with the tokens they
        share), best first: this session's own, then in memory, then the most recent."""
        holders: set[str] = set()
        depth = 0
        if content is not None:
            for i, h in enumerate(block_hashes(content, self.config.block_tokens, self.namespace)):
                found = self._by_hash.get(h)
                if not found:
                    break
                holders, depth = found, i + 1
        if not holders and session_id in self._by_session:  # no content given: its own
            entry = self._entries[self._by_session[session_id]]
            return [(entry, len(entry.hashes) * self.config.block_tokens)]
        tokens = depth * self.config.block_tokens
        ranked = sorted(
            (self._entries[i] for i in holders),
            key=lambda e: (e.session_id != session_id, e.entry_id not in self.host, -e.used_at),
        )
        return [(entry, tokens) for entry in ranked if tokens >= entry.block_size]

    async def _fetch(self, entry: _Entry, tokens: int) -> KeptPrefix | None:
        kept = self.host.get(entry.entry_id)
        if kept is not None:
            self.counts["host"].hits += 1
            return kept
        if self.disk is None or not self._on_disk(entry.entry_id):
            self._forget(entry.entry_id)
            return None
        load_s = entry.nbytes / self.read_bytes_per_s + _LOAD_OVERHEAD_S
        if load_s >= tokens / self.config.prefill_tokens_per_s:
            self.declined += 1  # computing these tokens is expected to be faster
            return None
        entry_id = entry.entry_id
        writing = self._writing.get(entry_id)
        self._reading[entry_id] = self._reading.get(entry_id, 0) + 1
        start = time.perf_counter()
        try:
            if writing is not None:
                await asyncio.wrap_future(writing)
                start = time.perf_counter()
            kept = await asyncio.to_thread(self.disk.read, entry_id)
        except PageRefused as exc:
            log.warning("KV page not loaded (the turn recomputes): %s", exc)
            self._forget(entry_id)
            return None
        finally:
            self._reading[entry_id] -= 1
            if not self._reading[entry_id]:
                del self._reading[entry_id]
            self._drop_orphans()
        took = time.perf_counter() - start
        self.read_bytes_per_s += _READ_RATE_WEIGHT * (entry.nbytes / took - self.read_bytes_per_s)
        self.counts["disk"].hits += 1
        self.counts["disk"].load_s += took
        if entry.entry_id in self._entries:  # (not replaced by its session's newer turn meanwhile)
            self._spill(
                self.host.put(entry.entry_id, kept, self._block_keys(kept))
            )  # for next turn
        return kept

    def _block_keys(self, kept: KeptPrefix) -> list[str]:
        return engine_block_keys(kept.facts, self.namespace)

    def _on_disk(self, entry_id: str) -> bool:
        writing = self._writing.get(entry_id)
        if writing is not None and writing.done():
            del self._writing[entry_id]
            return writing.result() and entry_id in self.disk
        return writing is not None or entry_id in self.disk

    # -- bookkeeping -------------------------------------------------------------------------

    def _index(self, entry_id: str, facts: PrefixFacts, nbytes: int) -> None:
        hashes = block_hashes(facts.content, self.config.block_tokens, self.namespace)
        entry = _Entry(entry_id, facts.session_id, hashes, nbytes, facts.block_size)
        self._entries[entry_id] = entry
        for h in hashes:
            self._by_hash.setdefault(h, set()).add(entry_id)
        if facts.session_id:
            old = self._by_session.get(facts.session_id)
            if old is not None and old != entry_id:
                self._forget(old)
            self._by_session[facts.session_id] = entry_id

    def _spill(self, pushed: list[tuple[str, KeptPrefix]]) -> None:
        """What memory pushed out goes to disk (unless it is there already), else is gone."""
        for entry_id, kept in pushed:
            if entry_id not in self._entries:
                continue
            if self.disk is not None and self._on_disk(entry_id):
                continue
            writing = self.disk.write(entry_id, kept) if self.disk is not None else None
            if writing is None:
                self._forget(entry_id)
            else:
                self._writing[entry_id] = writing

    def _forget(self, entry_id: str) -> None:
        entry = self._entries.pop(entry_id, None)
        if entry is None:
            return
        for h in entry.hashes:
            holders = self._by_hash.get(h)
            if holders is not None:
                holders.discard(entry_id)
                if not holders:
                    del self._by_hash[h]
        if entry.session_id and self._by_session.get(entry.session_id) == entry_id:
            del self._by_session[entry.session_id]
        self.host.remove(entry_id)
        if self.disk is not None:
            self._orphans[entry_id] = self._writing.pop(entry_id, None)
            self._drop_orphans()

    def _drop_orphans(self) -> None:
        for entry_id, writing in list(self._orphans.items()):
            if entry_id in self._reading or (writing is not None and not writing.done()):
                continue
            del self._orphans[entry_id]
            self.disk.drop(entry_id)

    def clear(self) -> None:
        for entry_id in list(self._entries):
            self.host.remove(entry_id)

    def spill(self, timeout_s: float) -> int:
        """Writes the prefixes only memory holds to disk and waits up to ``timeout_s`` for
        every write (a store that stops: the store after it finds them); how many pages were
        written in time. Blocking."""
        if self.disk is None or timeout_s <= 0:
            return 0
        spilled = []
        for entry_id, kept in self.host.held():
            if entry_id in self._entries and not self._on_disk(entry_id):
                writing = self.disk.write(entry_id, kept)
                if writing is not None:
                    self._writing[entry_id] = writing
                    spilled.append(writing)
        deadline = time.monotonic() + timeout_s
        for writing in list(self._writing.values()):  # every write in flight, these too
            try:
                writing.result(timeout=max(0.0, deadline - time.monotonic()))
            except TimeoutError:
                break
        return sum(1 for writing in spilled if writing.done() and writing.result())

    def stats(self) -> dict[str, Any]:
        host, disk = self.counts["host"], self.counts["disk"]
        out: dict[str, Any] = {
            "prefixes": len(self._entries),
            "misses": self.misses,
            "declined": self.declined,
            "host": {
                "prefixes": len(self.host),
                "bytes": self.host.nbytes,
                "prefix_bytes": self.host.prefix_bytes,
                "blocks": len(self.host.blocks),
                "max_bytes": self.host.max_bytes,
                "hits": host.hits,
                "evictions": self.host.evictions,
            },
            "degraded": None,
        }
        if self.disk is not None:
            out["disk"] = {
                "prefixes": len(self.disk),
                "bytes": self.disk.nbytes,
                "max_bytes": self.disk.max_bytes,
                "hits": disk.hits,
                "load_seconds": round(disk.load_s, 6),
                "evictions": self.disk.evictions,
                "writes": self.disk.writes,
                "write_errors": self.disk.write_errors,
                "refused": self.disk.refused,
                "read_bytes_per_s": round(self.read_bytes_per_s),
            }
            out["degraded"] = self.disk.degraded
        return out
