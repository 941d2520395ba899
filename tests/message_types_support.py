"""Helpers for the delay / transaction / retry tests: a raw TCP client speaking FerryMQ frames, and
a pull loop over HTTP."""

from __future__ import annotations

import socket
import time
import urllib.parse
from typing import Any

import msgpack
from support import http

from ferrymq.broker.protocol.request_codes import RequestCode
from ferrymq.broker.protocol.tcp_codec import FLAG_ONEWAY, Command, FrameDecoder, encode_frame

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
