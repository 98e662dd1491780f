"""NIXL workarounds, all in one place. Imported only by the direct channel backend.

NIXL 1.5.1 ships as ``nixl`` (a meta package that also pulls a CUDA build of torch), or as
``nixl-cu12`` / ``nixl-cu13`` alone (import names ``nixl_cu12`` / ``nixl_cu13``); the project
installs ``nixl-cu12`` by itself, which runs without CUDA (UCX over shared memory and TCP).
"""

from __future__ import annotations

import contextlib
import ctypes
import functools
import importlib
import logging
import os
from collections.abc import Iterator
from typing import Any

_MODULES = ("nixl", "nixl_cu12", "nixl_cu13")


def load_nixl() -> Any:
    """The NIXL Python API module (whichever build is installed)."""
    for name in _MODULES:
        try:
            module = importlib.import_module(name)
        except ImportError:
            continue
        if hasattr(module, "nixl_agent"):
            # nixl 1.5.1 logs every agent and backend it creates at INFO, to stderr.
            logging.getLogger(module.__name__).setLevel(logging.WARNING)
            logging.getLogger("nixl").setLevel(logging.WARNING)
            return module
    raise ImportError(
        "the direct channel backend needs NIXL: pip install 'nixl-cu12==1.5.1' "
        "(or the project's [direct] extra)"
    )


@functools.cache
def nixl_available() -> bool:
    try:
        load_nixl()
    except ImportError:
        return False
    return True


def new_agent(name: str) -> Any:
    """A UCX agent with NO progress thread: in nixl 1.5.1 that thread busy-polls, one full
    core per process for as long as the agent lives (measured: 3.0 s of CPU per 3 s idle).
    Without it, transfers progress when their state is checked and notifications when they
    are fetched, which the backend does itself."""
    nixl = load_nixl()
    _prepare_cuda()
    config = nixl.nixl_agent_config(enable_prog_thread=False, backends=["UCX"])
    return nixl.nixl_agent(name, config)


def _prepare_cuda() -> None:
    """Where this process has a GPU, set UCX up to read GPU memory well; elsewhere nothing
    (UCX warns about every CUDA variable it has no use for, once per agent)."""
    import torch

    if not torch.cuda.is_available():
        return
    # UCX 1.20 (in nixl 1.5.1) turns cuda_ipc's GET off where it finds no NVLink ("cuda-ipc
    # get zcopy disabled as no nvlinks detected"); the direct backend reads (GET), so reads of
    # GPU memory then went over TCP loopback fragment by fragment: 0.44 GB/s for 64 MB on an
    # H100 (seen with UCX_PROTO_INFO=y). On, unless the operator set it.
    os.environ.setdefault("UCX_CUDA_IPC_ENABLE_GET_ZCOPY", "on")
    # UCX 1.20 sets its CUDA transports up when the agent is created; an agent created before
    # the process had a CUDA context read GPU memory through an emulated path that waits on
    # the owner's progress loop (H100, one 16 MB read: 29 ms, against 0.02 ms with the context
    # made first; 64 bytes: 1.1 ms against 0.014 ms). The backend makes its agent lazily,
    # often for a CPU payload or in a worker thread, before any GPU work.
    torch.zeros(1, device="cuda")  # the primary context, current in this thread


def new_notifier(name: str) -> Any:
    """A second agent, only for sending notifications.

    In nixl 1.5.1 a notification still in flight on an agent (``send_notif``: an active
    message its receiver has not yet progressed) makes that agent's NEXT transfer wait until
    the receiver progresses its worker, although the transfer itself is one-sided (CUDA IPC,
    shared memory). The direct backend frees a buffer by notifying its owner right after
    reading it, and owners progress from a loop that polls every 1 ms when busy: every read
    after the first waited for that loop (a 4 KB read on CPU 1.1 ms, 0.05 ms without the
    notification; 10 ms with the loop at 10 ms; on an H100 0.37 ms per transfer). Sent from an
    agent that never transfers, notifications delay nothing."""
    return new_agent(name)


def drop_remote_agent(agent: Any, remote: str) -> None:
    """Forget ``remote`` after a failed read from it. NIXL 1.5.1 leaves the connection of a
    failed transfer (NIXL_ERR_REMOTE_DISCONNECT, e.g. a stale ref that read memory its owner
    had deregistered) unusable: ``add_remote_agent`` then fails (REMOTE_DISCONNECT, later
    INVALID_PARAM) until the agent is removed, which cut the reader off from a live producer
    for good. Removing it lets the next ref's metadata add it afresh. The direct backend also
    removes an agent before loading metadata from it after that agent deregistered memory:
    NIXL 1.5.1 refuses to re-key a known section (NIXL_ERR_NOT_ALLOWED), and a new buffer may
    sit at a dropped one's address."""
    with contextlib.suppress(Exception):  # unknown to this agent: nothing to drop
        agent.remove_remote_agent(remote)


def gpu_buffer(nbytes: int, device_index: int) -> Any:
    """``nbytes`` of GPU memory (a uint8 tensor) that other processes can read over CUDA IPC,
    allocated with cuMemAlloc outside torch's caching allocator.

    With ``PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True`` (a common setting against
    fragmentation) torch's memory is CUDA VMM memory, which has no CUDA IPC handle; UCX 1.20
    registers it anyway and reads of it fall back to an emulated path: on an H100 a 64 MB
    read took 135 ms (0.5 GB/s) instead of 1.5 ms, 10x slower than going through host memory
    (also nixl issue 1754). Plain cuMemAlloc memory has an IPC handle whatever the allocator
    is set to. Freed when the tensor (and every view of it) is gone."""
    import torch

    memory = _DeviceMemory(nbytes, device_index)
    return torch.as_tensor(memory, device=torch.device("cuda", device_index))


def _libcuda() -> Any:
    return ctypes.CDLL("libcuda.so.1")


class _DeviceMemory:
    """cuMemAlloc'd bytes, exposed through ``__cuda_array_interface__`` (torch keeps this
    object alive for as long as a tensor views the memory, then it is freed)."""

    def __init__(self, nbytes: int, device_index: int) -> None:
        self.cuda, self.device_index = _libcuda(), device_index
        pointer = ctypes.c_uint64()
        with self._context():
            self._check(self.cuda.cuMemAlloc_v2(ctypes.byref(pointer), ctypes.c_size_t(nbytes)))
        self.pointer = pointer.value
        self.__cuda_array_interface__ = {
            "shape": (nbytes,),
            "typestr": "|u1",
            "data": (self.pointer, False),
            "version": 2,
        }

    @contextlib.contextmanager
    def _context(self) -> Iterator[None]:
        """The device's primary context, current in this thread for the call (a worker
        thread may never have made one current)."""
        device, context = ctypes.c_int(), ctypes.c_void_p()
        self._check(self.cuda.cuDeviceGet(ctypes.byref(device), self.device_index))
        self._check(self.cuda.cuDevicePrimaryCtxRetain(ctypes.byref(context), device))
        self._check(self.cuda.cuCtxPushCurrent_v2(context))
        try:
            yield
        finally:
            self.cuda.cuCtxPopCurrent_v2(ctypes.byref(ctypes.c_void_p()))
            self.cuda.cuDevicePrimaryCtxRelease_v2(device)

    def _check(self, status: int) -> None:
        if status != 0:
            raise RuntimeError(f"CUDA driver call failed (CUresult {status})")

    def __del__(self) -> None:  # no imports here: it may run at interpreter exit
        if getattr(self, "pointer", None):
            with contextlib.suppress(Exception), self._context():
                self.cuda.cuMemFree_v2(ctypes.c_uint64(self.pointer))
