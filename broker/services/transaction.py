"""Transactional messages, as RocketMQ's TransactionalMessageService, EndTransactionProcessor and
TransactionalMessageCheckService.

Prepare: the message goes to RMQ_SYS_TRANS_HALF_TOPIC (queue 0) with its real topic in properties;
consumers never see it. Every half message carries a transaction id (``__transactionId__``, the
producer's UNIQ_KEY by default).

End: COMMIT puts the real message and an op record (RMQ_SYS_TRANS_OP_HALF_TOPIC, body = the half's
queue offset, tag ``d``) in one commit-log append, so both land or neither; ROLLBACK puts the op record
alone. The half message is named by its commit-log offset and must carry the caller's producer group
(PGROUP). Resolution is by transaction id and happens once: a second commit of the same transaction,
whichever copy of its half message it names, is answered without a second real message.

Check: every ``transactionCheckInterval`` the half queue is scanned from the persisted scan offset.
A half message whose transaction is resolved, or which a newer copy supersedes, is passed over; one
younger than ``transactionTimeOut`` (or its CHECK_IMMUNITY_TIME_IN_SECONDS) ends the round; one that has
been checked ``transactionCheckMax`` times goes to RMQ_SYS_TRANS_CHECK_MAX_TIME_TOPIC; any other is put
back (a new copy with TRANSACTION_CHECK_TIMES + 1) and a live producer of its group is asked for the
state: over TCP (CHECK_TRANSACTION_STATE, oneway, to any connection of the group, so a dead producer's
transactions are answered by its peers) or, for HTTP producers, by a POST to the ``checkUrl`` given with
the half message.

Which transactions are open is kept in memory (``open``: transaction id -> newest half copy) and rebuilt
at start from the half queue past the scan offset and the op records written since.
"""

from __future__ import annotations

import asyncio
import bisect
import collections
import contextlib
import itertools
import logging
import time
import uuid
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

import aiohttp

from ferrymq.broker.protocol.request_codes import RequestCode
from ferrymq.broker.protocol.tcp_codec import FLAG_ONEWAY, encode_frame
from ferrymq.broker.services.consumer_groups import ConsumerGroupService
from ferrymq.broker.services.messaging import MessagingService, SendResult
from ferrymq.broker.services.progress import DurableProgress, cancel_tasks
from ferrymq.broker.services.system_topics import CHECK_MAX_TOPIC, HALF_TOPIC, OP_TOPIC, hold_in, release
from ferrymq.broker.store.message_store import MessageStore
from ferrymq.common import record
from ferrymq.common.errors import FerryError
from ferrymq.common.message import (
    PROPERTY_CHECK_IMMUNITY_TIME,
    PROPERTY_PRODUCER_GROUP,
    PROPERTY_REAL_TOPIC,
    PROPERTY_TAGS,
    PROPERTY_TRANSACTION_CHECK_TIMES,
    PROPERTY_TRANSACTION_PREPARED,
    PROPERTY_UNIQ_KEY,
    SYSFLAG_TRANSACTION_COMMIT,
    SYSFLAG_TRANSACTION_PREPARED,
    Message,
    StoredMessage,
)

log = logging.getLogger(__name__)

PROPERTY_TRANSACTION_ID = "__transactionId__"
PROPERTY_CHECK_URL = "__checkUrl__"
PROPERTY_TRANSACTION_STATE = "TRAN_STATE"
OP_REMOVE_TAG = "d"
COMMIT, ROLLBACK, UNKNOWN = "COMMIT", "ROLLBACK", "UNKNOWN"
DISCARDED = "DISCARDED"
STATES = {COMMIT, ROLLBACK, UNKNOWN}
# RocketMQ's commitOrRollback numbers (MessageSysFlag) are accepted too.
STATE_NUMBERS = {8: COMMIT, 12: ROLLBACK, 0: UNKNOWN}
SCAN_BATCH = 64
# Put errors raised after the append succeeded (see MessageStore.wait_durable and replication).
WRITTEN_BUT_UNCONFIRMED = frozenset({"FLUSH_DISK_TIMEOUT", "FLUSH_SLAVE_TIMEOUT", "SLAVE_NOT_AVAILABLE",
                                     "IN_SYNC_REPLICAS_NOT_ENOUGH"})
REMEMBER_RESOLVED = 100_000
MAX_CALLBACKS_IN_FLIGHT = 32
HALF_ONLY_PROPERTIES = (PROPERTY_TRANSACTION_PREPARED, PROPERTY_TRANSACTION_CHECK_TIMES, PROPERTY_CHECK_URL,
                        PROPERTY_CHECK_IMMUNITY_TIME)


class CheckChannel(Protocol):
    """A producer's TCP connection, as far as a check needs it."""

    remote: str

    def write(self, frame: bytes) -> None: ...


def parse_state(raw: Any) -> str:
    if isinstance(raw, bool):
        raise FerryError("INVALID_REQUEST", "commitOrRollback is COMMIT, ROLLBACK or UNKNOWN")
    if isinstance(raw, int) and raw in STATE_NUMBERS:
        return STATE_NUMBERS[raw]
    if isinstance(raw, str) and raw.upper() in STATES:
        return raw.upper()
    raise FerryError("INVALID_REQUEST", f"transaction state {raw!r} is not COMMIT, ROLLBACK or UNKNOWN")


@dataclass
class OpenTransaction:
    producer_group: str
    queue_offset: int  # of the newest half copy; -1 while the first copy is being put
    physical_offset: int


class TransactionService:
    def __init__(self, store: MessageStore, messaging: MessagingService, groups: ConsumerGroupService,
                 data_dir: Path, *, check_interval_ms: int, timeout_ms: int, check_max: int,
                 url_prefixes: list[str], callback_timeout_ms: int, is_master: Callable[[], bool]) -> None:
        self.store = store
        self.messaging = messaging
        self.groups = groups
        self.check_interval = check_interval_ms / 1000
        self.timeout_ms = timeout_ms
        self.check_max = check_max
        self.url_prefixes = url_prefixes
        self.callback_timeout = callback_timeout_ms / 1000
        self.is_master = is_master
        # Puts messages that may carry a delay (the committed real message); set by the router.
        self.put_routed: Callable[[list[Message]], Awaitable[list[SendResult]]] = messaging.put
        self.progress = DurableProgress(data_dir / "config" / "transactionCheck.json", store)
        self.scan_offset = 0
        self.open: dict[str, OpenTransaction] = {}
        self.resolved: collections.OrderedDict[str, str] = collections.OrderedDict()
        self._resolving: dict[str, asyncio.Future[str]] = {}
        self._rr = itertools.count()
        self._task: asyncio.Task[None] | None = None
        self._callbacks: set[asyncio.Task[None]] = set()
        self._callback_slots = asyncio.Semaphore(MAX_CALLBACKS_IN_FLIGHT)
        self._session: aiohttp.ClientSession | None = None
        self._loaded_as_master = False
        self.stats = collections.Counter[str]()

    # ---- lifecycle --------------------------------------------------------------------------------
    async def start(self) -> None:
        """Rebuild the open transactions (before any request is served), then run the check loop."""
        if self.is_master():
            await self._load()
        self.progress.start()
        self._task = asyncio.get_running_loop().create_task(self._check_loop(), name="transaction-check")

    async def stop(self) -> None:
        await cancel_tasks([t for t in (self._task, *self._callbacks) if t is not None])
        self._task = None
        if self._session is not None:
            await self._session.close()
            self._session = None
        await self.progress.stop()

    def write_final(self) -> None:
        self.progress.write_final()

    async def _load(self) -> None:
        """Rebuild the open transactions: half copies past the scan offset, minus those whose op
        record exists. An op record for such a copy can only have been written after it (a copy is put
        back only while its transaction is open), so op records from that copy's position on suffice."""
        self.scan_offset = int(self.progress.load().get("halfOffset", 0))
        loop = asyncio.get_running_loop()
        halves = await loop.run_in_executor(self.messaging.readers, self._read_queue, HALF_TOPIC,
                                            max(self.scan_offset, self.store.min_offset(HALF_TOPIC, 0)), None)
        rebuilt: dict[str, OpenTransaction] = {}
        if halves:
            ops = await loop.run_in_executor(self.messaging.readers, self._read_ops_since, halves[0].physical_offset)
            for op in ops:
                txid = op.properties.get(PROPERTY_TRANSACTION_ID)
                if txid:
                    self._remember(txid, op.properties.get(PROPERTY_TRANSACTION_STATE, COMMIT))
        for h in halves:
            txid = h.properties.get(PROPERTY_TRANSACTION_ID, "")
            if txid and txid not in self.resolved:
                rebuilt[txid] = OpenTransaction(h.properties.get(PROPERTY_PRODUCER_GROUP, ""), h.queue_offset,
                                                h.physical_offset)
        # Keep what was prepared while the queue was being read (it lies past what was read).
        last = halves[-1].queue_offset if halves else -1
        for txid, tx in self.open.items():
            if txid not in rebuilt and (tx.queue_offset < 0 or tx.queue_offset > last):
                rebuilt[txid] = tx
        self.open = rebuilt
        self._loaded_as_master = True
        log.info("transactions: %d open, scan offset %d", len(self.open), self.scan_offset)

    def _read_queue(self, topic: str, start: int, limit: int | None) -> list[StoredMessage]:
        out: list[StoredMessage] = []
        offset = start
        while limit is None or len(out) < limit:
            res = self.store.get_messages(topic, 0, offset, SCAN_BATCH)
            out.extend(record.decode(r, verify=False) for r in res.records)
            if res.next_offset <= offset or res.status not in ("FOUND", "NO_MATCHED_MSG"):
                break
            offset = res.next_offset
        return out

    def _read_ops_since(self, phys: int) -> list[StoredMessage]:
        cq = self.store.queues.get((OP_TOPIC, 0))
        if cq is None:
            return []
        lo, hi = cq.min_offset, cq.max_offset
        offsets = range(lo, hi)
        first = bisect.bisect_left(offsets, phys, key=lambda q: (cq.entry(q) or (1 << 62,))[0])
        return self._read_queue(OP_TOPIC, offsets[first] if first < len(offsets) else hi, None)

    def _remember(self, txid: str, state: str) -> None:
        self.resolved[txid] = state
        self.resolved.move_to_end(txid)
        while len(self.resolved) > REMEMBER_RESOLVED:
            self.resolved.popitem(last=False)

    # ---- prepare (called by the send router) ------------------------------------------------------
    def prepare(self, msg: Message) -> str:
        """Turn ``msg`` into a half message; returns its transaction id. The caller puts it and then
        calls ``prepared`` (or ``prepare_failed``)."""
        pg = msg.properties.get(PROPERTY_PRODUCER_GROUP)
        if not pg:
            raise FerryError("MESSAGE_ILLEGAL", "a transactional message needs its producer group (PGROUP)")
        txid = msg.properties.get(PROPERTY_TRANSACTION_ID) or msg.properties.get(PROPERTY_UNIQ_KEY) \
            or uuid.uuid4().hex.upper()
        if txid in self.open or txid in self._resolving or txid in self.resolved:
            raise FerryError("MESSAGE_ILLEGAL", f"transaction {txid} already exists")
        check_url = msg.properties.get(PROPERTY_CHECK_URL)
        if check_url is not None:
            self.check_url_allowed(check_url)
        msg.properties[PROPERTY_TRANSACTION_ID] = txid
        msg.properties[PROPERTY_TRANSACTION_PREPARED] = "true"
        msg.sysflag |= SYSFLAG_TRANSACTION_PREPARED
        hold_in(msg, HALF_TOPIC, 0)
        # Open before the put: the check service must never take this half for a finished one.
        self.open[txid] = OpenTransaction(pg, -1, -1)
        return txid

    def prepared(self, txid: str, result: SendResult) -> None:
        tx = self.open.get(txid)
        if tx is not None and tx.queue_offset < result.queue_offset:
            tx.queue_offset, tx.physical_offset = result.queue_offset, result.physical_offset
        self.stats["prepared"] += 1

    def prepare_failed(self, txid: str) -> None:
        tx = self.open.get(txid)
        if tx is not None and tx.queue_offset < 0:
            del self.open[txid]

    def check_url_allowed(self, url: str) -> None:
        if not url.startswith(("http://", "https://")):
            raise FerryError("INVALID_REQUEST", "checkUrl must be an http:// or https:// URL")
        if self.url_prefixes and not any(url.startswith(p) for p in self.url_prefixes):
            raise FerryError("NO_PERMISSION", "checkUrl is not under an allowed prefix "
                                              "(transactionCheckUrlPrefixes)")

    # ---- end --------------------------------------------------------------------------------------
    async def end(self, producer_group: str, commit_log_offset: int, state: str, *,
                  queue_offset: int | None = None, from_check: bool = False) -> dict[str, Any]:
        """EndTransaction: resolve the transaction of the half message at ``commit_log_offset``."""
        if self.messaging.write_guard is not None:
            self.messaging.write_guard()
        loop = asyncio.get_running_loop()
        raw = await loop.run_in_executor(self.messaging.readers, self.store.read_message, commit_log_offset)
        if raw is None:
            raise FerryError("NOT_FOUND", f"no half message at commit-log offset {commit_log_offset}")
        half = record.decode(raw, verify=False)
        if half.topic != HALF_TOPIC:
            raise FerryError("MESSAGE_ILLEGAL", f"the message at commit-log offset {commit_log_offset} "
                                                "is not a half message")
        if half.properties.get(PROPERTY_PRODUCER_GROUP) != producer_group:
            raise FerryError("NO_PERMISSION", f"the half message belongs to another producer group, "
                                              f"not {producer_group!r}")
        if queue_offset is not None and queue_offset != half.queue_offset:
            raise FerryError("MESSAGE_ILLEGAL", f"tranStateTableOffset {queue_offset} does not match the "
                                                f"half message's queue offset {half.queue_offset}")
        return await self._resolve(half, state, from_check)

    async def end_by_id(self, txid: str, producer_group: str, state: str) -> dict[str, Any]:
        """EndTransaction named by transaction id (the HTTP API)."""
        tx = self.open.get(txid)
        if tx is None or tx.physical_offset < 0:
            done = self.resolved.get(txid)
            if done is not None:
                return self._already(txid, done, state)
            raise FerryError("NOT_FOUND", f"no open transaction {txid}")
        return await self.end(producer_group, tx.physical_offset, state)

    def _already(self, txid: str, done: str, state: str) -> dict[str, Any]:
        if state in (UNKNOWN, done):
            return {"transactionId": txid, "state": done, "alreadyResolved": True}
        raise FerryError("CONFLICT", f"transaction {txid} is already resolved: {done}")

    async def _resolve(self, half: StoredMessage, state: str, from_check: bool) -> dict[str, Any]:
        txid = half.properties.get(PROPERTY_TRANSACTION_ID, "")
        pending = self._resolving.get(txid)
        if pending is not None:
            with contextlib.suppress(Exception):
                await asyncio.shield(pending)
        done = self.resolved.get(txid)
        if done is not None:
            return self._already(txid, done, state)
        if txid not in self.open:
            raise FerryError("CONFLICT", f"transaction {txid} is no longer open (resolved or discarded)")
        if state == UNKNOWN:
            self.stats["unknown"] += 1
            return {"transactionId": txid, "state": UNKNOWN, "alreadyResolved": False}
        fut: asyncio.Future[str] = asyncio.get_running_loop().create_future()
        self._resolving[txid] = fut
        try:
            op = Message(topic=OP_TOPIC, body=str(half.queue_offset).encode(), queue_id=0,
                         properties={PROPERTY_TAGS: OP_REMOVE_TAG, PROPERTY_TRANSACTION_ID: txid,
                                     PROPERTY_TRANSACTION_STATE: state})
            batch = [op]
            if state == COMMIT:
                real = release(half, drop=HALF_ONLY_PROPERTIES)
                real.sysflag = (real.sysflag & ~0xC) | SYSFLAG_TRANSACTION_COMMIT
                real.prepared_transaction_offset = half.physical_offset
                cfg = self.messaging.topics.get(real.topic)
                if cfg is None:
                    raise FerryError("TOPIC_NOT_EXIST", f"topic {real.topic!r} of transaction {txid} is gone")
                if not 0 <= real.queue_id < cfg.writeQueueNums:
                    real.queue_id %= cfg.writeQueueNums
                batch = [real, op]
            try:
                results = await self.put_routed(batch)
            except FerryError as exc:
                if exc.code in WRITTEN_BUT_UNCONFIRMED:
                    # The records are in the log; only their flush or replication is late. Taking the
                    # transaction as resolved keeps a retried commit from writing a second message.
                    self.open.pop(txid, None)
                    self._remember(txid, state)
                raise
            self.open.pop(txid, None)
            self._remember(txid, state)
            fut.set_result(state)
            self.stats["committed" if state == COMMIT else "rolled_back"] += 1
            out: dict[str, Any] = {"transactionId": txid, "state": state, "alreadyResolved": False,
                                   "fromTransactionCheck": from_check}
            if state == COMMIT:
                out.update(results[0].to_api())
                out["topic"] = batch[0].topic
            return out
        except BaseException as exc:
            fut.set_exception(exc if isinstance(exc, Exception) else FerryError("SYSTEM_ERROR", "cancelled"))
            fut.exception()  # retrieved: waiters re-check the state instead
            raise
        finally:
            self._resolving.pop(txid, None)

    # ---- check ------------------------------------------------------------------------------------
    async def _check_loop(self) -> None:
        while True:
            try:
                await asyncio.sleep(self.check_interval)
                if not self.is_master():
                    self._loaded_as_master = False
                    continue
                if not self._loaded_as_master:
                    await self._load()
                await self.check_round()
            except asyncio.CancelledError:
                raise
            except Exception:
                log.exception("transaction check round failed")

    async def check_round(self) -> None:
        round_start = int(time.time() * 1000)
        loop = asyncio.get_running_loop()
        while True:
            start = max(self.scan_offset, self.store.min_offset(HALF_TOPIC, 0))
            halves = await loop.run_in_executor(self.messaging.readers, self._read_queue, HALF_TOPIC, start,
                                                SCAN_BATCH)
            if not halves:
                self.scan_offset = max(self.scan_offset, start)
                return
            for half in halves:
                if half.store_timestamp >= round_start:
                    return  # copies put back in this round wait for the next one
                if not await self._check_one(half, round_start):
                    return
                self.scan_offset = half.queue_offset + 1
                self.progress.record({"halfOffset": self.scan_offset}, self.store.commitlog.max_offset)

    async def _check_one(self, half: StoredMessage, now: int) -> bool:
        """Handle one half message; False ends the round without passing it."""
        txid = half.properties.get(PROPERTY_TRANSACTION_ID, "")
        tx = self.open.get(txid)
        if tx is None or half.queue_offset < tx.queue_offset:
            return True  # resolved, discarded, or superseded by a newer copy
        if txid in self._resolving:
            return False  # an EndTransaction is under way; look again next round
        checks = _int_prop(half, PROPERTY_TRANSACTION_CHECK_TIMES, 0)
        if checks >= self.check_max:
            await self._discard(half, txid)
            return True
        age = now - half.born_timestamp
        immunity_s = _int_prop(half, PROPERTY_CHECK_IMMUNITY_TIME, -1)
        if immunity_s >= 0 and age < immunity_s * 1000:
            await self._put_back(half, txid, checks)  # its own immunity: keep it, uncounted
            return True
        if immunity_s < 0 and age < self.timeout_ms:
            return False  # younger than transactionTimeOut; so is everything after it
        copy = await self._put_back(half, txid, checks + 1)
        if copy is not None:
            self._ask_producer(copy, tx.producer_group)
        return True

    async def _put_back(self, half: StoredMessage, txid: str, checks: int) -> StoredMessage | None:
        m = Message(topic=HALF_TOPIC, body=half.body, queue_id=0, flag=half.flag,
                    properties={**half.properties, PROPERTY_TRANSACTION_CHECK_TIMES: str(checks)},
                    sysflag=half.sysflag, born_timestamp=half.born_timestamp, born_host=half.born_host,
                    reconsume_times=half.reconsume_times)
        if txid not in self.open or txid in self._resolving:
            return None  # resolved meanwhile; checked right before the (synchronous) append
        r = (await self.messaging.put([m]))[0]
        tx = self.open.get(txid)
        if tx is None:
            return None
        tx.queue_offset, tx.physical_offset = r.queue_offset, r.physical_offset
        self.stats["put_back"] += 1
        return StoredMessage(topic=HALF_TOPIC, queue_id=0, queue_offset=r.queue_offset,
                             physical_offset=r.physical_offset, size=0, body=m.body, properties=m.properties,
                             flag=m.flag, sysflag=m.sysflag, born_timestamp=m.born_timestamp,
                             born_host=m.born_host, store_timestamp=0, store_host=self.store.commitlog.store_host,
                             reconsume_times=m.reconsume_times, prepared_transaction_offset=0, body_crc=0)

    async def _discard(self, half: StoredMessage, txid: str) -> None:
        m = Message(topic=CHECK_MAX_TOPIC, body=half.body, queue_id=0, flag=half.flag,
                    properties=dict(half.properties), sysflag=half.sysflag, born_timestamp=half.born_timestamp,
                    born_host=half.born_host, reconsume_times=half.reconsume_times)
        await self.messaging.put([m])
        if self.open.pop(txid, None) is not None:
            self._remember(txid, DISCARDED)
            self.stats["discarded"] += 1
            log.warning("transaction %s of group %s discarded after %d checks", txid,
                        half.properties.get(PROPERTY_PRODUCER_GROUP), self.check_max)

    def _ask_producer(self, half: StoredMessage, producer_group: str) -> None:
        url = half.properties.get(PROPERTY_CHECK_URL)
        coro = self._callback(url, half, producer_group) if url else self._ask_over_tcp(half, producer_group)
        task = asyncio.get_running_loop().create_task(coro)
        self._callbacks.add(task)
        task.add_done_callback(self._callbacks.discard)

    async def _ask_over_tcp(self, half: StoredMessage, producer_group: str) -> None:
        loop = asyncio.get_running_loop()
        raw = await loop.run_in_executor(self.messaging.readers, self.store.read_message, half.physical_offset)
        channels: list[Any] = [c for c in self.groups.producer_channels(producer_group) if hasattr(c, "write")]
        if not channels or raw is None:
            self.stats["no_producer"] += 1
            return
        ch: CheckChannel = channels[next(self._rr) % len(channels)]
        ext = {"producerGroup": producer_group, "topic": half.properties.get(PROPERTY_REAL_TOPIC, ""),
               "commitLogOffset": half.physical_offset, "tranStateTableOffset": half.queue_offset,
               "transactionId": half.properties.get(PROPERTY_TRANSACTION_ID, ""), "msgId": half.msg_id,
               "uniqKey": half.properties.get(PROPERTY_UNIQ_KEY, "")}
        ch.write(encode_frame(RequestCode.CHECK_TRANSACTION_STATE, next(self._rr), FLAG_ONEWAY, ext, None, raw))
        self.stats["checks_sent"] += 1

    async def _callback(self, url: str, half: StoredMessage, producer_group: str) -> None:
        from ferrymq.common.api_models import stored_to_api

        async with self._callback_slots:
            if self._session is None:
                self._session = aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=self.callback_timeout))
            real = release(half, drop=HALF_ONLY_PROPERTIES)
            payload = {"transactionId": half.properties.get(PROPERTY_TRANSACTION_ID, ""), "msgId": half.msg_id,
                       "commitLogOffset": half.physical_offset, "topic": real.topic, "producerGroup": producer_group,
                       "checkTimes": _int_prop(half, PROPERTY_TRANSACTION_CHECK_TIMES, 0),
                       "message": {**stored_to_api(half), "topic": real.topic, "queueId": real.queue_id}}
            self.stats["checks_sent"] += 1
            try:
                async with self._session.post(url, json=payload, allow_redirects=False) as resp:
                    if resp.status != 200:
                        log.info("check callback %s answered %d", url, resp.status)
                        return
                    answer = await resp.json(content_type=None)
                state = parse_state(answer.get("state") if isinstance(answer, dict) else None)
            except (aiohttp.ClientError, TimeoutError, ValueError, FerryError) as exc:
                log.info("check callback %s failed: %s", url, exc)
                return
        if state != UNKNOWN:
            with contextlib.suppress(FerryError):
                await self.end(producer_group, half.physical_offset, state, from_check=True)


def _int_prop(m: StoredMessage, name: str, default: int) -> int:
    try:
        return int(m.properties.get(name, default))
    except ValueError:
        return default
