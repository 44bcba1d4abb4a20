"""A tiny loopback OpenAI-compatible server (stdlib only) for plugin and CLI tests.

Streams ``words`` one per SSE chunk with cumulative usage on every chunk, and keeps toy
speculative counters (per request: 4 drafts, 12 draft tokens, 6 accepted) at /toy/counters.
"""

from __future__ import annotations

import json
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

WORDS = ["Hello", " from", " the", " toy", " server", "."]


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"

    def log_message(self, *args):  # quiet
        pass

    def _json(self, body, status=200):
        data = json.dumps(body).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def do_GET(self):
        if self.path == "/v1/models":
            return self._json({"object": "list", "data": [{"id": "toy-model", "object": "model"}]})
        if self.path == "/toy/counters":
            return self._json(self.server.counters)
        return self._json({"detail": "Not Found"}, 404)

    def do_POST(self):
        length = int(self.headers.get("Content-Length") or 0)
        body = json.loads(self.rfile.read(length) or b"{}")
        chat = self.path == "/v1/chat/completions"
        if self.path not in ("/v1/chat/completions", "/v1/completions"):
            return self._json({"detail": "Not Found"}, 404)
        with self.server.lock:
            c = self.server.counters
            c["drafts"] += 4
            c["draft_tokens"] += 12
            c["accepted_tokens"] += 6
            c["requests"] += 1
        self.send_response(200)
        self.send_header("Content-Type", "text/event-stream")
        self.send_header("Connection", "close")
        self.end_headers()
        words = WORDS[: body.get("max_tokens") or len(WORDS)]
        for i, word in enumerate(words, 1):
            choice = {"index": 0, "delta": {"content": word}} if chat else {"index": 0, "text": word}
            choice["finish_reason"] = "length" if i == len(words) else None
            chunk = {"choices": [choice], "usage": {"prompt_tokens": 5, "completion_tokens": i}}
            self.wfile.write(f"data: {json.dumps(chunk)}\n\n".encode())
            self.wfile.flush()
        self.wfile.write(b"data: [DONE]\n\n")
        self.wfile.flush()
        self.close_connection = True


class FakeOpenAIServer:
    def __init__(self):
        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), _Handler)
        self.httpd.daemon_threads = True
        self.httpd.counters = {"drafts": 0, "draft_tokens": 0, "accepted_tokens": 0, "requests": 0}
        self.httpd.lock = threading.Lock()
        self.thread = threading.Thread(target=self.httpd.serve_forever, daemon=True)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.httpd.server_address[1]}"

    def __enter__(self):
        self.thread.start()
        return self

    def __exit__(self, *exc):
        self.httpd.shutdown()
        self.httpd.server_close()
        self.thread.join(5)
