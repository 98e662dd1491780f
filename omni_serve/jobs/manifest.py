"""``manifest.jsonl``: one record per input line, what makes a batch job resumable.

Records are appended (and fsynced) only after a request's files are in place, so a record
with ``status: ok`` means its files are whole. On start the manifest is compacted: ok records
whose files still exist are kept (those requests are skipped), everything else is dropped and
runs again. A line cut short by a crash is ignored.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

MANIFEST = "manifest.jsonl"


class Manifest:
    def __init__(self, out_dir: Path) -> None:
        self.out_dir = out_dir
        self.path = out_dir / MANIFEST
        self._file = None

    def resume(self) -> dict[str, dict[str, Any]]:
        """Compact the manifest and return the finished requests, by custom id."""
        done: dict[str, dict[str, Any]] = {}
        for record in self._records():
            custom_id = record.get("custom_id")
            if custom_id is None:
                continue
            if record.get("status") == "ok" and self._files_exist(record):
                done[custom_id] = record
            else:
                done.pop(custom_id, None)  # a later failure replaces an earlier success
        tmp = self.path.with_name(f".{MANIFEST}.tmp")
        with open(tmp, "w") as f:
            for record in done.values():
                f.write(json.dumps(record) + "\n")
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, self.path)
        return done

    def append(self, record: dict[str, Any]) -> None:
        if self._file is None:
            self._file = open(self.path, "a")  # noqa: SIM115 - closed in close()
        self._file.write(json.dumps(record) + "\n")
        self._file.flush()
        os.fsync(self._file.fileno())

    def close(self) -> None:
        if self._file is not None:
            self._file.close()
            self._file = None

    def _records(self) -> list[dict[str, Any]]:
        if not self.path.exists():
            return []
        records = []
        for text in self.path.read_text().splitlines():
            try:
                record = json.loads(text)
            except json.JSONDecodeError:
                continue  # a record cut short by a crash: that request runs again
            if isinstance(record, dict):
                records.append(record)
        return records

    def _files_exist(self, record: dict[str, Any]) -> bool:
        return all((self.out_dir / name).is_file() for name in record.get("outputs", []))
