"""Helpers for the delay / transaction / retry tests: a raw TCP client speaking FerryMQ frames, and
a pull loop over HTTP."""

from __future__ import annotations

import json
import socket
import threading
import time
import urllib.parse
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import msgpack
from support import http

from ferrymq.broker.protocol.request_codes import RequestCode
from ferrymq.broker.protocol.tcp_codec import FLAG_ONEWAY, Command, FrameDecoder, encode_frame

# Small, sparse commit-log segments: test brokers must not fill a shared disk.
SMALL_STORE = {"mappedFileSizeCommitLog": 4 * 1024 * 1024, "preallocateCommitLog": False}
# Delay levels scaled down for tests: level N waits N * 100 ms (levels 1..18).
FAST_LEVELS = " ".join(f"{100 * n}ms" for n in range(1, 19))


class RawTcpClient:
    """One blocking TCP connection; requests are answered in order, oneway requests from the broker
    (CHECK_TRANSACTION_STATE) are collected in ``notices``."""

    def __init__(self, port: int) -> None:
        self.sock = socket.create_connection(("127.0.0.1", port), timeout=10)
        self.decoder = FrameDecoder()
        self.opaque = 0
        self.notices: list[Command] = []
        self._frames: list[Command] = []

    def close(self) -> None:
        self.sock.close()

    def _next_frame(self, timeout: float) -> Command | None:
        deadline = time.monotonic() + timeout
        while not self._frames:
            left = deadline - time.monotonic()
            if left <= 0:
                return None
            self.sock.settimeout(left)
            try:
                data = self.sock.recv(65536)
            except TimeoutError:
                return None
            if not data:
                raise ConnectionError("broker closed the connection")
            self._frames.extend(self.decoder.feed(data))
        return self._frames.pop(0)

    def request(self, code: int, ext: dict[str, Any], body: bytes = b"", timeout: float = 10) -> Command:
        self.opaque += 1
        self.sock.sendall(encode_frame(code, self.opaque, 0, ext, None, body))
        deadline = time.monotonic() + timeout
        while True:
            frame = self._next_frame(max(0.0, deadline - time.monotonic()))
            if frame is None:
                raise TimeoutError(f"no answer to request {code}")
            if frame.is_response and frame.opaque == self.opaque:
                return frame
            if not frame.is_response:
                self.notices.append(frame)

    def oneway(self, code: int, ext: dict[str, Any]) -> None:
        self.opaque += 1
        self.sock.sendall(encode_frame(code, self.opaque, FLAG_ONEWAY, ext))

    def wait_notice(self, code: int, timeout: float) -> Command | None:
        deadline = time.monotonic() + timeout
        while True:
            for i, n in enumerate(self.notices):
                if n.code == code:
                    return self.notices.pop(i)
            frame = self._next_frame(max(0.0, deadline - time.monotonic()))
            if frame is None:
                return None
            if not frame.is_response:
                self.notices.append(frame)

    def heartbeat(self, client_id: str, producer_groups: list[str]) -> None:
        body = msgpack.packb({"clientId": client_id, "producerGroups": producer_groups, "consumerGroups": []})
        r = self.request(RequestCode.HEART_BEAT, {}, body)
        assert r.code == 0, r.remark


def pull_all(url: str, topic: str, queue_id: int, offset: int = 0,
             wait_ms: int = 0) -> tuple[list[dict[str, Any]], int]:
    """Every message of one queue from ``offset``; (messages, next offset)."""
    out: list[dict[str, Any]] = []
    t = urllib.parse.quote(topic, safe="")
    while True:
        status, body = http("GET", f"{url}/v1/topics/{t}/queues/{queue_id}/messages"
                                   f"?offset={offset}&maxMessages=256&waitMs={wait_ms}")
        if status == 404:
            return out, offset
        assert status == 200, body
        out.extend(body["messages"])
        if body["nextOffset"] == offset:
            return out, offset
        offset = body["nextOffset"]
        wait_ms = 0


def pull_topic(url: str, topic: str, queues: int) -> list[dict[str, Any]]:
    msgs: list[dict[str, Any]] = []
    for q in range(queues):
        msgs.extend(pull_all(url, topic, q)[0])
    return msgs


class CheckServer:
    """An HTTP producer's check endpoint: answers each transaction from a script of states."""

    def __init__(self) -> None:
        self.script: dict[str, list[str]] = {}
        self.calls: list[dict[str, Any]] = []
        outer = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
                body["receivedMs"] = int(time.time() * 1000)
                outer.calls.append(body)
                states = outer.script.get(body["transactionId"], ["UNKNOWN"])
                state = states.pop(0) if len(states) > 1 else states[0]
                data = json.dumps({"state": state}).encode()
                self.send_response(200)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def log_message(self, *args: Any) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_port}/check"
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()

    def calls_for(self, txid: str) -> list[dict[str, Any]]:
        return [c for c in self.calls if c["transactionId"] == txid]
