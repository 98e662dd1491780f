"""This process's NIXL agent for the direct backend (``direct.py``): its pool of registered
buffers, the notifications that free them, and the reads.

Each process has one NIXL agent and a pool of registered buffers (registration is the slow
part, and it changes the agent's metadata, so buffers are reused like shared-memory segments,
and free ones are evicted, least recently used first, when a new size needs room). A buffer's
64-byte header holds a generation and a state, written by its owner before the payload; the
consumer reads header and payload in one transfer, then the header again, and accepts the
payload only if the generation matched both times and the buffer was in use (a seqlock: a
buffer freed or reused during the read shows up as "freed", never as someone else's data). The
consumer gets its own copy, so the owner may reuse a buffer as soon as it is freed or
abandoned; both arrive as notifications, handled by a thread of the owner that also drives UCX
for readers on other hosts. A consumer that dies before freeing leaves the buffer in use until
the lease runs out; a producer that dies makes reads fail at once.

The agent also registers memory that another backend owns and lends out (``lend``): the
pooled segments of ``shared_memory_direct``, whose frees it passes back to that backend.
"""

from __future__ import annotations

import atexit
import os
import socket
import threading
import time
import uuid
from collections import OrderedDict, deque
from collections.abc import Callable
from typing import Any

import torch

from omni_serve.transport.base import ALIGN, ChannelError
from omni_serve.transport.direct_buffers import (
    FREE,
    HEADER,
    IN_USE,
    Buffer,
    Lent,
    Where,
    allocate,
    nixl_mem_type,
)
from omni_serve.transport.direct_landings import Landings, pooled_size
from omni_serve.transport.direct_notes import MAX_OWNERS, Notifier
from omni_serve.transport.direct_read import nixl_read

LEASE_S = 600.0  # a buffer in use for longer than this has lost its consumer
POOL_BYTES = int(os.environ.get("OMNI_DIRECT_POOL_BYTES", 2 << 30))  # per pool, per process
TRANSFER_TIMEOUT_S = float(os.environ.get("OMNI_DIRECT_TIMEOUT_S", 30.0))
# The owner's notification loop: its pace right after a put (a reader over TCP, between
# hosts without RDMA, moves only as fast as the owner progresses UCX: 4 KB read in 2.1 ms at a
# 1 ms pace, 0.3 ms at 0.1 ms; 16 MB 11 -> 4 ms; the loop then costs 3.5% of a core, against
# 0.9%), while buffers are in use or a free is going out, and otherwise.
POLL_FAST_S, POLL_BUSY_S, POLL_IDLE_S = 0.0001, 0.001, 0.05
FAST_S = 0.1  # how long after a put (or a free sent) the loop keeps the fast pace
FREED_MEMORY = 4096  # refs this process freed, remembered so a second read fails here


class Endpoint:
    """This process's NIXL agent: owner of its buffers, reader of other agents' buffers."""

    def __init__(self) -> None:
        from omni_serve.compat.nixl import new_agent

        self.name = f"omni-{socket.gethostname()}-{os.getpid()}-{uuid.uuid4().hex[:8]}"
        self.agent = new_agent(self.name)
        self.lock = threading.RLock()  # NIXL agents are not thread-safe in this mode
        self.buffers: dict[int, Buffer] = {}
        self.lent: dict[int, Lent] = {}
        self.pooled_bytes = 0
        self.metadata, self.metadata_version = self.agent.get_agent_metadata(), 0
        self.registered = 0  # buffers registered so far: the next one's index
        self.generations = 0  # payloads put so far, over all buffers: the next one's generation
        # remote agent -> (version, dropped) loaded, least recently read first
        self.loaded: OrderedDict[str, tuple[int, int]] = OrderedDict()
        self.reading: dict[str, int] = {}  # remote agent -> reads from it under way
        self.reads_ended = threading.Condition(self.lock)
        self.dropped = 0  # buffers deregistered so far (one-read buffers, once read)
        self.reloads = 0  # remote agents dropped and added again (see _load)
        self.reloading: set[str] = set()  # remote agents being dropped and added again
        self.freed: deque[tuple[str, int, int]] = deque(maxlen=FREED_MEMORY)
        self.landings = Landings(self.agent, self.lock, POOL_BYTES)
        self.notes = Notifier(f"{self.name}-notes")  # sends the frees
        self.put_at = 0.0  # when this process last put a payload
        self.thread: threading.Thread | None = None
        self.wake = threading.Event()
        self.stopping = False

    # -- owner side -------------------------------------------------------------------------

    def acquire(self, nbytes: int, device: torch.device) -> Buffer:
        with self.lock:
            now, usable = time.time(), []
            for buffer in self.buffers.values():
                fits = buffer.memory.numel() >= nbytes and buffer.memory.device == device
                if fits and (buffer.state == FREE or now - buffer.since > LEASE_S):
                    usable.append(buffer)
            if usable:
                buffer = min(usable, key=lambda b: b.memory.numel())
            else:
                buffer = self._register(nbytes, device)
            # One count over all of this agent's buffers, not one per buffer: a stale ref names
            # an address and a generation, and a reader on this host (UCX over CMA) reads a
            # dropped buffer's memory even after deregistration; the allocator may hand that
            # address to a new buffer, whose header must then never show the stale generation.
            self.generations += 1
            buffer.generation = self.generations
            buffer.mark(IN_USE)
            self._serve()
            self.put_at = time.monotonic()
            self.wake.set()  # from its idle pace to the fast one: a reader may need it now
            return buffer

    def _register(self, nbytes: int, device: torch.device) -> Buffer:
        size = pooled_size(nbytes)
        if self.pooled_bytes + size > POOL_BYTES:
            self._evict(self.pooled_bytes + size - POOL_BYTES)
        pooled = self.pooled_bytes + size <= POOL_BYTES
        memory = allocate(size if pooled else nbytes, device)
        index, registration = self._registered(memory)
        buffer = Buffer(index, memory, registration, pooled)
        self.buffers[index] = buffer
        self.pooled_bytes += size if pooled else 0
        return buffer

    def _registered(self, memory: torch.Tensor) -> tuple[int, Any]:
        registration = self.agent.register_memory([memory])
        index = self.registered  # never a dropped buffer's: refs name buffers by it
        self.registered += 1
        self.metadata, self.metadata_version = self.agent.get_agent_metadata(), index + 1
        return index, registration

    def lend(
        self, memory: torch.Tensor, in_use: Callable[[], bool], release: Callable[[str, int], None]
    ) -> int:
        """Register memory another backend owns, for readers on other hosts; its index."""
        with self.lock:
            index, registration = self._registered(memory)
            self.lent[index] = Lent(memory, registration, in_use, release)
            return index

    def take_back(self, index: int) -> None:
        """Lent memory is going away: readers of refs to it fail from now on."""
        with self.lock:
            lent = self.lent.pop(index, None)
            if lent is not None:
                self.agent.deregister_memory(lent.registration)
                self.dropped += 1

    def put_lent(self) -> None:
        """A payload was written into lent memory: readers over TCP need this loop."""
        with self.lock:
            self._serve()
            self.put_at = time.monotonic()
            self.wake.set()

    def where(
        self,
        index: int,
        memory: torch.Tensor,
        generation: int,
        size: int,
        offsets: dict[str, tuple[int, int]],
        keys: list[Any] | None,
    ) -> Where:
        """What a reader needs for a payload in buffer ``index`` (``memory``). Under the lock:
        the metadata, its version and the drop count must be of one moment."""
        mem_type, device_id = nixl_mem_type(memory.device)
        with self.lock:
            return Where(
                self.name,
                self.metadata,
                self.metadata_version,
                self.dropped,
                index,
                memory.data_ptr(),
                mem_type,
                device_id,
                generation,
                size,
                offsets,
                keys,
            )

    def _evict(self, room: int) -> None:
        """Deregister free pooled buffers, least recently used first, until ``room`` bytes of
        the budget are free (or none is left to evict): payloads that grow (a session's KV
        prefix, turn after turn) would otherwise leave smaller free buffers holding the budget
        and every larger payload a one-read buffer, registered and dropped per read (and each
        drop makes its readers reload this agent)."""
        free = sorted(
            (b for b in self.buffers.values() if b.pooled and b.state == FREE),
            key=lambda b: b.since,
        )
        for buffer in free:
            if room <= 0:
                return
            self._drop(buffer)
            self.pooled_bytes -= buffer.memory.numel()
            room -= buffer.memory.numel()

    def _drop(self, buffer: Buffer) -> None:
        self.agent.deregister_memory(buffer.registration)
        del self.buffers[buffer.index]
        self.dropped += 1

    def release(self, index: int, generation: int, verb: str = "free") -> None:
        if (lent := self.lent.get(index)) is not None:
            lent.release(verb, generation)  # its own locking: not under this one
            return
        with self.lock:
            buffer = self.buffers.get(index)
            if buffer is None or buffer.generation != generation or buffer.state == FREE:
                return  # a second free, or the buffer serves a newer payload already
            buffer.mark(FREE)
            if not buffer.pooled:
                self._drop(buffer)

    def _serve(self) -> None:
        if self.thread is None:
            self.thread = threading.Thread(target=self._notifications, daemon=True)
            self.thread.start()
            atexit.register(self._stop)

    def _stop(self) -> None:
        """At exit, before the interpreter finalizes: a daemon thread still inside a NIXL call
        (GIL released) when it does is killed on re-acquiring the GIL, which aborts the
        process from C++ (std::terminate; exit status 134 after every test passed)."""
        self.stopping = True
        self.wake.set()
        if self.thread is not None:
            self.thread.join(timeout=5.0)

    def _notifications(self) -> None:
        """Frees what consumers (and callers whose calls ended) hand back; each poll also
        progresses UCX for readers that need the owner's help (TCP across hosts), and the
        notifier, whose frees go out only as it progresses (the first to an owner waits for
        the connection to be set up)."""
        while not self.stopping:
            with self.lock:
                notifications = self.agent.get_new_notifs()
                self.notes.progress()
                busy = any(b.state == IN_USE for b in self.buffers.values()) or any(
                    lent.in_use() for lent in self.lent.values()
                )
                recent = time.monotonic() - max(self.put_at, self.notes.sent_at) < FAST_S
            for messages in notifications.values():
                for message in messages:
                    try:
                        verb, index, generation = message.decode().split(":")
                        if verb in ("free", "abandon"):
                            self.release(int(index), int(generation), verb)
                    except ValueError:  # not ours: one bad message must not stop the loop
                        continue
            self.wake.wait(POLL_FAST_S if recent else POLL_BUSY_S if busy else POLL_IDLE_S)
            self.wake.clear()

    # -- consumer side ----------------------------------------------------------------------

    def _load(self, where: Where) -> None:
        """Load the owner's metadata if this ref's is newer (caller holds ``self.lock``).

        Adding metadata again only adds the sections new to this reader, and NIXL 1.5.1
        refuses a known section (address and length) under a new key (NIXL_ERR_NOT_ALLOWED
        from ``nixlRemoteSection::addDescList``: it cannot update a section's metadata),
        after which neither removing nor adding the agent works (INVALID_PARAM). A new
        buffer lands at a dropped one's address easily (seen on an H100: the CUDA caching
        allocator hands a one-read 1 GiB buffer's block back), so once the owner has dropped
        a buffer since this reader loaded it, the reader drops the agent first (when no read
        from it is under way) and adds it afresh. Reads from that agent that start meanwhile
        wait for the reload, or a steady stream of them would hold it off."""
        if not self.reads_ended.wait_for(
            lambda: where.agent not in self.reloading, TRANSFER_TIMEOUT_S
        ):
            raise ChannelError(f"direct ref from {where.agent}: its reload never ended")
        version, dropped = self.loaded.get(where.agent, (-1, 0))
        if version >= where.metadata_version:
            return
        reloading = version >= 0 and where.dropped > dropped
        if reloading:
            self.reloading.add(where.agent)
        try:
            if reloading:
                if not self.reads_ended.wait_for(
                    lambda: not self.reading.get(where.agent), TRANSFER_TIMEOUT_S
                ):
                    raise ChannelError(f"direct ref from {where.agent}: its reads never ended")
                self._forget(where.agent)
                self.reloads += 1
            try:
                self.agent.add_remote_agent(where.metadata)
            except Exception as exc:  # nixl raises its own exception types
                self._forget(where.agent)
                raise ChannelError(f"direct ref from {where.agent} unreachable: {exc}") from exc
            self.loaded[where.agent] = (where.metadata_version, where.dropped)
            self._trim()
        finally:
            if reloading:
                self.reloading.discard(where.agent)
                self.reads_ended.notify_all()

    def _trim(self) -> None:
        """Past ``MAX_OWNERS`` owners loaded, forget the least recently read that no read
        uses (caller holds ``self.lock``): owners come and go with replicas, and each one
        loaded keeps a connection and its metadata (see ``direct_notes``)."""
        for agent in list(self.loaded)[: len(self.loaded) - MAX_OWNERS]:
            if not self.reading.get(agent) and agent not in self.reloading:
                self.reading.pop(agent, None)
                self._forget(agent)

    def _forget(self, agent: str) -> None:
        """After a failed read, or before reloading it: the next ref adds ``agent`` afresh."""
        from omni_serve.compat.nixl import drop_remote_agent

        with self.lock:
            self.loaded.pop(agent, None)
            drop_remote_agent(self.agent, agent)

    def read(self, where: Where, device: torch.device) -> torch.Tensor:
        """The payload's bytes (header included), checked against the generation."""
        if (where.agent, where.buffer, where.generation) in self.freed:
            raise ChannelError(f"direct ref {where.agent}/{where.buffer} was freed")
        if where.agent == self.name:
            return self._read_own(where, device)
        remote = [(where.address, where.size, where.device_id)]
        header_only = [(where.address, HEADER.size, where.device_id)]
        with self.lock:
            self._load(where)
            self.loaded.move_to_end(where.agent)
            self.reading[where.agent] = self.reading.get(where.agent, 0) + 1
        try:
            # The payload, then room for the second header read (it must be registered too).
            memory, done = self.landings.take(where.size + ALIGN, device)
            try:
                self._transfer(memory[: where.size], remote, where)
                first = HEADER.unpack(memory[: HEADER.size].cpu().numpy().tobytes())
                again = memory[where.size : where.size + HEADER.size]
                self._transfer(again, header_only, where)
                second = HEADER.unpack(again.cpu().numpy().tobytes())
            finally:
                done()
        finally:
            with self.lock:
                self.reading[where.agent] -= 1
                self.reads_ended.notify_all()
        if first != (where.generation, IN_USE) or second != first:
            raise ChannelError(f"direct ref {where.agent}/{where.buffer} was freed")
        return memory

    def _read_own(self, where: Where, device: torch.device) -> torch.Tensor:
        with self.lock:
            buffer = self.buffers.get(where.buffer)
            if buffer is None or (buffer.generation, buffer.state) != (where.generation, IN_USE):
                raise ChannelError(f"direct ref {where.agent}/{where.buffer} was freed")
            return buffer.memory[: where.size].to(device, copy=True)

    def _transfer(
        self, local: torch.Tensor, remote: list[tuple[int, int, int]], where: Where
    ) -> None:
        state = "ERR"
        try:
            state = nixl_read(self.agent, self.lock, local, remote, where, TRANSFER_TIMEOUT_S)
        finally:
            if state != "DONE":  # the next ref from this owner adds it afresh
                self._forget(where.agent)
        if state != "DONE":
            why = "timed out" if state == "PROC" else "failed (its producer may be gone)"
            raise ChannelError(f"reading direct ref from {where.agent} {why}")

    def hand_back(self, where: Where, verb: str = "free") -> None:
        """Tell the owner it may reuse the buffer (at once, if the owner is this process).
        "abandon": the caller's call ended; lent memory decides whether a reader has it."""
        self.freed.append((where.agent, where.buffer, where.generation))
        if where.agent == self.name:
            self.release(where.buffer, where.generation, verb)
            return
        with self.lock:
            message = f"{verb}:{where.buffer}:{where.generation}"
            if not self.notes.send(where.agent, where.metadata, message):
                return  # the owner is gone: nothing left to free
            self._serve()  # its loop progresses the notifier, which sends the free
            self.wake.set()


_endpoint: Endpoint | None = None
_endpoint_lock = threading.Lock()


def endpoint() -> Endpoint:
    global _endpoint
    with _endpoint_lock:
        if _endpoint is None:
            _endpoint = Endpoint()
        return _endpoint
