"""The disk tier: kept prefixes as page files on local disk, written off the request path,
bounded in bytes, and found again after a restart.

One page per prefix, in safetensors (the KV blocks, the companion rows) with a JSON header:
the store's namespace (model, tokenizer), the facts the engine checks, and a checksum of the
tensors. A page is loaded only if its namespace is the store's and its checksum holds; any
other page is refused (and a damaged one deleted), so the turn recomputes instead.

A write that fails (a full disk, a path that cannot be written) costs that prefix its place
on disk and nothing else; the tier says it is degraded, and why, until a write succeeds.
"""

from __future__ import annotations

import json
import logging
import os
import threading
from collections import Counter, OrderedDict
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

import blake3
import torch
from safetensors import safe_open
from safetensors.torch import load_file, save_file

from omni_serve.kv_store.kept_prefix import KeptPrefix, PrefixFacts

log = logging.getLogger(__name__)
PAGE_FORMAT = "omni-serve-kv-page/1"
SUFFIX = ".kvpage"
_COMPANION = "companion"
_KV = "kv/"


class PageRefused(ValueError):
    """A page that must not be loaded: another namespace, damaged, or unreadable."""


@dataclass
class Page:
    entry_id: str
    path: Path
    nbytes: int
    facts: PrefixFacts


def _checksum(tensors: dict[str, torch.Tensor]) -> str:
    hasher = blake3.blake3()
    for name in sorted(tensors):
        t = tensors[name].contiguous()
        hasher.update(f"{name}:{t.dtype}:{tuple(t.shape)};".encode())
        hasher.update(t.view(torch.uint8).reshape(-1).numpy().data if t.numel() else b"")
    return hasher.hexdigest()


def _tensors(kept: KeptPrefix) -> dict[str, torch.Tensor]:
    # Fresh, unshared copies: safetensors refuses tensors that share memory (the blocks of
    # one channel buffer do), and the copies free the buffer from the writer's schedule.
    out = {f"{_KV}{name}": t.detach().to("cpu").clone() for name, t in kept.kv.items()}
    if kept.companion is not None:
        out[_COMPANION] = kept.companion.detach().to("cpu").clone()
    return out


class DiskTier:
    def __init__(self, root: Path | str, max_bytes: int, namespace: str) -> None:
        self.dir = Path(root) / namespace[:32]
        self.max_bytes = max_bytes
        self.namespace = namespace
        self.nbytes = 0  # pages on disk plus those being written
        self.degraded: str | None = None
        self.evictions = self.writes = self.write_errors = self.refused = 0
        self._pages: OrderedDict[str, Page] = OrderedDict()  # least recently used first
        self._reading: Counter[str] = Counter()  # pages being read: never evicted under a read
        self._lock = threading.Lock()
        self._writer = ThreadPoolExecutor(1, thread_name_prefix="kv-disk-writer")
        try:
            self.dir.mkdir(parents=True, exist_ok=True)
        except OSError as exc:
            self.degraded = f"cannot create {self.dir}: {exc}"
            log.warning("KV disk tier degraded: %s", self.degraded)

    def __contains__(self, entry_id: str) -> bool:
        return entry_id in self._pages

    def __len__(self) -> int:
        return len(self._pages)

    def scan(self) -> list[Page]:
        """The pages a previous store left in this namespace's directory (a restart), oldest
        use first; unreadable ones are refused and deleted."""
        found = []
        paths = sorted(self.dir.glob(f"*{SUFFIX}"), key=lambda p: p.stat().st_mtime)
        for path in paths:
            try:
                facts = self._header(path)
            except PageRefused as exc:
                log.warning("KV page %s refused: %s", path.name, exc)
                self.refused += 1
                path.unlink(missing_ok=True)
                continue
            page = Page(path.stem, path, path.stat().st_size, facts)
            self._pages[page.entry_id] = page
            self.nbytes += page.nbytes
            found.append(page)
        with self._lock:
            self._evict(0)
        return [page for page in found if page.entry_id in self._pages]

    def write(self, entry_id: str, kept: KeptPrefix) -> Future[bool] | None:
        """Writes the page in the background (None: it can never fit, or the tier has no
        directory). The page counts against the budget from now."""
        nbytes = kept.nbytes
        if nbytes > self.max_bytes or not self.dir.is_dir():
            return None
        with self._lock:
            if not self._evict(nbytes):  # the rest is being read: this page must wait its turn
                return None
            self.nbytes += nbytes
        path = self.dir / f"{entry_id}{SUFFIX}"
        return self._writer.submit(self._write, entry_id, path, kept, nbytes)

    def _write(self, entry_id: str, path: Path, kept: KeptPrefix, nbytes: int) -> bool:
        tensors = _tensors(kept)
        header = {
            "format": PAGE_FORMAT,
            "namespace": self.namespace,
            "facts": json.dumps(kept.facts.to_json()),
            "checksum": _checksum(tensors),
        }
        partial = path.with_suffix(".partial")
        try:
            save_file(tensors, partial, metadata=header)
            os.replace(partial, path)
            size = path.stat().st_size
        except OSError as exc:
            partial.unlink(missing_ok=True)
            with self._lock:
                self.nbytes -= nbytes
                self.write_errors += 1
                self.degraded = f"writing {path.name}: {exc}"
            log.warning("KV disk tier degraded: %s", self.degraded)
            return False
        with self._lock:
            self.nbytes += size - nbytes
            self._pages[entry_id] = Page(entry_id, path, size, kept.facts)
            self.writes += 1
            self.degraded = None
        return True

    def read(self, entry_id: str) -> KeptPrefix:
        """The page's prefix (PageRefused: gone, foreign or damaged; a damaged one is
        deleted). Blocking: call it off the event loop."""
        with self._lock:
            page = self._pages.get(entry_id)
            if page is None:
                raise PageRefused(f"no page {entry_id}")
            self._reading[entry_id] += 1
        try:
            return self._read(page)
        finally:
            with self._lock:
                self._reading -= Counter({entry_id: 1})

    def _read(self, page: Page) -> KeptPrefix:
        entry_id = page.entry_id
        try:
            facts = self._header(page.path)
            tensors = load_file(page.path)
            with safe_open(page.path, "pt") as f:
                checksum = (f.metadata() or {}).get("checksum")
            if checksum != _checksum(tensors):
                raise PageRefused("its checksum does not match its tensors")
        except (PageRefused, OSError, RuntimeError, ValueError) as exc:
            self.refused += 1
            self.drop(entry_id)
            raise PageRefused(f"page {entry_id}: {exc}") from None
        with self._lock:
            self._pages.move_to_end(entry_id)
        kv = {name[len(_KV) :]: t for name, t in tensors.items() if name.startswith(_KV)}
        return KeptPrefix(facts, kv, tensors.get(_COMPANION))

    def drop(self, entry_id: str) -> None:
        with self._lock:
            page = self._pages.pop(entry_id, None)
            if page is not None:
                self.nbytes -= page.nbytes
        if page is not None:
            page.path.unlink(missing_ok=True)

    def flush(self, timeout_s: float = 60.0) -> None:
        """Waits for the writes submitted so far (tests, and a store that stops)."""
        self._writer.submit(lambda: None).result(timeout=timeout_s)

    def _header(self, path: Path) -> PrefixFacts:
        try:
            with safe_open(path, "pt") as f:
                meta = f.metadata() or {}
        except (OSError, RuntimeError, ValueError) as exc:
            raise PageRefused(f"unreadable: {exc}") from None
        if meta.get("format") != PAGE_FORMAT:
            raise PageRefused(f"not a page of this format ({meta.get('format')!r})")
        if meta.get("namespace") != self.namespace:
            raise PageRefused("another model, tokenizer or store namespace")
        try:
            return PrefixFacts.from_json(json.loads(meta["facts"]))
        except (KeyError, TypeError, ValueError) as exc:
            raise PageRefused(f"unreadable facts: {exc}") from None

    def _evict(self, incoming: int) -> bool:
        """Frees the least recently used pages not being read until ``incoming`` more bytes
        fit; whether they do. Call it holding the lock."""
        for entry_id in list(self._pages):
            if self.nbytes + incoming <= self.max_bytes:
                break
            if self._reading[entry_id]:
                continue
            page = self._pages.pop(entry_id)
            self.nbytes -= page.nbytes
            self.evictions += 1
            page.path.unlink(missing_ok=True)
        return self.nbytes + incoming <= self.max_bytes
