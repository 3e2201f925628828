"""The suite's fenced store: a protected system that checks tokens.

Per key it keeps the highest fencing token it accepted and, atomically,
rejects any lower token (equal ones are accepted: one holder may write many
times). Agents reach it over TCP with one JSON line per connection
(PROTOCOL.md, "The fenced store"). It is in the suite, not PostgreSQL, so
that every agent can write to it without a database driver and the suite
needs no database server; `clients/python/tests/test_fencing_pg.py` checks
the Python PostgreSQL helper against a real PostgreSQL with the same
semantics.
"""

from __future__ import annotations

import json
import socketserver
import threading
from typing import Any, Optional


class FencedStore:
    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.highest: dict[str, int] = {}
        self.values: dict[str, str] = {}
        #: Every write in arrival order: (key, token, value, accepted).
        self.log: list[tuple[str, int, str, bool]] = []
        store = self

        class Handler(socketserver.StreamRequestHandler):
            def handle(self) -> None:
                self.request.settimeout(5)
                try:
                    msg = json.loads(self.rfile.readline())
                    reply: dict[str, Any] = store.write(str(msg["key"]), int(msg["token"]), str(msg.get("value", "")))
                except Exception as e:  # malformed: say so, never crash the store
                    reply = {"error": f"{type(e).__name__}: {e}"}
                self.wfile.write((json.dumps(reply) + "\n").encode())

        class Server(socketserver.ThreadingTCPServer):
            daemon_threads = True
            allow_reuse_address = True

        self._server = Server(("127.0.0.1", 0), Handler)
        self.address = f"127.0.0.1:{self._server.server_address[1]}"
        self._thread = threading.Thread(target=self._server.serve_forever, daemon=True)
        self._thread.start()

    def write(self, key: str, token: int, value: str) -> dict[str, Any]:
        with self._lock:
            current = self.highest.get(key, 0)
            accepted = token > 0 and token >= current
            if accepted:
                self.highest[key] = token
                self.values[key] = value
            self.log.append((key, token, value, accepted))
            return {"accepted": accepted, "highest": str(self.highest.get(key, 0))}

    def value(self, key: str) -> Optional[str]:
        with self._lock:
            return self.values.get(key)

    def close(self) -> None:
        self._server.shutdown()
        self._server.server_close()
