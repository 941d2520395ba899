"""Transaction producer (RocketMQ's TransactionMQProducer): half message, local transaction, end.

``send_in_transaction`` sends the message as a *half* message (properties TRAN_MSG, PGROUP and
UNIQ_KEY, the transaction id), which the broker keeps invisible to consumers; then runs ``execute``
(an exception or a non-state answer counts as UNKNOWN, as in RocketMQ) and sends END_TRANSACTION with
the half's commit-log offset: COMMIT makes the message visible, ROLLBACK drops it, UNKNOWN sends
nothing and leaves the decision to the check-back.

Check-back: the producer heartbeats its group, and a broker holding an undecided half message sends
CHECK_TRANSACTION_STATE to any live producer of the group (so a dead producer's transactions are
answered by its peers). ``check`` runs on a worker thread, never on the event loop, and its answer
goes back as END_TRANSACTION with ``fromTransactionCheck``. ``check`` gets the half message as a
ReceivedMessage of the real topic; ``properties["UNIQ_KEY"]`` is the transaction id.
"""

from __future__ import annotations

import asyncio
import dataclasses
import inspect
import logging
import struct
import uuid
from collections.abc import Awaitable, Callable, Iterable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any

from ferrymq.broker.protocol.request_codes import RequestCode
from ferrymq.broker.protocol.tcp_codec import Command
from ferrymq.client.errors import ClientError, ClientStateError
from ferrymq.client.message import Message, MessageQueue, ReceivedMessage, SendResult, TransactionState
from ferrymq.client.producer import AsyncProducer
from ferrymq.client.transport import Connection
from ferrymq.common import record
from ferrymq.common.message import (
    KEY_SEPARATOR,
    PROPERTY_KEYS,
    PROPERTY_PRODUCER_GROUP,
    PROPERTY_REAL_QUEUE_ID,
    PROPERTY_REAL_TOPIC,
    PROPERTY_TAGS,
    PROPERTY_TRANSACTION_PREPARED,
    PROPERTY_UNIQ_KEY,
    parse_offset_msg_id,
)

log = logging.getLogger(__name__)

Execute = Callable[[Message, Any], TransactionState | Awaitable[TransactionState]]
Check = Callable[[ReceivedMessage], TransactionState | Awaitable[TransactionState]]
END_TIMEOUT_S = 3.0


@dataclass(slots=True)
class TransactionSendResult(SendResult):
    """The half message's send result (msg_id, queue, offset: the half's), the transaction id and what
    the local transaction decided; ``committed_msg_id`` is the visible message's id once committed."""

    transaction_id: str = ""
    local_state: TransactionState = TransactionState.UNKNOWN
    committed_msg_id: str | None = None


@dataclass(slots=True)
class HalfSent:
    """Between the two phases: what END_TRANSACTION needs."""

    result: SendResult
    transaction_id: str


def as_state(value: Any, what: str) -> TransactionState:
    """A listener's answer; anything that is not a state is UNKNOWN (the check-back asks again)."""
    try:
        return TransactionState(value)
    except (ValueError, TypeError):
        log.warning("%s returned %r, not a TransactionState; taken as UNKNOWN", what, value)
        return TransactionState.UNKNOWN


def new_transaction_id() -> str:
    return uuid.uuid4().hex.upper()


class AsyncTransactionProducer:
    """``execute(msg, arg)`` and ``check(msg)`` may be plain functions (run on worker threads) or
    coroutine functions. ``topics`` are looked up at start so that the producer can be asked about
    transactions on those topics before it has sent anything itself (a peer taking over a dead one)."""

    def __init__(self, url: str, group: str, execute: Execute, check: Check, *, topics: Iterable[str] = (),
                 check_thread_count: int = 2, **producer_options: Any) -> None:
        self.group, self.execute, self.check = group, execute, check
        self.topics = list(topics)
        self.producer = AsyncProducer(url, group, **producer_options)
        self.instance = self.producer.instance
        self.executor = ThreadPoolExecutor(max(1, check_thread_count), thread_name_prefix=f"tx-check-{group}")
        self._checks: set[asyncio.Task[None]] = set()
        self._running = False

    async def start(self) -> None:
        if self._running:
            return
        self.instance.transaction_checkers[self.group] = self._on_check
        await self.producer.start()
        self._running = True
        try:
            for topic in self.topics:
                await self.instance.route(topic)
        except BaseException:
            await self.shutdown()
            raise
        # Registered at once, not at the first send: the broker asks only producers it knows.
        await self.instance.heartbeat_all()

    async def shutdown(self) -> None:
        if not self._running:
            return
        self._running = False
        self.instance.transaction_checkers.pop(self.group, None)
        for t in list(self._checks):
            t.cancel()
        if self._checks:
            await asyncio.wait(list(self._checks), timeout=5)
        await self.producer.shutdown()
        self.executor.shutdown(wait=False, cancel_futures=True)

    async def __aenter__(self) -> AsyncTransactionProducer:
        await self.start()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.shutdown()

    # ---- sending ------------------------------------------------------------------------------------------
    async def send_in_transaction(self, msg: Message, arg: Any = None) -> TransactionSendResult:
        half = await self.send_half(msg)
        try:
            if inspect.iscoroutinefunction(self.execute):
                state = await self.execute(msg, arg)
            else:
                # the default pool, not the check pool: many sends in flight must not starve the checks
                state = await asyncio.get_running_loop().run_in_executor(None, self.execute, msg, arg)
            state = as_state(state, "execute")
        except Exception:
            log.warning("local transaction %s raised; its state is UNKNOWN until checked", half.transaction_id,
                        exc_info=True)
            state = TransactionState.UNKNOWN
        return await self.end(half, state)

    async def send_half(self, msg: Message) -> HalfSent:
        """Phase one: the half message. Raises if it was not stored (the local transaction must not run)."""
        if not self._running:
            raise ClientStateError("the transaction producer is not started (call start() first) or was shut down")
        if msg.delay_level or msg.deliver_at_ms is not None:
            raise ClientError("MESSAGE_ILLEGAL", "a transactional message cannot be delayed")
        props = dict(msg.properties or {})
        txid = props.get(PROPERTY_UNIQ_KEY) or new_transaction_id()
        props.update({PROPERTY_TRANSACTION_PREPARED: "true", PROPERTY_PRODUCER_GROUP: self.group,
                      PROPERTY_UNIQ_KEY: txid})
        result = await self.producer.send(dataclasses.replace(msg, properties=props))
        return HalfSent(result, txid)

    async def end(self, half: HalfSent, state: TransactionState) -> TransactionSendResult:
        """Phase two: END_TRANSACTION for COMMIT or ROLLBACK. A failure here is logged, not raised: the
        half message is stored, so the broker's check-back resolves it through ``check``."""
        r = half.result
        out = TransactionSendResult(r.msg_id, r.queue_id, r.queue_offset, r.topic, r.broker_group, r.status,
                                    transaction_id=half.transaction_id, local_state=state)
        if state is TransactionState.UNKNOWN:
            return out
        ext = {"producerGroup": self.group, "commitLogOffset": parse_offset_msg_id(r.msg_id),
               "tranStateTableOffset": r.queue_offset, "commitOrRollback": state.value,
               "transactionId": half.transaction_id, "msgId": r.msg_id, "fromTransactionCheck": False}
        try:
            addr = await self.instance.address(MessageQueue(r.topic, r.broker_group, r.queue_id))
            resp = await self.instance.remoting.invoke(addr, RequestCode.END_TRANSACTION, ext, timeout_s=END_TIMEOUT_S)
        except ClientError as exc:
            log.warning("ending transaction %s (%s) failed, the broker's check-back will resolve it: %s",
                        half.transaction_id, state.value, exc)
            return out
        if state is TransactionState.COMMIT:
            out.committed_msg_id = resp.ext.get("msgId")
        return out

    # ---- check-back ---------------------------------------------------------------------------------------
    def _on_check(self, conn: Connection, cmd: Command) -> None:
        """CHECK_TRANSACTION_STATE from the broker at ``conn`` (called on the loop; must not block)."""
        if not self._running:
            return
        task = asyncio.get_running_loop().create_task(self._answer_check(conn.address, cmd))
        self._checks.add(task)
        task.add_done_callback(self._checks.discard)

    async def _answer_check(self, address: str, cmd: Command) -> None:
        ext = cmd.ext
        txid = str(ext.get("transactionId") or ext.get("uniqKey") or "")
        loop = asyncio.get_running_loop()
        group = self._group_of(address)
        try:
            msg = await loop.run_in_executor(self.executor, self._half_message, cmd, group)
            if inspect.iscoroutinefunction(self.check):
                state = as_state(await self.check(msg), "check")
            else:
                state = as_state(await loop.run_in_executor(self.executor, self.check, msg), "check")
        except Exception:
            log.warning("checking transaction %s failed; the broker will ask again", txid, exc_info=True)
            return
        if state is TransactionState.UNKNOWN:
            return  # nothing to tell: the broker asks again at its next round
        answer = {"producerGroup": self.group, "commitLogOffset": ext.get("commitLogOffset"),
                  "tranStateTableOffset": ext.get("tranStateTableOffset"), "commitOrRollback": state.value,
                  "transactionId": txid, "msgId": ext.get("msgId"), "fromTransactionCheck": True}
        try:
            await self.instance.remoting.invoke(address, RequestCode.END_TRANSACTION,
                                                {k: v for k, v in answer.items() if v is not None},
                                                timeout_s=END_TIMEOUT_S)
        except ClientError as exc:
            # CONFLICT / already resolved by someone else, or the broker is gone: it asks again if needed
            log.info("answer to the check of transaction %s (%s) not taken: %s", txid, state.value, exc)

    @staticmethod
    def _half_message(cmd: Command, broker_group: str) -> ReceivedMessage:
        try:
            half = record.decode(cmd.body)
        except (ValueError, IndexError, struct.error) as exc:
            raise ClientError("SYSTEM_ERROR", f"undecodable half message in a transaction check: {exc}") from exc
        props = dict(half.properties)
        topic = props.pop(PROPERTY_REAL_TOPIC, None) or str(cmd.ext.get("topic") or half.topic)
        try:
            queue_id = int(props.pop(PROPERTY_REAL_QUEUE_ID, half.queue_id))
        except ValueError:
            queue_id = half.queue_id
        tags, keys = props.pop(PROPERTY_TAGS, None), props.pop(PROPERTY_KEYS, None)
        return ReceivedMessage(
            msg_id=half.msg_id, topic=topic, queue_id=queue_id, queue_offset=half.queue_offset, body=half.body,
            tags=tags, keys=keys.split(KEY_SEPARATOR) if keys else [], properties=props,
            born_timestamp=half.born_timestamp, store_timestamp=half.store_timestamp,
            reconsume_times=half.reconsume_times, broker_group=broker_group, commit_log_offset=half.physical_offset)

    def _group_of(self, address: str) -> str:
        for route in self.instance.routes.routes.values():
            for g in route.groups:
                if g.master_tcp == address:
                    return g.group
        return ""


__all__ = ["AsyncTransactionProducer", "HalfSent", "TransactionSendResult"]
