"""A TCP proxy that can lose replies: the suite's way to make "the acquire
was committed but its reply never arrived" happen for any client.

`hold()` keeps everything the server sends from reaching the client
(requests still go through); `cut()` then closes every proxied connection
and drops what was held, so the client sees a transport failure and must
retry, on a new connection, with the same request id."""

from __future__ import annotations

import socket
import threading


class ReplyDroppingProxy:
    def __init__(self, upstream: str) -> None:
        host, port = upstream.rsplit(":", 1)
        self.upstream = (host, int(port))
        self._listener = socket.socket()
        self._listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self._listener.bind(("127.0.0.1", 0))
        self._listener.listen(16)
        self.address = f"127.0.0.1:{self._listener.getsockname()[1]}"
        self._lock = threading.Lock()
        self._conns: list[tuple[socket.socket, socket.socket]] = []
        self._holding = False
        self._closed = False
        self.held_bytes = 0
        threading.Thread(target=self._accept, daemon=True).start()

    def hold(self) -> None:
        with self._lock:
            self._holding = True

    def cut(self) -> None:
        with self._lock:
            conns, self._conns = self._conns, []
            self._holding = False
        for a, b in conns:
            for s in (a, b):
                try:
                    s.shutdown(socket.SHUT_RDWR)
                except OSError:
                    pass
                s.close()

    def close(self) -> None:
        self._closed = True
        self.cut()
        self._listener.close()

    def _accept(self) -> None:
        while not self._closed:
            try:
                client, _ = self._listener.accept()
            except OSError:
                return
            try:
                server = socket.create_connection(self.upstream, timeout=5)
                server.settimeout(None)
            except OSError:
                client.close()
                continue
            with self._lock:
                self._conns.append((client, server))
            threading.Thread(target=self._pump, args=(client, server, False), daemon=True).start()
            threading.Thread(target=self._pump, args=(server, client, True), daemon=True).start()

    def _pump(self, src: socket.socket, dst: socket.socket, from_server: bool) -> None:
        try:
            while True:
                data = src.recv(65536)
                if not data:
                    break
                with self._lock:
                    hold = from_server and self._holding
                    if hold:
                        self.held_bytes += len(data)
                if not hold:
                    dst.sendall(data)
        except OSError:
            pass
        finally:
            for s in (src, dst):
                try:
                    s.shutdown(socket.SHUT_RDWR)
                except OSError:
                    pass
