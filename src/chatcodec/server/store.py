"""The Responses store: each stored response's answer and the conversation it ends, in one SQLite file.

``previous_response_id`` continues the conversation a stored response ended; ``GET`` and ``DELETE
/v1/responses/{id}`` read and remove one. The file is bounded in entries and in bytes, oldest out first, and
several server processes may share it (``chatcodec serve --workers N``): SQLite's own locking orders their
writes (WAL journal, a busy timeout), and each write trims in the same transaction, so no process sees the
store over its bounds.

>>> import tempfile, pathlib
>>> store = ResponseStore(pathlib.Path(tempfile.mkdtemp()) / "r.sqlite3", max_entries=2)
>>> for n in range(3):
...     store.put(f"resp_{n}", {"id": f"resp_{n}"}, [{"role": "user", "content": str(n)}])
>>> store.get("resp_0") is None, store.get("resp_2").response["id"], len(store)
(True, 'resp_2', 2)
"""

from __future__ import annotations

import json
import os
import sqlite3
import threading
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ..exceptions import InputError

__all__ = ["MAX_BYTES", "MAX_ENTRIES", "ResponseStore", "Stored", "default_path"]

#: the default bounds: how many responses the file keeps, and how many bytes of JSON in all
MAX_ENTRIES = 10_000
MAX_BYTES = 256 * 1024 * 1024

_SCHEMA = """
CREATE TABLE IF NOT EXISTS responses (
    seq INTEGER PRIMARY KEY AUTOINCREMENT,
    id TEXT NOT NULL UNIQUE,
    created REAL NOT NULL,
    size INTEGER NOT NULL,
    response TEXT NOT NULL,
    messages TEXT NOT NULL,
    items TEXT NOT NULL DEFAULT '[]'
)
"""


def default_path() -> Path:
    """``$XDG_DATA_HOME/chatcodec/responses.sqlite3`` (default ``~/.local/share/chatcodec/...``)."""
    base = os.environ.get("XDG_DATA_HOME") or str(Path.home() / ".local" / "share")
    return Path(base) / "chatcodec" / "responses.sqlite3"


@dataclass(frozen=True, slots=True)
class Stored:
    """One stored response: its answer as the client got it, and the whole conversation it ended (the chat
    messages, its own output last), which the next request's ``previous_response_id`` continues. ``items`` are
    its input items with their ids (those of the responses it continues first), for ``GET .../input_items``."""

    response: dict[str, Any]
    messages: list[dict[str, Any]]
    items: list[dict[str, Any]] = field(default_factory=list)


class ResponseStore:
    """Stored responses in the SQLite file at ``path`` (created with its folder on first use), at most
    ``max_entries`` of them and ``max_bytes`` of JSON, the oldest dropped first. Blocking: call it off the event
    loop. One connection per thread, so the server's worker threads never share one."""

    def __init__(self, path: str | Path, *, max_entries: int = MAX_ENTRIES, max_bytes: int = MAX_BYTES) -> None:
        if max_entries < 1 or max_bytes < 1:
            raise InputError(
                f"A response store keeps at least one entry and one byte, not {max_entries} and {max_bytes}."
            )
        self.path = Path(path)
        self.max_entries = max_entries
        self.max_bytes = max_bytes
        self._local = threading.local()

    def _db(self) -> sqlite3.Connection:
        db: sqlite3.Connection | None = getattr(self._local, "db", None)
        if db is None:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            db = sqlite3.connect(self.path, timeout=30.0, isolation_level=None)
            db.execute("PRAGMA busy_timeout = 30000")
            db.execute("PRAGMA journal_mode = WAL")
            db.execute("PRAGMA synchronous = NORMAL")  # WAL: a crash of the process loses nothing committed
            db.execute(_SCHEMA)
            try:  # a file from before input items were kept
                db.execute("ALTER TABLE responses ADD COLUMN items TEXT NOT NULL DEFAULT '[]'")
            except sqlite3.OperationalError as exc:
                if "duplicate column" not in str(exc):  # else it is there: the new schema, or another process's
                    raise
            self._local.db = db
        return db

    def put(
        self,
        response_id: str,
        response: Mapping[str, Any],
        messages: Sequence[Mapping[str, Any]],
        items: Sequence[Mapping[str, Any]] = (),
    ) -> None:
        """Keep ``response``, the conversation it ends and its input ``items``, then drop the oldest entries past
        the bounds. An entry larger than ``max_bytes`` alone is not kept (the store would have to empty itself)."""
        body = json.dumps(response, ensure_ascii=False)
        convo = json.dumps(list(messages), ensure_ascii=False, default=str)
        inputs = json.dumps(list(items), ensure_ascii=False, default=str)
        size = len(body.encode()) + len(convo.encode()) + len(inputs.encode())
        if size > self.max_bytes:
            return
        db = self._db()
        db.execute("BEGIN IMMEDIATE")  # one writer at a time across processes: the trim sees every insert
        try:
            db.execute(
                "INSERT OR REPLACE INTO responses (id, created, size, response, messages, items)"
                " VALUES (?, ?, ?, ?, ?, ?)",
                (response_id, time.time(), size, body, convo, inputs),
            )
            count, total = db.execute("SELECT COUNT(*), COALESCE(SUM(size), 0) FROM responses").fetchone()
            if count > self.max_entries or total > self.max_bytes:
                self._trim(db)
            db.execute("COMMIT")
        except BaseException:
            db.execute("ROLLBACK")
            raise

    def _trim(self, db: sqlite3.Connection) -> None:
        """Drop the oldest entries until both bounds hold (inside :meth:`put`'s transaction): the newest entry
        past either bound, counting from the newest, and every older one."""
        row = db.execute(
            "SELECT seq FROM (SELECT seq, ROW_NUMBER() OVER newest AS n, SUM(size) OVER newest AS kept"
            " FROM responses WINDOW newest AS (ORDER BY seq DESC)) WHERE n > ? OR kept > ? ORDER BY seq DESC LIMIT 1",
            (self.max_entries, self.max_bytes),
        ).fetchone()
        if row is not None:
            db.execute("DELETE FROM responses WHERE seq <= ?", (row[0],))

    def get(self, response_id: str) -> Stored | None:
        """The stored response ``response_id``, or None (never stored, deleted, or dropped for the bounds)."""
        row = (
            self._db()
            .execute("SELECT response, messages, items FROM responses WHERE id = ?", (response_id,))
            .fetchone()
        )
        if row is None:
            return None
        return Stored(json.loads(row[0]), json.loads(row[1]), json.loads(row[2]))

    def delete(self, response_id: str) -> bool:
        """Remove ``response_id``; False when it was not there."""
        return self._db().execute("DELETE FROM responses WHERE id = ?", (response_id,)).rowcount > 0

    def usage(self) -> tuple[int, int]:
        """How many responses are kept, and their bytes of JSON."""
        count, total = self._db().execute("SELECT COUNT(*), COALESCE(SUM(size), 0) FROM responses").fetchone()
        return int(count), int(total)

    def __len__(self) -> int:
        return self.usage()[0]

    def close(self) -> None:
        """Close this thread's connection (others close when their thread ends)."""
        db = getattr(self._local, "db", None)
        if db is not None:
            db.close()
            self._local.db = None
