"""A local HTTP server that answers JSON by path and records what it was sent (a Jobs API stand-in, a hostile
listener): unit tests of the product's HTTP clients, on 127.0.0.1 only."""

from __future__ import annotations

import http.server
import json
import threading
from typing import Callable, Optional


class JsonServer:
    """Answers `replies[key]` for the first key `match(path, key)` accepts ({} when none); `seen` holds (path,
    Authorization header) of every request."""

    def __init__(self, replies: dict, match: Optional[Callable[[str, str], bool]] = None):
        self.seen: list[tuple[str, str]] = []
        match = match or (lambda path, key: path.startswith(key))
        outer = self

        class Handler(http.server.BaseHTTPRequestHandler):
            def _answer(self):
                outer.seen.append((self.path, self.headers.get("Authorization") or ""))
                body = next((v for k, v in replies.items() if match(self.path, k)), {})
                raw = json.dumps(body).encode()
                self.send_response(200)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(raw)))
                self.end_headers()
                self.wfile.write(raw)

            do_GET = do_POST = _answer

            def log_message(self, *a):
                pass

        self.srv = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.port = self.srv.server_address[1]
        threading.Thread(target=self.srv.serve_forever, daemon=True).start()

    def close(self) -> None:
        self.srv.shutdown()
        self.srv.server_close()
