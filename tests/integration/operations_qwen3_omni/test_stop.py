"""User story: stopping the app leaves no shared memory behind."""

from __future__ import annotations

from pathlib import Path

import pytest

from omni_serve.testing.serve_process import replica_pids
from tests.integration.operations_qwen3_omni.app import SPOKEN, audio_question, chat
from tests.integration.served_processes import (
    gone_within,
    shm_files_mapped,
    the_thinker_and_its_engine,
)

pytestmark = pytest.mark.integration


def test_stopping_the_server_removes_its_shared_memory(served):
    """Ctrl-C on ``serve run`` stops every replica cleanly: the channel's segments of each stage
    (/dev/shm/omni-shm-<pid>-*) and the queues the Thinker's vLLM processes map (psm_*) go
    with them, instead of piling up run after run (Serve ends a replica without exit handlers).
    Last in this package (its conftest orders it): it stops the app."""
    # A spoken reply puts the Thinker's rows and Code2wav's audio on shared memory (the audio
    # question alone goes inline and by the object store: run alone, this found no segments).
    assert chat({**audio_question(), **SPOKEN}).status_code == 200
    _, engine = the_thinker_and_its_engine(served)
    queues = shm_files_mapped(engine)
    assert any("/psm_" in q for q in queues), queues  # else there is nothing to check
    segments = {
        str(path)
        for pid in replica_pids(r"[^\s.]+")
        for path in Path("/dev/shm").glob(f"omni-shm-{pid}-*")
    }
    assert segments  # the stages' pools
    served.stop()
    # The engine process unlinks its queues as it exits, which can trail `serve run`'s own
    # exit by a moment on a loaded machine: gone within seconds, not piling up.
    gone_within(queues | segments, 30)
