"""Batch and streaming writes: rows → messages, POSTed in batches to the topic's masters.

At-least-once: a batch is retried (with backoff, then on another broker group) until a broker
acknowledges it, so a retry after a lost answer may store a message twice; nothing acknowledged is
dropped. A row the broker can never take (too big, bad properties) fails the task with an error that
names the row; the limits are checked here before sending, with the broker's own validation code.
"""

from __future__ import annotations

import base64
import logging
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

from pydantic import ValidationError
from pyspark.sql import Row
from pyspark.sql.datasource import DataSourceStreamWriter, DataSourceWriter, WriterCommitMessage
from pyspark.sql.types import (
    ArrayType,
    BinaryType,
    ByteType,
    DataType,
    IntegerType,
    LongType,
    MapType,
    ShortType,
    StringType,
    StructType,
)

from ferrymq.common.api_models import MessageIn, validation_message
from ferrymq.common.errors import FerryError
from ferrymq.common.message import encode_properties
from ferrymq.pipeline.broker_http import BrokerError, BrokerHttp
from ferrymq.pipeline.options import WriteOptions
from ferrymq.pipeline.routes import GroupRoute, discover

log = logging.getLogger(__name__)

_INTS = (ByteType, ShortType, IntegerType, LongType)
# column -> the types it may have; other columns (topic, msgId, timestamps ... of a read) are ignored
ACCEPTED: dict[str, tuple[type[DataType], ...]] = {
    "body": (BinaryType, StringType),
    "tags": (StringType,),
    "keys": (ArrayType, StringType),
    "properties": (MapType,),
    "queueId": _INTS,
    "brokerGroup": (StringType,),
}


class FerryWriteError(RuntimeError):
    """A row that cannot be written; the message names the row."""


@dataclass
class FerryCommitMessage(WriterCommitMessage):
    partition_id: int
    count: int


def check_schema(schema: StructType) -> dict[str, int]:
    """Column name → index of the columns the writer uses; a clear error for a wrong type."""
    fields = {f.name: (i, f.dataType) for i, f in enumerate(schema.fields)}
    if "body" not in fields:
        raise FerryWriteError(f"writing to ferrymq needs a 'body' column (binary or string); the columns are "
                              f"{schema.fieldNames()}")
    out = {}
    for name, types in ACCEPTED.items():
        if name not in fields:
            continue
        idx, dtype = fields[name]
        ok = isinstance(dtype, types)
        if isinstance(dtype, ArrayType):
            ok = ok and isinstance(dtype.elementType, StringType)
        if isinstance(dtype, MapType):
            ok = isinstance(dtype.keyType, StringType) and isinstance(dtype.valueType, StringType)
        if not ok:
            want = " or ".join(t.__name__.removesuffix("Type").lower() for t in types)
            if name == "keys":
                want = "array<string> or string"
            elif name == "properties":
                want = "map<string,string>"
            raise FerryWriteError(f"column {name!r} is {dtype.simpleString()}; it must be {want}")
        out[name] = idx
    return out


def _describe(pid: int, index: int, row: Row, cols: dict[str, int]) -> str:
    hints = []
    for name in ("keys", "tags", "queueId"):
        if name in cols and row[cols[name]] is not None:
            hints.append(f"{name}={row[cols[name]]!r}")
    return f"row {index} of partition {pid}" + (f" ({', '.join(hints)})" if hints else "")


def row_to_message(row: Row, cols: dict[str, int], topic: str, max_body: int) -> tuple[dict[str, Any], int]:
    """One row → (message object for the HTTP API, body size); raises ValueError with the reason."""
    body = row[cols["body"]]
    if body is None:
        raise ValueError("body is null")
    raw = body.encode() if isinstance(body, str) else bytes(body)
    if not raw:
        raise ValueError("body is empty")
    if len(raw) > max_body:
        raise ValueError(f"body is {len(raw)} bytes; the limit is {max_body} bytes")
    msg: dict[str, Any] = {"bodyBase64": base64.b64encode(raw).decode()}
    if "tags" in cols and row[cols["tags"]] is not None:
        msg["tags"] = row[cols["tags"]]
    if "keys" in cols and row[cols["keys"]] is not None:
        keys = row[cols["keys"]]
        msg["keys"] = [keys] if isinstance(keys, str) else [k for k in keys if k is not None]
    if "properties" in cols and row[cols["properties"]]:
        msg["properties"] = {str(k): "" if v is None else str(v) for k, v in row[cols["properties"]].items()}
    if "queueId" in cols and row[cols["queueId"]] is not None:
        msg["queueId"] = int(row[cols["queueId"]])
    try:
        # The broker's own parsing, so that what it would refuse is refused here, before sending.
        parsed = MessageIn.model_validate(msg).to_message(topic)
        encode_properties(parsed.properties)
    except ValidationError as exc:
        raise ValueError(validation_message(exc)) from None
    except FerryError as exc:
        raise ValueError(exc.message) from None
    return msg, len(raw)


@dataclass
class _Pending:
    group: str | None  # None: any group
    rows: list[tuple[int, dict[str, Any], Row]] = field(default_factory=list)
    size: int = 0


class _PartitionWriter:
    """Writes one task's rows; discovers routes itself, so executors never need the driver."""

    def __init__(self, opts: WriteOptions, cols: dict[str, int], pid: int) -> None:
        self.opts = opts
        self.cols = cols
        self.pid = pid
        self.policy = opts.policy()
        self.clients: dict[str, BrokerHttp] = {}
        self.routes: list[GroupRoute] = []
        self.turn = pid
        self.count = 0
        self._refresh()

    def _refresh(self) -> None:
        self.routes = [r for r in discover(self.opts.endpoint, self.opts.topic, self.policy)
                       if r.writable and r.address is not None and r.write_queues > 0]
        if not self.routes:
            raise FerryWriteError(f"no broker group can take writes for topic {self.opts.topic!r} now")

    def _client(self, address: str) -> BrokerHttp:
        if address not in self.clients:
            self.clients[address] = BrokerHttp(address, self.policy)
        return self.clients[address]

    def close(self) -> None:
        for c in self.clients.values():
            c.close()

    def write(self, rows: Iterator[Row]) -> int:
        any_group = _Pending(None)
        pinned: dict[str, _Pending] = {}
        group_col = self.cols.get("brokerGroup")
        for index, row in enumerate(rows):
            try:
                msg, size = row_to_message(row, self.cols, self.opts.topic, self.opts.maxMessageSize)
            except ValueError as exc:
                raise FerryWriteError(f"cannot write {_describe(self.pid, index, row, self.cols)} to topic "
                                      f"{self.opts.topic!r}: {exc}") from None
            group = row[group_col] if group_col is not None else None
            pending = any_group if group is None else pinned.setdefault(group, _Pending(group))
            pending.rows.append((index, msg, row))
            pending.size += size * 4 // 3 + 256
            if len(pending.rows) >= self.opts.writeBatchSize or pending.size >= self.opts.writeBatchBytes:
                self._flush(pending)
        self._flush(any_group)
        for p in pinned.values():
            self._flush(p)
        return self.count

    def _flush(self, pending: _Pending) -> None:
        if not pending.rows:
            return
        body = {"messages": [m for _i, m, _r in pending.rows]}
        if pending.group is not None:
            candidates = [pending.group] * 2  # a second try after looking up the master again
        else:
            names = [r.group for r in self.routes]
            self.turn += 1
            candidates = [names[(self.turn + i) % len(names)] for i in range(len(names))]
        last: BrokerError | None = None
        for attempt, group in enumerate(candidates):
            if attempt:
                self._refresh()
            route = next((r for r in self.routes if r.group == group), None)
            if route is None or route.address is None:
                last = BrokerError("SERVICE_NOT_AVAILABLE", f"broker group {group!r} cannot take writes for "
                                   f"topic {self.opts.topic!r} now")
                continue
            try:
                self._client(route.address).request("POST", f"/v1/topics/{self.opts.topic}/messages", body)
            except BrokerError as exc:
                if exc.retryable or exc.status == 0:
                    log.warning("batch of %d to group %s failed (%s); trying again elsewhere", len(pending.rows),
                                group, exc)
                    last = exc
                    continue
                if len(pending.rows) > 1 and not isinstance(exc.details.get("index"), int):
                    # A 4xx refuses the whole batch before storing any of it; sending the rows one by
                    # one finds the row to name (the ones before it are stored, as they would have been).
                    self._one_by_one(pending, route.address)
                    return
                raise self._row_error(pending, exc) from None
            self.count += len(pending.rows)
            pending.rows.clear()
            pending.size = 0
            return
        assert last is not None
        raise FerryWriteError(f"could not write rows {pending.rows[0][0]}..{pending.rows[-1][0]} of partition "
                              f"{self.pid} to topic {self.opts.topic!r} after retries: {last}") from None

    def _one_by_one(self, pending: _Pending, address: str) -> None:
        client = self._client(address)
        for i, (index, msg, row) in enumerate(pending.rows):
            try:
                client.request("POST", f"/v1/topics/{self.opts.topic}/messages", msg)
            except BrokerError as exc:
                del pending.rows[:i]
                raise self._row_error(_Pending(pending.group, [(index, msg, row)]), exc) from None
            self.count += 1
        pending.rows.clear()
        pending.size = 0

    def _row_error(self, pending: _Pending, exc: BrokerError) -> FerryWriteError:
        i = exc.details.get("index", 0 if len(pending.rows) == 1 else None)
        if isinstance(i, int) and 0 <= i < len(pending.rows):
            index, _msg, row = pending.rows[i]
            return FerryWriteError(f"the broker refused {_describe(self.pid, index, row, self.cols)} for topic "
                                   f"{self.opts.topic!r}: {exc.code}: {exc.message}")
        return FerryWriteError(f"the broker refused rows {pending.rows[0][0]}..{pending.rows[-1][0]} of partition "
                               f"{self.pid} for topic {self.opts.topic!r}: {exc.code}: {exc.message}")


def _partition_id() -> int:
    from pyspark import TaskContext

    ctx = TaskContext.get()
    return ctx.partitionId() if ctx is not None else 0


def write_partition(opts: WriteOptions, cols: dict[str, int], rows: Iterator[Row]) -> FerryCommitMessage:
    pid = _partition_id()
    w = _PartitionWriter(opts, cols, pid)
    try:
        return FerryCommitMessage(pid, w.write(rows))
    finally:
        w.close()


class FerryBatchWriter(DataSourceWriter):
    def __init__(self, opts: WriteOptions, schema: StructType) -> None:
        self.opts = opts
        self.cols = check_schema(schema)

    def write(self, iterator: Iterator[Row]) -> WriterCommitMessage:
        return write_partition(self.opts, self.cols, iterator)

    def commit(self, messages: list[WriterCommitMessage | None]) -> None:
        total = sum(m.count for m in messages if isinstance(m, FerryCommitMessage))
        log.info("wrote %d messages to topic %s", total, self.opts.topic)

    def abort(self, messages: list[WriterCommitMessage | None]) -> None:
        done = sum(m.count for m in messages if isinstance(m, FerryCommitMessage))
        log.warning("write to topic %s aborted; %d messages were already acknowledged and stay in the topic",
                    self.opts.topic, done)


class FerryStreamWriter(DataSourceStreamWriter):
    def __init__(self, opts: WriteOptions, schema: StructType) -> None:
        self.opts = opts
        self.cols = check_schema(schema)

    def write(self, iterator: Iterator[Row]) -> WriterCommitMessage:
        return write_partition(self.opts, self.cols, iterator)

    def commit(self, messages: list[WriterCommitMessage | None], batchId: int) -> None:
        total = sum(m.count for m in messages if isinstance(m, FerryCommitMessage))
        log.info("batch %d: wrote %d messages to topic %s", batchId, total, self.opts.topic)

    def abort(self, messages: list[WriterCommitMessage | None], batchId: int) -> None:
        log.warning("batch %d to topic %s aborted; acknowledged messages stay (at-least-once)", batchId,
                    self.opts.topic)
