"""FerryMQ itself: ``ferrymq standalone`` as a child process, driven through its own client over TCP
and through the HTTP API.

Server: ``--flush sync`` (SYNC_FLUSH: a send is answered after an fdatasync covering it; concurrent
sends share one) or ``--flush async`` (ASYNC_FLUSH: answered once in the page cache, flushed every
``flushIntervalCommitLog`` ms). Topics are created through the HTTP API with ``QUEUES`` queues.
TCP: ``ferrymq.client.AsyncProducer.send_batch`` of ``BATCH`` messages with ``INFLIGHT`` batches in
flight; consume with ``AsyncPullConsumer``, committing each queue's offset after every pull without
waiting for the commit before the next pull (all commits are awaited before the clock stops).
HTTP: ``POST /v1/topics/{t}/messages`` with ``{"messages": [...]}`` of ``BATCH``, ``INFLIGHT`` requests in
flight; consume with one puller per queue (``GET .../queues/{q}/messages``, then
``PUT /v1/groups/{g}/offsets/{t}/{q}`` after every pull).
"""

from __future__ import annotations

import asyncio
import json
import sys
from pathlib import Path
from typing import Any

import aiohttp

from bench.peers.procs import free_port, spawn, wait_until
from bench.peers.server import PeerServer, System
from bench.peers.workload import SEQ_DIGITS, Driver

ROOT = Path(__file__).resolve().parents[2]
QUEUES = 4
BATCH = 500
INFLIGHT = 4
PULL_MAX = 1024  # the broker's maxPullMessages
GROUP = "bench-cg"


def http_json(method: str, url: str, body: Any = None, timeout: float = 10) -> tuple[int, Any]:
    """One blocking HTTP call for the orchestrator (readiness); never raises on 4xx/5xx."""
    import urllib.error
    import urllib.request

    data = json.dumps(body).encode() if body is not None else None
    req = urllib.request.Request(url, data=data, method=method, headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(req, timeout=timeout) as resp:
            raw = resp.read()
            return resp.status, json.loads(raw) if raw else None
    except urllib.error.HTTPError as exc:
        return exc.code, None


class FerryServer(PeerServer):
    name = "ferrymq"

    def __init__(self, workdir: Path, flush: str, *, queues: int = QUEUES, batch: int = BATCH,
                 inflight: int = INFLIGHT) -> None:
        super().__init__(workdir)
        if flush not in ("sync", "async"):
            raise ValueError(f"flush {flush!r}")
        self.flush = flush
        self.queues, self.batch, self.inflight = queues, batch, inflight
        self.http_port, self.tcp_port = free_port(), free_port()
        from ferrymq import __version__

        self.version = __version__

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.http_port}"

    def start(self) -> None:
        self.workdir.mkdir(parents=True, exist_ok=True)
        self.proc = spawn([sys.executable, "-m", "ferrymq", "standalone", "--data-dir", str(self.workdir / "data"),
                           "--host", "127.0.0.1", "--http-port", str(self.http_port),
                           "--tcp-port", str(self.tcp_port), "--flush", self.flush], self.log_path, cwd=ROOT)
        wait_until(lambda: http_json("GET", f"{self.url}/v1/health", timeout=1)[0] == 200, self.proc, 60,
                   "ferrymq standalone", self.log_path)

    def systems(self) -> list[System]:
        kind = "SYNC_FLUSH" if self.flush == "sync" else "ASYNC_FLUSH"
        target = {"url": self.url, "tcp_port": self.tcp_port, "queues": self.queues, "batch": self.batch,
                  "inflight": self.inflight, "server_pids": self.server_pids()}
        return [System(key=f"ferrymq-{self.flush}-{proto}", label=f"FerryMQ {self.version} {kind}, {proto.upper()}",
                       durability=kind, fsync_before_ack=self.flush == "sync", module="ferrymq_peer",
                       target={**target, "driver": proto}, is_ferrymq=True, protocol=proto)
                for proto in ("tcp", "http")]


async def windowed(coros: list[Any], inflight: int) -> list[Any]:
    """Run the coroutines with at most ``inflight`` at once, in order of submission; results in order."""
    sem = asyncio.Semaphore(inflight)

    async def one(c: Any) -> Any:
        async with sem:
            return await c

    return await asyncio.gather(*(one(c) for c in coros))


class FerryHttpDriver(Driver):
    def __init__(self, target: dict[str, Any]) -> None:
        super().__init__(target)
        self.url: str = target["url"]
        self.batch = int(target["batch"])
        self.inflight = int(target["inflight"])
        self.queues = int(target["queues"])
        self.produce_mode = f"POST batches of {self.batch}, {self.inflight} requests in flight"
        self.consume_mode = f"GET pulls of {PULL_MAX} per queue ({self.queues} queues), PUT offset after each"
        self.session: aiohttp.ClientSession | None = None

    async def connect(self) -> None:
        self.session = aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=max(self.inflight, self.queues)),
                                             timeout=aiohttp.ClientTimeout(total=120))

    async def close(self) -> None:
        if self.session is not None:
            await self.session.close()

    async def call(self, method: str, path: str, body: Any = None, ok: tuple[int, ...] = (200,)) -> Any:
        assert self.session is not None
        data = json.dumps(body) if body is not None else None
        async with self.session.request(method, f"{self.url}{path}", data=data,
                                        headers={"Content-Type": "application/json"}) as resp:
            raw = await resp.read()
            if resp.status not in ok:
                raise RuntimeError(f"{method} {path}: {resp.status} {raw[:300]!r}")
            return json.loads(raw) if raw else None

    async def drop(self, name: str) -> None:
        await self.call("DELETE", f"/v1/topics/{name}", ok=(204, 404))

    async def prepare(self, name: str) -> None:
        await self.drop(name)
        await self.call("PUT", f"/v1/topics/{name}", {"readQueueNums": self.queues, "writeQueueNums": self.queues,
                                                      "perm": "RW"})

    async def _post(self, name: str, bodies: list[bytes]) -> None:
        res = await self.call("POST", f"/v1/topics/{name}/messages",
                              {"messages": [{"body": b.decode()} for b in bodies]})
        if len(res["results"]) != len(bodies) or any(r["status"] != "SEND_OK" for r in res["results"]):
            raise RuntimeError("a batch was not fully acknowledged")

    async def produce(self, name: str, bodies: list[bytes]) -> None:
        await windowed([self._post(name, bodies[i:i + self.batch]) for i in range(0, len(bodies), self.batch)],
                       self.inflight)

    async def send_one(self, name: str, body: bytes) -> None:
        res = await self.call("POST", f"/v1/topics/{name}/messages", {"body": body.decode()})
        if res["results"][0]["status"] != "SEND_OK":
            raise RuntimeError(f"send failed: {res}")

    async def consume(self, name: str, n: int, seen: list[bytes]) -> None:
        info = await self.call("GET", f"/v1/topics/{name}")
        ends = {q["queueId"]: q["maxOffset"] for q in info["queues"]}

        async def puller(qid: int, end: int) -> None:
            offset = 0
            while offset < end:
                res = await self.call("GET", f"/v1/topics/{name}/queues/{qid}/messages"
                                             f"?offset={offset}&maxMessages={PULL_MAX}&waitMs=1000")
                for m in res["messages"]:
                    seen.append(m["body"][:SEQ_DIGITS].encode())
                offset = res["nextOffset"]
                await self.call("PUT", f"/v1/groups/{GROUP}/offsets/{name}/{qid}", {"offset": offset})

        await asyncio.gather(*(puller(q, end) for q, end in ends.items()))

    async def after_consume(self, name: str, n: int) -> None:
        committed = 0
        for q in range(self.queues):
            committed += (await self.call("GET", f"/v1/groups/{GROUP}/offsets/{name}/{q}"))["offset"]
        if committed != n:
            raise RuntimeError(f"committed offsets add up to {committed}, expected {n}")


class FerryTcpDriver(Driver):
    """Through ``ferrymq.client`` (the contract's AsyncProducer / AsyncPullConsumer) over TCP."""

    def __init__(self, target: dict[str, Any]) -> None:
        super().__init__(target)
        self.url: str = target["url"]
        self.batch = int(target["batch"])
        self.inflight = int(target["inflight"])
        self.queues = int(target["queues"])
        self.produce_mode = f"AsyncProducer.send_batch of {self.batch}, {self.inflight} batches in flight"
        self.consume_mode = (f"AsyncPullConsumer.pull of {PULL_MAX} per queue ({self.queues} queues), "
                             f"commit_offset after each, not awaited before the next pull")
        self.http = FerryHttpDriver(target)  # topic admin goes through the HTTP API
        self.producer: Any = None

    async def connect(self) -> None:
        from ferrymq.client import AsyncProducer

        await self.http.connect()
        self.producer = AsyncProducer(self.url, group="bench-pg")
        await self.producer.start()

    async def close(self) -> None:
        if self.producer is not None:
            await self.producer.shutdown()
        await self.http.close()

    async def prepare(self, name: str) -> None:
        await self.http.prepare(name)

    async def drop(self, name: str) -> None:
        await self.http.drop(name)

    async def _batch(self, name: str, bodies: list[bytes]) -> None:
        from ferrymq.client import Message

        results = await self.producer.send_batch([Message(topic=name, body=b) for b in bodies])
        if len(results) != len(bodies) or any(r.status != "SEND_OK" for r in results):
            raise RuntimeError("a batch was not fully acknowledged")

    async def produce(self, name: str, bodies: list[bytes]) -> None:
        await windowed([self._batch(name, bodies[i:i + self.batch]) for i in range(0, len(bodies), self.batch)],
                       self.inflight)

    async def send_one(self, name: str, body: bytes) -> None:
        from ferrymq.client import Message

        result = await self.producer.send(Message(topic=name, body=body))
        if result.status != "SEND_OK":
            raise RuntimeError(f"send failed: {result}")

    async def consume(self, name: str, n: int, seen: list[bytes]) -> None:
        from ferrymq.client import AsyncPullConsumer

        consumer = AsyncPullConsumer(self.url, group=GROUP)
        await consumer.start()

        async def puller(mq: Any) -> None:
            end = await consumer.max_offset(mq)
            offset = 0
            # Commits overlap the next pull (one connection keeps them in order); all are awaited
            # before the clock stops, so every acknowledgement has reached the broker.
            commits = []
            while offset < end:
                res = await consumer.pull(mq, offset, PULL_MAX, wait_ms=1000)
                for m in res.messages:
                    seen.append(m.body[:SEQ_DIGITS])
                offset = res.next_offset
                commits.append(asyncio.ensure_future(consumer.commit_offset(mq, offset)))
            if not all(await asyncio.gather(*commits)):
                raise RuntimeError(f"a commit of {mq} was not taken by the master")

        try:
            await asyncio.gather(*(puller(mq) for mq in await consumer.fetch_queues(name)))
        finally:
            await consumer.shutdown()

    async def after_consume(self, name: str, n: int) -> None:
        await self.http.after_consume(name, n)


DRIVERS = {"http": FerryHttpDriver, "tcp": FerryTcpDriver}
