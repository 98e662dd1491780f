"""Batch generation against a deployed omni-serve app, meant to run as a Ray job::

    ray job submit --working-dir . -- python -m omni_serve.jobs.batch \\
        --input prompts.jsonl --output /data/out

Each input line is an OpenAI Batch API request (see ``items.py``). Every response becomes
files named after its ``custom_id`` in the output directory, plus a record in
``manifest.jsonl``. Files are written under a temporary name and renamed into place before
their record is written, so a crash or Ctrl-C never leaves a half-written file counted as
done; re-running the same command skips what is done and retries what failed.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import random
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
from tqdm import tqdm

from omni_serve.jobs.items import BatchItem, LineError, parse_line, response_files
from omni_serve.jobs.manifest import Manifest

RETRY_STATUSES = (502, 503)  # the server is busy or a replica is being replaced
RETRYABLE_ERRORS = (httpx.ConnectError, httpx.RemoteProtocolError, httpx.ReadError)


@dataclass
class BatchSettings:
    input: Path
    output: Path
    url: str = "http://127.0.0.1:8000"
    api_key: str | None = None
    concurrency: int = 8
    max_retries: int = 5
    request_timeout_s: float = 900.0
    progress: bool = True


@dataclass
class BatchSummary:
    ok: int = 0
    failed: int = 0
    skipped: int = 0  # finished by an earlier run
    failures: list[str] = field(default_factory=list)


class _RequestFailed(Exception):
    def __init__(self, message: str, status_code: int | None = None) -> None:
        super().__init__(message)
        self.status_code = status_code


def _lines(path: Path) -> Iterator[tuple[int, str]]:
    with open(path) as f:
        for number, text in enumerate(f, start=1):
            if text.strip():
                yield number, text


class BatchRunner:
    def __init__(self, settings: BatchSettings, client: httpx.AsyncClient) -> None:
        self.settings = settings
        self.client = client
        self.out_dir = settings.output
        self.manifest = Manifest(self.out_dir)
        self.summary = BatchSummary()

    async def run(self) -> BatchSummary:
        self.out_dir.mkdir(parents=True, exist_ok=True)
        self._remove_partial_files()
        done = self.manifest.resume()
        total = sum(1 for _ in _lines(self.settings.input))
        queue: asyncio.Queue[BatchItem | None] = asyncio.Queue(self.settings.concurrency * 2)
        with tqdm(
            total=total,
            unit="req",
            desc="batch",
            disable=not self.settings.progress,
            mininterval=0.5 if sys.stderr.isatty() else 10.0,
        ) as bar:
            workers = [
                asyncio.create_task(self._worker(queue, bar))
                for _ in range(self.settings.concurrency)
            ]
            try:
                await self._feed(queue, done, bar)
                for _ in workers:
                    await queue.put(None)
                await asyncio.gather(*workers)
            finally:
                for worker in workers:
                    worker.cancel()
                await asyncio.gather(*workers, return_exceptions=True)
                self.manifest.close()
        return self.summary

    async def _feed(self, queue: asyncio.Queue, done: dict[str, Any], bar: tqdm) -> None:
        first_line: dict[str, int] = {}
        for number, text in _lines(self.settings.input):
            try:
                item = parse_line(number, text)
            except LineError as exc:
                self._record_line_error(number, str(exc), bar)
                continue
            if item.custom_id in first_line:
                message = f"duplicate custom_id {item.custom_id!r} (first on line "
                self._record_line_error(number, message + f"{first_line[item.custom_id]})", bar)
                continue
            first_line[item.custom_id] = number
            if item.custom_id in done:
                self.summary.skipped += 1
                bar.update()
                continue
            await queue.put(item)

    async def _worker(self, queue: asyncio.Queue, bar: tqdm) -> None:
        while (item := await queue.get()) is not None:
            started = time.monotonic()
            record: dict[str, Any] = {
                "custom_id": item.custom_id,
                "line": item.line,
                "url": item.url,
            }
            try:
                response, attempts = await self._send(item)
                names = self._write_files(response_files(item, response.content))
                record.update(
                    status="ok", outputs=names, attempts=attempts, **_response_details(response)
                )
                self.summary.ok += 1
            except _RequestFailed as exc:
                record.update(status="error", status_code=exc.status_code, error=str(exc))
                self._failed(item.custom_id, str(exc))
            except (KeyError, ValueError, TypeError) as exc:  # a response we cannot unpack
                record.update(status="error", error=f"unexpected response: {exc!r}"[:500])
                self._failed(item.custom_id, record["error"])
            record["latency_s"] = round(time.monotonic() - started, 3)
            self.manifest.append(record)
            bar.update()

    async def _send(self, item: BatchItem) -> tuple[httpx.Response, int]:
        for attempt in range(1, self.settings.max_retries + 2):
            last_try = attempt > self.settings.max_retries
            try:
                response = await self.client.post(item.url, json=item.body)
            except RETRYABLE_ERRORS as exc:
                if last_try:
                    raise _RequestFailed(f"{type(exc).__name__}: {exc}") from None
                await asyncio.sleep(_backoff_s(attempt))
                continue
            except httpx.TimeoutException:
                timeout = self.settings.request_timeout_s
                raise _RequestFailed(f"no response within {timeout} s") from None
            if response.status_code in RETRY_STATUSES and not last_try:
                await asyncio.sleep(_retry_after_s(response) or _backoff_s(attempt))
                continue
            if response.status_code != 200:
                raise _RequestFailed(_error_message(response), response.status_code)
            return response, attempt
        raise AssertionError("unreachable")

    def _write_files(self, files: dict[str, bytes]) -> list[str]:
        out = self.out_dir.resolve()
        for name in files:
            if (out / name).resolve().parent != out:  # parse_line already forbids this
                raise ValueError(f"output {name!r} would leave the output directory")
        for name, data in files.items():
            tmp = out / f".{name}.partial"
            try:
                tmp.write_bytes(data)
                os.replace(tmp, out / name)
            finally:
                tmp.unlink(missing_ok=True)
        return sorted(files)

    def _remove_partial_files(self) -> None:
        for tmp in self.out_dir.glob(".*.partial"):
            tmp.unlink(missing_ok=True)

    def _record_line_error(self, line: int, message: str, bar: tqdm) -> None:
        self.manifest.append({"custom_id": None, "line": line, "status": "error", "error": message})
        self._failed(f"line {line}", message)
        bar.update()

    def _failed(self, where: str, message: str) -> None:
        self.summary.failed += 1
        self.summary.failures.append(f"{where}: {message}")


def _response_details(response: httpx.Response) -> dict[str, Any]:
    if not response.headers.get("content-type", "").startswith("application/json"):
        return {}
    body = response.json()
    return {k: body[k] for k in ("usage", "timings", "seeds") if k in body}


def _error_message(response: httpx.Response) -> str:
    try:
        return str(response.json()["error"]["message"])
    except (ValueError, KeyError, TypeError):
        return f"HTTP {response.status_code}: {response.text[:300]}"


def _retry_after_s(response: httpx.Response) -> float | None:
    try:
        return min(60.0, max(0.0, float(response.headers["retry-after"])))
    except (KeyError, ValueError):
        return None


def _backoff_s(attempt: int) -> float:
    return min(30.0, 0.5 * 2 ** (attempt - 1)) * (0.5 + random.random())


async def run_batch(settings: BatchSettings) -> BatchSummary:
    headers = {"Authorization": f"Bearer {settings.api_key}"} if settings.api_key else {}
    timeout = httpx.Timeout(settings.request_timeout_s, connect=10.0)
    limits = httpx.Limits(max_connections=settings.concurrency)
    async with httpx.AsyncClient(
        base_url=settings.url, headers=headers, timeout=timeout, limits=limits
    ) as client:
        return await BatchRunner(settings, client).run()


def _parse_args(argv: list[str] | None) -> BatchSettings:
    parser = argparse.ArgumentParser(
        prog="python -m omni_serve.jobs.batch", description=__doc__.split("::")[0].strip()
    )
    parser.add_argument(
        "--input",
        required=True,
        type=Path,
        help="JSONL file, one OpenAI Batch API request per line",
    )
    parser.add_argument(
        "--output",
        required=True,
        type=Path,
        help="directory for the output files and manifest.jsonl (use an "
        "absolute path under `ray job submit`: the job runs in a temp dir)",
    )
    parser.add_argument(
        "--url",
        default=os.environ.get("OMNI_SERVE_URL", "http://127.0.0.1:8000"),
        help="the deployed app (default $OMNI_SERVE_URL or http://127.0.0.1:8000)",
    )
    parser.add_argument(
        "--api-key",
        default=os.environ.get("OMNI_SERVE_API_KEY"),
        help="Bearer token if the app requires one (default $OMNI_SERVE_API_KEY)",
    )
    parser.add_argument("--concurrency", type=int, default=8, help="requests in flight")
    parser.add_argument(
        "--max-retries",
        type=int,
        default=5,
        help="retries of a request refused with 502/503 or a dropped connection",
    )
    parser.add_argument(
        "--request-timeout",
        type=float,
        default=900.0,
        dest="request_timeout_s",
        help="seconds to wait for one response",
    )
    parser.add_argument("--no-progress", action="store_false", dest="progress")
    args = parser.parse_args(argv)
    if args.concurrency < 1:
        parser.error("--concurrency must be at least 1")
    if not args.input.is_file():
        parser.error(f"--input {args.input}: no such file")
    return BatchSettings(**vars(args))


def main(argv: list[str] | None = None) -> int:
    """Exit 0 when every line succeeded, 1 when some failed (the manifest says which), 130
    when interrupted (re-run to resume)."""
    settings = _parse_args(argv)
    try:
        summary = asyncio.run(run_batch(settings))
    except KeyboardInterrupt:
        print(
            "interrupted: finished requests are in the manifest; re-run to resume", file=sys.stderr
        )
        return 130
    print(
        f"{summary.ok} ok, {summary.failed} failed, {summary.skipped} skipped (done before); "
        f"manifest: {settings.output / 'manifest.jsonl'}"
    )
    for failure in summary.failures[:20]:
        print(f"  failed: {failure}", file=sys.stderr)
    return 1 if summary.failed else 0


if __name__ == "__main__":
    sys.exit(main())
