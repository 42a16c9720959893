"""CursorFile: a service's progress file written off the loop, failures kept dirty."""

from __future__ import annotations

import json
import logging

import trio

from core.broker import cursor_file
from core.broker.cursor_file import CursorFile


class _Service(CursorFile):
    def __init__(self, path: str) -> None:
        self._open_cursor_file(path)
        self.table = {"a": 1}

    def _snapshot(self) -> bytes:
        self._dirty = False
        return json.dumps(self.table).encode()


def test_a_failed_write_stays_dirty_and_is_logged_by_the_service(tmp_path, monkeypatch, caplog):
    path = tmp_path / "cursor.json"
    service = _Service(str(path))
    real = cursor_file.atomic_write_bytes
    disk = {"full": True}

    def writer(p, payload):
        if disk["full"]:
            raise OSError(28, "No space left on device")
        real(p, payload)

    monkeypatch.setattr(cursor_file, "atomic_write_bytes", writer)
    service._dirty = True
    with caplog.at_level(logging.ERROR):
        trio.run(service._persist_in_thread)
        assert service._dirty and not path.exists()  # the next pass tries again
        service._persist_at_shutdown()
    assert [(r.name, r.getMessage().split(":")[0]) for r in caplog.records] == [
        (__name__, f"cannot persist {path}"), (__name__, f"cannot persist {path} at shutdown")]
    disk["full"] = False
    service.table["a"] = 2
    trio.run(service._persist_in_thread)
    assert not service._dirty and json.loads(path.read_text()) == {"a": 2}
