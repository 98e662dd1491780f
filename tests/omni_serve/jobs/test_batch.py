"""The batch job against a fake HTTP backend: files, manifest, retries, resume, bad lines.

The fake answers like the ingress does (same response shapes); the served app runs a batch job
in tests/integration/test_operations.py.
"""

from __future__ import annotations

import asyncio
import base64
import json
from pathlib import Path

import httpx
import pytest

from omni_serve.jobs.batch import BatchRunner, BatchSettings, main

WAV = b"RIFF-fake-wav"
PNG = b"\x89PNG-fake"


class FakeServer:
    """Answers the three endpoints; ``script`` queues special answers per custom prompt."""

    def __init__(self) -> None:
        self.calls: list[str] = []
        self.script: dict[str, list[httpx.Response | Exception]] = {}
        self.hold = asyncio.Event()  # requests with prompt "hold" wait on it

    async def __call__(self, request: httpx.Request) -> httpx.Response:
        body = json.loads(request.content)
        key = body.get("input") or body.get("prompt") or body["messages"][0]["content"]
        self.calls.append(key)
        if self.script.get(key):
            answer = self.script[key].pop(0)
            if isinstance(answer, Exception):
                raise answer
            return answer
        if key == "hold":
            await self.hold.wait()
        if request.url.path == "/v1/audio/speech":
            return httpx.Response(200, content=WAV, headers={"content-type": "audio/wav"})
        if request.url.path == "/v1/images/generations":
            data = [{"b64_json": base64.b64encode(PNG).decode()}] * body.get("n", 1)
            return httpx.Response(200, json={"data": data, "seeds": [1] * len(data)})
        message = {"role": "assistant", "content": f"reply to {key}"}
        if "audio" in body.get("modalities", []):
            message["audio"] = {"data": base64.b64encode(WAV).decode(), "transcript": "x"}
        usage = {"prompt_tokens": 3, "completion_tokens": 2, "total_tokens": 5}
        return httpx.Response(200, json={"choices": [{"message": message}], "usage": usage})


def line(custom_id, url="/v1/chat/completions", **body) -> str:
    if not body:
        body = {"model": "m", "messages": [{"role": "user", "content": custom_id}]}
    return json.dumps({"custom_id": custom_id, "method": "POST", "url": url, "body": body})


async def run(tmp_path: Path, server: FakeServer, lines: list[str], **overrides):
    (tmp_path / "in.jsonl").write_text("\n".join(lines) + "\n")
    settings = BatchSettings(
        input=tmp_path / "in.jsonl", output=tmp_path / "out", progress=False, **overrides
    )
    transport = httpx.MockTransport(server)
    async with httpx.AsyncClient(transport=transport, base_url="http://fake") as client:
        return await BatchRunner(settings, client).run()


def manifest(tmp_path: Path) -> list[dict]:
    return [json.loads(t) for t in (tmp_path / "out" / "manifest.jsonl").read_text().splitlines()]


async def test_each_endpoint_writes_its_files_and_a_manifest_record(tmp_path):
    server = FakeServer()
    lines = [
        line("chat-1"),
        line(
            "omni-1",
            model="m",
            messages=[{"role": "user", "content": "omni-1"}],
            modalities=["text", "audio"],
            audio={"voice": "ethan", "format": "wav"},
        ),
        line("tts-1", "/v1/audio/speech", model="m", input="tts-1", response_format="wav"),
        line("img-2", "/v1/images/generations", prompt="img-2", n=2),
    ]
    summary = await run(tmp_path, server, lines)
    out = tmp_path / "out"
    assert (summary.ok, summary.failed) == (4, 0)
    assert (out / "chat-1.txt").read_text() == "reply to chat-1"
    assert (out / "omni-1.txt").exists() and (out / "omni-1.wav").read_bytes() == WAV
    assert (out / "tts-1.wav").read_bytes() == WAV
    assert (out / "img-2-0.png").read_bytes() == PNG == (out / "img-2-1.png").read_bytes()
    records = {r["custom_id"]: r for r in manifest(tmp_path)}
    assert records["omni-1"]["outputs"] == ["omni-1.txt", "omni-1.wav"]
    assert records["chat-1"]["usage"]["total_tokens"] == 5
    assert all(r["status"] == "ok" and r["attempts"] == 1 for r in records.values())


async def test_bad_lines_are_reported_and_do_not_stop_the_job(tmp_path):
    server = FakeServer()
    lines = [
        "{not json",
        line("../escape"),
        line("a/b"),
        line(".hidden"),
        line("ok-1"),
        line("ok-1"),
        line("x", "/v1/embeddings"),
        "[1, 2]",
        line("ok-2"),
        json.dumps({"url": "/v1/chat/completions", "body": {}}),
    ]
    summary = await run(tmp_path, server, lines)
    assert (summary.ok, summary.failed) == (2, 8)
    errors = {r["line"]: r["error"] for r in manifest(tmp_path) if r["status"] == "error"}
    assert "not valid JSON" in errors[1] and "custom_id" in errors[2] and "custom_id" in errors[3]
    assert "duplicate custom_id 'ok-1' (first on line 5)" in errors[6]
    assert "url '/v1/embeddings'" in errors[7]
    assert errors[10] == "custom_id is missing (it names the output files)"
    assert sorted(server.calls) == ["ok-1", "ok-2"]
    written = {p.relative_to(tmp_path).as_posix() for p in tmp_path.rglob("*") if p.is_file()}
    assert written == {"in.jsonl", "out/manifest.jsonl", "out/ok-1.txt", "out/ok-2.txt"}


async def test_a_4xx_is_recorded_with_the_servers_reason(tmp_path):
    server = FakeServer()
    reason = {"error": {"message": "unknown voice 'zed'", "type": "invalid_request_error"}}
    server.script["bad"] = [httpx.Response(400, json=reason)]
    summary = await run(tmp_path, server, [line("bad")])
    assert summary.failed == 1
    [record] = manifest(tmp_path)
    assert record["status_code"] == 400 and record["error"] == "unknown voice 'zed'"


async def test_503_is_retried_after_the_servers_retry_after(tmp_path):
    server = FakeServer()
    busy = httpx.Response(503, headers={"retry-after": "0"}, json={"error": {"message": "busy"}})
    server.script["busy"] = [busy, busy]
    summary = await run(tmp_path, server, [line("busy")])
    assert summary.ok == 1 and server.calls == ["busy"] * 3
    assert manifest(tmp_path)[0]["attempts"] == 3


async def test_a_dropped_connection_is_retried(tmp_path, monkeypatch):
    monkeypatch.setattr("omni_serve.jobs.batch._backoff_s", lambda attempt: 0.0)
    server = FakeServer()
    server.script["gone"] = [httpx.ConnectError("refused"), httpx.RemoteProtocolError("reset")]
    summary = await run(tmp_path, server, [line("gone")])
    assert summary.ok == 1 and manifest(tmp_path)[0]["attempts"] == 3


async def test_retries_are_bounded(tmp_path):
    server = FakeServer()
    server.script["busy"] = [httpx.Response(503, headers={"retry-after": "0"})] * 3
    summary = await run(tmp_path, server, [line("busy")], max_retries=2)
    assert summary.failed == 1 and len(server.calls) == 3
    assert manifest(tmp_path)[0]["status_code"] == 503


async def test_rerun_skips_what_is_done_and_retries_what_failed(tmp_path):
    server = FakeServer()
    server.script["flaky"] = [httpx.Response(500, json={"error": {"message": "stage died"}})]
    lines = [line("a"), line("b"), line("flaky")]
    first = await run(tmp_path, server, lines)
    assert (first.ok, first.failed) == (2, 1)
    (tmp_path / "out" / "b.txt").unlink()  # an output lost since: that request runs again
    server.calls.clear()
    second = await run(tmp_path, server, lines)
    assert (second.ok, second.failed, second.skipped) == (2, 0, 1)
    assert sorted(server.calls) == ["b", "flaky"]
    records = manifest(tmp_path)
    assert sorted(r["custom_id"] for r in records) == ["a", "b", "flaky"]  # one record each
    assert all(r["status"] == "ok" for r in records)


async def test_a_crash_mid_write_leaves_nothing_counted_as_done(tmp_path):
    out = tmp_path / "out"
    out.mkdir()
    (out / ".a.txt.partial").write_text("half")  # a file the crash cut short
    ok = {"custom_id": "b", "status": "ok", "outputs": ["b.txt"]}
    (out / "b.txt").write_text("reply to b")
    (out / "manifest.jsonl").write_text(json.dumps(ok) + "\n" + '{"custom_id": "a", "sta')
    server = FakeServer()
    summary = await run(tmp_path, server, [line("a"), line("b")])
    assert (summary.ok, summary.skipped) == (1, 1) and server.calls == ["a"]
    assert not list(out.glob(".*.partial"))
    assert [r["custom_id"] for r in manifest(tmp_path)] == ["b", "a"]


async def test_an_interrupted_job_records_only_finished_requests(tmp_path):
    server = FakeServer()
    task = asyncio.ensure_future(run(tmp_path, server, [line("a"), line("hold")], concurrency=2))
    while len(server.calls) < 2:
        await asyncio.sleep(0.01)
    await asyncio.sleep(0.05)
    task.cancel()  # what Ctrl-C does to asyncio.run's main task
    with pytest.raises(asyncio.CancelledError):
        await task
    assert [r["custom_id"] for r in manifest(tmp_path)] == ["a"]
    assert sorted(p.name for p in (tmp_path / "out").iterdir()) == ["a.txt", "manifest.jsonl"]


def test_cli_rejects_a_missing_input_file(tmp_path, capsys):
    with pytest.raises(SystemExit) as exit_:
        main(["--input", str(tmp_path / "nope.jsonl"), "--output", str(tmp_path / "out")])
    assert exit_.value.code == 2 and "no such file" in capsys.readouterr().err


def test_cli_exits_1_and_names_the_failure_when_a_line_fails(tmp_path, capsys):
    (tmp_path / "in.jsonl").write_text("{broken\n")
    code = main(
        [
            "--input",
            str(tmp_path / "in.jsonl"),
            "--output",
            str(tmp_path / "out"),
            "--url",
            "http://127.0.0.1:9",
            "--no-progress",
        ]
    )
    assert code == 1
    captured = capsys.readouterr()
    assert "0 ok, 1 failed" in captured.out and "line 1: not valid JSON" in captured.err
